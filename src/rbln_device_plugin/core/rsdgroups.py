"""The RSD sequence both front ends run for a checked request: the first host look beside
the final status reads, then the device nodes, rbln-smi and the node's RSD group.

The device plugin's Allocate makes one group per container; the DRA front end one per
claim. Both go through ``GroupMaker``: this daemon's group changes queue in arrival order
(``rsd_queue``) in front of the node-wide file lock, inside one 5 s budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final

from rbln_device_plugin.config import Config
from rbln_device_plugin.host import devnodes, rsd, smi
from rbln_device_plugin.host.hostio import Call, HostBatch, HostIO, Slot, Stalled
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.telemetry import metrics as m

# A queue wait shorter than this is not worth naming in a lock timeout's message.
_SHOWN_QUEUE_S: Final = 0.05
_SMI_LOOKUP: Final = "rbln-smi lookup"


def failure_class(exc: BaseException) -> str:
    """The metrics' result class of a failure after validation."""
    if isinstance(exc, devnodes.DeviceNodeMissing | devnodes.NotADeviceNode):
        return m.ALLOCATE_DEVICE_NODE
    if isinstance(exc, rsd.RsdLockTimeout):
        return m.ALLOCATE_RSD_LOCK
    if isinstance(exc, rsd.RsdError):  # incl. rbln-smi not found
        return m.ALLOCATE_RSD_GROUP
    return m.ALLOCATE_INTERNAL


@dataclass(frozen=True, slots=True)
class FirstLook:
    """The first round of the groups' host checks, run in the same off-loop batch as
    the final status reads (``batch``): what sits at each requested device's node (None:
    usable), the rbln-smi to run (or why there is none), and per group the RSD lock
    file opened ahead (``rsd.open_lock_file_ahead``; a group takes its own when its turn
    comes, ``close`` drops the ones never taken)."""

    batch: HostBatch
    node_kinds: Mapping[Path, Slot[str | None]]
    rbln_smi: Slot[Path | smi.SmiNotFound]
    lock_files: Sequence[Slot[rsd.OpenedLockFile | OSError]]

    @classmethod
    def build(cls, config: Config, distinct: Sequence[str], groups: int) -> FirstLook:
        """The calls for the distinct requested device names: the device nodes, the
        rbln-smi lookup, then one RSD lock file opened per group."""
        accept_files = config.test_file_device_nodes
        batch = HostBatch()
        kinds = {}
        for device_id in distinct:
            path = config.dev_root / device_id
            look = partial(devnodes.node_kind, path, accept_files)
            kinds[path] = batch.add(Call(str(path), look))
        found = batch.add(Call(_SMI_LOOKUP, partial(_lookup, config.rbln_smi)))
        lock_path = config.rsd_lock_path
        locks = [
            batch.add(Call(str(lock_path), partial(rsd.open_lock_file_ahead, lock_path)))
            for _ in range(groups)
        ]
        return cls(batch, kinds, found, locks)

    def lock_file(self, group: int) -> rsd.LockFileAhead | None:
        if group < len(self.lock_files):
            return self.lock_files[group].result()
        return None

    def close(self) -> None:
        for slot in self.lock_files:
            try:
                ahead = slot.result()
            except RuntimeError:  # the batch never ran: nothing was opened
                return
            if isinstance(ahead, rsd.OpenedLockFile):
                ahead.close()


class GroupMaker:
    """Makes one RSD group for a set of checked devices, within the lock budget."""

    def __init__(
        self,
        config: Config,
        hostio: HostIO,
        metrics: m.Metrics,
        rsd_queue: asyncio.Lock,
    ) -> None:
        self._config = config
        self._hostio = hostio
        self._rsd_queue = rsd_queue
        # Where and how this node's RSD groups change: the same for every group.
        self.host = rsd.RsdHost(
            hostio,
            config.rsd_lock_path,
            config.dev_root,
            accept_file_nodes=config.test_file_device_nodes,
            metrics=metrics,
        )

    def look_ahead(self, distinct: Sequence[str], groups: int) -> FirstLook:
        """The first host checks of a validated request, as calls for the status reads'
        batch: they only stat paths and open the RSD lock file (creating it when
        missing), lock nothing and create no group."""
        return FirstLook.build(self._config, distinct, groups)

    async def nodes_and_rbln_smi(self, node_paths: Sequence[Path], first: FirstLook) -> Path:
        """Wait for the device nodes, then find rbln-smi.

        The first round of both is ``first`` (taken beside the status reads). Only when a
        node is not there yet (or is something else) does the usual polling wait follow.
        """
        accept_files = self._config.test_file_device_nodes
        kinds = [first.node_kinds[p].result() for p in node_paths]
        found = first.rbln_smi.result()
        if any(kind is not None for kind in kinds):
            await devnodes.wait_for_nodes(node_paths, self._hostio, accept_files=accept_files)
        # Not finding rbln-smi is a discovery error to the scan; here it fails the group.
        if isinstance(found, smi.SmiNotFound):
            raise rsd.RsdError(str(found)) from found
        if isinstance(found, Stalled):
            raise rsd.RsdError(f"looking for rbln-smi: {found}")
        return found

    async def recreate(
        self, binary: Path, devices: Sequence[Device], lock_file: rsd.LockFileAhead | None
    ) -> rsd.RsdGroup:
        """Recreate the RSD group within one 5 s lock budget.

        This daemon's own group changes queue in arrival order (no 100 ms polling races
        between them); the time spent in that queue counts against the same budget as
        the file lock, so no request waits longer than the lock policy allows.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(rsd.LOCK_TIMEOUT_S):
                await self._rsd_queue.acquire()
        except TimeoutError:
            raise self._lock_timeout("queued behind this daemon's earlier allocations") from None
        queued = loop.time() - started
        try:
            return await rsd.recreate_rsd_group(
                self.host,
                binary,
                [d.bus_id for d in devices],
                expected={d.name: d.bus_id for d in devices},
                lock_timeout=max(rsd.LOCK_RETRY_S, rsd.LOCK_TIMEOUT_S - queued),
                opened_lock=lock_file,
            )
        except rsd.RsdLockTimeout as exc:
            # The file lock had what the queue left of the budget: the request waited
            # the whole budget, and says so (not the remainder the file lock was given).
            queue_part = (
                f"{queued:.1f} s of it queued behind this daemon's earlier allocations"
                if queued >= _SHOWN_QUEUE_S
                else None
            )
            raise self._lock_timeout(queue_part) from exc
        finally:
            self._rsd_queue.release()

    def _lock_timeout(self, queue_part: str | None) -> rsd.RsdLockTimeout:
        """The whole 5 s budget ran out; ``queue_part`` says how much went in the queue."""
        note = f" ({queue_part})" if queue_part else ""
        return rsd.RsdLockTimeout(
            f"timed out after {rsd.LOCK_TIMEOUT_S:g} s waiting for the RSD lock "
            f"{self.host.lock_path}{note}"
        )


def _lookup(configured: Path | None) -> Path | smi.SmiNotFound:
    try:
        return smi.locate_rbln_smi(configured)
    except smi.SmiNotFound as exc:
        return exc
