"""A CDI spec document decoded into the library's Go types as go-yaml v3 decodes it.

``cdi.ParseSpec`` (tags.cncf.io/container-device-interface v1.1.1) runs go-yaml's
``Decoder`` with ``KnownFields(true)`` into ``specs.Spec``. This is that decoding, ported
from ``decode.go`` for the types of ``specs-go/config.go``, and what it means:

- Field names match exactly (``cdiVersion``, not ``CdiVersion``); a name no field has is
  an error at every level (``deviceNodes``, ``mounts``, ``hooks``, ``intelRdt``...).
- A key twice in one mapping is an error (compared by raw text: ``a`` and ``"a"`` clash).
- A string field takes any scalar's raw text (``name: 0x1F`` is the name "0x1F"); a number
  field takes ints and floats in range (``major: "236"`` is an error, ``1.5`` is 1);
  ``additionalGids``, ``fileMode``, ``uid`` and ``gid`` are uint32 (negative is an error);
  a bool takes true/false and the strings yes/no/on/off.
- A null leaves a field at its zero value; a null entry of a list of strings or devices
  is dropped, of a list of pointers (``deviceNodes``, ``mounts``, ``hooks``,
  ``netDevices``) kept as nil (the library's validation then dereferences it and panics).
- Aliases, merge keys (``<<``) and go-yaml's limit on excessive aliasing work as there.

The decoder reads nodes from ``cdiyaml.Reader`` as they stream and stops at the first
error: any error makes the file unusable, whichever go-yaml would have named first.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from rbln_device_plugin.model.cdiyaml import (
    ALIAS,
    BINARY_TAG,
    MAPPING,
    MERGE_TAG,
    NULL_TAG,
    SCALAR,
    SEQUENCE,
    STR_TAG,
    Budget,
    Node,
    Reader,
    SpecError,
    SpecUnchecked,
    resolve,
)


# ---------------------------------------------------------------- the Go types
@dataclass(slots=True)
class DeviceNode:
    path: str = ""
    hostPath: str = ""  # the YAML names, so one table serves both
    type: str = ""
    major: int = 0
    minor: int = 0
    fileMode: int | None = None
    permissions: str = ""
    uid: int | None = None
    gid: int | None = None


@dataclass(slots=True)
class Mount:
    hostPath: str = ""
    containerPath: str = ""
    options: list[str] | None = None
    type: str = ""


@dataclass(slots=True)
class Hook:
    hookName: str = ""
    path: str = ""
    args: list[str] | None = None
    env: list[str] | None = None
    timeout: int | None = None


@dataclass(slots=True)
class IntelRdt:
    closID: str = ""
    l3CacheSchema: str = ""
    memBwSchema: str = ""
    schemata: list[str] | None = None  # [] is not None: it needs v1.1.0
    enableMonitoring: bool = False


@dataclass(slots=True)
class NetDevice:
    hostInterfaceName: str = ""
    name: str = ""


@dataclass(slots=True)
class Edits:
    env: list[str] | None = None
    deviceNodes: list[DeviceNode | None] | None = None
    netDevices: list[NetDevice | None] | None = None
    hooks: list[Hook | None] | None = None
    mounts: list[Mount | None] | None = None
    intelRdt: IntelRdt | None = None
    additionalGids: list[int] | None = None


@dataclass(slots=True)
class Device:
    name: str = ""
    annotations: dict[str, str] | None = None
    containerEdits: Edits = field(default_factory=Edits)


@dataclass(slots=True)
class RawSpec:
    cdiVersion: str = ""
    kind: str = ""
    annotations: dict[str, str] | None = None
    devices: list[Device] | None = None
    containerEdits: Edits = field(default_factory=Edits)


# ---------------------------------------------------------------- type descriptors
class _Scalar:
    __slots__ = ("go", "zero")

    def __init__(self, go: str, zero: object) -> None:
        self.go, self.zero = go, zero


STRING: Final = _Scalar("string", "")
INT64: Final = _Scalar("int64", 0)
INT: Final = _Scalar("int", 0)
UINT32: Final = _Scalar("uint32", 0)
FILE_MODE: Final = _Scalar("fs.FileMode", 0)
BOOL: Final = _Scalar("bool", False)


@dataclass(frozen=True, slots=True)
class _Ptr:
    elem: Any


@dataclass(frozen=True, slots=True)
class _Slice:
    elem: Any


@dataclass(frozen=True, slots=True)
class _StringMap:
    pass


@dataclass(frozen=True, slots=True)
class _Struct:
    go: str
    new: Callable[[], Any]
    fields: dict[str, Any]


_Type = _Scalar | _Ptr | _Slice | _StringMap | _Struct

_STRINGS: Final = _Slice(STRING)
_ANNOTATIONS: Final = _StringMap()
_DEVICE_NODE: Final = _Struct(
    "specs.DeviceNode", DeviceNode,
    {"path": STRING, "hostPath": STRING, "type": STRING, "major": INT64, "minor": INT64,
     "fileMode": _Ptr(FILE_MODE), "permissions": STRING, "uid": _Ptr(UINT32),
     "gid": _Ptr(UINT32)},
)  # fmt: skip
_MOUNT: Final = _Struct(
    "specs.Mount", Mount,
    {"hostPath": STRING, "containerPath": STRING, "options": _STRINGS, "type": STRING},
)  # fmt: skip
_HOOK: Final = _Struct(
    "specs.Hook", Hook,
    {"hookName": STRING, "path": STRING, "args": _STRINGS, "env": _STRINGS, "timeout": _Ptr(INT)},
)  # fmt: skip
_INTEL_RDT: Final = _Struct(
    "specs.IntelRdt", IntelRdt,
    {"closID": STRING, "l3CacheSchema": STRING, "memBwSchema": STRING, "schemata": _STRINGS,
     "enableMonitoring": BOOL},
)  # fmt: skip
_NET_DEVICE: Final = _Struct(
    "specs.LinuxNetDevice", NetDevice, {"hostInterfaceName": STRING, "name": STRING}
)
_EDITS: Final = _Struct(
    "specs.ContainerEdits", Edits,
    {"env": _STRINGS, "deviceNodes": _Slice(_Ptr(_DEVICE_NODE)),
     "netDevices": _Slice(_Ptr(_NET_DEVICE)), "hooks": _Slice(_Ptr(_HOOK)),
     "mounts": _Slice(_Ptr(_MOUNT)), "intelRdt": _Ptr(_INTEL_RDT),
     "additionalGids": _Slice(UINT32)},
)  # fmt: skip
_DEVICE: Final = _Struct(
    "specs.Device", Device,
    {"name": STRING, "annotations": _ANNOTATIONS, "containerEdits": _EDITS},
)  # fmt: skip
_SPEC: Final = _Struct(
    "specs.Spec", RawSpec,
    {"cdiVersion": STRING, "kind": STRING, "annotations": _ANNOTATIONS,
     "devices": _Slice(_DEVICE), "containerEdits": _EDITS},
)  # fmt: skip


def _go_name(typ: _Type) -> str:
    if isinstance(typ, _Scalar | _Struct):
        return typ.go
    if isinstance(typ, _Ptr):
        return "*" + _go_name(typ.elem)
    if isinstance(typ, _Slice):
        return "[]" + _go_name(typ.elem)
    return "map[string]string"


def _zero(typ: _Type) -> Any:
    if isinstance(typ, _Scalar):
        return typ.zero
    if isinstance(typ, _Struct):
        return typ.new()
    return None


# go-yaml's excessive-aliasing rule (decode.go allowedAliasRatio).
_ALIAS_RANGE_LOW: Final = 400_000
_ALIAS_RANGE_HIGH: Final = 4_000_000


def _allowed_alias_ratio(count: int) -> float:
    if count <= _ALIAS_RANGE_LOW:
        return 0.99
    if count >= _ALIAS_RANGE_HIGH:
        return 0.10
    return 0.99 - 0.89 * ((count - _ALIAS_RANGE_LOW) / (_ALIAS_RANGE_HIGH - _ALIAS_RANGE_LOW))


_MAX_INT64_F: Final = float(1 << 63)  # math.MaxInt64 as a float64


def decode_spec(reader: Reader, root: Node | None, budget: Budget) -> RawSpec:
    """The spec the first document decodes to; SpecError as go-yaml's Decode fails (or
    "no Spec data" for a null document), SpecUnchecked when the budget runs out."""
    if root is None:
        raise SpecError("empty: no spec data (no YAML document)")
    if root.kind == SEQUENCE or (root.kind == SCALAR and root.short_tag() != NULL_TAG):
        what = "a list" if root.kind == SEQUENCE else f"the scalar {root.value[:32]!r}"
        raise SpecError(f"not a mapping at the top level ({what})")
    decoder = _Decoder(reader, budget)
    try:
        _ok, spec = decoder.unmarshal(root, _Ptr(_SPEC), None)
    except RecursionError:
        raise SpecUnchecked("nested too deeply to check (merge keys or aliases)") from None
    if spec is None:
        raise SpecError("empty: no spec data (the document is null)")
    assert isinstance(spec, RawSpec)
    return spec


class _Decoder:
    def __init__(self, reader: Reader, budget: Budget) -> None:
        self.reader = reader
        self.budget = budget
        self.decode_count = 0
        self.alias_count = 0
        self.alias_depth = 0
        self.in_alias: set[int] = set()
        self.merged: set[str] | None = None

    def unmarshal(self, node: Node, typ: _Type, current: Any) -> tuple[bool, Any]:
        """go-yaml's decoder.unmarshal: whether ``node`` set a value, and the value."""
        budget = self.budget
        budget.left -= 1
        if budget.left < 0:
            budget.take(0)  # raises BudgetSpent
        self.decode_count += 1
        if self.alias_depth > 0:
            self.alias_count += 1
        if (
            self.alias_count > 100
            and self.decode_count > 1000
            and self.alias_count / self.decode_count > _allowed_alias_ratio(self.decode_count)
        ):
            raise SpecError("yaml: document contains excessive aliasing")
        if node.kind == ALIAS:
            return self.alias(node, typ, current)
        if node.short_tag() != NULL_TAG:  # decoder.prepare: allocate through pointers
            while isinstance(typ, _Ptr):
                typ = typ.elem
                if current is None:
                    current = _zero(typ)
        if node.kind == SCALAR:
            return self.scalar(node, typ, current)
        if node.kind == MAPPING:
            return self.mapping(node, typ, current)
        return self.sequence(node, typ, current)

    def alias(self, node: Node, typ: _Type, current: Any) -> tuple[bool, Any]:
        assert node.alias is not None
        if node.alias.live:
            # An alias inside the node it names: go-yaml decodes that node again inside
            # itself and meets this alias again ("contains itself"), unless a type error
            # stops it first; either way the file fails.
            raise SpecError(
                f"yaml: anchor '{node.value[:64]}' value contains itself (an alias inside "
                "the node it names)"
            )
        if id(node) in self.in_alias:
            raise SpecError(f"yaml: anchor '{node.value[:64]}' value contains itself")
        self.in_alias.add(id(node))
        self.alias_depth += 1
        try:
            return self.unmarshal(node.alias, typ, current)
        finally:
            self.alias_depth -= 1
            self.in_alias.discard(id(node))

    def terror(self, node: Node, tag: str, typ: _Type) -> SpecError:
        tag = node.tag or tag
        value = ""
        if tag not in ("!!seq", "!!map"):
            text = node.value if len(node.value) <= 10 else node.value[:7] + "..."
            value = f" `{text}`"
        return SpecError(
            f"yaml: unmarshal errors: line {node.line}: cannot unmarshal {tag}{value} "
            f"into {_go_name(typ)}"
        )

    # ------------------------------------------------------------ scalars
    def scalar(self, node: Node, typ: _Type, current: Any) -> tuple[bool, Any]:
        tag: str
        resolved: object
        if node.indicated_string():
            tag, resolved = STR_TAG, node.value
        else:
            tag, resolved = resolve(node.tag, node.value)
            if tag == BINARY_TAG:
                resolved = _binary(node.value)
        if resolved is None:  # decoder.null
            if isinstance(typ, _Ptr | _Slice | _StringMap):
                return True, None
            return False, current
        if typ is STRING:
            return True, resolved if tag == BINARY_TAG else node.value
        if typ in (INT64, INT):
            if isinstance(resolved, int) and not isinstance(resolved, bool):
                if -(1 << 63) <= resolved < (1 << 63):
                    return True, resolved
            elif isinstance(resolved, float) and resolved <= _MAX_INT64_F:  # NaN fails
                return True, _go_int64(resolved)
        elif typ in (UINT32, FILE_MODE):
            if isinstance(resolved, int) and not isinstance(resolved, bool):
                if 0 <= resolved < (1 << 32):
                    return True, resolved
            elif isinstance(resolved, float) and -1.0 < resolved < float(1 << 32):
                return True, int(resolved)  # Go truncates; (-1, 0) converts to 0
        elif typ is BOOL:
            if isinstance(resolved, bool):
                return True, resolved
            if isinstance(resolved, str):
                if resolved in ("y", "Y", "yes", "Yes", "YES", "on", "On", "ON"):
                    return True, True
                if resolved in ("n", "N", "no", "No", "NO", "off", "Off", "OFF"):
                    return True, False
        raise self.terror(node, tag, typ)

    # ------------------------------------------------------------ sequences
    def sequence(self, node: Node, typ: _Type, current: Any) -> tuple[bool, Any]:
        if not isinstance(typ, _Slice):
            raise self.terror(node, "!!seq", typ)
        items: list[Any] = []  # never None: [] counts where the library asks "!= nil"
        for child in self.reader.children(node):
            ok, value = self.unmarshal(child, typ.elem, _zero(typ.elem))
            if ok:
                items.append(value)
        return True, items

    # ------------------------------------------------------------ mappings
    def mapping(self, node: Node, typ: _Type, current: Any) -> tuple[bool, Any]:
        if isinstance(typ, _Struct):
            return self.mapping_struct(node, typ, current)
        if isinstance(typ, _StringMap):
            return self.mapping_map(node, current)
        raise self.terror(node, "!!map", typ)

    def mapping_struct(self, node: Node, typ: _Struct, current: Any) -> tuple[bool, Any]:
        merged, self.merged = self.merged, None
        merge: Node | None = None
        keys: list[Node] = []
        done: set[str] = set()
        seen: dict[tuple[int, str], int] = {}
        children = self.reader.children(node)
        for key in children:
            self._unique(key, seen)
            if _is_merge(key):
                if node.live:
                    self.reader.record_next()
                merge = next(children)
                self.reader.skip(merge)  # keep it whole: it is applied last
                keys.append(key)
                continue
            value = next(children)
            keys.append(key)
            ok, name = self.unmarshal(key, STRING, "")
            if not ok:
                continue  # a null key: go-yaml skips the pair
            if merged is not None:
                if name in merged:
                    continue
                merged.add(name)
            field_type = typ.fields.get(name)
            if field_type is None:
                raise SpecError(
                    f"line {key.line}: unknown field {name[:64]!r} in {typ.go} (field names "
                    "match exactly; the library decodes strictly)"
                )
            if name in done:
                raise SpecError(
                    f"yaml: unmarshal errors: line {key.line}: field {name[:64]} already set "
                    f"in type {typ.go}"
                )
            done.add(name)
            ok, result = self.unmarshal(value, field_type, getattr(current, name))
            if ok:
                setattr(current, name, result)
        self.merged = merged
        if merge is not None:
            self.merge(keys, merge, typ, current)
        return True, current

    def mapping_map(self, node: Node, current: dict[str, str] | None) -> tuple[bool, Any]:
        merged, self.merged = self.merged, None
        merge: Node | None = None
        keys: list[Node] = []
        result: dict[str, str] = {} if current is None else current
        fresh = current is None
        seen: dict[tuple[int, str], int] = {}
        children = self.reader.children(node)
        for key in children:
            self._unique(key, seen)
            if _is_merge(key):
                if node.live:
                    self.reader.record_next()
                merge = next(children)
                self.reader.skip(merge)
                keys.append(key)
                continue
            value = next(children)
            keys.append(key)
            ok, name = self.unmarshal(key, STRING, "")
            if not ok:
                continue
            if merged is not None:
                if name in merged:
                    continue
                merged.add(name)
            ok, text = self.unmarshal(value, STRING, "")
            if ok or (value.short_tag() == NULL_TAG and (fresh or name not in result)):
                result[name] = text
        self.merged = merged
        if merge is not None:
            self.merge(keys, merge, _ANNOTATIONS, result)
        return True, result

    @staticmethod
    def _unique(key: Node, seen: dict[tuple[int, str], int]) -> None:
        """go-yaml's uniqueKeys: two keys of one mapping with the same kind and raw text."""
        first = seen.get((key.kind, key.value))
        if first is not None:
            raise SpecError(
                f"yaml: unmarshal errors: line {key.line}: mapping key {key.value[:64]!r} "
                f"already defined at line {first}"
            )
        seen[(key.kind, key.value)] = key.line

    def merge(self, keys: list[Node], merge: Node, typ: _Type, current: Any) -> None:
        """go-yaml's decoder.merge: the merged mappings fill what the parent left unset."""
        outer = self.merged
        if outer is None:
            self.merged = set()
            for key in keys:
                name = self._interface_key(key)
                if name is not None:
                    self.merged.add(name)
        targets: list[Node]
        if merge.kind == MAPPING:
            targets = [merge]
        elif merge.kind == ALIAS:
            assert merge.alias is not None
            if merge.alias.kind != MAPPING:
                raise _want_map()
            targets = [merge]
        elif merge.kind == SEQUENCE:
            targets = []
            for item in self.reader.children(merge):
                target = item.alias if item.kind == ALIAS else item
                if target is None or target.kind != MAPPING:
                    raise _want_map()
                targets.append(item)
        else:
            raise _want_map()
        for target in targets:
            self.unmarshal(target, typ, current)
        self.merged = outer

    def _interface_key(self, key: Node) -> str | None:
        """A parent key decoded into interface{} for the merged-field set: its string, or
        None when it decodes to something else (only strings match a field name)."""
        self.budget.take()
        self.decode_count += 1
        while key.kind == ALIAS and key.alias is not None:
            key = key.alias
        if key.kind != SCALAR:
            raise SpecError("yaml: runtime error: hash of unhashable type (a collection as a key)")
        if key.indicated_string():
            return key.value
        tag, resolved = resolve(key.tag, key.value)
        if tag == BINARY_TAG:
            return _binary(key.value)
        return resolved if isinstance(resolved, str) else None


def _want_map() -> SpecError:
    return SpecError("yaml: map merge requires map or sequence of maps as the value")


def _is_merge(node: Node) -> bool:
    return (
        node.kind == SCALAR
        and node.value == "<<"
        and (node.tag in ("", "!") or node.tag == MERGE_TAG)
    )


def _go_int64(value: float) -> int:
    """int64(f) as Go on amd64 converts it: truncated; out of range gives MinInt64."""
    if value != value or not -_MAX_INT64_F <= value < _MAX_INT64_F:
        return -(1 << 63)
    return int(value)


def _binary(text: str) -> str:
    """A !!binary scalar's bytes (base64.StdEncoding.DecodeString, which skips CR and LF)."""
    text = text.replace("\r", "").replace("\n", "")
    try:
        if len(text) % 4:  # Go wants whole quanta; Python forgives extra padding
            raise ValueError(text)
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SpecError("yaml: !!binary value contains invalid base64 data") from None
    return raw.decode("utf-8", errors="surrogateescape")
