"""Command dispatch: ``inspect``, or the daemon (logger first, then options, then run).

stdout carries only the structured log stream; --help, --version and usage text go to
stderr so that every stdout line stays machine-parseable.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence

from rbln_device_plugin import processtweaks, signalcatch

# Before asyncio is imported by anything below (see processtweaks). dra mode keeps ssl:
# its API server client speaks TLS through asyncio.
processtweaks.keep_out_unused_modules(processtweaks.needs_tls(sys.argv[1:], os.environ))

from rbln_device_plugin import __version__, config, options  # noqa: E402
from rbln_device_plugin.model import resources  # noqa: E402
from rbln_device_plugin.telemetry import grpc_relay, logs  # noqa: E402

IGNORED_SETTING_MSG = "Setting ignored; using its default"
# How long the start's look at what --rsd-lock-path names may take (a mount that hangs).
LOCK_PATH_LOOK_S = 2.0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["inspect"]:
        # Before the daemon's logger: inspect's stdout is its report, not log records.
        from rbln_device_plugin.inspect import command

        return command.main(args[1:])
    try:
        code = _main(args)
    finally:
        # Records are written by a background thread: let the last ones out (bounded,
        # so a blocked stdout cannot hold the exit).
        logs.flush()
    if signalcatch.installed():
        # No interpreter finalisation: it would put the signals back to their defaults.
        processtweaks.exit_now(code)
    return code


def _main(args: Sequence[str]) -> int:
    # The gRPC C core logs straight to fd 2 and reads this once, at import.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    logs.install(os.environ)
    # Before the first record: from here on a shutdown signal is always an orderly stop,
    # a second one the forced exit (see runtime.signals; imports no gRPC). One caught
    # since the start (signalcatch, installed by entry) is handled now.
    from rbln_device_plugin.runtime import signals

    signals.install()
    log = logs.get_logger()
    try:
        cfg = options.parse(args, os.environ)
        _check_lock_path(cfg)
    except options.UsageError as exc:
        options.daemon_parser().print_usage(sys.stderr)
        sys.stderr.write(f"rbln-device-plugin: error: {exc}\n")
        log.error("Invalid command line", err=str(exc))
        return options.EXIT_USAGE
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)

    log.info("Starting rbln-device-plugin", version=__version__, config=cfg.describe())
    if cfg.test_file_device_nodes:
        log.warning(
            "Test-only setting enabled: regular files pass as device nodes",
            setting="--test-file-device-nodes / RBLN_TEST_FILE_DEVICE_NODES",
            hint="for the simulated node only; unset it on a real node",
        )
    for setting, value, reason in cfg.ignored:
        log.warning(IGNORED_SETTING_MSG, setting=setting, value=value, err=reason, usedDefault=True)
    ignored_problem = config.ignored_env_problem(os.environ, cfg.legacy_names_flag)
    if ignored_problem is not None:
        log.warning(
            f"Invalid {config.IGNORED_ENV}, ignoring it",
            variable=config.IGNORED_ENV,
            value=os.environ.get(config.IGNORED_ENV),
            err=ignored_problem,
        )
    legacy_names = config.legacy_names_requested(os.environ, cfg.legacy_names_flag)
    if legacy_names is not None:
        setting, value = legacy_names
        log.warning(
            f"{config.IGNORED_ENV}=false has no effect: resource names are fixed",
            **{"flag" if setting.startswith("-") else "variable": setting},
            value=value,
            resourceNames=list(resources.RESOURCE_NAMES),
            hint="per-product names such as rebellions.ai/ATOM are not advertised; "
            "workloads must request the names above",
        )
    # From here on gRPC's C-core lines on fd 2 become component=grpc records.
    relay = grpc_relay.install()
    try:
        from rbln_device_plugin.runtime import daemon  # imports grpc: after GRPC_VERBOSITY is set

        return daemon.run(cfg)
    except Exception as exc:
        log.error("Unexpected internal error; exiting", err=exc, exc_info=True)
        return options.EXIT_FAILURE
    finally:
        if relay is not None:
            relay.stop()


def _check_lock_path(cfg: config.Config) -> None:
    """UsageError when ``--rsd-lock-path`` names an entry that cannot be the lock file (a
    directory, a symlink, a device...): the daemon would otherwise find it at the first
    Allocate. Looked at (``lstat``) on a thread of its own, bounded: on a mount that does
    not answer the daemon starts anyway, and Allocate refuses what it finds there."""
    from rbln_device_plugin.host import ownfiles

    found: list[str | None] = []
    done = threading.Event()

    def look() -> None:
        try:
            found.append(ownfiles.configured_file_problem(cfg.rsd_lock_path))
        finally:
            done.set()

    threading.Thread(target=look, name="rsd-lock-path-look", daemon=True).start()
    if done.wait(LOCK_PATH_LOOK_S) and found and found[0] is not None:
        raise options.UsageError(f"{cfg.origin('rsd_lock_path')}: {cfg.rsd_lock_path} {found[0]}")


if __name__ == "__main__":
    raise SystemExit(main())
