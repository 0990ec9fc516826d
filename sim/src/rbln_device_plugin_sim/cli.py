"""``rbln-device-plugin-sim``: build, serve, change and demo a simulated node.

Every command says what it did. Commands that change the node act on the files under
``--root``; ``preferred``, ``allocate`` and ``restart-kubelet`` ask the ``serve`` running
on that root to act as the kubelet (see ``control``); ``probe`` asks the daemon's health
service as the kubelet's gRPC probes do.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from rbln_device_plugin.model import resources
from rbln_device_plugin_sim import kubeletcmds, nodecmds
from rbln_device_plugin_sim.layout import PRESETS, LayoutError
from rbln_device_plugin_sim.shell import SIM_PROG
from rbln_device_plugin_sim.state import COMMANDS, FAULT_MODES, StateError
from rbln_device_plugin_sim.tree import SimError

NPU = resources.NPU.name


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=SIM_PROG, description="Simulated Rebellions NPU node.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("presets", help="list the node presets")
    p = sub.add_parser("demo", help="run the daemon against a simulated node and narrate")
    p.add_argument(
        "--keep", action="store_true", help="keep the node and the daemon's log afterwards"
    )

    for name, text in (
        ("materialize", "build a node under --root and exit"),
        ("serve", "build (or reopen) a node and run a kubelet stand-in until interrupted"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--root", required=True, type=Path, help="directory for the node")
        source = p.add_mutually_exclusive_group()
        source.add_argument(
            "--preset", choices=sorted(PRESETS), help="node shape [atom-max-8 for a new node]"
        )
        source.add_argument("--layout", type=Path, help="a layout JSON file instead of a preset")
        p.add_argument(
            "--force",
            action="store_true",
            help="replace a node already under --root (its files are deleted)",
        )

    def with_root(name: str, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text)
        p.add_argument("--root", required=True, type=Path, help="a materialised node")
        return p

    p = with_root("set-status", "write a device's status file")
    p.add_argument("device")
    value = p.add_mutually_exclusive_group(required=True)
    value.add_argument("code", nargs="?", help="lifecycle code (0 READY .. 5 FINISH) or text")
    value.add_argument("--raw", help="exact file contents, e.g. garbage")
    value.add_argument("--delete", action="store_true", help="remove the status file")

    p = with_root("add-device", "add a device given as a layout device JSON object")
    p.add_argument("device_json")
    p = with_root("remove-device", "remove a device (a PF takes its VFs)")
    p.add_argument("device")
    p = with_root("repartition", "write a PF's sriov_numvfs and recreate its VFs")
    p.add_argument("pf")
    p.add_argument("count", type=int)
    p.add_argument("--unlisted", action="store_true", help="rbln-smi does not list the VFs")
    p = with_root("renumber", "reload the driver with the PFs probed in another order")
    p.add_argument("names", nargs="+", metavar="OLD=NEW", help="e.g. rbln0=rbln1 rbln1=rbln0")

    p = with_root("fault", "make rbln-smi misbehave (or 'clear')")
    p.add_argument("mode", choices=[*FAULT_MODES, "clear"])
    p.add_argument("--only", action="append", choices=COMMANDS, default=[], help="repeatable")
    p.add_argument("--delay", type=float, default=0.0, help="seconds, for 'slow'")
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--message", default="rbln-smi: injected failure")
    p.add_argument("--times", type=int, help="only the next N matching invocations")

    with_root("groups", "show RSD groups as rbln-smi reports them")

    # Through the kubelet stand-in of the `serve` running on --root.
    p = with_root("preferred", "ask the plugin for a preferred allocation (needs serve)")
    p.add_argument("--size", type=int, required=True, help="how many devices")
    p.add_argument("--resource", help=f"resource name [the one listing the IDs, else {NPU}]")
    p.add_argument("--available", help="comma-separated IDs [the resource's Healthy devices]")
    p.add_argument("--must-include", help="comma-separated IDs the answer must hold")

    p = with_root("allocate", "send Allocate for one pod's container(s) (needs serve)")
    p.add_argument(
        "containers",
        nargs="*",
        metavar="IDS",
        help="comma-separated device IDs, one argument per container",
    )
    p.add_argument(
        "--size", type=int, help="pick SIZE devices with GetPreferredAllocation first, as the "
        "kubelet does, instead of naming them",
    )  # fmt: skip
    p.add_argument("--resource", help=f"resource name [the one listing the IDs, else {NPU}]")

    p = with_root("restart-kubelet", "restart the kubelet stand-in of serve (needs serve)")
    p.add_argument(
        "--wait", type=float, default=10.0, help="seconds to wait for re-registration [10]"
    )

    p = sub.add_parser(
        "probe", help="ask the daemon's health service as a gRPC probe does (exit 0: SERVING)"
    )
    p.add_argument("service", help="liveness, readiness, registered, or '' (the server)")
    p.add_argument("--port", type=int, required=True, help="the daemon's --healthcheck-port")
    p.add_argument("--host", default="127.0.0.1", help="[127.0.0.1]")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds, as the chart's [5]")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors and --help: argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    if args.command == "allocate" and bool(args.containers) == (args.size is not None):
        parser.print_usage(sys.stderr)
        print(f"{SIM_PROG}: error: allocate takes device IDs or --size, not both", file=sys.stderr)
        return 2
    try:
        return _COMMANDS[args.command](args)
    except (SimError, LayoutError, StateError, OSError, ValueError) as exc:
        print(f"{SIM_PROG}: error: {exc}", file=sys.stderr)
        return 1


def _demo(args: argparse.Namespace) -> int:
    from rbln_device_plugin_sim.demo import DemoConfig, run_demo

    return run_demo(DemoConfig(keep=args.keep))


def _probe(args: argparse.Namespace) -> int:
    from rbln_device_plugin_sim.probecmd import probe  # grpc loads only to probe

    return probe(args)


def _serve(args: argparse.Namespace) -> int:
    from rbln_device_plugin_sim.servecmd import serve  # grpc loads only to serve

    return serve(args)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "presets": nodecmds.presets,
    "demo": _demo,
    "materialize": nodecmds.materialize_cmd,
    "serve": _serve,
    "probe": _probe,
    "set-status": nodecmds.set_status,
    "add-device": nodecmds.add_device,
    "remove-device": nodecmds.remove_device,
    "repartition": nodecmds.repartition,
    "renumber": nodecmds.renumber,
    "fault": nodecmds.fault,
    "groups": nodecmds.groups,
    "preferred": kubeletcmds.preferred,
    "allocate": kubeletcmds.allocate,
    "restart-kubelet": kubeletcmds.restart_kubelet,
}
