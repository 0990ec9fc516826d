"""``rbln-device-plugin-sim``: build, serve, change and demo a simulated node."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rbln_device_plugin_sim.layout import PRESETS, Layout, LayoutError, SimDevice, preset
from rbln_device_plugin_sim.node import LAYOUT_FILE, SimError, SimNode, materialize
from rbln_device_plugin_sim.state import COMMANDS, FAULT_MODES, Fault, StateError

if TYPE_CHECKING:  # grpc loads only for the commands that serve
    from rbln_device_plugin_sim.kubelet import KubeletStub

PROG = "rbln-device-plugin-sim"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Simulated Rebellions NPU node.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("presets", help="list the node presets")
    sub.add_parser("demo", help="run the daemon against a simulated node and narrate")

    for name, text in (
        ("materialize", "build a node under --root and exit"),
        ("serve", "build (or reopen) a node, serve a kubelet stub until interrupted"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--root", required=True, type=Path, help="directory for the node")
        source = p.add_mutually_exclusive_group()
        source.add_argument("--preset", default="atom-max-8", choices=sorted(PRESETS))
        source.add_argument("--layout", type=Path, help="a layout JSON file instead of a preset")

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
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # usage errors and --help: argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return _COMMANDS[args.command](args)
    except (SimError, LayoutError, StateError, OSError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


def _presets(_: argparse.Namespace) -> int:
    for name in PRESETS:
        layout = preset(name)
        print(f"{name:<16} {len(layout.devices):>3} devices  {layout.description}")
    return 0


def _layout(args: argparse.Namespace) -> Layout:
    return Layout.load(args.layout) if args.layout else preset(args.preset)


def _materialize(args: argparse.Namespace) -> int:
    node = materialize(_layout(args), args.root)
    print(f"built {node.layout.name} ({len(node.layout.devices)} devices) under {node.root}")
    return 0


def _set_status(args: argparse.Namespace) -> int:
    node = SimNode.open(args.root)
    value: int | str | None
    if args.delete:
        value = None
    elif args.raw is not None:
        value = args.raw
    else:
        value = int(args.code) if args.code.lstrip("-").isdigit() else args.code
    node.set_status(args.device, value)
    return 0


def _add_device(args: argparse.Namespace) -> int:
    node = SimNode.open(args.root)
    data = json.loads(args.device_json)
    # One device through the layout parser: same validation as a layout file.
    dev: SimDevice = Layout.from_dict({"devices": [data]}).devices[0]
    node.add_device(dev)
    return 0


def _remove_device(args: argparse.Namespace) -> int:
    print("removed", " ".join(SimNode.open(args.root).remove_device(args.device)))
    return 0


def _repartition(args: argparse.Namespace) -> int:
    node = SimNode.open(args.root)
    vfs = node.repartition(args.pf, args.count, listed=not args.unlisted)
    print(f"{args.pf}: {args.count} VF(s) {' '.join(vfs)}".rstrip())
    return 0


def _renumber(args: argparse.Namespace) -> int:
    names: dict[str, str] = {}
    for pair in args.names:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise SimError(f"{pair!r}: expected OLD=NEW, e.g. rbln0=rbln1")
        names[old] = new
    renamed = SimNode.open(args.root).renumber(names)
    print(" ".join(f"{old}->{new}" for old, new in renamed.items()))
    return 0


def _fault(args: argparse.Namespace) -> int:
    node = SimNode.open(args.root)
    if args.mode == "clear":
        node.clear_faults()
        return 0
    node.inject_fault(
        Fault(
            args.mode,
            tuple(args.only),
            delay=args.delay,
            exit_code=args.exit_code,
            message=args.message,
            remaining=args.times,
        )
    )
    return 0


def _groups(args: argparse.Namespace) -> int:
    for gid, names in sorted(SimNode.open(args.root).groups().items(), key=lambda i: int(i[0])):
        print(f"{gid}: {' '.join(names)}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from rbln_device_plugin_sim.kubelet import KubeletStub

    root = Path(args.root).absolute()
    existing = (root / LAYOUT_FILE).exists()
    node = SimNode.open(root) if existing else materialize(_layout(args), root)
    command = [sys.executable, "-m", "rbln_device_plugin", *node.daemon_args()]
    print(f"node {node.layout.name}: {len(node.layout.devices)} devices under {node.root}")
    print("run the daemon against it with:")
    print("  " + shlex.join(command))
    print("change it from another shell, e.g.:")
    print(f"  {PROG} set-status --root {shlex.quote(str(node.root))} rbln0 4")
    print("kubelet stub events follow; Ctrl-C to stop.", flush=True)

    def event(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')}  {text}", flush=True)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with KubeletStub(node.kubelet_dir, on_event=event) as stub:
            watcher = asyncio.create_task(_report_lists(stub, event))
            await stop.wait()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    asyncio.run(serve())
    print(f"stopped; the node stays under {node.root}")
    return 0


async def _report_lists(stub: KubeletStub, event: Callable[[str], None]) -> None:
    """Print each resource's healthy/unhealthy counts whenever a new list arrives."""
    seen: dict[str, tuple[int, int]] = {}
    while True:
        await asyncio.sleep(0.2)
        for resource in stub.resources():
            view = stub.view(resource)
            if view is None or view.messages == 0:
                continue
            key = (view.generation, view.messages)
            if seen.get(resource) != key:
                seen[resource] = key
                event(
                    f"{resource}: {len(view.devices)} devices, "
                    f"{view.count('Healthy')} Healthy, {view.count('Unhealthy')} Unhealthy"
                )


def _demo(_: argparse.Namespace) -> int:
    from rbln_device_plugin_sim.demo import run_demo

    return run_demo()


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "presets": _presets,
    "demo": _demo,
    "materialize": _materialize,
    "serve": _serve,
    "set-status": _set_status,
    "add-device": _add_device,
    "remove-device": _remove_device,
    "repartition": _repartition,
    "renumber": _renumber,
    "fault": _fault,
    "groups": _groups,
}
