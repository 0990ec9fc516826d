"""A strict JSON Schema for the Prometheus Operator PrometheusRule the chart renders
(monitoring.coreos.com/v1), for the chart tests: Kubernetes' own schemas do not know the
CRD. Field names, required keys and the duration pattern follow the operator's CRD
(``prometheusrules.monitoring.coreos.com``, operator 0.82); every object is closed, so a
misspelt or misplaced field fails as a strict apply would."""

from __future__ import annotations

from typing import Any, Final

_DURATION: Final = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
    r"(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_STRINGS: Final = {"type": "object", "additionalProperties": {"type": "string"}}


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "required": list(required)}  # fmt: skip


_RULE: Final = _closed(
    {
        "alert": {"type": "string"},
        "record": {"type": "string"},
        "expr": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "for": _DURATION,
        "keep_firing_for": {**_DURATION, "minLength": 1},
        "labels": _STRINGS,
        "annotations": _STRINGS,
    },
    ("expr",),
)
_GROUP: Final = _closed(
    {
        "name": {"type": "string", "minLength": 1},
        "interval": _DURATION,
        "query_offset": _DURATION,
        "limit": {"type": "integer"},
        "labels": _STRINGS,
        "partial_response_strategy": {"type": "string"},
        "rules": {"type": "array", "items": _RULE},
    },
    ("name",),
)
PROMETHEUS_RULE_SCHEMA: Final = _closed(
    {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _closed(
            {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _STRINGS},
            ("name", "namespace"),
        ),
        "spec": _closed({"groups": {"type": "array", "items": _GROUP}}),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)
