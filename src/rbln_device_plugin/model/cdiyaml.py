"""A CDI spec file's first YAML document as go-yaml v3 sees it, read under a work budget.

The CDI library containerd 2.x uses (tags.cncf.io/container-device-interface v1.1.1)
decodes every spec file, ``.json`` as well as ``.yaml``, with ``go.yaml.in/yaml/v3``'s
``Decoder`` (strict: ``KnownFields``). This module gives ``cdidecode`` that document's
nodes the way go-yaml's parser builds them: each node's tag as go-yaml resolves it
(``resolve``, ported from ``resolve.go``), its raw text and style, anchors and aliases.

Nothing here builds the whole document. ``Reader`` streams libyaml's events (PyYAML's
C parser) and hands the decoder one node at a time, so a file the decoder rejects at its
third node costs three events, and only anchored nodes (and merge values) are kept as
trees, for the aliases that may name them later. Every event and every decoding step takes
one unit of a ``Budget``; a file that needs more is "too complex to check" (the daemon
cannot tell), never a reason to use more memory. A ``.json`` file is read with ``json``
(in C) when its text means the same to go-yaml, after a count of its values against the
budget; otherwise it takes the YAML path too.

Where libyaml and go-yaml differ, this follows go-yaml: go-yaml's scanner reads two tokens
past the end of the first document (a broken token right after ``---`` fails the file),
nests at most 10000 flow collections, and refuses the ``\\/`` escape libyaml accepts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any, Final

import yaml

# Kinds of node, as go-yaml's Kind.
SCALAR: Final = 1
SEQUENCE: Final = 2
MAPPING: Final = 3
ALIAS: Final = 4
# Style bits, as go-yaml's Style.
TAGGED: Final = 1
DOUBLE_QUOTED: Final = 2
SINGLE_QUOTED: Final = 4
LITERAL: Final = 8
FOLDED: Final = 16
FLOW: Final = 32
QUOTED_OR_BLOCK: Final = DOUBLE_QUOTED | SINGLE_QUOTED | LITERAL | FOLDED

NULL_TAG: Final = "!!null"
BOOL_TAG: Final = "!!bool"
STR_TAG: Final = "!!str"
INT_TAG: Final = "!!int"
FLOAT_TAG: Final = "!!float"
TIMESTAMP_TAG: Final = "!!timestamp"
SEQ_TAG: Final = "!!seq"
MAP_TAG: Final = "!!map"
BINARY_TAG: Final = "!!binary"
MERGE_TAG: Final = "!!merge"
_LONG_PREFIX: Final = "tag:yaml.org,2002:"
_RESOLVABLE: Final = frozenset({"", STR_TAG, BOOL_TAG, INT_TAG, FLOAT_TAG, NULL_TAG, TIMESTAMP_TAG})

MAX_FLOW_DEPTH: Final = 10_000  # go-yaml's max_flow_level and max_indents
LOOKAHEAD_TOKENS: Final = 2  # go-yaml's scanner keeps two tokens beyond the one parsed

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SpecError(ValueError):
    """Why a spec file is unusable to the runtimes, in the library's terms."""


class SpecUnchecked(SpecError):
    """The daemon cannot tell whether the runtimes use the file (too complex to check
    within the budget, or a newer format than this daemon knows)."""


class BudgetSpent(SpecUnchecked):
    """The budget ran out before the file was checked."""


class Budget:
    """Units of work: one per YAML event, JSON value or decoding step. Shared by the files
    of one pass over the spec directories, so any set of files costs a bounded time."""

    __slots__ = ("left", "total")

    def __init__(self, units: int) -> None:
        self.total = units
        self.left = units

    def take(self, units: int = 1) -> None:
        self.left -= units
        if self.left < 0:
            raise BudgetSpent(
                f"too complex to check (more than {self.total} values and steps; "
                "the daemon cannot tell whether the runtimes use it)"
            )


class Node:
    """One node of the document. ``content`` is the list of children (keys and values
    alternating in a mapping) when the node is kept as a tree, None while it streams."""

    __slots__ = ("alias", "anchor", "content", "kind", "line", "live", "style", "tag", "value")

    def __init__(self, kind: int, tag: str, value: str, style: int, line: int) -> None:
        self.kind = kind
        self.tag = tag  # go-yaml's short tag, resolved at parse time for plain scalars
        self.value = value  # a scalar's text; an alias's anchor name
        self.style = style
        self.line = line
        self.anchor = ""
        self.alias: Node | None = None
        self.content: list[Node] | None = None
        self.live = False  # the reader is still inside it

    def short_tag(self) -> str:
        """go-yaml's Node.ShortTag."""
        if self.kind == ALIAS:
            return self.alias.short_tag() if self.alias is not None else ""
        if self.indicated_string():
            return STR_TAG
        return self.tag

    def indicated_string(self) -> bool:
        """go-yaml's indicatedString: a scalar that is a string whatever its text."""
        return self.kind == SCALAR and (
            self.tag == STR_TAG or (self.tag in ("", "!") and bool(self.style & QUOTED_OR_BLOCK))
        )


def short_tag(tag: str) -> str:
    if tag.startswith(_LONG_PREFIX):
        return "!!" + tag[len(_LONG_PREFIX) :]
    return tag


# ---------------------------------------------------------------- go-yaml's resolve
class Timestamp:
    """A value go-yaml resolves to time.Time; no CDI field takes one."""

    __slots__ = ()


_NULLS: Final = frozenset({"", "~", "null", "Null", "NULL"})
_BOOLS: Final = {"true": True, "True": True, "TRUE": True, "false": False, "False": False,
                 "FALSE": False}  # fmt: skip
_FLOATS: Final = {".nan": math.nan, ".NaN": math.nan, ".NAN": math.nan, ".inf": math.inf,
                  ".Inf": math.inf, ".INF": math.inf, "+.inf": math.inf, "+.Inf": math.inf,
                  "+.INF": math.inf, "-.inf": -math.inf, "-.Inf": -math.inf,
                  "-.INF": -math.inf}  # fmt: skip
_HINTS: Final = {**dict.fromkeys("+-", "S"), **dict.fromkeys("0123456789", "D"),
                 **dict.fromkeys("yYnNtTfFoO~", "M"), ".": "."}  # fmt: skip
_YAML_FLOAT: Final = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_DOT_FLOAT: Final = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")
_TIMESTAMP: Final = re.compile(
    r"(\d{4})-(\d{1,2})-(\d{1,2})"
    r"(?:([Tt ])(\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.\d+)?(Z|[+-]\d{2}:\d{2})?)?"
)
_INT64: Final = 1 << 63
_UINT64: Final = 1 << 64
_DAYS: Final = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _go_int(text: str, base: int, signed: bool) -> int | None:
    """strconv.ParseInt/ParseUint(text, base, 64) without underscores (go-yaml removed
    them); None where Go fails."""
    body, negative = text, False
    if signed and body[:1] in ("+", "-"):
        negative, body = body[0] == "-", body[1:]
    if base == 0:
        base = 10
        if body[:1] == "0":
            prefix = body[1:2].lower()
            if len(body) >= 3 and prefix in ("x", "o", "b"):
                base, body = {"x": 16, "o": 8, "b": 2}[prefix], body[2:]
            else:
                base = 8
    if not body or not body.isascii() or not body.isalnum():
        return None
    try:
        value = int(body, base)
    except ValueError:
        return None
    if negative:
        value = -value
    if signed:
        return value if -_INT64 <= value < _INT64 else None
    return value if value < _UINT64 else None


def _timestamp(text: str) -> bool:
    """Whether go-yaml's parseTimestamp takes ``text`` (time.Parse with its 4 layouts)."""
    found = _TIMESTAMP.fullmatch(text)
    if found is None:
        return False
    year, month, day = int(found[1]), int(found[2]), int(found[3])
    if not 1 <= month <= 12 or not 1 <= day <= _DAYS[month - 1]:
        return False
    if month == 2 and day == 29 and not (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)):
        return False
    if found[4] is None:
        return True
    if found[4] == " " and found[8] is not None:
        return False  # the space-separated layout has no zone
    return int(found[5]) < 24 and int(found[6]) < 60 and int(found[7]) < 60


def _number(plain: str) -> tuple[str, object] | None:
    value = _go_int(plain, 0, signed=True)
    if value is not None:
        return INT_TAG, value
    value = _go_int(plain, 0, signed=False)
    if value is not None:
        return INT_TAG, value
    if _YAML_FLOAT.fullmatch(plain):
        number = float(plain)
        if not math.isinf(number):  # ParseFloat's ErrRange
            return FLOAT_TAG, number
    for prefix, base in (("0b", 2), ("0o", 8)):
        if plain.startswith(prefix):
            value = _go_int(plain[2:], base, signed=True)
            if value is None:
                value = _go_int(plain[2:], base, signed=False)
            if value is not None:
                return INT_TAG, value
        elif plain.startswith("-" + prefix):
            value = _go_int("-" + plain[3:], base, signed=True)
            if value is not None:
                return INT_TAG, value
    return None


def resolve(tag: str, text: str) -> tuple[str, object]:
    """go-yaml's resolve: the tag and value a scalar's text stands for. SpecError where
    go-yaml fails (an explicit tag the text does not fit)."""
    if tag not in _RESOLVABLE:
        return tag, text
    rtag, value = _resolve(tag, text)
    if tag in ("", rtag, STR_TAG, BINARY_TAG):
        return rtag, value
    if tag == FLOAT_TAG and rtag == INT_TAG and isinstance(value, int):
        return FLOAT_TAG, float(value)
    raise SpecError(f"yaml: cannot decode {rtag} `{text[:64]}` as a {tag}")


def _resolve(tag: str, text: str) -> tuple[str, object]:
    hint = _HINTS.get(text[:1], "") if text else "N"
    if hint and tag not in (STR_TAG, BINARY_TAG):
        if text in _NULLS:
            return NULL_TAG, None
        if text in _BOOLS:
            return BOOL_TAG, _BOOLS[text]
        if text in _FLOATS:
            return FLOAT_TAG, _FLOATS[text]
        if text == "<<":
            return MERGE_TAG, text
        if hint == "." and _DOT_FLOAT.fullmatch(text):
            number = float(text)
            if not math.isinf(number):
                return FLOAT_TAG, number
        elif hint in ("D", "S"):
            if tag in ("", TIMESTAMP_TAG) and _timestamp(text):
                return TIMESTAMP_TAG, Timestamp()
            found = _number(text.replace("_", ""))
            if found is not None:
                return found
    return STR_TAG, text


def node_tag(kind: int, explicit: str | None, style: int, text: str) -> tuple[str, int]:
    """The tag go-yaml's parser gives a new node, and the TAGGED style bit."""
    if explicit and explicit != "!":
        return short_tag(explicit), TAGGED
    if kind == SEQUENCE:
        return SEQ_TAG, 0
    if kind == MAPPING:
        return MAP_TAG, 0
    if style & QUOTED_OR_BLOCK:
        return STR_TAG, 0
    if text == "<<":
        return MERGE_TAG, 0
    return _resolve("", text)[0], 0


_STYLES: Final = {"'": SINGLE_QUOTED, '"': DOUBLE_QUOTED, "|": LITERAL, ">": FOLDED}


# ---------------------------------------------------------------- the YAML path
class Reader:
    """The first document's nodes, streamed from libyaml's events under a budget.

    ``children(node)`` yields a collection's children in order (a mapping's keys and
    values alternate); a child collection the caller leaves unread is skipped when the
    next child is asked for. A tree node (JSON, an anchored node, a recorded merge value)
    is walked from its content instead.
    """

    def __init__(self, data: bytes, budget: Budget) -> None:
        self._data = data
        self._budget = budget
        self._loader: Any = None
        self._stack: list[Node] = []  # live collections, innermost last
        self._anchors: dict[str, Node] = {}
        self._flow = 0
        self._record_next = False

    # The first document's root, or None when the stream holds no document at all.
    def root(self) -> Node | None:
        self._loader = _Loader(self._data)
        self._event()  # stream start
        first = self._event()
        if isinstance(first, yaml.StreamEndEvent):
            return None
        holder = Node(SEQUENCE, "", "", 0, 0)  # stands for the document node
        holder.live = True
        self._stack.append(holder)
        root = self._next(holder)
        assert root is not None  # a document always holds one node
        self._holder = holder
        return root

    def finish(self) -> None:
        """Read to the first document's end and check what go-yaml's scanner reads past
        it. Call after the root was decoded without error."""
        while len(self._stack) > 1:
            self._next(self._stack[-1])
        end: Any = self._event()
        if not isinstance(end, yaml.DocumentEndEvent):  # pragma: no cover - libyaml's grammar
            raise SpecError("yaml: expected the end of the document")
        start: Any = end.start_mark
        mark = (start.line, start.column)
        self._close()
        scan_past_document(self._data, mark, self._budget)

    def close(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._loader is not None:
            self._loader.dispose()
            self._loader = None

    def children(self, node: Node) -> Iterator[Node]:
        if not node.live:
            if node.content is not None:
                yield from node.content
            return
        while True:
            child = self._next(node)
            if child is None:
                return
            yield child
            self.skip(child)

    def skip(self, node: Node) -> None:
        """Consume the rest of ``node`` (anchors inside are still kept)."""
        while node.live:
            self._next(self._stack[-1])

    def record_next(self) -> None:
        """Keep the next child as a tree (a merge value, applied after the mapping)."""
        self._record_next = True

    def _event(self) -> Any:
        budget = self._budget
        budget.left -= 1
        if budget.left < 0:
            budget.take(0)  # raises BudgetSpent
        try:
            return self._loader.get_event()
        except yaml.YAMLError as exc:
            raise _libyaml_error(exc) from None
        except (ValueError, RecursionError) as exc:  # e.g. bad UTF-8 bytes
            raise SpecError(f"not YAML or JSON: {_one_line(exc)}") from None

    def _next(self, parent: Node) -> Node | None:
        """One event inside ``parent`` (the innermost live collection): its next child,
        or None at its end. (The hot path of every file: types compared by identity.)"""
        event: Any = self._event()
        cls = type(event)
        if cls is _SCALAR_EVENT:
            style = _STYLES.get(event.style, 0) if event.style else 0
            text: str = event.value
            if event.tag is None and not style:
                tag = MERGE_TAG if text == "<<" else _resolve("", text)[0]
                node = Node(SCALAR, tag, text, 0, event.start_mark.line + 1)
            else:
                tag, tagged = node_tag(SCALAR, event.tag, style, text)
                node = Node(SCALAR, tag, text, style | tagged, event.start_mark.line + 1)
            anchor = event.anchor
        elif cls is _SEQUENCE_END or cls is _MAPPING_END:
            self._stack.pop()
            parent.live = False
            if parent.style & FLOW:
                self._flow -= 1
            return None
        elif cls is _ALIAS_EVENT:
            name: str = event.anchor or ""
            node = Node(ALIAS, "", name, 0, event.start_mark.line + 1)
            node.alias = self._anchors.get(name)
            if node.alias is None:
                raise SpecError(f"yaml: unknown anchor '{name[:64]}' referenced")
            anchor = None
        else:
            kind = SEQUENCE if cls is _SEQUENCE_START else MAPPING
            tag, tagged = node_tag(kind, event.tag, 0, "")
            style = tagged | (FLOW if event.flow_style else 0)
            node = Node(kind, tag, "", style, event.start_mark.line + 1)
            node.live = True
            self._stack.append(node)
            if event.flow_style:
                self._flow += 1
                if self._flow > MAX_FLOW_DEPTH:
                    raise SpecError(f"yaml: exceeded max depth of {MAX_FLOW_DEPTH}")
            anchor = event.anchor
            if parent.content is not None or anchor or self._record_next:
                node.content = []
        self._record_next = False
        if anchor:
            node.anchor = anchor
            self._anchors[anchor] = node  # a later anchor of the same name wins
        if parent.content is not None:
            parent.content.append(node)
        return node


_SCALAR_EVENT: Final = yaml.ScalarEvent
_ALIAS_EVENT: Final = yaml.AliasEvent
_SEQUENCE_START: Final = yaml.SequenceStartEvent
_SEQUENCE_END: Final = yaml.SequenceEndEvent
_MAPPING_END: Final = yaml.MappingEndEvent


class QuoteEscape(SpecError):
    """libyaml refused a ``\\'`` escape in a double-quoted scalar, which go-yaml takes
    (as ``'``): the caller may write it as ``\\x27`` and read the file again."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index  # in characters of the decoded text


def _libyaml_error(exc: yaml.YAMLError) -> SpecError:
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem == "exceeded maximum nesting depth":
        return SpecUnchecked(
            "nested deeper than libyaml follows (1000 collections; go-yaml takes 10000): "
            "the daemon cannot tell"
        )
    if problem == "found unknown escape character" and mark is not None:
        return QuoteEscape(f"not YAML or JSON: {_one_line(exc)}", mark.index)
    return SpecError(f"not YAML or JSON: {_one_line(exc)}")


def with_quote_escape_replaced(data: bytes, index: int) -> bytes | None:
    """``data`` with the ``\\'`` at ``index`` written ``\\x27``, or None when that is
    not what libyaml refused there."""
    text = _text(data)
    if text[index : index + 2] != "\\'":
        return None
    return (text[:index] + "\\x27" + text[index + 2 :]).encode("utf-8", "surrogateescape")


def scan_past_document(data: bytes, mark: tuple[int, int], budget: Budget) -> None:
    """go-yaml's scanner keeps two tokens beyond the one its parser reads: a token it
    cannot scan right after the first document's end (``---`` or ``...``) fails the
    file, though nothing after that end is decoded."""
    loader: Any = _Loader(data)
    try:
        after = -1
        while loader.check_token():
            budget.take()
            token = loader.get_token()
            if after >= 0:
                after += 1
                if after >= LOOKAHEAD_TOKENS:
                    return
            elif (token.start_mark.line, token.start_mark.column) >= mark:
                if isinstance(token, yaml.StreamEndToken):
                    return
                if isinstance(token, (yaml.DocumentStartToken, yaml.DocumentEndToken)):
                    after = 0
    except yaml.YAMLError as exc:
        raise _libyaml_error(exc) from None
    finally:
        loader.dispose()


_ESCAPED_SLASH: Final = re.compile(r"(?<!\\)(?:\\\\)*\\/")


def check_escapes(data: bytes, budget: Budget) -> None:
    """go-yaml refuses the ``\\/`` escape in a double-quoted scalar; libyaml takes it."""
    utf16 = data.startswith((b"\xff\xfe", b"\xfe\xff"))
    if b"\\/" not in data and not (utf16 and "\\/" in _text(data)):
        return
    loader: Any = _Loader(data)
    text: str | None = None
    try:
        while loader.check_token():
            budget.take()
            token = loader.get_token()
            if isinstance(token, yaml.ScalarToken) and token.style == '"':
                if text is None:
                    text = _text(data)
                raw = text[token.start_mark.index : token.end_mark.index]
                if _ESCAPED_SLASH.search(raw):
                    raise SpecError(
                        f"yaml: line {token.start_mark.line + 1}: found unknown escape "
                        "character while parsing a quoted scalar (\\/)"
                    )
    except yaml.YAMLError:
        return  # the parse proper reports it
    finally:
        loader.dispose()


def _text(data: bytes) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    return data.decode("utf-8-sig", errors="replace")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


# ---------------------------------------------------------------- the JSON path
# Text where JSON and go-yaml could disagree sends a .json file down the YAML path:
# characters YAML forbids or folds (JSON strings may hold DEL, C1 controls, U+FFFE, NEL,
# LS, PS), escapes go-yaml refuses or treats otherwise (\/, surrogate pairs), and a tab
# where go-yaml's block context starts (before or after the top-level value).
_NOT_YAML_TEXT: Final = re.compile(
    "[^\x09\x0a\x0d\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]|[\x85\u2028\u2029]"
    r"|\\/|\\[uU][dD][89a-fA-F]"
)
_VALUE_MARKS: Final = (b",", b"[", b"{", b":")
MAX_SIMPLE_KEY: Final = 1000  # go-yaml's 1024 characters from a key's start to its ':'


class _Raw:
    """A JSON number or constant: its text, read as a plain YAML scalar."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Pairs(list[tuple[str, Any]]):
    """A JSON object's members in order, duplicates kept (go-yaml refuses them)."""

    __slots__ = ()


class _NotSame(Exception):
    """The JSON text may mean something else to go-yaml."""


def json_root(data: bytes, budget: Budget) -> Node | None:
    """The document of a ``.json`` file as a tree, or None when it should take the YAML
    path (not JSON, or text go-yaml could read otherwise)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    # Not a mapping at the top: the YAML path refuses it at its first node. (Looked at on
    # the bytes: a hostile file costs no copy.)
    if _JSON_OBJECT_START.match(data) is None or not data[-64:].rstrip(b" \r\n").endswith(b"}"):
        return None
    # Every value but the first follows one of these marks: the count bounds the objects
    # json would build, before it builds them. More than the budget allows: the YAML path
    # streams it and may refuse it early (an unknown field, a wrong type) at no cost.
    values = sum(data.count(mark) for mark in _VALUE_MARKS) + 1
    if values > budget.left:
        return None
    budget.take(values)

    def pairs(items: list[tuple[str, Any]]) -> _Pairs:
        if any(len(key) > MAX_SIMPLE_KEY for key, _ in items):
            raise _NotSame
        return _Pairs(items)

    try:
        text = data.decode("utf-8")
        value = json.loads(
            text, object_pairs_hook=pairs, parse_int=_Raw, parse_float=_Raw, parse_constant=_Raw
        )
        if _NOT_YAML_TEXT.search(text):  # after json, which refuses most files sooner
            return None
        return _json_node(value)
    except (ValueError, RecursionError, _NotSame):  # UnicodeDecodeError is a ValueError
        return None


_JSON_OBJECT_START: Final = re.compile(rb"[ \r\n]*\{")


def _json_node(value: Any) -> Node:
    if isinstance(value, str):
        return Node(SCALAR, STR_TAG, value, DOUBLE_QUOTED, 0)
    if isinstance(value, _Raw) or value is None or isinstance(value, bool):
        text = value.text if isinstance(value, _Raw) else json.dumps(value)
        return Node(SCALAR, _resolve("", text)[0], text, 0, 0)
    if not isinstance(value, _Pairs):
        node = Node(SEQUENCE, SEQ_TAG, "", FLOW, 0)
        node.content = [_json_node(item) for item in value]
        return node
    node = Node(MAPPING, MAP_TAG, "", FLOW, 0)
    node.content = []
    for key, item in value:
        node.content.append(Node(SCALAR, STR_TAG, key, DOUBLE_QUOTED, 0))
        node.content.append(_json_node(item))
    return node
