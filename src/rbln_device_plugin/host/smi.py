"""rbln-smi: find the binary, run it (``proc``) and count the call, parse its JSON.

The only parser of rbln-smi's JSON: the inventory (``-j``) and the groups (``-g -j``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

from rbln_device_plugin.host import proc
from rbln_device_plugin.model.inventory import Problem, SmiRecord
from rbln_device_plugin.shorten import middle_truncate
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()

DEFAULT_CANDIDATES: Final = (
    Path("/usr/bin/rbln-smi"),
    Path("/run/rbln/driver/usr/bin/rbln-smi"),
    Path("/host/usr/bin/rbln-smi"),
    Path("/host/driver/usr/bin/rbln-smi"),
)
INVENTORY_TIMEOUT_S: Final = 5.0
# A healthy 64-device listing is tens of KiB; the cap only stops a runaway tool.
MAX_OUTPUT_BYTES: Final = 16 * 1024 * 1024


class DiscoveryError(Exception):
    """Device discovery failed as a whole: the node then reports zero devices."""


class SmiNotFound(DiscoveryError):
    """No usable rbln-smi; ``tried`` lists every path looked at, in search order."""

    def __init__(self, message: str, tried: Sequence[Path]) -> None:
        super().__init__(message)
        self.tried = tuple(tried)


# An rbln-smi run failed: could not start, timed out, exited non-zero, printed too much.
SmiError = proc.CommandError


def _is_executable_file(path: Path) -> bool:
    try:
        return path.is_file() and os.access(path, os.X_OK)
    except OSError:
        return False


def locate_rbln_smi(
    configured: Path | None, candidates: Sequence[Path] = DEFAULT_CANDIDATES
) -> Path:
    """The rbln-smi to run: the configured one, else the first usable candidate, else $PATH.

    Raises DiscoveryError when nothing is usable.
    """
    if configured is not None:
        if _is_executable_file(configured):
            return configured
        raise SmiNotFound(
            f"configured rbln-smi {configured} is not an executable file", [configured]
        )
    for candidate in candidates:
        if _is_executable_file(candidate):
            return candidate
    path_env = os.environ.get("PATH", os.defpath)
    # The PATH search by hand: shutil would load compression modules this daemon never uses.
    on_path = [Path(d or os.curdir) / "rbln-smi" for d in path_env.split(os.pathsep)]
    for candidate in on_path:
        if _is_executable_file(candidate):
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise SmiNotFound(
        f"rbln-smi not found (tried {tried} and $PATH={path_env})",
        list(dict.fromkeys([*candidates, *on_path])),
    )


async def run_smi(
    binary: Path,
    args: Sequence[str],
    timeout: float,  # noqa: ASYNC109 - the tool's deadline; it is killed when it passes
    *,
    max_output: int = MAX_OUTPUT_BYTES,
    pass_fds: Sequence[int] = (),
    metrics: m.Metrics = m.NOOP,
) -> str:
    """Run ``binary args`` (see ``proc.run``) and return its stdout; counts the call.

    The process is killed on timeout, on oversized output and on cancellation. Raises
    SmiError naming the command, duration, exit status and the trimmed output.
    ``pass_fds`` are inherited by the tool (the RSD lock: see ``rsd``).
    """
    started = time.monotonic()
    result = m.SMI_CANCELLED
    try:
        output = await proc.run(
            binary, args, timeout, tool="rbln-smi", max_output=max_output, pass_fds=pass_fds
        )
        result = m.OK
        return output
    except SmiError as exc:
        result = exc.result
        raise
    finally:
        if metrics.enabled:
            metrics.rbln_smi_call(m.smi_subcommand(args), result, time.monotonic() - started)


def load_devices(text: str) -> list[Any]:
    """The ``devices`` list of rbln-smi's JSON; anything else at the top is a DiscoveryError.

    ``"devices": null`` is how rbln-smi (a Go program: a nil slice marshals to null)
    lists no devices: an empty list, not a failure. A missing key or any other type is.
    """
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        shown = middle_truncate(text.encode(), 256)
        raise DiscoveryError(f"rbln-smi printed invalid JSON ({exc}): {shown!r}") from None
    if not isinstance(document, dict):
        raise DiscoveryError(f"rbln-smi JSON is a {type(document).__name__}, not an object")
    devices = document.get("devices")
    if devices is None and "devices" in document:
        log.debug("rbln-smi listed no devices (devices is null); treating it as an empty list")
        return []
    if not isinstance(devices, list):
        raise DiscoveryError(
            "rbln-smi JSON has no 'devices' list"
            if devices is None
            else f"rbln-smi JSON 'devices' is a {type(devices).__name__}, not a list"
        )
    return devices


def _text(value: Any, what: str, *, required: bool) -> str:
    # rbln-smi prints numbers as strings; accept bare integers too, nothing else.
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if value is None and not required:
        return ""
    raise ValueError(f"{what} is {'missing' if value is None else type(value).__name__}")


def _npu(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 10:
        return int(value)
    raise ValueError(f"npu is {value!r}, not a non-negative integer")


def parse_record(entry: Any) -> SmiRecord:
    """One device entry; ValueError says what is wrong with it."""
    if not isinstance(entry, dict):
        raise ValueError(f"entry is a {type(entry).__name__}, not an object")
    pci = entry.get("pci")
    if not isinstance(pci, dict):
        raise ValueError("pci is missing" if pci is None else "pci is not an object")
    group = entry.get("group_id")
    return SmiRecord(
        name=_text(entry.get("device"), "device", required=True),
        product=_text(entry.get("name"), "name", required=True),
        bus_id=_text(pci.get("bus_id"), "pci.bus_id", required=True),
        pci_device_id=_text(pci.get("dev"), "pci.dev", required=False),
        numa_node=_text(pci.get("numa_node"), "pci.numa_node", required=False),
        sid=_text(entry.get("sid"), "sid", required=False),
        npu=_npu(entry.get("npu")),
        group_id=None if group is None else _text(group, "group_id", required=True),
        # Only published (DRA), never used for a decision: any odd value is "not known"
        # rather than a reason to skip a device that worked without it.
        uuid=uuid if isinstance(uuid := entry.get("uuid"), str) else "",
    )


def _entry_label(index: int, entry: Any) -> str:
    if isinstance(entry, Mapping):
        name = entry.get("device")
        if isinstance(name, str) and len(name) <= 64:
            return f"entry {index} ({name!r})"
    return f"entry {index}"


class ParsedEntry(NamedTuple):
    """One entry of the ``devices`` list: its record, or the Problem that skipped it."""

    position: int  # index in the devices list
    raw: Any  # the entry as rbln-smi printed it
    record: SmiRecord | None
    problem: Problem | None


def parse_entries(text: str) -> list[ParsedEntry]:
    """Every entry of ``rbln-smi -j`` with its outcome; DiscoveryError for bad JSON."""
    parsed: list[ParsedEntry] = []
    for index, entry in enumerate(load_devices(text)):
        try:
            parsed.append(ParsedEntry(index, entry, parse_record(entry), None))
        except ValueError as exc:
            label = _entry_label(index, entry)
            problem = Problem(
                f"malformed-entry:{label}:{exc}",
                "Skipping malformed rbln-smi device entry",
                {"entry": label, "reason": str(exc)},
            )
            parsed.append(ParsedEntry(index, entry, None, problem))
    return parsed


def parse_inventory(text: str) -> tuple[list[SmiRecord], list[Problem]]:
    """Parse ``rbln-smi -j``. Malformed entries are skipped with a Problem naming them."""
    records: list[SmiRecord] = []
    problems: list[Problem] = []
    for entry in parse_entries(text):
        if entry.record is not None:
            records.append(entry.record)
        if entry.problem is not None:
            problems.append(entry.problem)
    return records, problems


@dataclass(frozen=True, slots=True)
class GroupEntry:
    """One device of ``rbln-smi -g -j`` as far as groups are concerned."""

    bus_id: str | None  # lowercase
    npu: int | None
    group_id: str
    name: str | None = None  # "rbln0"


def parse_groups(text: str) -> list[GroupEntry]:
    """``rbln-smi -g -j``: every listed device must report its group, since a skipped
    entry could hide a used id. DiscoveryError for bad JSON, ValueError for an entry."""
    entries: list[GroupEntry] = []
    for index, entry in enumerate(load_devices(text)):
        if not isinstance(entry, dict):
            raise ValueError(f"rbln-smi -g -j entry {index} is not an object")
        group = entry.get("group_id")
        if isinstance(group, int) and not isinstance(group, bool):
            group = str(group)
        if not isinstance(group, str):
            raise ValueError(f"rbln-smi -g -j entry {index} has no group_id")
        pci = entry.get("pci")
        bus = pci.get("bus_id") if isinstance(pci, dict) else None
        npu = entry.get("npu")
        name = entry.get("device")
        entries.append(
            GroupEntry(
                bus_id=bus.lower() if isinstance(bus, str) else None,
                npu=npu if isinstance(npu, int) and not isinstance(npu, bool) else None,
                group_id=group.strip(),
                name=name if isinstance(name, str) else None,
            )
        )
    return entries
