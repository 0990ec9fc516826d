"""One benchmark row: a figure, and when it has one, its floor and the ratio to it."""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]


def floor_row(
    area: str,
    metric: str,
    value: float,
    unit: str,
    floor: float | None = None,
    extra: str = "",
    *,
    floor_unit: str | None = None,
    ratio_digits: int = 2,
) -> Row:
    """The row of ``metric``; its note starts with the floor (in ``floor_unit``, by default
    the figure's own) and the ratio to it, then ``extra``."""
    note = extra
    if floor is not None:
        ratio = f"{value / floor:.{ratio_digits}f}x" if floor > 0 else "n/a"
        shown_unit = unit if floor_unit is None else floor_unit
        note = f"floor {floor:.3f} {shown_unit} ({ratio})" + (f"; {extra}" if extra else "")
    return {"area": area, "metric": metric, "value": value, "unit": unit, "note": note}
