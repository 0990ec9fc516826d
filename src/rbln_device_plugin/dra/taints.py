"""Taints of Unhealthy devices in the ResourceSlices: what each says, since when, and
which ones the API server holds (the records and the counter of each change).

An Unhealthy device carries one taint, ``npu.rebellions.ai/unhealthy=<status name>``
(``dra.slices`` puts it on the device), with NoSchedule, or NoExecute where the operator
chose eviction (``--dra-taint-no-execute``). Its ``timeAdded`` is the time the device was
first found Unhealthy and stays while it stays tainted (``TaintTimes``): a republish never
changes it, so an unchanged scan still writes nothing and the eviction controller's clock
never restarts; a new plugin life takes the time over from the slices on the server.
``TaintLedger`` follows the taints the server holds and says what each write changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from rbln_device_plugin.dra.names import DRIVER_NAME
from rbln_device_plugin.model.inventory import natural_key
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()

TAINT_KEY: Final = f"{DRIVER_NAME}/unhealthy"
NO_SCHEDULE: Final = "NoSchedule"
NO_EXECUTE: Final = "NoExecute"
# A taint's value is a label value: at most 63 characters, alphanumerics at both ends.
_LABEL_VALUE_RE: Final = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")

TAINTED_MSG: Final = "Device tainted in the ResourceSlices"
UNTAINTED_MSG: Final = "Device taint removed from the ResourceSlices"

Taint = tuple[str, str]  # (value, effect) of the TAINT_KEY taint


def taint_value(status: str) -> str:
    """The status name as a taint value: ``UNKNOWN(7)`` (no label value) is ``UNKNOWN``."""
    return status if _LABEL_VALUE_RE.fullmatch(status) else "UNKNOWN"


def taint_json(status: str, effect: str, added: str | None) -> dict[str, str]:
    taint = {"key": TAINT_KEY, "value": taint_value(status), "effect": effect}
    if added is not None:
        taint["timeAdded"] = added
    return taint


def device_taint(device: Mapping[str, Any]) -> Taint | None:
    """The TAINT_KEY taint of a device's JSON (built here or read from the server)."""
    for taint in device.get("taints") or ():
        if taint.get("key") == TAINT_KEY:
            return str(taint.get("value", "")), str(taint.get("effect", ""))
    return None


def server_taints(
    devices: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, Taint], dict[str, str]]:
    """Devices' JSON as listed -> (device -> its taint, device -> the taint's timeAdded)."""
    taints: dict[str, Taint] = {}
    times: dict[str, str] = {}
    for device in devices:
        taint = device_taint(device)
        if taint is None:
            continue
        taints[device["name"]] = taint
        for found in device["taints"]:
            if found.get("key") == TAINT_KEY and found.get("timeAdded"):
                times[device["name"]] = str(found["timeAdded"])
    return taints, times


class TaintTimes:
    """When each tainted device's taint was added (RFC 3339, whole seconds, as the API
    server keeps it): set when the device is first tainted, kept while it stays tainted,
    taken over from the server's slices after a restart, dropped when the taint goes (a
    later fault is a new taint)."""

    def __init__(self, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._now = now
        self.since: dict[str, str] = {}

    def stamp(self, tainted: Iterable[str]) -> dict[str, str]:
        wanted = set(tainted)
        new = wanted - set(self.since)
        stamp = self._now().strftime("%Y-%m-%dT%H:%M:%SZ") if new else ""
        self.since = {d: self.since.get(d, stamp) for d in sorted(wanted)}
        return dict(self.since)

    def adopt(self, found: Mapping[str, str]) -> bool:
        """Take the server's times (device -> timeAdded) for devices tainted here too;
        True when any changed."""
        changed = {d: found[d] for d in self.since if d in found and found[d] != self.since[d]}
        self.since.update(changed)
        return bool(changed)


class TaintLedger:
    """The taints the API server holds for this node (None: not known), and each change
    a write made to them, logged and counted."""

    def __init__(self, node: str, metrics: m.Metrics = m.NOOP) -> None:
        self.node = node
        self._metrics = metrics
        self.held: dict[str, Taint] | None = None

    def forget(self) -> None:
        self.held = None

    def listed(self, taints: dict[str, Taint]) -> None:
        """What a listing found, when nothing better is known."""
        if self.held is None:
            self.held = taints

    def holds(self, now: dict[str, Taint]) -> None:
        """The server holds ``now``: each taint added, changed or gone is said once."""
        before, self.held = self.held or {}, now
        applied = sorted((d for d in now if before.get(d) != now[d]), key=natural_key)
        removed = sorted((d for d in before if d not in now), key=natural_key)
        for device in applied:
            value, effect = now[device]
            log.warning(TAINTED_MSG, node=self.node, device=device, key=TAINT_KEY,
                        value=value, effect=effect)  # fmt: skip
        for device in removed:
            log.info(UNTAINTED_MSG, node=self.node, device=device, key=TAINT_KEY,
                     value=before[device][0])  # fmt: skip
        self._metrics.dra_taints(m.TAINT_APPLIED, len(applied))
        self._metrics.dra_taints(m.TAINT_REMOVED, len(removed))
