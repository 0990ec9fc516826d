"""A simulated node scanned by the real core, as the DRA front end sees it: the entries
(resource name -> device ID -> ``Entry``) that ``DraDevices.states`` hold after a scan,
which is what the ResourceSlice publisher is given."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from rbln_device_plugin import options
from rbln_device_plugin.core.devices import NodeDevices
from rbln_device_plugin.dra.prepare import DraDevices
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.scan import Scanner
from rbln_device_plugin.model.devicetable import Entry
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin_sim.layout import Layout, preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir

Entries = Mapping[str, Mapping[str, Entry]]


@dataclass
class ScannedNode:
    sim: SimNode
    devices: DraDevices
    _found: NodeDevices

    async def scan(self) -> Entries:
        """Scan the node again (the daemon's scan loop, once); the entries after it."""
        await self.devices.update((await self._found.discover()).offered)
        return self.entries()

    def entries(self) -> Entries:
        return {name: dict(state.entries) for name, state in self.devices.states.items()}


@asynccontextmanager
async def scanned(layout: str | Layout) -> AsyncIterator[ScannedNode]:
    root = short_tempdir()
    hostio = HostIO()
    try:
        sim = materialize(preset(layout) if isinstance(layout, str) else layout, root / "sim")
        config = options.parse(sim.daemon_args("1h"), {})
        scanner = Scanner(sysfs_root=config.sysfs_root, smi_path=config.rbln_smi, hostio=hostio)
        found = NodeDevices(config, scanner, hostio, m.NOOP)
        node = ScannedNode(sim, DraDevices(found.open_state), found)
        await node.scan()
        yield node
    finally:
        for state in list(node.devices.states.values()) if "node" in locals() else []:
            await state.close()
        hostio.close()
        shutil.rmtree(root, ignore_errors=True)
