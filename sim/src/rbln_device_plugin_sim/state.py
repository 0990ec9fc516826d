"""The fake rbln-smi's state file: device records, RSD groups and injected faults.

Every reader and writer holds an flock on a sidecar lock file, so concurrent ``rbln-smi``
invocations and runtime changes from tests never lose an update. Writes go through a
temporary file and a rename, so even an unlocked reader never sees half a file.

Each write also leaves the two listings (``-j`` and ``-g -j``) of a fault-free state in a
sidecar file, ``<state>.listings``, beside the exact state text they were rendered from:
the tests' daemons list the node on every scan, and ``smi_exe`` answers from that file
without importing ``json`` (see ``listings_text`` for its format).

Stdlib only: this module is imported by every fake ``rbln-smi`` process.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

# The four things rbln-smi is asked to do; faults can target any subset of them.
COMMANDS: Final = ("list", "list-groups", "group-create", "group-delete")
FAULT_MODES: Final = ("error", "hang", "garbage", "slow")
# "hold": the invocation waits, marked as held, until the test releases it and then runs
# normally (``SimNode.held`` / ``release_held``). For tests that must act while a call is
# in flight without guessing how long it takes; the CLI does not offer it (no release).
HOLD: Final = "hold"
HANG_SECONDS: Final = 3600.0
# Minor numbers of character-device nodes: rbln<N> (any function) gets its rbln-smi index
# ``npu``; rsd<G> gets RSD_MINOR_BASE + G.
RSD_MINOR_BASE: Final = 128
GARBAGE: Final = "rbln-smi: \x1b[31m<<garbled output>>\x1b[0m {not json\n"


def make_dev_node(path: Path, char_major: int | None, minor: int) -> None:
    """A /dev entry: a character device (major, minor) when a major is set, else a file."""
    if char_major is None:
        path.touch()
        return
    path.unlink(missing_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(char_major, minor))


class StateError(Exception):
    """The state file is missing or not what the simulator wrote."""


@dataclass(frozen=True, slots=True)
class Fault:
    """How the next matching rbln-smi invocations misbehave."""

    mode: str  # one of FAULT_MODES, or HOLD
    commands: tuple[str, ...] = ()  # empty: every command
    delay: float = 0.0  # "slow": seconds to wait before answering
    exit_code: int = 1  # "error"
    message: str = "rbln-smi: injected failure"  # "error": text on stderr
    remaining: int | None = None  # invocations left; None: until cleared

    def __post_init__(self) -> None:
        if self.mode not in (*FAULT_MODES, HOLD):
            raise StateError(f"unknown fault mode {self.mode!r}; choose from {FAULT_MODES}")
        bad = [c for c in self.commands if c not in COMMANDS]
        if bad:
            raise StateError(f"unknown rbln-smi command(s) {bad}; choose from {COMMANDS}")
        if self.delay < 0 or (self.remaining is not None and self.remaining < 1):
            raise StateError("delay must be >= 0 and remaining >= 1")

    def matches(self, command: str) -> bool:
        return not self.commands or command in self.commands

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["commands"] = list(self.commands)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fault:
        values = dict(data)
        values["commands"] = tuple(values.get("commands", ()))
        return cls(**values)


@dataclass(slots=True)
class SmiState:
    kmd_version: str
    dev_root: str  # where `group -c` creates rsd<G> nodes
    # Full records as `rbln-smi -g -j` prints them, in listing order.
    devices: list[dict[str, Any]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    # Set: /dev entries are character devices of this major (needs root), else files.
    char_major: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "KMD_version": self.kmd_version,
            "dev_root": self.dev_root,
            "devices": self.devices,
            "faults": [f.to_dict() for f in self.faults],
        }
        if self.char_major is not None:
            out["char_major"] = self.char_major
        return out

    @classmethod
    def from_dict(cls, data: Any) -> SmiState:
        try:
            return cls(
                kmd_version=str(data["KMD_version"]),
                dev_root=str(data["dev_root"]),
                devices=list(data["devices"]),
                faults=[Fault.from_dict(f) for f in data.get("faults", [])],
                char_major=None if data.get("char_major") is None else int(data["char_major"]),
            )
        except (KeyError, TypeError, ValueError, StateError) as exc:
            raise StateError(f"state file is not a simulator state: {exc}") from exc

    def groups(self) -> dict[str, list[str]]:
        """Group id -> device names, group "0" (the default) included."""
        out: dict[str, list[str]] = {}
        for rec in self.devices:
            out.setdefault(str(rec.get("group_id", "0")), []).append(str(rec["device"]))
        return out

    def take_fault(self, command: str) -> Fault | None:
        """The first fault matching ``command``, consuming one of its uses."""
        for index, fault in enumerate(self.faults):
            if not fault.matches(command):
                continue
            if fault.remaining is not None:
                if fault.remaining <= 1:
                    del self.faults[index]
                else:
                    self.faults[index] = replace(fault, remaining=fault.remaining - 1)
            return fault
        return None


def listing(state: SmiState, with_groups: bool) -> str:
    """What ``rbln-smi -j`` (``-g -j`` with ``with_groups``) prints for this state."""
    devices: list[dict[str, Any]] = []
    for rec in state.devices:
        out = dict(rec)
        if not with_groups:
            out.pop("group_id", None)
        devices.append(out)
    return json.dumps({"KMD_version": state.kmd_version, "devices": devices}, indent=4) + "\n"


def listings_text(state_text: str) -> str | None:
    """The listings sidecar for this state file text, or None when a listing must be decided
    by ``smi_tool`` (a fault is set: it may act on the next listing).

    Three length-prefixed parts: ``<n>\\n`` then n characters, for the state text, the
    ``-j`` listing and the ``-g -j`` listing. The state text is kept whole so that a reader
    can tell that the sidecar belongs to the state file it has just read, even when a test
    rewrote that file behind the store's back.
    """
    # Rendered from the text as a reader will load it, not from the state in memory.
    state = SmiState.from_dict(json.loads(state_text))
    if state.faults:
        return None
    parts = (state_text, listing(state, with_groups=False), listing(state, with_groups=True))
    return "".join(f"{len(part)}\n{part}" for part in parts)


class StateStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self.listings_path = path.with_name(path.name + ".listings")
        # Invocations waiting in a HOLD fault: one file each, named by the process id and
        # holding the command; deleting the file releases that invocation.
        self.held_dir = path.with_name(path.name + ".held")

    @contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _load(self) -> SmiState:
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise StateError(f"cannot read state file {self.path}: {exc}") from exc
        try:
            return SmiState.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise StateError(f"state file {self.path} is not JSON: {exc}") from exc

    def _save(self, state: SmiState) -> None:
        text = json.dumps(state.to_dict(), indent=1)
        # The sidecar goes first: a reader takes it only beside this exact state text.
        listings = listings_text(text)
        if listings is None:
            self.listings_path.unlink(missing_ok=True)
        else:
            self._replace(self.listings_path, listings)
        self._replace(self.path, text)

    @staticmethod
    def _replace(path: Path, text: str) -> None:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)

    def read(self) -> SmiState:
        with self._locked(exclusive=False):
            return self._load()

    @contextmanager
    def transaction(self) -> Iterator[SmiState]:
        """Load under an exclusive lock; save on a clean exit, discard on an exception."""
        with self._locked(exclusive=True):
            state = self._load()
            yield state
            self._save(state)

    def create(self, state: SmiState) -> None:
        with self._locked(exclusive=True):
            self._save(state)
