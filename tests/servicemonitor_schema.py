"""A strict JSON Schema for the part of a Prometheus Operator ServiceMonitor the chart
renders (monitoring.coreos.com/v1), for the chart tests: Kubernetes' own schemas do not
know the CRD, and the whole CRD schema is far larger than what the chart uses.

Field names, the required keys and the duration pattern follow the operator's CRD
(``servicemonitors.monitoring.coreos.com``, operator 0.84); every object here is closed,
so a misspelt or misplaced field fails like Kubernetes' strict validation would.
"""

from __future__ import annotations

from typing import Any, Final

_DURATION: Final = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
    r"(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_STRINGS: Final = {"type": "object", "additionalProperties": {"type": "string"}}
_LABEL_NAME: Final = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "required": list(required),
    }


SERVICE_MONITOR_SCHEMA: Final = _closed(
    {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _closed(
            {
                "name": {"type": "string", "minLength": 1},
                "namespace": {"type": "string"},
                "labels": _STRINGS,
                "annotations": _STRINGS,
            },
            ("name",),
        ),
        "spec": _closed(
            {
                "selector": _closed({"matchLabels": _STRINGS}),
                "namespaceSelector": _closed(
                    {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    }
                ),
                "jobLabel": {"type": "string"},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _closed(
                        {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {
                                "type": "array",
                                "items": _closed(
                                    {
                                        "action": {
                                            "enum": [
                                                "replace",
                                                "Replace",
                                                "keep",
                                                "Keep",
                                                "drop",
                                                "Drop",
                                                "labelmap",
                                                "LabelMap",
                                            ]
                                        },
                                        "sourceLabels": {"type": "array", "items": _LABEL_NAME},
                                        "targetLabel": {"type": "string"},
                                        "regex": {"type": "string"},
                                        "replacement": {"type": "string"},
                                        "separator": {"type": "string"},
                                    }
                                ),
                            },
                        }
                    ),
                },
            },
            ("endpoints", "selector"),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)
