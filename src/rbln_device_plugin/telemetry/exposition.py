"""OpenTelemetry metrics data -> the Prometheus text exposition format (version 0.0.4).

Names follow OpenTelemetry's Prometheus compatibility rules, as a collector would
translate the same OTLP data: characters outside ``[a-zA-Z0-9_:]`` become ``_``, the
unit is appended as a word (``s`` -> ``_seconds``; annotations such as ``{device}``
add nothing), a monotonic sum is a counter ending in ``_total``, any other sum or a gauge
is a gauge, and a histogram gives cumulative ``_bucket`` series with ``le`` plus
``_sum`` and ``_count``. Attribute keys become label names by the same character rule.

The resource's attributes become one ``target_info`` gauge (OpenTelemetry's rule for a
pull exporter), so a query can join them in. Two things the SDK cannot express are done
here: histogram series that should exist at 0 before their first observation (the SDK
has no data point until something is recorded).

Pure: plain SDK data in, text out (the endpoint and the tests share it).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
TARGET_INFO: Final = "target_info"

_INVALID_NAME_CHARS: Final = re.compile(r"[^a-zA-Z0-9_:]+")
_INVALID_LABEL_CHARS: Final = re.compile(r"[^a-zA-Z0-9_]+")
_UNIT_WORDS: Final[Mapping[str, str]] = {
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "min": "minutes",
    "h": "hours",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "%": "percent",
}


def _sanitize(name: str, pattern: re.Pattern[str]) -> str:
    text = pattern.sub("_", name)
    return "_" + text if text[:1].isdigit() else text


def unit_word(unit: str, *, gauge: bool) -> str:
    """The suffix a unit adds to a name ("" for none or a ``{...}`` annotation)."""
    unit = re.sub(r"\{[^}]*\}", "", unit).strip()
    if not unit:
        return ""
    if unit == "1":
        return "ratio" if gauge else ""
    return _UNIT_WORDS.get(unit, _sanitize(unit, _INVALID_LABEL_CHARS).strip("_"))


def metric_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus family name of an instrument; ``kind`` is counter, gauge or histogram."""
    base = _sanitize(name, _INVALID_NAME_CHARS)
    word = unit_word(unit, gauge=kind == "gauge")
    if word and not base.endswith(f"_{word}"):
        base = f"{base}_{word}"
    if kind == "counter" and not base.endswith("_total"):
        base += "_total"
    return base


def label_name(key: str) -> str:
    return _sanitize(key, _INVALID_LABEL_CHARS)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(attributes: Mapping[str, Any] | None, extra: tuple[str, str] | None = None) -> str:
    block = _label_block(tuple(attributes.items()) if attributes else ())
    if extra is None:
        return block
    pair = f'{extra[0]}="{_escape(extra[1])}"'
    return f"{block[:-1]},{pair}}}" if block else f"{{{pair}}}"


@functools.lru_cache(maxsize=4096)
def _label_block(items: tuple[tuple[str, Any], ...]) -> str:
    """``{k="v",...}`` sorted by key; cached, as the same label sets recur on every scrape."""
    if not items:
        return ""
    pairs = sorted((label_name(k), str(v)) for k, v in items)
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _kind(data: Any) -> str:
    kind = type(data).__name__
    if kind == "Histogram":
        return "histogram"
    if kind == "Sum" and data.is_monotonic:
        return "counter"
    return "gauge"  # Gauge, and a non-monotonic Sum (an up-down counter)


@dataclass(frozen=True, slots=True)
class ZeroHistogram:
    """A histogram series shown at 0 until the SDK has a data point for it."""

    name: str  # the instrument's name, as the SDK reports it
    unit: str
    description: str
    bounds: Sequence[float]
    attributes: Mapping[str, str]

    @property
    def count(self) -> int:
        return 0

    @property
    def sum(self) -> int:
        return 0

    @property
    def explicit_bounds(self) -> Sequence[float]:
        return self.bounds

    @property
    def bucket_counts(self) -> Sequence[int]:
        return [0] * (len(self.bounds) + 1)


def _histogram_lines(name: str, point: Any) -> Iterable[str]:
    cumulative = 0
    bounds: Sequence[float] = point.explicit_bounds
    for bound, count in zip([*bounds, math.inf], point.bucket_counts, strict=True):
        cumulative += count
        le = ("le", format_value(float(bound)))
        yield f"{name}_bucket{_labels(point.attributes, le)} {cumulative}"
    yield f"{name}_sum{_labels(point.attributes)} {format_value(point.sum)}"
    yield f"{name}_count{_labels(point.attributes)} {point.count}"


def render(metrics_data: Any, zeros: Sequence[ZeroHistogram] = ()) -> str:
    """Every metric of an SDK ``MetricsData`` as exposition text (families sorted by name).

    ``zeros`` are added where the data has no point with their attributes.
    """
    families: dict[str, tuple[str, str, list[str]]] = {}
    seen: set[tuple[str, str]] = set()
    target: dict[str, str] = {}
    if metrics_data is None:
        return ""
    for resource_metrics in metrics_data.resource_metrics:
        target.update((k, str(v)) for k, v in resource_metrics.resource.attributes.items())
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = _kind(metric.data)
                name = metric_name(metric.name, metric.unit or "", kind)
                _, _, lines = families.setdefault(name, (kind, metric.description or "", []))
                for point in metric.data.data_points:
                    if kind == "histogram":
                        seen.add((name, _labels(point.attributes)))
                        lines.extend(_histogram_lines(name, point))
                    else:
                        lines.append(f"{name}{_labels(point.attributes)} "
                                     f"{format_value(point.value)}")  # fmt: skip
    for zero in zeros:
        name = metric_name(zero.name, zero.unit, "histogram")
        if (name, _labels(zero.attributes)) in seen:
            continue
        _, _, lines = families.setdefault(name, ("histogram", zero.description, []))
        lines.extend(_histogram_lines(name, zero))
    if target and families:
        families[TARGET_INFO] = ("gauge", "Target metadata", [f"{TARGET_INFO}{_labels(target)} 1"])
    out: list[str] = []
    for name in sorted(families):
        kind, description, lines = families[name]
        if not lines:
            continue
        if description:
            out.append(f"# HELP {name} {_escape_help(description)}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(lines)
    return "\n".join(out) + "\n" if out else ""
