"""Whether the container runtimes can resolve the CDI device the answers name.

Checked at start and after every scan whose look is due (``model.looks``: the spec
directories are watched with inotify; without a live watch every scan looks): per spec
directory one bounded look, listed again only when the directory changed and each file
read again only when it changed (``host.cdidirs``), the verdict from
``model.cdispec``. What the operator reads: one warn record when the spec goes missing,
one info record when that ends (found, or no longer knowable), an info record when the
daemon cannot tell (a directory it cannot see, a file it could not check that could
define the device or clash with its definition; never taken for "missing"), a warn
record when a FIFO appears where the runtimes would read a spec (their CDI library
blocks on it for good), and the ``rbln_device_plugin_cdi_spec`` gauge.
Allocate's answers never depend on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Final

from rbln_device_plugin.config import Config
from rbln_device_plugin.host import inotify
from rbln_device_plugin.host.cdidirs import SpecDirReader, read_spec_dirs
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.model.cdispec import (
    REFERENCED_DEVICES,
    CdiState,
    SpecVerdict,
    resolve_cdi_devices,
)
from rbln_device_plugin.model.looks import BACKUP_S, LookSchedule, WatchState
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.telemetry.metrics import Metrics

# What the records say about who is affected and who fixes it.
REFUSED_BY: Final = (
    "containerd 2.x (CreateContainerError: CDI device injection failed: unresolvable CDI "
    "devices), and containerd 1.7 or CRI-O with CDI enabled"
)
WRITTEN_BY: Final = (
    "the RBLN container toolkit (rbln.yaml) or the RBLN NPU operator's toolkit component"
)
HUNG: Final = (
    "containerd 2.x, and containerd 1.7 or CRI-O with CDI enabled: their CDI cache refresh "
    "waits on the FIFO with its lock held, so every container with a CDI device (any "
    "vendor's) waits at creation"
)
# Every way a spec file can come, go or change in place (a rewrite that keeps size and
# mtime included), and the directory itself going.
_DIR_EVENTS: Final = (
    inotify.IN_CREATE
    | inotify.IN_DELETE
    | inotify.IN_MOVED_FROM
    | inotify.IN_MOVED_TO
    | inotify.IN_MODIFY
    | inotify.IN_ATTRIB
    | inotify.IN_CLOSE_WRITE
    | inotify.IN_DELETE_SELF
    | inotify.IN_MOVE_SELF
)
_SHOWN_FILES: Final = 16  # per field of a record; a directory of junk stays one line

log = get_logger()


class CdiSpecCheck:
    """The daemon's view of the CDI spec, and the records when it changes."""

    def __init__(self, config: Config, hostio: HostIO, metrics: Metrics) -> None:
        self._dirs = tuple(str(path) for path in config.cdi_spec_dirs)
        self._mode = config.cdi_mode
        self._hostio = hostio
        self._metrics = metrics
        self._reader = SpecDirReader()
        self.verdict: SpecVerdict | None = None
        self._missing_since: float | None = None
        self._malformed_seen: dict[str, str] = {}
        self._hangs_seen: frozenset[str] = frozenset()
        # The directories are looked at again only when their watches are not live or
        # reported a change, a file could not be checked, or the backup is due.
        self._watched = [WatchState() for _ in self._dirs]
        self._looks = LookSchedule(*self._watched)

    async def check(self) -> SpecVerdict:
        now = time.monotonic()
        last = self.verdict
        if last is not None and not last.unchecked and not self._looks.due(now):
            self._metrics.cdi_spec(last.state.value)
            return last
        self._looks.looking(now)
        dirs = await read_spec_dirs(self._hostio, self._reader, self._dirs)
        verdict = resolve_cdi_devices(dirs, REFERENCED_DEVICES)
        previous, self.verdict = self.verdict, verdict
        self._report(previous, verdict)
        self._metrics.cdi_spec(verdict.state.value)
        return verdict

    async def watch(self, stop: asyncio.Event) -> None:
        """Follow each spec directory's changes with inotify until ``stop``."""
        await asyncio.gather(
            *(
                _follow(directory, state, stop)
                for directory, state in zip(self._dirs, self._watched, strict=True)
            )
        )

    def _report(self, previous: SpecVerdict | None, verdict: SpecVerdict) -> None:
        for path, reason in verdict.malformed.items():
            if self._malformed_seen.get(path) != reason:
                log.debug("CDI spec file is unusable; the runtimes skip it", path=path, err=reason)
        self._malformed_seen = dict(verdict.malformed)
        new_hangs = [path for path in verdict.hangs if path not in self._hangs_seen]
        self._hangs_seen = frozenset(verdict.hangs)
        if new_hangs:
            log.warning(
                "A FIFO in a CDI spec directory would hang the container runtimes' CDI "
                "library; remove it",
                files=new_hangs[:_SHOWN_FILES], hangs=HUNG,
            )  # fmt: skip
        before = previous.state if previous is not None else None
        if verdict.state is before:
            if (
                verdict.state is CdiState.PRESENT
                and previous is not None
                and (previous.found != verdict.found)
            ):
                log.debug("CDI spec moved", specFiles=dict(verdict.found))
            return
        fields = self._fields(verdict)
        if verdict.state is CdiState.MISSING:
            self._missing_since = time.monotonic()
            log.warning(
                "No CDI spec defines the NPU CDI device; CDI-enabled container runtimes will "
                "refuse NPU containers until one is written",
                **fields, refusedBy=REFUSED_BY, writtenBy=WRITTEN_BY,
            )  # fmt: skip
            return
        ended = self._ended_missing()
        if verdict.state is CdiState.PRESENT:
            log.info("CDI spec found for the NPU CDI device", **fields, **ended)
        else:
            log.info(
                "Cannot tell whether a CDI spec defines the NPU CDI device",
                **fields, **ended, writtenBy=WRITTEN_BY,
            )  # fmt: skip

    def _ended_missing(self) -> dict[str, Any]:
        since, self._missing_since = self._missing_since, None
        if since is None:
            return {}
        return {"missingSeconds": round(time.monotonic() - since, 1)}

    def _fields(self, verdict: SpecVerdict) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "cdiDevices": list(verdict.wanted),
            "cdiMode": self._mode,
            "specDirs": list(self._dirs),
        }
        if verdict.found:
            fields["specFiles"] = dict(verdict.found)
        if verdict.missing:
            fields["missing"] = list(verdict.missing)
        for name, value in (
            ("notVisible", verdict.unseen),
            ("notChecked", verdict.unchecked),
            ("unusable", verdict.malformed),
        ):
            if value:
                fields[name] = _bounded(value)
        if verdict.conflicts:
            fields["conflicts"] = {d: list(p) for d, p in verdict.conflicts.items()}
        return fields


async def _follow(directory: str, state: WatchState, stop: asyncio.Event) -> None:
    # Without inotify (or while the directory does not exist) every check looks, as the
    # state is not live; trying inotify again once a backup period is enough.
    entry = inotify.WatchedEntry(directory, "", _DIR_EVENTS, BACKUP_S)
    try:
        await inotify.follow_entry(
            entry,
            state.changed,
            (stop,),
            on_mode=lambda mode, _reason: state.set_live(mode == "inotify"),
            on_any=state.changed,
        )
    finally:
        state.set_live(False)  # nothing follows the directory now: checks look


def _bounded(items: Mapping[str, str]) -> dict[str, str]:
    shown = dict(list(items.items())[:_SHOWN_FILES])
    if len(items) > _SHOWN_FILES:
        shown["..."] = f"{len(items) - _SHOWN_FILES} more"
    return shown
