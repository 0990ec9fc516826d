"""RSD group recreation: give one container's NPUs a fresh group and its /dev/rsd<G> node.

The whole sequence runs under an exclusive flock on a node-wide lock file, so every
allocator on the node (other resource plugins, other processes) sees consistent group
ids. The lock is taken with non-blocking attempts and asyncio sleeps, so waiting for it
never stalls the event loop.

Every ``rbln-smi`` started under the lock inherits the locked descriptor. A flock
belongs to the open file, not to the process, so the lock stays held for as long as any
of those tools runs: if the daemon is killed in the middle of a group change, the
orphaned tool finishes under the lock, and a successor waits for it instead of handing
out a group that the orphan is about to destroy.

Each listing is also checked against what the daemon believes (the last scan's
device-name to bus-ID mapping): the group is built from bus IDs, the container gets
``/dev/<name>``, so after a driver reload that renumbered the devices they would be two
different devices. Any difference refuses the allocation before any group changes.
A reload can also land after the last listing, while ``group -c`` runs: that command
takes npu numbers, which then name other functions. So the new group is read back
(one more ``rbln-smi -g -j``): it must hold exactly the requested bus IDs, and every
name must still sit at its bus ID; otherwise the group is destroyed again and the
allocation refused the same way.

The lock serialises exactly the processes that take it: every allocation of every
daemon whose ``--rsd-lock-path`` names the same file, and any ``rbln-smi`` such a daemon
left running. With the default path inside a container, that is one pod; the chart points
it at ``/run/rbln`` on the host, so a surge successor and a killed pod's orphaned tool
wait for each other too. Other programs that change groups (an operator running
``rbln-smi group`` by hand) do not take it.

The reference sequence lists the groups twice (before and after destroying stale
ones). When none of the requested devices sits in a non-default group there is nothing
to destroy, and under the lock nothing else changes the groups, so the first listing
already is the second: one ``rbln-smi -g -j`` and one ``group -c`` suffice (and the
read-back listing after it).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

from rbln_device_plugin.host import ownfiles, smi
from rbln_device_plugin.host.devnodes import DeviceNodeMissing, NotADeviceNode, wait_for_nodes
from rbln_device_plugin.host.hostio import HostIO, Stalled
from rbln_device_plugin.host.paths import ensure_dir
from rbln_device_plugin.host.smi import DiscoveryError, GroupEntry, SmiError, run_smi
from rbln_device_plugin.model.inventory import is_valid_bus_id
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()

LOCK_TIMEOUT_S: Final = 5.0
LOCK_RETRY_S: Final = 0.1
LIST_TIMEOUT_S: Final = 5.0
CHANGE_TIMEOUT_S: Final = 10.0
NODE_TIMEOUT_S: Final = 5.0
NODE_POLL_S: Final = 0.1
DEFAULT_GROUP: Final = "0"


class RsdError(Exception):
    """RSD group recreation failed; the message says at which step and why."""


class DeviceMappingChanged(RsdError):
    """rbln-smi names a requested device at another bus ID than the last scan did."""

    def __init__(self, device: str, snapshot_bus_id: str, current_bus_id: str | None) -> None:
        self.device = device
        self.snapshot_bus_id = snapshot_bus_id
        self.current_bus_id = current_bus_id
        now = f"at bus ID {current_bus_id}" if current_bus_id else "not listed"
        super().__init__(
            f"{device} is {now} according to rbln-smi, but the last scan saw it at "
            f"{snapshot_bus_id}: the devices changed since (a driver reload?); refused so "
            "that no container gets the group of one device and the node of another; "
            "a rescan is under way, retry after it"
        )


class RenumberedDuringCreate(DeviceMappingChanged):
    """The group read back after ``group -c`` is not the one asked for: the devices were
    renumbered between the last listing and the creation (``group -c`` takes npu numbers,
    which then named other PCI functions). The group was destroyed again (if it could be).
    """

    def __init__(
        self,
        device: str,
        snapshot_bus_id: str,
        current_bus_id: str | None,
        *,
        group_id: int,
        group_bus_ids: Sequence[str],
        destroy_error: RsdError | None,
    ) -> None:
        now = f"at bus ID {current_bus_id}" if current_bus_id else "not listed"
        held = ", ".join(group_bus_ids) or "no device"
        undone = (
            "the group was destroyed again"
            if destroy_error is None
            else f"destroying the group failed too ({destroy_error})"
        )
        # Not DeviceMappingChanged's message: this one says the group was made, and undone.
        RsdError.__init__(
            self,
            f"the devices were renumbered while RSD group {group_id} was being created "
            f"(a driver reload?): read back, the group holds {held}, and {device} is {now}, "
            f"but the last scan saw {device} at {snapshot_bus_id}; {undone} and the "
            "allocation refused so that no container gets another device than the one "
            "checked; a rescan is under way, retry after it",
        )
        self.device = device
        self.snapshot_bus_id = snapshot_bus_id
        self.current_bus_id = current_bus_id
        self.group_id = group_id
        self.group_bus_ids = list(group_bus_ids)
        self.destroyed = destroy_error is None


class RsdLockTimeout(RsdError):
    """The RSD lock was not free within the budget."""


@dataclass(frozen=True, slots=True)
class RsdGroup:
    group_id: int
    host_path: Path  # <dev root>/rsd<group_id>
    bus_ids: tuple[str, ...]  # its members as read back after creating it (sorted)


def check_mapping(entries: Sequence[GroupEntry], expected: Mapping[str, str]) -> None:
    """Raise DeviceMappingChanged unless each name in ``expected`` (name -> lowercase bus
    ID) is listed at exactly that bus ID, and that bus ID under exactly that name."""
    for name, bus_id in sorted(expected.items()):
        at_name = {e.bus_id for e in entries if e.name == name}
        at_bus = {e.name for e in entries if e.bus_id == bus_id}
        if at_name != {bus_id}:
            current = sorted(b for b in at_name if b)
            raise DeviceMappingChanged(name, bus_id, ", ".join(current) or None)
        if at_bus != {name}:
            others = sorted(str(n) for n in at_bus - {name})
            raise DeviceMappingChanged(name, bus_id, f"{bus_id}, shared with {', '.join(others)}")


def groups_to_destroy(entries: Sequence[GroupEntry], bus_ids: Sequence[str]) -> list[str]:
    """Distinct non-default groups holding any of ``bus_ids``, in a stable order."""
    wanted = set(bus_ids)
    found = {e.group_id for e in entries if e.bus_id in wanted and e.group_id != DEFAULT_GROUP}
    return sorted(found, key=lambda g: (len(g), g))


def next_group_id(entries: Sequence[GroupEntry]) -> int:
    """Smallest id >= 1 that no device uses."""
    used: set[int] = set()
    for entry in entries:
        group = entry.group_id
        if not group.isascii() or not group.isdigit():
            raise RsdError(f"rbln-smi reports a non-numeric group_id {group!r}")
        used.add(int(group))
    candidate = 1
    while candidate in used:
        candidate += 1
    return candidate


def npus_for(entries: Sequence[GroupEntry], bus_ids: Sequence[str]) -> list[int]:
    by_bus = {e.bus_id: e.npu for e in entries if e.bus_id is not None}
    npus: list[int] = []
    for bus_id in bus_ids:
        if bus_id not in by_bus:
            raise RsdError(f"rbln-smi does not list bus ID {bus_id}")
        npu = by_bus[bus_id]
        if npu is None:
            raise RsdError(f"rbln-smi lists bus ID {bus_id} without an npu number")
        npus.append(npu)
    return npus


# The setting that names the RSD lock file: what sits at its path is refused, never
# renamed (see ``ownfiles``).
LOCK_PATH_SETTING: Final = "--rsd-lock-path (RSD_LOCK_PATH)"


def _open_lock_file(path: Path) -> int:
    """The RSD lock file, looked at before it is opened (never followed, no device or pipe
    opened) and checked (see ``ownfiles``): its directory (``/run/rbln`` on the host) is
    shared with other programs. The operator named this path, so an unusable entry there
    fails the call (``ownfiles.UnsafeEntry``, naming the setting) and is left where it is."""
    ensure_dir(path.parent)
    with ownfiles.opened_dir(path.parent) as parent_fd:
        fd = ownfiles.open_file(parent_fd, path.parent, path.name, configured_by=LOCK_PATH_SETTING)
    assert fd is not None  # created when missing
    return fd


class OpenedLockFile:
    """The RSD lock file opened ahead of its use, not locked: an Allocate opens it in
    the same off-loop batch as its first checks instead of a thread hop of its own.

    Whoever locks it ``take``s the descriptor; one never taken is closed by ``close`` or,
    if the batch's results are dropped (a cancelled call), when it is garbage collected.
    """

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def take(self) -> int:
        fd, self._fd = self._fd, None
        if fd is None:
            raise RuntimeError("the opened RSD lock file was already taken")
        return fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


# What opening the lock file ahead came to: the file, why it could not be opened, or the
# stalled call (see ``open_lock_file_ahead``).
LockFileAhead = OpenedLockFile | OSError | Stalled


def open_lock_file_ahead(path: Path) -> OpenedLockFile | OSError:
    """Open (creating when missing) the RSD lock file, for a ``HostIO`` batch: never raises."""
    try:
        return OpenedLockFile(_open_lock_file(path))
    except OSError as exc:
        return exc


@contextlib.asynccontextmanager
async def rsd_lock(
    path: Path,
    *,
    timeout: float = LOCK_TIMEOUT_S,  # noqa: ASYNC109 - a lock-wait budget
    retry: float = LOCK_RETRY_S,
    metrics: m.Metrics = m.NOOP,
    hostio: HostIO,
    opened: LockFileAhead | None = None,
) -> AsyncIterator[int]:
    """Hold an exclusive flock on ``path``; released on every exit path.

    Yields the locked descriptor, for the tools that must hold the lock too. The file is
    created and opened through ``hostio``: off the event loop, with its bound
    (``/run/rbln`` is a host directory like any other); ``opened`` is that open done
    ahead (``open_lock_file_ahead``), whose descriptor this then owns.
    """
    try:
        if isinstance(opened, OpenedLockFile):
            fd = opened.take()
        elif isinstance(opened, Stalled):
            raise RsdError(f"cannot open RSD lock file {path}: {opened}")
        elif isinstance(opened, OSError):
            raise opened
        else:
            result = await hostio.call(str(path), partial(_open_lock_file, path))
            if isinstance(result, Stalled):
                raise RsdError(f"cannot open RSD lock file {path}: {result}")
            fd = result
    except OSError as exc:
        raise RsdError(f"cannot open RSD lock file {path}: {exc}") from exc
    try:
        # The running loop's clock, as every other budget in async code (allocate.py's
        # queue share of this one): the same as time.monotonic() on a normal loop, and
        # fast-forwarded with the loop under fake time in the tests.
        loop = asyncio.get_running_loop()
        began = loop.time()
        deadline = began + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                metrics.rsd_lock_wait(m.OK, loop.time() - began)
                break
            except BlockingIOError:
                if loop.time() >= deadline:
                    metrics.rsd_lock_wait(m.LOCK_TIMEOUT, loop.time() - began)
                    raise RsdLockTimeout(
                        f"timed out after {timeout:.2g} s waiting for the RSD lock {path}"
                    ) from None
                await asyncio.sleep(retry)
            except OSError as exc:
                raise RsdError(f"cannot lock {path}: {exc}") from exc
        yield fd
    finally:
        # Closing the descriptor drops the flock too, even if we never got it.
        os.close(fd)


@dataclass(frozen=True, slots=True)
class RsdTimings:
    """The budgets of one group change, in seconds, besides the lock's."""

    listing: float = LIST_TIMEOUT_S  # one ``rbln-smi -g -j``
    change: float = CHANGE_TIMEOUT_S  # one ``group -d`` or ``group -c``
    node: float = NODE_TIMEOUT_S  # until the new group's device node appears
    node_poll: float = NODE_POLL_S


@dataclass(frozen=True, slots=True)
class RsdHost:
    """Where and how this node's RSD groups are changed."""

    hostio: HostIO
    lock_path: Path
    dev_root: Path
    # A regular file may stand for the group's device node (test only, see ``devnodes``).
    accept_file_nodes: bool = False
    metrics: m.Metrics = m.NOOP
    timings: RsdTimings = RsdTimings()


class GroupSteps:
    """The ``rbln-smi`` steps of one group change, run while ``lock_fd`` holds the lock.

    Every listing is checked against ``expected`` (device name -> bus ID) when given.
    """

    __slots__ = ("_binary", "_expected", "_fd", "_host")

    def __init__(
        self, host: RsdHost, binary: Path, lock_fd: int, expected: Mapping[str, str] | None
    ) -> None:
        self._host = host
        self._binary = binary
        self._fd = lock_fd
        self._expected = None if expected is None else {n: b.lower() for n, b in expected.items()}

    async def _run(self, args: Sequence[str], limit: float, step: str) -> str:
        try:
            return await run_smi(
                self._binary, args, limit, pass_fds=(self._fd,), metrics=self._host.metrics
            )
        except SmiError as exc:
            raise RsdError(f"{step}: {exc}") from exc

    async def listing(self) -> list[GroupEntry]:
        entries = await self._entries("listing RSD groups")
        if self._expected is not None:
            check_mapping(entries, self._expected)
        return entries

    async def _entries(self, step: str) -> list[GroupEntry]:
        text = await self._run(["-g", "-j"], self._host.timings.listing, step)
        try:  # a listing that cannot be trusted (see ``smi.parse_groups``)
            return smi.parse_groups(text)
        except (DiscoveryError, ValueError) as exc:
            raise RsdError(f"{step}: {exc}") from None

    async def destroy(self, groups: Sequence[str]) -> None:
        joined = ",".join(groups)
        change = self._host.timings.change
        await self._run(["group", "-d", joined], change, f"destroying groups {joined}")

    async def create(self, entries: Sequence[GroupEntry], bus_ids: Sequence[str]) -> RsdGroup:
        """A new group of exactly ``bus_ids`` (lowercase), once its device node is there."""
        host, timings = self._host, self._host.timings
        group_id = next_group_id(entries)
        npus = ",".join(str(npu) for npu in npus_for(entries, bus_ids))
        args = ["group", "-c", str(group_id), "-a", npus]
        await self._run(args, timings.change, f"creating group {group_id}")
        members = await self._read_back(group_id, bus_ids)
        host_path = host.dev_root / f"rsd{group_id}"
        try:
            await wait_for_nodes(
                [host_path],
                host.hostio,
                timeout=timings.node,
                interval=timings.node_poll,
                accept_files=host.accept_file_nodes,
            )
        except (DeviceNodeMissing, NotADeviceNode) as exc:
            raise RsdError(f"created group {group_id}, but {exc}") from exc
        return RsdGroup(group_id, host_path, members)

    async def _read_back(self, group_id: int, bus_ids: Sequence[str]) -> tuple[str, ...]:
        """Check that group ``group_id`` holds exactly ``bus_ids`` and that every expected
        name still sits at its bus ID (its members, read back); otherwise destroy the
        group and refuse.

        The listing before ``group -c`` was checked, but the tool takes npu numbers: a
        driver reload after that listing makes the same numbers name other functions,
        and ``/dev/<name>`` another device than the one whose status was read.
        """
        step = f"reading back group {group_id}"
        try:
            entries = await self._entries(step)
        except RsdError as exc:
            await self._undo(group_id)  # what it holds is unknown: not handed out
            raise RsdError(f"created group {group_id}, but {exc}") from exc
        members = sorted(e.bus_id for e in entries if e.group_id == str(group_id) and e.bus_id)
        mismatch = _mismatch(entries, members, bus_ids, self._expected or {})
        if mismatch is None:
            return tuple(members)
        device, snapshot_bus_id, current_bus_id = mismatch
        raise RenumberedDuringCreate(
            device,
            snapshot_bus_id,
            current_bus_id,
            group_id=group_id,
            group_bus_ids=members,
            destroy_error=await self._undo(group_id),
        )

    async def _undo(self, group_id: int) -> RsdError | None:
        """Destroy a group this call created and must not hand out; the failure, if any."""
        try:
            await self.destroy([str(group_id)])
        except RsdError as exc:
            log.error("Cannot destroy a wrongly created RSD group", groupId=group_id, err=exc)
            return exc
        return None


def _mismatch(
    entries: Sequence[GroupEntry],
    members: Sequence[str],
    bus_ids: Sequence[str],
    expected: Mapping[str, str],
) -> tuple[str, str, str | None] | None:
    """(device, bus ID the scan saw, bus ID now) of the first difference between the group
    read back and what was asked for; None when it is exactly that."""
    try:
        check_mapping(entries, expected)
    except DeviceMappingChanged as exc:
        return exc.device, exc.snapshot_bus_id, exc.current_bus_id
    if list(members) == sorted(bus_ids):
        return None
    name_of = {bus_id: name for name, bus_id in expected.items()}
    missing = sorted(set(bus_ids) - set(members)) or sorted(bus_ids)
    shown = name_of.get(missing[0], missing[0])
    return shown, missing[0], ", ".join(sorted(set(members) - set(bus_ids))) or None


def _wanted(bus_ids: Sequence[str], opened_lock: LockFileAhead | None) -> list[str]:
    """The distinct bus IDs, lowercase; RsdError (the lock file closed) when unusable."""
    wanted = sorted({bus_id.lower() for bus_id in bus_ids})
    bad = [bus_id for bus_id in wanted if not is_valid_bus_id(bus_id)]
    if not wanted or bad:
        if isinstance(opened_lock, OpenedLockFile):
            opened_lock.close()
        raise RsdError(f"invalid bus IDs {bad}" if bad else "no bus IDs to group")
    return wanted


async def recreate_rsd_group(
    host: RsdHost,
    binary: Path,
    bus_ids: Sequence[str],
    *,
    expected: Mapping[str, str] | None = None,
    lock_timeout: float = LOCK_TIMEOUT_S,
    opened_lock: LockFileAhead | None = None,
) -> RsdGroup:
    """Put exactly ``bus_ids`` into a new RSD group and wait for its device node.

    ``expected`` (device name -> bus ID, as the last scan saw them) is checked against
    every listing; a difference raises DeviceMappingChanged before any group changes.

    ``opened_lock``: the lock file opened ahead (``open_lock_file_ahead``), now owned
    here: locked, or closed when the call fails before locking.
    """
    started = time.monotonic()
    wanted = _wanted(bus_ids, opened_lock)
    async with rsd_lock(
        host.lock_path,
        timeout=lock_timeout,
        metrics=host.metrics,
        hostio=host.hostio,
        opened=opened_lock,
    ) as fd:
        steps = GroupSteps(host, binary, fd, expected)
        entries = await steps.listing()
        stale = groups_to_destroy(entries, wanted)
        if stale:  # else the first listing already is the second (see the module's doc)
            await steps.destroy(stale)
            entries = await steps.listing()
        group = await steps.create(entries, wanted)
    fields: dict[str, Any] = {
        "groupId": group.group_id,
        "busIDs": list(group.bus_ids),  # as read back: what the container gets
        "hostRsdPath": str(group.host_path),
        "destroyedGroups": stale,
        "durationMs": round((time.monotonic() - started) * 1000, 1),
    }
    log.debug("Recreated RSD group", **fields)
    return group
