"""``rbln-device-plugin inspect``: one read-only pass over the node, printed as a report.

The daemon's flags, environment variables and defaults (``options``/``config``), the
daemon's discovery code (``host.smi``, ``host.sysfs``) and its policy (``report``):
only the output differs. Nothing here creates an RSD group, takes a lock, opens a socket
or a port, or writes a file, so it is safe next to a running daemon
(``kubectl exec ds/<name> -- rbln-device-plugin inspect``).

stdout carries only the report. Log records go to stderr, and only at error level (an
internal error) unless RBLN_DEVICE_PLUGIN_LOG_LEVEL=debug: the report already says
everything the daemon would log about the node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Final

from rbln_device_plugin import __version__, config, options
from rbln_device_plugin.host import smi, sysfs
from rbln_device_plugin.host.cdidirs import SpecDirReader, read_spec_dirs
from rbln_device_plugin.host.hostio import Call, HostIO, Stalled
from rbln_device_plugin.inspect.drafacts import gather_mode
from rbln_device_plugin.inspect.drareport import build_mode_report
from rbln_device_plugin.inspect.facts import HostFacts, SmiOutcome, wanted_reads
from rbln_device_plugin.inspect.preferredreport import explain_preferred
from rbln_device_plugin.inspect.render import render_table, to_document
from rbln_device_plugin.inspect.report import RESOURCES, Report, build_report
from rbln_device_plugin.model.cdispec import REFERENCED_DEVICES, SpecVerdict, resolve_cdi_devices
from rbln_device_plugin.model.inventory import RESOURCE_NPU, DeviceFacts, SriovFacts
from rbln_device_plugin.telemetry import logs

PROG: Final = "rbln-device-plugin inspect"
EXIT_INTERRUPTED: Final = 130

_EPILOG: Final = (
    "Runs one discovery pass with the daemon's configuration (same flags, environment "
    "variables and defaults) and prints what the node has, what the kubelet is told and "
    "why; which mode is configured and which sockets of either mode are on the node; in "
    "dra mode the ResourceSlice devices and the prepared claims. Read-only: no RSD "
    "group, lock, socket, port or file is created. Exit status: 0 "
    "when at least one device is advertised and no error was found, 1 when discovery "
    "fails, nothing is advertised or an error was found, 2 for usage errors. The report "
    "goes to stdout; log records go to stderr, errors only unless "
    f"{logs.LEVEL_ENV}=debug. Every other daemon flag and environment variable is "
    "accepted too, so the daemon's own command line works here, but changes nothing."
)
# The settings that change what inspect reads; --help lists only these.
_SHOWN_FIELDS: Final = (
    "sysfs_root", "rbln_smi", "cdi_root", "cdi_static_dir", "mode", "node_name",
    "kubelet_dir", "kubelet_plugins_registry_path", "kubelet_plugins_path",
)  # fmt: skip
_SHOWN: Final = tuple(o for o in config.OPTIONS if o.field in _SHOWN_FIELDS)


@dataclass(frozen=True, slots=True)
class InspectRequest:
    config: config.Config
    output: str  # "table" or "json"
    preferred: int | None  # allocation size; None: no preferred-allocation question
    resource: str
    available: list[str] | None  # None: the resource's Healthy devices
    must_include: list[str]


def build_parser() -> argparse.ArgumentParser:
    """The daemon's parser (every daemon flag; help shows those that matter here) plus
    inspect's own flags."""
    parser = options.build_parser(
        PROG, "Show what this node has, what the kubelet is told, and why.", _EPILOG, _SHOWN
    )
    group = parser.add_argument_group("inspect options")
    group.add_argument(
        "--output", choices=("table", "json"), default="table", help="report format [table]"
    )
    group.add_argument(
        "--preferred",
        type=int,
        metavar="SIZE",
        help="also show what GetPreferredAllocation would answer for SIZE devices now, "
        "with every score level of the winner and of the runner-up",
    )
    group.add_argument(
        "--resource",
        choices=RESOURCES,
        metavar="NAME",
        help=f"resource of the --preferred request [{RESOURCE_NPU}]",
    )
    group.add_argument(
        "--available",
        metavar="IDS",
        help="comma-separated device IDs the kubelet offers (default: the resource's "
        "Healthy devices)",
    )
    group.add_argument(
        "--must-include", metavar="IDS", help="comma-separated device IDs the answer must hold"
    )
    return parser


def parse(
    parser: argparse.ArgumentParser, argv: Sequence[str], environ: Mapping[str, str]
) -> InspectRequest:
    """Flags + environment -> InspectRequest. Raises UsageError for anything unusable."""
    namespace = options.parse_args(parser, argv)
    if namespace.preferred is None:
        given = [
            flag
            for flag, value in (
                ("--resource", namespace.resource),
                ("--available", namespace.available),
                ("--must-include", namespace.must_include),
            )
            if value is not None
        ]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            named = " and ".join([", ".join(given[:-1]), given[-1]] if len(given) > 1 else given)
            raise options.UsageError(f"{named} {verb} --preferred SIZE")
    return InspectRequest(
        config=options.config_from_namespace(namespace, environ),
        output=namespace.output,
        preferred=namespace.preferred,
        resource=namespace.resource or RESOURCE_NPU,
        available=None if namespace.available is None else _ids(namespace.available),
        must_include=_ids(namespace.must_include or ""),
    )


def _ids(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


async def run_discovery(cfg: config.Config, io: HostIO) -> SmiOutcome:
    """Find and run ``rbln-smi -j`` exactly as a daemon scan does; never raises for it."""
    try:
        found = await io.call("rbln-smi lookup", partial(smi.locate_rbln_smi, cfg.rbln_smi))
        if isinstance(found, Stalled):
            return SmiOutcome(None, f"looking for rbln-smi: {found}")
        binary = found
    except smi.SmiNotFound as exc:
        configured = str(cfg.rbln_smi) if cfg.rbln_smi is not None else None
        return SmiOutcome(configured, str(exc), tuple(str(path) for path in exc.tried))
    except smi.DiscoveryError as exc:
        return SmiOutcome(None, str(exc))
    started = time.monotonic()

    def elapsed() -> float:
        return round((time.monotonic() - started) * 1000, 1)

    try:
        text = await smi.run_smi(binary, ["-j"], smi.INVENTORY_TIMEOUT_S)
        entries = tuple(smi.parse_entries(text))
    except (smi.SmiError, smi.DiscoveryError) as exc:
        return SmiOutcome(str(binary), str(exc), duration_ms=elapsed())
    return SmiOutcome(str(binary), entries=entries, duration_ms=elapsed())


async def gather(cfg: config.Config) -> HostFacts:
    """The read-only pass: rbln-smi once, then the sysfs files the report needs.

    Host reads go through the daemon's bounded runner: a file a wedged driver never
    answers shows up as unreadable (with the reason) instead of hanging the command.
    The runner's idle threads end with the pass: a caller that goes on running (the tests
    call ``main`` in-process) is left none waiting for work that never comes.
    """
    io = HostIO()
    try:
        return await _gather(cfg, io)
    finally:
        io.close()


async def _gather(cfg: config.Config, io: HostIO) -> HostFacts:
    root = cfg.sysfs_root
    outcome = await run_discovery(cfg, io)
    listed = await io.call(
        os.path.join(root, "bus", "pci", "devices"),
        lambda: tuple(sysfs.list_sysfs_devices(root)),
    )
    devices = () if isinstance(listed, Stalled) else listed
    missing = await io.call(str(root), partial(sysfs.missing_roots, root))
    bus_ids, names = wanted_reads(outcome.entries, devices)
    facts = await io.map(
        [Call(sysfs.pci_device_dir(root, b), partial(sysfs.read_device_facts, root, b))
         for b in bus_ids]
    )  # fmt: skip
    statuses = await sysfs.read_statuses(io, root, names)
    cdi = await check_cdi(cfg, io)
    mode = await gather_mode(cfg, io)
    return HostFacts(
        smi=outcome,
        sysfs_devices=devices,
        facts={
            bus_id: fact if isinstance(fact, DeviceFacts) else _stalled_facts(fact)
            for bus_id, fact in zip(bus_ids, facts, strict=True)
        },
        statuses=statuses,
        config=cfg.describe(),
        sysfs_missing=() if isinstance(missing, Stalled) else missing,
        cdi=cdi,
        mode=mode,
    )


async def check_cdi(cfg: config.Config, io: HostIO) -> SpecVerdict:
    """The daemon's CDI spec check: the same directories, reader and rules."""
    paths = [str(path) for path in cfg.cdi_spec_dirs]
    return resolve_cdi_devices(await read_spec_dirs(io, SpecDirReader(), paths), REFERENCED_DEVICES)


def _stalled_facts(stalled: Stalled) -> DeviceFacts:
    return DeviceFacts(sriov=SriovFacts(error=str(stalled)), pci_path_error=str(stalled))


def render(request: InspectRequest, host: HostFacts) -> tuple[str, int]:
    report = explain_mode(build_report(host))
    preferred = None
    if request.preferred is not None:
        preferred = explain_preferred(
            report, request.resource, request.preferred, request.available, request.must_include
        )
    if request.output == "json":
        document = to_document(report, preferred, __version__)
        return json.dumps(document, indent=2, default=str) + "\n", report.exit_code
    return render_table(report, preferred), report.exit_code


def _install_logging(environ: Mapping[str, str]) -> None:
    settings = logs.resolve_settings(environ)
    level = "debug" if settings.level_name == "debug" else "error"
    logs.install({**environ, logs.LEVEL_ENV: level}, stream=sys.stderr)


def main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    try:
        return _main(argv, os.environ if environ is None else environ)
    finally:
        logs.flush()  # records are written by a background thread


def _main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    _install_logging(environ)
    log = logs.get_logger()
    parser = build_parser()
    try:
        request = parse(parser, argv, environ)
    except options.UsageError as exc:
        parser.print_usage(sys.stderr)
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return options.EXIT_USAGE
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
    try:
        started = time.monotonic()
        host = asyncio.run(gather(request.config))
        output, code = render(request, host)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        log.error("Unexpected internal error in inspect", err=exc, exc_info=True)
        return options.EXIT_FAILURE
    log.debug(
        "Inspected node",
        exitCode=code,
        durationMs=round((time.monotonic() - started) * 1000, 1),
        config=request.config.describe(),
    )
    try:
        sys.stdout.write(output)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): keep the exit status, drop the rest quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return code


def explain_mode(report: Report) -> Report:
    """``report`` with its mode part and the mode's findings; unchanged without facts."""
    facts = report.facts.mode
    if facts is None:
        return report
    mode = build_mode_report(facts, report.tables)
    return replace(report, mode=mode, findings=(*report.findings, *mode.findings))
