"""CDI spec files as the container runtimes read them: which devices they define.

Pure. ``parse_spec`` checks one file's bytes as the CDI library containerd 2.x uses
(tags.cncf.io/container-device-interface v1.1.1, pinned by containerd v2.4.2) does:
``cdiyaml`` reads the first YAML document as go-yaml v3 parses it, ``cdidecode`` decodes
it into the library's Go types (strict: unknown fields, duplicate keys and wrong types are
errors at every level), and ``validate`` applies ``pkg/cdi``'s checks and
``specs-go/version.go``'s version rules. ``resolve_cdi_devices`` combines the files of the
spec directories the way that library's cache does, and says whether every device the
daemon's answers name is defined, missing, or whether the daemon cannot tell (a directory
it cannot see, a file it could not check).

What the library does that matters here:

- Directories are read in order, ``/etc/cdi`` then ``/var/run/cdi``; a later directory's
  definition of a device wins over an earlier one's. Two files of one directory defining
  the same device are a conflict, and the device is dropped altogether.
- Only ``*.json`` and ``*.yaml`` files count (not ``.yml``); subdirectories are skipped.
  Both are decoded as YAML (JSON is YAML to go-yaml); only the first document counts.
- A file is decoded strictly and validated as a whole: one bad device makes the whole
  file unusable, and the runtime skips it.

The work is bounded: every file takes units of a ``Budget`` (one per YAML event, JSON
value or decoding step), at most ``MAX_FILE_UNITS`` each, and a caller checking a whole
pass of files shares one budget of ``PASS_UNITS`` among them. A file beyond the budget is
"unchecked" (the daemon cannot tell), never a reason for more memory or time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from rbln_device_plugin.model.cdidecode import (
    DeviceNode,
    Edits,
    Hook,
    IntelRdt,
    Mount,
    NetDevice,
    RawSpec,
    decode_spec,
)
from rbln_device_plugin.model.cdiyaml import (
    Budget,
    BudgetSpent,
    QuoteEscape,
    Reader,
    SpecError,
    SpecUnchecked,
    check_escapes,
    json_root,
    with_quote_escape_replaced,
)

__all__ = ["Budget", "SpecError", "SpecUnchecked"]

# The devices the daemon's answers reference (annotation value, cdi_devices names).
KIND: Final = "rebellions.ai/npu"
RUNTIME_DEVICE: Final = f"{KIND}=runtime"
REFERENCED_DEVICES: Final = (RUNTIME_DEVICE,)
SPEC_SUFFIXES: Final = (".json", ".yaml")

# cdiVersion values the library accepts (specs-go/version.go), oldest first. A newer
# version than the last is "cannot tell": a newer library on the node may accept it.
KNOWN_VERSIONS: Final = (
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
)  # fmt: skip
EARLIEST_VERSION: Final = "0.3.0"  # what a spec using no versioned feature needs
# Units of work (YAML events, JSON values, decoding steps). The largest real specs (an
# NVIDIA toolkit spec of ~100 KiB) take about 7,000 events and as many steps.
MAX_FILE_UNITS: Final = 60_000
PASS_UNITS: Final = 150_000  # one pass over every spec directory
# libyaml refuses the \' escape go-yaml takes: each one costs a fresh read of the file.
MAX_QUOTE_ESCAPES: Final = 4

_NODE_TYPES: Final = frozenset({"", "b", "c", "u", "p"})
_HOOK_NAMES: Final = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
_VENDOR_OR_CLASS: Final = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_SEMVER: Final = re.compile(r"v?(\d{1,9})\.(\d{1,9})\.(\d{1,9})")
# The top-level cdiVersion as written in YAML or JSON (for a newer version's verdict
# when the file does not decode: a newer library may know its fields).
_DECLARED_VERSION: Final = re.compile(
    rb"""(?m)^["']?cdiVersion["']?[ \t]*:[ \t]*["']?(v?\d{1,9}\.\d{1,9}\.\d{1,9})|"""
    rb""""cdiVersion"\s*:\s*"(v?\d{1,9}\.\d{1,9}\.\d{1,9})\""""
)


def is_spec_file_name(name: str) -> bool:
    return name.endswith(SPEC_SUFFIXES)


def validate_vendor_or_class(text: str, what: str) -> None:
    if not text:
        raise SpecError(f"invalid {what}: empty name")
    if not ("A" <= text[0] <= "Z" or "a" <= text[0] <= "z"):
        raise SpecError(f"invalid {what} {text!r}: should start with a letter")
    if _VENDOR_OR_CLASS.fullmatch(text) is None:
        raise SpecError(
            f"invalid {what} {text!r}: only letters, digits, '_', '-' and '.', "
            "ending with a letter or digit"
        )


def validate_device_name(text: str) -> None:
    if not text:
        raise SpecError("invalid (empty) device name")
    if _DEVICE_NAME.fullmatch(text) is None:
        raise SpecError(
            f"invalid device name {text!r}: only letters, digits, '_', '-', '.' and ':', "
            "starting and ending with a letter or digit"
        )


def split_kind(kind: str) -> tuple[str, str]:
    """``vendor/class`` -> (vendor, class) as parser.ParseQualifier cuts it; SpecError
    unless both are valid."""
    vendor, slash, klass = kind.partition("/")
    if not slash or not vendor or not klass:
        raise SpecError(f"invalid kind {kind[:64]!r}: expected <vendor>/<class> (invalid vendor)")
    validate_vendor_or_class(vendor, "vendor")
    validate_vendor_or_class(klass, "class")
    return vendor, klass


@dataclass(frozen=True, slots=True)
class Spec:
    """A usable spec file: its kind and the qualified names of its devices."""

    kind: str
    devices: frozenset[str]  # qualified: kind=name


def parse_spec(
    text: bytes | str, *, json_format: bool = False, budget: Budget | None = None
) -> Spec:
    """Check one spec file; SpecError says why the runtimes would not use it,
    SpecUnchecked why the daemon cannot tell.

    ``json_format``: the file's name ends in ``.json`` (read with ``json`` when its text
    means the same to go-yaml). ``budget``: shared by the files of one pass; each file
    also stops at ``MAX_FILE_UNITS``.
    """
    data = text.encode("utf-8", errors="surrogateescape") if isinstance(text, str) else text
    units = MAX_FILE_UNITS if budget is None else min(MAX_FILE_UNITS, budget.left)
    if units <= 0:
        raise BudgetSpent("not checked: the files before it used this pass's budget")
    local = Budget(units)
    try:
        raw = _decode(data, local, json_format)
    except BudgetSpent:
        if units < MAX_FILE_UNITS:
            raise BudgetSpent(
                "not checked: the files before it used most of this pass's budget"
            ) from None
        raise
    finally:
        if budget is not None:
            budget.left -= local.total - max(local.left, 0)
    return validate(raw)


def _decode(data: bytes, budget: Budget, json_format: bool) -> RawSpec:
    try:
        root = json_root(data, budget) if json_format else None
        if root is not None:
            return decode_spec(Reader(b"", budget), root, budget)
        for _ in range(MAX_QUOTE_ESCAPES + 1):
            reader = Reader(data, budget)
            try:
                raw = decode_spec(reader, reader.root(), budget)
                reader.finish()
            except QuoteEscape as exc:
                fixed = with_quote_escape_replaced(data, exc.index)
                if fixed is None:
                    raise SpecError(str(exc)) from None
                data = fixed  # go-yaml reads \' as ': so does the next try
                continue
            finally:
                reader.close()
            check_escapes(data, budget)  # only a file that decodes needs the second look
            return raw
        raise SpecUnchecked(f"more than {MAX_QUOTE_ESCAPES} \\' escapes: not checked")
    except SpecUnchecked:
        raise
    except SpecError as exc:
        newer = _declared_newer_version(data)
        if newer:
            raise SpecUnchecked(
                f"cdiVersion {newer} is newer than this daemon knows ({KNOWN_VERSIONS[-1]}), "
                f"and a newer CDI library may read what this one does not: {exc}"
            ) from None
        raise


def _declared_newer_version(data: bytes) -> str:
    head = data[:65536]
    if b"cdiVersion" not in head:  # the cheap look first: most hostile files have none
        return ""
    found = _DECLARED_VERSION.search(head)
    if found is None:
        return ""
    version = (found[1] or found[2]).decode()
    return version if _newer(version) else ""


def _newer(version: str) -> bool:
    found = _SEMVER.fullmatch(version)
    if found is None:
        return False
    key = tuple(int(part) for part in found.groups())
    return key > _key(KNOWN_VERSIONS[-1])


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


# ---------------------------------------------------------------- pkg/cdi's validation
class LibraryPanic(SpecError):
    """Where the library dereferences a null entry: containerd's refresh panics."""

    def __init__(self, where: str) -> None:
        super().__init__(
            f"a null entry in {where}: the CDI library dereferences it and panics; "
            "containerd crashes reading this file (at start and at each refresh), and no "
            "CDI device resolves"
        )


def validate(raw: RawSpec) -> Spec:
    """Spec.validate of pkg/cdi/spec.go on a decoded spec, in its order."""
    _validate_version(raw)
    kind = raw.kind
    split_kind(kind)
    _validate_edits(raw.containerEdits, "spec")
    names: set[str] = set()
    for device in raw.devices or ():
        validate_device_name(device.name)
        where = f"device {device.name!r}"
        if _is_empty(device.containerEdits):
            raise SpecError(f"invalid device {device.name!r}: empty device edits")
        _validate_edits(device.containerEdits, where)
        if device.name in names:
            raise SpecError(f"invalid spec, multiple device {device.name!r}")
        names.add(device.name)
    if not names:
        raise SpecError("invalid spec, no devices")
    return Spec(kind, frozenset(f"{kind}={name}" for name in names))


def _validate_version(raw: RawSpec) -> None:
    bare = raw.cdiVersion.removeprefix("v")
    if bare not in KNOWN_VERSIONS:
        if _newer(bare):
            raise SpecUnchecked(
                f"cdiVersion {raw.cdiVersion[:32]!r} is newer than this daemon knows "
                f"({KNOWN_VERSIONS[-1]}): a newer CDI library may accept it"
            )
        raise SpecError(
            f"invalid cdiVersion {raw.cdiVersion[:32]!r} (known: {', '.join(KNOWN_VERSIONS)})"
        )
    needed = required_version(raw)
    if _key(needed) > _key(bare):
        raise SpecError(f"the spec version must be at least v{needed}")


def required_version(raw: RawSpec) -> str:
    """specs-go's requiredVersion: the newest version whose features the spec uses, asked
    newest first as the library asks (its checks of 0.5.0 and 0.4.0 panic on null
    ``deviceNodes`` and ``mounts`` entries)."""
    edits = [device.containerEdits for device in raw.devices or ()] + [raw.containerEdits]
    if any(_rdt_v110(e.intelRdt) or e.netDevices for e in edits):
        return "1.1.0"
    if any(e.intelRdt is not None or e.additionalGids for e in edits):
        return "0.7.0"
    if raw.annotations or any(device.annotations for device in raw.devices or ()):
        return "0.6.0"
    _vendor, slash, klass = raw.kind.partition("/")
    if slash and "." in klass:
        return "0.6.0"
    if any(device.name[:1].isdigit() and device.name[:1].isascii() for device in raw.devices or ()):
        return "0.5.0"
    for e in edits:
        for node in e.deviceNodes or ():
            if node is None:
                raise LibraryPanic("deviceNodes")
            if node.hostPath:
                return "0.5.0"
    for e in edits:
        for mount in e.mounts or ():
            if mount is None:
                raise LibraryPanic("mounts")
            if mount.type:
                return "0.4.0"
    return EARLIEST_VERSION


def _rdt_v110(rdt: IntelRdt | None) -> bool:
    return rdt is not None and (rdt.schemata is not None or rdt.enableMonitoring)


def _is_empty(edits: Edits) -> bool:
    return not (
        edits.env or edits.deviceNodes or edits.hooks or edits.mounts or edits.additionalGids
        or edits.intelRdt is not None or edits.netDevices
    )  # fmt: skip


def _validate_env(env: list[str] | None, where: str) -> None:
    for item in env or ():
        if item.find("=") <= 0:
            raise SpecError(f"{where}: invalid environment variable {item[:64]!r}")


def _validate_edits(edits: Edits, where: str) -> None:
    """ContainerEdits.Validate."""
    _validate_env(edits.env, f"{where}: invalid container edits")
    for node in edits.deviceNodes or ():
        _validate_node(node, where)
    for hook in edits.hooks or ():
        _validate_hook(hook, where)
    for mount in edits.mounts or ():
        _validate_mount(mount, where)
    if edits.intelRdt is not None:
        _validate_rdt(edits.intelRdt, where)
    _validate_net_devices(edits.netDevices, where)


def _validate_node(node: DeviceNode | None, where: str) -> None:
    if node is None:
        raise LibraryPanic("deviceNodes")
    if not node.path:
        raise SpecError(f"{where}: invalid (empty) device path")
    if node.type not in _NODE_TYPES:
        raise SpecError(f"{where}: device {node.path[:64]!r}: invalid type {node.type[:16]!r}")
    permissions = node.permissions
    if permissions not in ("", "none") and permissions.strip("rwm"):
        raise SpecError(
            f"{where}: device {node.path[:64]!r}: invalid permissions {permissions[:16]!r}"
        )


def _validate_hook(hook: Hook | None, where: str) -> None:
    if hook is None:
        raise LibraryPanic("hooks")
    if hook.hookName not in _HOOK_NAMES:
        raise SpecError(f"{where}: invalid hook name {hook.hookName[:32]!r}")
    if not hook.path:
        raise SpecError(f"{where}: invalid hook {hook.hookName!r} with empty path")
    _validate_env(hook.env, f"{where}: invalid hook {hook.hookName!r}")


def _validate_mount(mount: Mount | None, where: str) -> None:
    if mount is None:
        raise LibraryPanic("mounts")
    if not mount.hostPath:
        raise SpecError(f"{where}: invalid mount, empty host path (hostPath)")
    if not mount.containerPath:
        raise SpecError(f"{where}: invalid mount, empty container path (containerPath)")


def _validate_rdt(rdt: IntelRdt, where: str) -> None:
    closid = rdt.closID
    if closid != "/" and (
        len(closid.encode("utf-8", errors="surrogateescape")) >= 4096
        or closid in (".", "..")
        or "/" in closid
        or "\n" in closid
    ):
        raise SpecError(f"{where}: invalid ClosID {closid[:64]!r} in intelRdt")


def _validate_net_devices(devices: list[NetDevice | None] | None, where: str) -> None:
    hosts: set[str] = set()
    names: set[str] = set()
    for device in devices or ():
        if device is None:
            raise LibraryPanic("netDevices")
        if not device.hostInterfaceName:
            raise SpecError(f"{where}: invalid linux net device, empty HostInterfaceName")
        if not device.name:
            raise SpecError(f"{where}: invalid linux net device, empty Name")
        if device.hostInterfaceName in hosts:
            raise SpecError(
                f"{where}: invalid linux net device, duplicate HostInterfaceName "
                f"{device.hostInterfaceName[:64]!r}"
            )
        hosts.add(device.hostInterfaceName)
        if device.name in names:
            raise SpecError(
                f"{where}: invalid linux net device, duplicate Name {device.name[:64]!r}"
            )
        names.add(device.name)


# ---------------------------------------------------------------- the directories
class FileState(StrEnum):
    USABLE = "usable"  # parsed and valid: the runtimes load it
    MALFORMED = "malformed"  # read, and the runtimes would skip it
    # not read (too large, unreadable, a symlink leaving the dir), too complex to check
    # within the budget, or a newer cdiVersion than the daemon knows
    UNCHECKED = "unchecked"
    HANGS = "hangs"  # not read: the runtimes' read blocks on it for good (a FIFO)


@dataclass(frozen=True, slots=True)
class SpecFile:
    """One ``*.json``/``*.yaml`` entry of a spec directory, as far as it was checked."""

    path: str
    state: FileState
    spec: Spec | None = None
    reason: str = ""
    # The library panics reading it: the runtime's whole refresh fails, every device too.
    panics: bool = False


def check_spec_file(path: str, data: bytes, budget: Budget | None = None) -> SpecFile:
    """One file's state, as a spec directory reader records it: usable, malformed (the
    runtimes skip it) or unchecked (the daemon cannot tell)."""
    try:
        spec = parse_spec(data, json_format=path.endswith(".json"), budget=budget)
    except SpecUnchecked as exc:
        return SpecFile(path, FileState.UNCHECKED, reason=str(exc))
    except LibraryPanic as exc:
        return SpecFile(path, FileState.MALFORMED, reason=str(exc), panics=True)
    except SpecError as exc:
        return SpecFile(path, FileState.MALFORMED, reason=str(exc))
    return SpecFile(path, FileState.USABLE, spec=spec)


@dataclass(frozen=True, slots=True)
class SpecDir:
    """One spec directory: its files, or why it could not be listed (``error``)."""

    path: str
    files: tuple[SpecFile, ...] = ()
    error: str = ""  # not visible: missing (not mounted?), unlistable, stalled
    truncated: int = 0  # candidate files beyond the listing cap, not checked


class CdiState(StrEnum):
    PRESENT = "present"
    MISSING = "missing"
    UNKNOWN = "unknown"  # the daemon cannot tell


@dataclass(frozen=True, slots=True)
class SpecVerdict:
    state: CdiState
    wanted: tuple[str, ...]
    missing: tuple[str, ...] = ()  # wanted devices no visible usable spec defines
    found: Mapping[str, str] = field(default_factory=dict)  # device -> defining file
    unseen: Mapping[str, str] = field(default_factory=dict)  # directory -> why not visible
    unchecked: Mapping[str, str] = field(default_factory=dict)  # file -> why not checked
    malformed: Mapping[str, str] = field(default_factory=dict)  # file -> why unusable
    conflicts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # device -> files
    hangs: tuple[str, ...] = ()  # files the runtimes' read blocks on for good (in unchecked)


def resolve_cdi_devices(
    dirs: Sequence[SpecDir], wanted: Iterable[str] = REFERENCED_DEVICES
) -> SpecVerdict:
    """Whether the runtimes' CDI cache, built from ``dirs`` (lowest priority first),
    resolves every wanted device.

    A file the daemon did not check could define any device: where one of a directory's
    files defines a wanted device, or two or more were not checked, they may define it
    twice and the library drops it, so a device found is only "present" when no
    directory holds such a pair. A file the runtimes' read blocks on (a FIFO) stops the
    library's refresh with its lock held: whatever else is there, the daemon cannot tell.
    """
    wanted_t = tuple(wanted)
    defined: dict[str, tuple[int, str]] = {}  # device -> (priority, file)
    clashes: dict[str, list[str]] = {}
    unseen: dict[str, str] = {}
    unchecked: dict[str, str] = {}
    malformed: dict[str, str] = {}
    hangs: list[str] = []
    # Per directory: entries not checked, and how many of its usable files define each device.
    per_dir: list[tuple[int, dict[str, int]]] = []
    for priority, directory in enumerate(dirs):
        if directory.error:
            unseen[directory.path] = directory.error
            continue
        not_checked = directory.truncated
        here: dict[str, int] = {}
        if directory.truncated:
            unchecked[directory.path] = f"{directory.truncated} more spec files not checked"
        for spec_file in sorted(directory.files, key=lambda f: f.path):
            if spec_file.state in (FileState.UNCHECKED, FileState.HANGS):
                unchecked[spec_file.path] = spec_file.reason
                not_checked += 1
                if spec_file.state is FileState.HANGS:
                    hangs.append(spec_file.path)
                continue
            if spec_file.state is FileState.MALFORMED or spec_file.spec is None:
                malformed[spec_file.path] = spec_file.reason
                continue
            for device in spec_file.spec.devices:
                here[device] = here.get(device, 0) + 1
                earlier = defined.get(device)
                if earlier is not None and earlier[0] == priority:
                    clashes.setdefault(device, [earlier[1]]).append(spec_file.path)
                if earlier is None or earlier[0] < priority:
                    defined[device] = (priority, spec_file.path)
        per_dir.append((not_checked, here))
    crashing = any(f.panics for d in dirs if not d.error for f in d.files)
    found = {
        d: defined[d][1]
        for d in wanted_t
        if d in defined and d not in clashes and not crashing  # a panic ends the refresh
    }
    missing = tuple(d for d in wanted_t if d not in found)
    may_clash = any(
        not_checked and not_checked + here.get(d, 0) >= 2
        for d in found
        for not_checked, here in per_dir
    )
    if hangs or (missing and (unseen or unchecked)) or (not missing and may_clash):
        state = CdiState.UNKNOWN
    elif missing:
        state = CdiState.MISSING
    else:
        state = CdiState.PRESENT
    return SpecVerdict(
        state,
        wanted_t,
        missing,
        found,
        unseen,
        unchecked,
        malformed,
        {d: tuple(paths) for d, paths in clashes.items() if d in wanted_t},
        tuple(hangs),
    )
