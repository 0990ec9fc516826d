"""The benchmarks' command lines, parsed by argparse: ``--help`` or a mistyped flag
never starts a run of several minutes."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser with the flag every benchmark takes; add a module's own to it."""
    first_paragraph = (doc or "").strip().split("\n\n")[0]
    p = argparse.ArgumentParser(
        description=first_paragraph, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="shorter runs: a smoke run, not figures to report"
    )
    return p


def idle_window(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--idle-window", type=float, default=None, metavar="SECONDS",
        help="the fast-rbln-smi idle window (default: 600 s, 15 s with --quick)",
    )  # fmt: skip


def quick(doc: str | None, argv: Sequence[str] | None = None) -> bool:
    """``--quick`` for a benchmark that takes no other flag."""
    return bool(parser(doc).parse_args(argv).quick)
