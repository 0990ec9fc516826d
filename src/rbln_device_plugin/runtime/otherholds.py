"""A node switched between the two modes: the devices that running pods hold through the
other kubelet API are kept back from this mode's offer until they are released.

Each scan asks ``withheld`` which of the offered devices to keep back (``model.holds``
decides; this is its I/O). The answer comes from the kubelet's PodResources API
(``kubelet.podresources``), read at every scan until a read finds nothing held; from then
on nothing is read again in this process's life: the node's instance lock keeps the other
mode from running beside this one, so nothing new can be handed out the other way.

- **dra mode** keeps back the devices the pods hold through this plugin's device-plugin
  resources. Before the first successful read every device is kept back (any might be
  held), so a PodResources API that cannot be read means no devices published.
- **device-plugin mode** keeps back the devices of this driver's DRA claims the pods hold.
  Only a node where the DRA mode left prepared claims is asked at all: the DRA mode's
  checkpoint records every claim before it changes anything on the host and drops it
  only when the kubelet unprepares it, so a node without one (every node that never ran
  the dra mode) holds nothing through DRA and is never read. Until the first successful
  read the checkpoint's devices are kept back; a checkpoint that cannot be read keeps back
  every device.

Why PodResources and not the checkpoint alone: a claim stays prepared in the checkpoint
after its pods ended when no DRA plugin runs to unprepare it (the kubelet calls only the
plugin), so the checkpoint would keep devices back that no container uses until the node
went back to DRA. PodResources lists only the kubelet's active pods.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Final

from rbln_device_plugin.config import MODE_DRA, Config
from rbln_device_plugin.dra import checkpoint, files, names
from rbln_device_plugin.host.hostio import HostIO, Stalled
from rbln_device_plugin.model import holds, resources
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.model.streaks import FailureStreak
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()

HELD_MSG: Final = "Device held through the other kubelet API; not offered until released"
RELEASED_MSG: Final = "Device released by the other kubelet API's pods; offered"
READ_FAILED_MSG: Final = (
    "Cannot read the kubelet's pod resources; keeping back devices that may be held"
)
READ_RECOVERED_MSG: Final = "Kubelet's pod resources readable again"
SETTLED_MSG: Final = "No device is held through the other kubelet API"
CHECKPOINT_MSG: Final = "DRA checkpoint holds prepared claims; asking the kubelet which are in use"
CHECKPOINT_FAILED_MSG: Final = "Cannot read the DRA checkpoint; keeping back every device"

Reader = Callable[[], Awaitable[list[holds.PodUse]]]
Offered = Mapping[str, Sequence[Device]]


def _read_checkpoint(path: Path) -> frozenset[str] | str | None:
    """Blocking: the devices of the DRA checkpoint's claims, None without a checkpoint, or
    why it cannot be used."""
    try:
        data = files.read_regular(path)
        if data is None:
            return None
        claims = checkpoint.decode(data, str(path)).claims.values()
    except (OSError, checkpoint.CheckpointError) as exc:
        return str(exc)
    return frozenset(device.device for claim in claims for device in claim.devices)


class OtherModeHolds:
    """The devices to keep back at each scan (see the module's doc)."""

    def __init__(
        self, config: Config, hostio: HostIO, metrics: m.Metrics = m.NOOP,
        reader: Reader | None = None,
    ) -> None:  # fmt: skip
        self._dra = config.mode == MODE_DRA
        self._hostio = hostio
        self._metrics = metrics
        self._checkpoint = config.kubelet_plugins_path / names.DRIVER_NAME / names.CHECKPOINT_FILE
        socket = config.kubelet_pod_resources_socket
        if reader is None and socket is not None:
            reader = partial(_list_pods, socket)
        self._reader = reader  # None: off (the setting is empty)
        self._holds: holds.Holds | None = None  # made at the first scan
        self._streak = FailureStreak()
        self._withheld: frozenset[str] = frozenset()
        self.reads = 0  # successful and failed Lists (for tests and inspect)

    @property
    def other_mode(self) -> str:
        return "device-plugin" if self._dra else "dra"

    async def withheld(self, offered: Offered) -> frozenset[str]:
        """Of the offered devices, those to keep back now."""
        if self._reader is None:
            return frozenset()
        if self._holds is None:
            self._holds = await self._start()
        if not self._holds.settled:
            await self._read(self._holds)
        ids = [device.name for devices in offered.values() for device in devices]
        now = self._holds.withheld(ids)
        self._report(now, offered)
        return now

    async def _start(self) -> holds.Holds:
        if self._dra:
            return holds.Holds(None)  # any device may be held by a device-plugin pod
        path = self._checkpoint
        found = await self._hostio.call(str(path), partial(_read_checkpoint, path))
        if found is None:
            return holds.Holds(())  # no checkpoint: nothing prepared through DRA
        if isinstance(found, (str, Stalled)):
            log.error(CHECKPOINT_FAILED_MSG, path=str(path), err=str(found))
            return holds.Holds(None)
        if found:
            log.info(CHECKPOINT_MSG, path=str(path), devices=sorted(found))
        return holds.Holds(found)

    async def _read(self, state: holds.Holds) -> None:
        assert self._reader is not None
        self.reads += 1
        try:
            pods = await self._reader()
        except Exception as exc:  # PodResourcesError, or a bug on odd input: never the scan's
            self._metrics.pod_resources_read(m.POD_RESOURCES_FAILED)
            if self._streak.failed(str(exc)):
                log.error(
                    READ_FAILED_MSG, err=str(exc), otherMode=self.other_mode,
                    keptBack="the last read's holdings" if state.known else "every device "
                    "that may be held", failedReads=self._streak.failures,
                )  # fmt: skip
            return
        self._metrics.pod_resources_read(m.OK)
        failed = self._streak.succeeded()
        if failed:
            log.info(READ_RECOVERED_MSG, failedReads=failed)
        if self._dra:
            held = holds.held_through_device_plugin(pods, resources.RESOURCE_NAMES)
        else:
            held = holds.held_through_dra(pods, names.DRIVER_NAME)
        state.read(held)
        if state.settled:
            log.info(SETTLED_MSG, otherMode=self.other_mode, reads=self.reads)

    def _report(self, now: frozenset[str], offered: Offered) -> None:
        before, self._withheld = self._withheld, now
        if now == before:
            return
        assert self._holds is not None
        for resource, devices in sorted(offered.items()):
            for device in devices:
                if device.name in now and device.name not in before:
                    holders = self._holds.holders(device.name)
                    log.warning(
                        HELD_MSG, resourceName=resource, device=device.name,
                        otherMode=self.other_mode,
                        holders=sorted(str(h) for h in holders) or "unknown (not read yet)",
                    )  # fmt: skip
                elif device.name in before and device.name not in now:
                    log.info(
                        RELEASED_MSG, resourceName=resource, device=device.name,
                        otherMode=self.other_mode,
                    )  # fmt: skip
        self._metrics.withheld_devices(
            {r: sum(d.name in now for d in devices) for r, devices in offered.items()}
        )


async def _list_pods(socket: Path) -> list[holds.PodUse]:
    from rbln_device_plugin.kubelet.podresources import list_pods

    return await list_pods(socket)
