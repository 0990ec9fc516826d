"""The ``text`` log format: one logfmt line per record that logfmt readers read back.

Keys come in the record's order. A value is written bare when it can be (no space, "=",
quote, backslash or unprintable character), else quoted with JSON's string escapes,
which are the ones go-logfmt (and Loki's logfmt parser) decode. Nested values become
compact JSON first, so a reader gets the configuration as JSON, not a Python repr.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from typing import Any


def value(raw: Any) -> str:
    """One value as logfmt readers (go-logfmt, Loki's logfmt parser) read it back.

    Nested values (the start record's configuration, lists of names) become compact
    JSON. A value with a space, "=", a quote, a backslash or anything unprintable is
    quoted with JSON's escapes, which are the ones go-logfmt decodes, so it reads back
    exactly as written and never spans two lines.
    """
    if raw is None:
        return ""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, Mapping | list | tuple | set | frozenset):
        if isinstance(raw, set | frozenset):
            raw = sorted(raw, key=str)
        text = json.dumps(raw, separators=(",", ":"), default=str, ensure_ascii=False)
    else:
        text = str(raw)
    if text and all(ch > " " and ch not in '="\\' and ch.isprintable() for ch in text):
        return text
    quoted = json.dumps(text, ensure_ascii=False)
    if quoted.isprintable():
        return quoted
    return "".join(ch if ch.isprintable() else _json_escape(ch) for ch in quoted)


def _json_escape(ch: str) -> str:
    """``\\uXXXX`` (a surrogate pair above U+FFFF), as JSON writes it."""
    return json.dumps(ch, ensure_ascii=True)[1:-1]


def render(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> str:
    """structlog's last processor for the ``text`` format: one logfmt line."""
    return " ".join(f"{key}={value(raw)}" for key, raw in event_dict.items())
