"""The commands that build or change the node on disk; each prints what it changed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rbln_device_plugin.model.health import StatusReading
from rbln_device_plugin_sim import control, shell
from rbln_device_plugin_sim.layout import PRESETS, Layout, SimDevice, preset
from rbln_device_plugin_sim.node import LAYOUT_FILE, SimError, SimNode, materialize, remove_node
from rbln_device_plugin_sim.state import Fault

DEFAULT_PRESET = "atom-max-8"


def presets(_: argparse.Namespace) -> int:
    for name in PRESETS:
        layout = preset(name)
        print(f"{name:<16} {len(layout.devices):>3} devices  {layout.description}")
    return 0


def wanted_layout(args: argparse.Namespace) -> Layout | None:
    """The layout --preset or --layout asks for; None when neither was given."""
    if args.layout is not None:
        return Layout.load(args.layout)
    return preset(args.preset) if args.preset is not None else None


def open_or_build(args: argparse.Namespace, *, reopen: bool) -> tuple[SimNode, str]:
    """The node under --root and what was done to get it ("built", "reopened", ...).

    A node already there is replaced only with --force; it is reopened (``reopen``) only
    when no other layout was asked for. Never a flag silently ignored.
    """
    root = Path(args.root).absolute()
    wanted = wanted_layout(args)
    if not (root / LAYOUT_FILE).exists():
        return materialize(wanted or preset(DEFAULT_PRESET), root), "built"
    existing = SimNode.open(root)
    if args.force:
        if control.in_use(root):
            raise SimError(f"a `serve` is running on {root}; stop it (Ctrl-C) before --force")
        remove_node(root)
        layout = wanted or existing.layout
        return materialize(layout, root), f"replaced the {existing.layout.name} node; built"
    same = wanted is None or (
        wanted.name == existing.layout.name if args.layout is None else wanted == existing.layout
    )
    if reopen and same:
        return existing, "reopened as it was left (--force rebuilds it)"
    asked = f" with {wanted.name}" if wanted is not None else ""
    hint = "leave out --preset/--layout to reopen it, " if reopen else ""
    raise SimError(
        f"{root} already holds a simulated node ({existing.layout.name}); {hint}pass --force "
        f"to replace it{asked} (its files are deleted), or choose another --root"
    )


def materialize_cmd(args: argparse.Namespace) -> int:
    node, done = open_or_build(args, reopen=False)
    print(f"{done} {node.layout.name} ({len(node.layout.devices)} devices) under {node.root}")
    return 0


def set_status(args: argparse.Namespace) -> int:
    node = SimNode.open(args.root)
    value: int | str | None
    if args.delete:
        value = None
    elif args.raw is not None:
        value = args.raw
    else:
        value = int(args.code) if args.code.lstrip("-").isdigit() else args.code
    node.set_status(args.device, value)
    if value is None:
        print(f"{args.device}: status file deleted (the daemon reads it as UNREADABLE)")
    elif isinstance(value, int):
        print(f"{args.device}: status file now reads {value} ({StatusReading(value).name})")
    else:
        print(f"{args.device}: status file now holds {value!r} (not a status code: UNREADABLE)")
    return 0


def add_device(args: argparse.Namespace) -> int:
    node = SimNode.open(args.root)
    data = json.loads(args.device_json)
    # One device through the layout parser: same validation as a layout file.
    dev: SimDevice = Layout.from_dict({"devices": [data]}).devices[0]
    node.add_device(dev)
    listed = "listed by rbln-smi" if dev.listed else "not listed by rbln-smi"
    print(f"added {dev.name} ({dev.product} at {dev.bus_id}, {listed})")
    return 0


def remove_device(args: argparse.Namespace) -> int:
    print("removed", " ".join(SimNode.open(args.root).remove_device(args.device)))
    return 0


def repartition(args: argparse.Namespace) -> int:
    node = SimNode.open(args.root)
    vfs = node.repartition(args.pf, args.count, listed=not args.unlisted)
    print(f"{args.pf}: {args.count} VF(s) {' '.join(vfs)}".rstrip())
    return 0


def renumber(args: argparse.Namespace) -> int:
    names: dict[str, str] = {}
    for pair in args.names:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise SimError(f"{pair!r}: expected OLD=NEW, e.g. rbln0=rbln1")
        names[old] = new
    renamed = SimNode.open(args.root).renumber(names)
    moves = ", ".join(f"{old} is now {new}" for old, new in renamed.items())
    print(f"driver reloaded: {moves}; every device is back in RSD group 0")
    return 0


def fault(args: argparse.Namespace) -> int:
    node = SimNode.open(args.root)
    if args.mode == "clear":
        removed = len(node.store.read().faults)
        node.clear_faults()
        print(f"rbln-smi behaves again ({removed} fault(s) cleared)")
        return 0
    injected = Fault(
        args.mode,
        tuple(args.only),
        delay=args.delay,
        exit_code=args.exit_code,
        message=args.message,
        remaining=args.times,
    )
    node.inject_fault(injected)
    undo = shell.sim("fault", "--root", str(args.root), "clear")
    print(f"rbln-smi {_describe(injected)}; undo with: {undo}")
    return 0


def _describe(injected: Fault) -> str:
    which = " and ".join(injected.commands) if injected.commands else "every call"
    what = {
        "error": f"fails (exit {injected.exit_code})",
        "hang": "hangs",
        "garbage": "prints garbage",
        "slow": f"answers after {injected.delay:g} s",
    }[injected.mode]
    when = f"the next {injected.remaining} time(s)" if injected.remaining else "until cleared"
    return f"now {what} on {which}, {when}"


def groups(args: argparse.Namespace) -> int:
    for gid, names in sorted(SimNode.open(args.root).groups().items(), key=lambda i: int(i[0])):
        print(f"{gid}: {' '.join(names)}")
    return 0
