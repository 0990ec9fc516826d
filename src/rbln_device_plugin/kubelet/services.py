"""What every resource plugin of one daemon shares: settings, host I/O, telemetry and
the in-process RSD queue."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from rbln_device_plugin.config import Config
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.telemetry.metrics import NOOP, Metrics
from rbln_device_plugin.telemetry.tracing import Tracer


@dataclass(frozen=True, slots=True)
class SharedServices:
    config: Config
    tracer: Tracer
    hostio: HostIO = field(default_factory=HostIO)
    metrics: Metrics = NOOP
    # Serialises this daemon's RSD group changes (every resource plugin), in arrival
    # order, in front of the node-wide RSD file lock.
    rsd_queue: asyncio.Lock = field(default_factory=asyncio.Lock)
    # This instance's token in its plugin socket names (empty: the fixed names), see
    # model.resources.socket_name and runtime.handover.
    instance_token: str = ""
    # Set when the daemon begins to stop: every Allocate is refused from then on, so a
    # kubelet with a successor's endpoint never gets an answer from a leaving instance.
    stepping_down: asyncio.Event = field(default_factory=asyncio.Event)
