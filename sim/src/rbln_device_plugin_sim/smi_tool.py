"""The fake ``rbln-smi`` program: ``-j``, ``-g -j``, ``group -c``, ``group -d``.

Materialised nodes get a tiny executable that calls ``main(argv, state_path)``. It
answers from the state file, changes RSD groups there and in ``<dev root>/rsd<G>``, and
refuses what the real tool refuses, with a message on stderr and a non-zero exit.
Injected faults stored in the state file take effect before the command runs.

Stdlib only, and nothing imported at module level that a quick CLI would not need.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rbln_device_plugin_sim.state import (
    GARBAGE,
    HANG_SECONDS,
    HOLD,
    RSD_MINOR_BASE,
    SmiState,
    StateError,
    StateStore,
    listing,
    make_dev_node,
)

USAGE = (
    "usage: rbln-smi -j | rbln-smi -g -j | rbln-smi group -c <gid> -a <npu>[,<npu>...]"
    " | rbln-smi group -d <gid>[,<gid>...]"
)
EXIT_USAGE = 2
EXIT_REFUSED = 1


class Refused(Exception):
    """The real tool would refuse this request."""


@dataclass(frozen=True, slots=True)
class Command:
    kind: str  # one of state.COMMANDS
    group_ids: tuple[int, ...] = ()
    npus: tuple[int, ...] = ()


def _int_list(text: str, what: str) -> tuple[int, ...]:
    parts = text.split(",")
    if not text or any(not p.isascii() or not p.isdigit() for p in parts):
        raise Refused(f"invalid {what} {text!r}: expected comma-separated non-negative integers")
    values = tuple(int(p) for p in parts)
    if len(set(values)) != len(values):
        raise Refused(f"duplicate {what} in {text!r}")
    return values


def parse_args(argv: list[str]) -> Command:
    """Raises Refused for anything the four supported commands do not cover."""
    if argv == ["-j"]:
        return Command("list")
    if sorted(argv) == ["-g", "-j"]:
        return Command("list-groups")
    if argv[:1] == ["group"]:
        rest = argv[1:]
        if len(rest) == 2 and rest[0] == "-d":
            return Command("group-delete", group_ids=_int_list(rest[1], "group id"))
        if len(rest) == 4 and rest[0] == "-c" and rest[2] == "-a":
            gid = _int_list(rest[1], "group id")
            if len(gid) != 1:
                raise Refused(f"group -c takes one group id, got {rest[1]!r}")
            return Command("group-create", group_ids=gid, npus=_int_list(rest[3], "npu"))
    raise Refused(f"unknown arguments: {' '.join(argv) or '(none)'}")


def create_group(state: SmiState, gid: int, npus: tuple[int, ...]) -> Path:
    if gid == 0:
        raise Refused("group 0 is the default group and cannot be created")
    by_npu = {int(rec["npu"]): rec for rec in state.devices}
    if str(gid) in state.groups():
        raise Refused(f"group {gid} already exists")
    for npu in npus:
        rec = by_npu.get(npu)
        if rec is None:
            raise Refused(f"npu {npu} not found")
        if str(rec.get("group_id", "0")) != "0":
            raise Refused(f"npu {npu} ({rec['device']}) already belongs to group {rec['group_id']}")
    for npu in npus:
        by_npu[npu]["group_id"] = str(gid)
    node = Path(state.dev_root) / f"rsd{gid}"
    make_dev_node(node, state.char_major, RSD_MINOR_BASE + gid)
    return node


def destroy_groups(state: SmiState, gids: tuple[int, ...]) -> None:
    existing = state.groups()
    for gid in gids:
        if gid == 0:
            raise Refused("group 0 is the default group and cannot be destroyed")
        if str(gid) not in existing:
            raise Refused(f"group {gid} does not exist")
    wanted = {str(g) for g in gids}
    for rec in state.devices:
        if str(rec.get("group_id", "0")) in wanted:
            rec["group_id"] = "0"
    for gid in gids:
        (Path(state.dev_root) / f"rsd{gid}").unlink(missing_ok=True)


def run(argv: list[str], store: StateStore, out: TextIO, err: TextIO) -> int:
    try:
        command = parse_args(argv)
    except Refused as exc:
        err.write(f"rbln-smi: {exc}\n{USAGE}\n")
        return EXIT_USAGE
    fault = None
    # Most calls find no fault: check under the shared lock, write only to consume one.
    if any(f.matches(command.kind) for f in store.read().faults):
        with store.transaction() as state:
            fault = state.take_fault(command.kind)
    if fault is not None:
        if fault.mode == HOLD:
            _hold(store, command.kind)
        elif fault.mode == "hang":
            time.sleep(HANG_SECONDS)
        elif fault.mode == "slow":
            time.sleep(fault.delay)
        elif fault.mode == "garbage":
            out.write(GARBAGE)
            return 0
        elif fault.mode == "error":
            err.write(fault.message.rstrip("\n") + "\n")
            return fault.exit_code
    if command.kind in ("list", "list-groups"):
        out.write(listing(store.read(), with_groups=command.kind == "list-groups"))
        return 0
    try:
        with store.transaction() as state:
            if command.kind == "group-create":
                node = create_group(state, command.group_ids[0], command.npus)
                report = f"Created group {command.group_ids[0]} ({node.name})\n"
            else:
                destroy_groups(state, command.group_ids)
                report = f"Destroyed group(s) {','.join(map(str, command.group_ids))}\n"
    except Refused as exc:  # the transaction discards the partly changed state
        err.write(f"rbln-smi: {exc}\n")
        return EXIT_REFUSED
    # Like the real tool: the change is made, then reported. A caller that is gone (its
    # pipe closed) does not undo it.
    out.write(report)
    return 0


def _hold(store: StateStore, kind: str) -> None:
    """Wait until the test deletes this invocation's marker, then carry on normally."""
    store.held_dir.mkdir(exist_ok=True)
    marker = store.held_dir / str(os.getpid())
    marker.write_text(kind, encoding="utf-8")
    while marker.exists():
        time.sleep(0.01)


def main(argv: list[str] | None = None, state_path: str | None = None) -> int:
    path = state_path or os.environ.get("RBLN_SIM_STATE", "")
    if not path:
        sys.stderr.write("rbln-smi (simulated): no state file given\n")
        return EXIT_USAGE
    try:
        args = sys.argv[1:] if argv is None else argv
        return run(args, StateStore(Path(path)), sys.stdout, sys.stderr)
    except (StateError, OSError) as exc:
        sys.stderr.write(f"rbln-smi: cannot access device state: {exc}\n")
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
