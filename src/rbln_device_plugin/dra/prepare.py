"""NodePrepareResources and NodeUnprepareResources for one claim each, on the core.

Prepare, one way, as the device plugin's Allocate: the claim's allocation (read from the
API server) names devices; each must be one this node offers now (``DeviceState.validate``
of the resource it belongs to); the final status check runs on them with the RSD
sequence's first host look in the same batch (``DeviceState.final_check``,
``core.rsdgroups``); a faulted device is refused by name. Only then does anything change
on the host: the checkpoint records the claim as started, the claim's devices get one
fresh RSD group, its CDI spec is written, and the checkpoint records it as completed with
the CDI device IDs the kubelet gets.

Both calls are idempotent: a completed claim is answered from the checkpoint (no second
group), an unknown claim's unprepare succeeds. One lock serialises the host changes and
the checkpoint; the API read happens before it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rbln_device_plugin.config import Config
from rbln_device_plugin.core.devices import Offered
from rbln_device_plugin.core.devicestate import DeviceState
from rbln_device_plugin.core.requests import AllocationError
from rbln_device_plugin.core.rsdgroups import FirstLook, GroupMaker, failure_class
from rbln_device_plugin.dra import cdispec, files, names
from rbln_device_plugin.dra import checkpoint as cp
from rbln_device_plugin.dra.apiclaims import ClaimSource
from rbln_device_plugin.dra.claims import ClaimProblem, ClaimRef, allocated_devices
from rbln_device_plugin.host import rsd
from rbln_device_plugin.host.hostio import HostBatch, HostIO, Stalled
from rbln_device_plugin.host.paths import ensure_dir
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()


@dataclass(frozen=True, slots=True)
class Outcome:
    """One claim's answer: its devices, or the error the kubelet shows on the pod."""

    devices: tuple[cp.PreparedDevice, ...] = ()
    error: str = ""


class DraDevices:
    """The devices the DRA front end serves: one core ``DeviceState`` per offered resource,
    updated by each scan's discovery."""

    def __init__(self, open_state: Any) -> None:
        self._open_state = open_state  # NodeDevices.open_state
        self.states: dict[str, DeviceState] = {}
        # Held by pods of the device-plugin mode (``runtime.otherholds``): neither published
        # nor prepared until they are released.
        self.withheld: frozenset[str] = frozenset()

    async def update(self, offered: Offered) -> None:
        for resource in sorted(set(self.states) - set(offered)):
            await self.states.pop(resource).close()
        for resource, devices in offered.items():
            state = self.states.get(resource)
            if state is None:
                state = self.states[resource] = self._open_state(resource)
            await state.update(devices)

    def owner(self, device: str) -> DeviceState | None:
        if device in self.withheld:
            return None
        for state in self.states.values():
            if device in state.entries:
                return state
        return None


class Preparer:
    def __init__(
        self,
        config: Config,
        devices: DraDevices,
        claims: ClaimSource,
        *,
        node_name: str,
        plugin_dir: Path,
        hostio: HostIO,
        metrics: m.Metrics = m.NOOP,
        rsd_queue: asyncio.Lock | None = None,
        wake: asyncio.Event | None = None,
    ) -> None:
        self._config = config
        self._devices = devices
        self._claims = claims
        self.pool = node_name  # one pool per node, named after it (as Rebellions' driver)
        self._plugin_dir = plugin_dir
        self._hostio = hostio
        self._metrics = metrics
        self._groups = GroupMaker(config, hostio, metrics, rsd_queue or asyncio.Lock())
        self._wake = wake  # the scan loop's: set when the node's devices changed
        self._lock = asyncio.Lock()
        self._checkpoint = cp.Checkpoint()

    @property
    def checkpoint(self) -> cp.Checkpoint:
        return self._checkpoint

    async def start(self) -> None:
        """Make the driver's directory and read the checkpoint (CheckpointError when it
        cannot be trusted: a restart must not forget what it prepared)."""
        path = self._plugin_dir / names.CHECKPOINT_FILE
        await self._host(partial(ensure_dir, self._plugin_dir), "create", self._plugin_dir)
        data = await self._host(partial(files.read_regular, path), "read", path)
        if data is not None:
            self._checkpoint = cp.decode(data, str(path))
        self._metrics.dra_prepared_claims(_completed_count(self._checkpoint))
        log.info(
            "DRA checkpoint loaded",
            path=str(path),
            claimCount=len(self._checkpoint.claims),
            started=sorted(u for u, e in self._checkpoint.claims.items() if e.state == cp.STARTED),
        )

    # ----------------------------------------------------------------- prepare
    async def prepare(self, ref: ClaimRef) -> Outcome:
        started = time.monotonic()
        try:
            devices = await self._prepare(ref)
        except (ClaimProblem, AllocationError, rsd.RsdError, OSError) as exc:
            message = f"{names.DRIVER_NAME}: claim {ref} ({ref.uid}): {exc}"
            result = _result(exc)
            log.error(
                "DRA claim preparation failed",
                claim=str(ref), claimUID=ref.uid, err=str(exc), durationMs=_ms(started),
                result=result,
            )  # fmt: skip
            self._metrics.dra_claim(m.DRA_PREPARE, result, time.monotonic() - started)
            return Outcome(error=message)
        self._metrics.dra_claim(m.DRA_PREPARE, m.OK, time.monotonic() - started)
        log.info(
            "DRA claim prepared",
            claim=str(ref), claimUID=ref.uid, devices=[d.device for d in devices],
            durationMs=_ms(started),
        )  # fmt: skip
        return Outcome(devices)

    async def _prepare(self, ref: ClaimRef) -> tuple[cp.PreparedDevice, ...]:
        problem = names.claim_uid_problem(ref.uid)
        if problem is not None:
            raise ClaimProblem(problem)
        done = self._completed(ref)
        if done is not None:  # before the API read: a retry costs nothing
            return done
        claim = await self._claims.get(ref)
        allocated = allocated_devices(claim, ref, names.DRIVER_NAME, self.pool)
        if not allocated:
            raise ClaimProblem(f"ResourceClaim {ref} allocates no device of {names.DRIVER_NAME}")
        async with self._lock:
            done = self._completed(ref)  # a concurrent call for the same claim finished
            if done is not None:
                return done
            wanted = [a.device for a in allocated]
            snapshot, first = await self._final_check(wanted)
            try:
                entry = cp.ClaimEntry(ref.namespace, ref.name, cp.STARTED)
                await self._save(self._checkpoint.with_claim(ref.uid, entry))
                group_path = await self._make_group([snapshot[d] for d in wanted], first)
            finally:
                first.close()  # the lock file opened ahead, if the group never took it
            spec = cdispec.claim_spec(ref.uid, wanted, self._config.dev_root, group_path)
            spec_name = names.spec_file_name(ref.uid)
            cdi_root = self._config.cdi_root
            await self._host(partial(ensure_dir, cdi_root), "create", cdi_root)
            write = partial(files.write_atomically, cdi_root, spec_name, spec)
            await self._host(write, "write", cdi_root / spec_name)
            requests_seen: set[str] = set()
            prepared = []
            for a in allocated:
                first_of_request = a.request not in requests_seen
                requests_seen.add(a.request)
                ids = cdispec.cdi_device_ids(ref.uid, a.device, first_of_request)
                prepared.append(cp.PreparedDevice(a.request, a.pool, a.device, tuple(ids)))
            done_entry = cp.ClaimEntry(ref.namespace, ref.name, cp.COMPLETED, tuple(prepared))
            await self._save(self._checkpoint.with_claim(ref.uid, done_entry))
            return done_entry.devices

    def _completed(self, ref: ClaimRef) -> tuple[cp.PreparedDevice, ...] | None:
        entry = self._checkpoint.claims.get(ref.uid)
        if entry is not None and entry.state == cp.COMPLETED:
            return entry.devices
        return None

    async def _final_check(self, wanted: Sequence[str]) -> tuple[Mapping[str, Device], FirstLook]:
        """Every allocated device must be offered now and pass the final status check."""
        by_state: dict[DeviceState, list[str]] = {}
        for device in wanted:
            state = self._devices.owner(device)
            if state is None:
                raise AllocationError(
                    f"device {device} is not offered on this node now (vanished, or not "
                    "advertised: see the daemon's discovery records)",
                    result=m.ALLOCATE_INVALID_REQUEST,
                )
            by_state.setdefault(state, []).append(device)
        first = self._groups.look_ahead(list(wanted), 1)
        snapshot: dict[str, Device] = {}
        ahead: HostBatch | None = first.batch
        try:
            for state, ids in by_state.items():
                checked = state.validate([ids])
                snapshot.update(await state.final_check(checked, ahead or HostBatch()))
                ahead = None  # the first look runs once, beside the first status reads
        except BaseException:
            first.close()
            raise
        return snapshot, first

    async def _make_group(self, devices: Sequence[Device], first: FirstLook) -> Path:
        node_paths = [self._config.dev_root / d.name for d in devices]
        binary = await self._groups.nodes_and_rbln_smi(node_paths, first)
        try:
            group = await self._groups.recreate(binary, devices, first.lock_file(0))
        except rsd.DeviceMappingChanged:
            if self._wake is not None:
                self._wake.set()  # the scan loop rescans now
            raise
        return group.host_path

    # ----------------------------------------------------------------- unprepare
    async def unprepare(self, ref: ClaimRef) -> Outcome:
        problem = names.claim_uid_problem(ref.uid)
        if problem is not None:
            return Outcome(error=f"{names.DRIVER_NAME}: claim {ref}: {problem}")
        try:
            async with self._lock:
                if ref.uid not in self._checkpoint.claims:
                    return Outcome()  # never prepared here, or already unprepared
                spec_name = names.spec_file_name(ref.uid)
                cdi_root = self._config.cdi_root
                await self._host(
                    partial(files.remove, cdi_root, spec_name), "remove", cdi_root / spec_name
                )
                await self._save(self._checkpoint.without(ref.uid))
        except OSError as exc:
            message = f"{names.DRIVER_NAME}: claim {ref} ({ref.uid}): {exc}"
            log.error(
                "DRA claim unpreparation failed", claim=str(ref), claimUID=ref.uid, err=str(exc)
            )
            self._metrics.dra_claim(m.DRA_UNPREPARE, m.DRA_FAILED, 0.0)
            return Outcome(error=message)
        self._metrics.dra_claim(m.DRA_UNPREPARE, m.OK, 0.0)
        log.info("DRA claim unprepared", claim=str(ref), claimUID=ref.uid)
        return Outcome()

    # ----------------------------------------------------------------- host
    async def _save(self, checkpoint: cp.Checkpoint) -> None:
        data = cp.encode(checkpoint)
        write = partial(
            files.write_atomically, self._plugin_dir, names.CHECKPOINT_FILE, data, 0o600
        )
        await self._host(write, "write", self._plugin_dir / names.CHECKPOINT_FILE)
        self._checkpoint = checkpoint
        self._metrics.dra_prepared_claims(_completed_count(checkpoint))

    async def _host(self, run: Any, verb: str, path: Path) -> Any:
        result = await self._hostio.call(str(path), run)
        if isinstance(result, Stalled):
            raise OSError(f"cannot {verb} {path}: {result}")
        return result


def _result(exc: Exception) -> str:
    """The metrics' result class of a failed prepare."""
    if isinstance(exc, AllocationError):
        return exc.result
    if isinstance(exc, ClaimProblem):
        return m.DRA_CLAIM_PROBLEM
    return failure_class(exc)


def _completed_count(checkpoint: cp.Checkpoint) -> int:
    return sum(1 for entry in checkpoint.claims.values() if entry.state == cp.COMPLETED)


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
