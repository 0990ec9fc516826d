"""CDI spec files as the container runtimes read them: which devices they define.

Pure. ``parse_spec`` checks one file's text by the rules of the CDI library that
containerd and CRI-O use (tags.cncf.io/container-device-interface: ``pkg/parser`` for
names, the default validator and ``specs-go/version.go`` for the rest); ``resolve_cdi_devices``
combines the files of the spec directories the way that library's cache does, and says
whether every device the daemon's answers name is defined, missing, or whether the
daemon cannot tell (a directory it cannot see, a file it could not check).

What the library does that matters here:

- Directories are read in order, ``/etc/cdi`` then ``/var/run/cdi``; a later directory's
  definition of a device wins over an earlier one's. Two files of one directory defining
  the same device are a conflict, and the device is dropped altogether.
- Only ``*.json`` and ``*.yaml`` files count (not ``.yml``); subdirectories are skipped.
- A file is decoded strictly (an unknown field is an error) and validated as a whole: one
  bad device makes the whole file unusable, and the runtime skips it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import yaml

# The devices the daemon's answers reference (annotation value, cdi_devices names).
KIND: Final = "rebellions.ai/npu"
RUNTIME_DEVICE: Final = f"{KIND}=runtime"
REFERENCED_DEVICES: Final = (RUNTIME_DEVICE,)
SPEC_SUFFIXES: Final = (".json", ".yaml")

# cdiVersion values the library accepts, and what each feature needs at least.
KNOWN_VERSIONS: Final = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0")
# Nodes visited while checking one file; a file of repeated YAML aliases stops here
# instead of costing exponential work (go-yaml refuses such files as well).
MAX_NODES: Final = 100_000

_SPEC_FIELDS: Final = frozenset({"cdiVersion", "kind", "devices", "containerEdits", "annotations"})
_DEVICE_FIELDS: Final = frozenset({"name", "annotations", "containerEdits"})
_EDIT_FIELDS: Final = frozenset(
    {"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids", "netDevices"}
)
_NODE_TYPES: Final = frozenset({"", "b", "c", "u", "p"})
_HOOK_NAMES: Final = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
_VENDOR_OR_CLASS: Final = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SpecError(ValueError):
    """Why a spec file is unusable to the runtimes, in the library's terms."""


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
    """``vendor/class`` -> (vendor, class); SpecError unless both are valid."""
    vendor, slash, klass = kind.partition("/")
    if not slash or not vendor or not klass:
        raise SpecError(f"invalid kind {kind!r}: expected <vendor>/<class>")
    validate_vendor_or_class(vendor, "vendor")
    validate_vendor_or_class(klass, "class")
    return vendor, klass


@dataclass(frozen=True, slots=True)
class Spec:
    """A usable spec file: its kind and the qualified names of its devices."""

    kind: str
    devices: frozenset[str]  # qualified: kind=name


class _Budget:
    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_NODES

    def take(self, count: int = 1) -> None:
        self.left -= count
        if self.left < 0:
            raise SpecError(f"too complex (more than {MAX_NODES} values, repeated aliases?)")


def parse_spec(text: bytes | str) -> Spec:
    """Check one spec file; SpecError says why the runtimes would not use it."""
    try:
        document = yaml.load(text, Loader=_Loader)  # CSafeLoader or SafeLoader
    except yaml.YAMLError as exc:
        raise SpecError(f"not YAML or JSON: {_one_line(exc)}") from None
    except (ValueError, RecursionError) as exc:  # e.g. bad UTF-8 bytes
        raise SpecError(f"not YAML or JSON: {_one_line(exc)}") from None
    if document is None:
        raise SpecError("empty: no spec data")
    if not isinstance(document, dict):
        raise SpecError(f"not a mapping at the top level (a {_type(document)})")
    budget = _Budget()
    _fields(document, _SPEC_FIELDS, "spec")
    version = document.get("cdiVersion")
    if not isinstance(version, str):
        raise SpecError(f"cdiVersion must be a string, got {_type(version)}")
    kind = document.get("kind")
    if not isinstance(kind, str):
        raise SpecError(f"kind must be a string, got {_type(kind)}")
    _vendor, klass = split_kind(kind)
    annotations = _annotations(document.get("annotations"), "spec", budget)
    needed = _VersionNeeds()
    needed.note("0.6.0", bool(annotations) or "." in klass)
    _edits(document.get("containerEdits"), "spec", budget, needed, require=False)
    devices = document.get("devices")
    if devices is None:
        devices = []
    if not isinstance(devices, list):
        raise SpecError(f"devices must be a list, got {_type(devices)}")
    names: set[str] = set()
    for index, device in enumerate(devices):
        budget.take()
        where = f"device {index}"
        if not isinstance(device, dict):
            raise SpecError(f"{where}: not a mapping (a {_type(device)})")
        _fields(device, _DEVICE_FIELDS, where)
        name = device.get("name")
        if not isinstance(name, str):
            raise SpecError(f"{where}: name must be a string, got {_type(name)}")
        validate_device_name(name)
        where = f"device {name!r}"
        if name in names:
            raise SpecError(f"invalid spec, multiple device {name!r}")
        names.add(name)
        needed.note("0.5.0", not ("A" <= name[0] <= "Z" or "a" <= name[0] <= "z"))
        needed.note("0.6.0", bool(_annotations(device.get("annotations"), where, budget)))
        _edits(device.get("containerEdits"), where, budget, needed, require=True)
    if not names:
        raise SpecError("invalid spec, no devices")
    _check_version(version, needed.version)
    return Spec(kind, frozenset(f"{kind}={name}" for name in names))


class _VersionNeeds:
    """The lowest cdiVersion that has every feature the file uses."""

    __slots__ = ("version",)

    def __init__(self) -> None:
        self.version = "0.3.0"

    def note(self, version: str, used: bool) -> None:
        if used and _key(version) > _key(self.version):
            self.version = version


def _check_version(version: str, needed: str) -> None:
    bare = version.removeprefix("v")
    if bare not in KNOWN_VERSIONS:
        raise SpecError(f"invalid cdiVersion {version!r} (known: {', '.join(KNOWN_VERSIONS)})")
    if _key(needed) > _key(bare):
        raise SpecError(f"the spec version must be at least v{needed}")


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _fields(mapping: Mapping[Any, Any], allowed: frozenset[str], where: str) -> None:
    unknown = [key for key in mapping if key not in allowed]
    if unknown:
        raise SpecError(f"{where}: unknown field {str(unknown[0])[:64]!r}")


def _annotations(value: object, where: str, budget: _Budget) -> Mapping[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: annotations must be a mapping, got {_type(value)}")
    budget.take(len(value))
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise SpecError(f"{where}: annotations must map strings to strings")
    return value


def _strings(value: object, where: str, budget: _Budget) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecError(f"{where} must be a list, got {_type(value)}")
    budget.take(len(value))
    if not all(isinstance(item, str) for item in value):
        raise SpecError(f"{where} must hold strings only")
    return value


def _env(value: object, where: str, budget: _Budget) -> list[str]:
    env = _strings(value, f"{where}: env", budget)
    for item in env:
        if item.find("=") <= 0:
            raise SpecError(f"{where}: invalid environment variable {item[:64]!r}")
    return env


def _records(value: object, where: str, budget: _Budget) -> list[dict[Any, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecError(f"{where} must be a list, got {_type(value)}")
    budget.take(len(value))
    for item in value:
        if not isinstance(item, dict):
            raise SpecError(f"{where}: every entry must be a mapping")
        budget.take(len(item))
    return value


def _edits(
    value: object, where: str, budget: _Budget, needed: _VersionNeeds, *, require: bool
) -> None:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: containerEdits must be a mapping, got {_type(value)}")
    _fields(value, _EDIT_FIELDS, f"{where}: containerEdits")
    env = _env(value.get("env"), where, budget)
    nodes = _records(value.get("deviceNodes"), f"{where}: deviceNodes", budget)
    for node in nodes:
        path, kind = node.get("path"), node.get("type", "")
        if not isinstance(path, str) or not path:
            raise SpecError(f"{where}: invalid (empty) device path")
        if kind not in _NODE_TYPES:
            raise SpecError(f"{where}: device {path[:64]!r}: invalid type {str(kind)[:16]!r}")
        permissions = node.get("permissions", "")
        if not isinstance(permissions, str) or set(permissions) - set("rwm"):
            raise SpecError(f"{where}: device {path[:64]!r}: invalid permissions")
        needed.note("0.5.0", bool(node.get("hostPath")))
    hooks = _records(value.get("hooks"), f"{where}: hooks", budget)
    for hook in hooks:
        name = hook.get("hookName")
        if name not in _HOOK_NAMES:
            raise SpecError(f"{where}: invalid hook name {str(name)[:32]!r}")
        if not isinstance(hook.get("path"), str) or not hook["path"]:
            raise SpecError(f"{where}: invalid hook {name!r} with empty path")
        _env(hook.get("env"), f"{where}: hook {name!r}", budget)
    mounts = _records(value.get("mounts"), f"{where}: mounts", budget)
    for mount in mounts:
        for key in ("hostPath", "containerPath"):
            if not isinstance(mount.get(key), str) or not mount[key]:
                raise SpecError(f"{where}: invalid mount, empty {key}")
        needed.note("0.4.0", bool(mount.get("type")))
    gids = value.get("additionalGids")
    if gids is not None and not isinstance(gids, list):
        raise SpecError(f"{where}: additionalGids must be a list")
    rdt = value.get("intelRdt")
    needed.note("0.7.0", bool(gids) or rdt is not None)
    if require and not (env or nodes or hooks or mounts or gids or rdt is not None):
        raise SpecError(f"{where}: empty container edits")


def _type(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


# ---------------------------------------------------------------- the directories
class FileState(StrEnum):
    USABLE = "usable"  # parsed and valid: the runtimes load it
    MALFORMED = "malformed"  # read, and the runtimes would skip it
    UNCHECKED = "unchecked"  # not read (too large, unreadable, a symlink leaving the dir)
    HANGS = "hangs"  # not read: the runtimes' read blocks on it for good (a FIFO)


@dataclass(frozen=True, slots=True)
class SpecFile:
    """One ``*.json``/``*.yaml`` entry of a spec directory, as far as it was checked."""

    path: str
    state: FileState
    spec: Spec | None = None
    reason: str = ""


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
    found = {d: defined[d][1] for d in wanted_t if d in defined and d not in clashes}
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
