"""Table text for ``inspect``: printable one-line cells and aligned columns (pure).

Text that comes from the host (names, bus IDs, paths, error messages) goes through
``cell``, so a hostile rbln-smi or file name cannot move the cursor or forge lines on an
operator's terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

CELL_MAX: Final = 72
DASH: Final = "-"


def columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [len(title) for title in header]
    for row in rows:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))

    def line(cells: Sequence[str]) -> str:
        padded = [text.ljust(widths[i]) for i, text in enumerate(cells[:-1])]
        return "  ".join([*padded, cells[-1]]).rstrip()

    return [line(header), *(line(row) for row in rows)]


def cell(text: str, limit: int = CELL_MAX) -> str:
    """One line of printable text: control characters escaped, long text shortened."""
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
