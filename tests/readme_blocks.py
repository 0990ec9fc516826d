"""The README's shell blocks as data: commands, the output shown for them, and matching.

A ```console block holds commands after a ``$ `` prompt (continued with a trailing
backslash) and, under each, the output the README shows for it. A ```sh block holds
commands only. In shown output a line ``...`` stands for any number of lines. Before
comparing, what differs from run to run is replaced on both sides: clock times,
durations, process IDs and the demo's random temporary directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ELLIPSIS = "..."
_FENCE = re.compile(r"^```(\w*)\s*$")
_VARYING = (
    (re.compile(r"\b\d\d:\d\d:\d\d\b"), "HH:MM:SS"),
    (re.compile(r"\b\d+(?:\.\d+)? (ms|s)\b"), r"N \1"),
    (re.compile(r"\b(durationMs|waitedSeconds)=[\d.]+"), r"\1=N"),
    (re.compile(r"\bpid \d+"), "pid N"),
    (re.compile(r"rbln-demo-[a-z0-9_]{8}\b"), "rbln-demo-XXXXXXXX"),
)
_EXIT = re.compile(r"# exit (\d+)\s*$")


@dataclass(frozen=True, slots=True)
class Command:
    text: str  # as printed, continuation lines included, prompt removed
    shown: tuple[str, ...] | None  # the output the README shows; None: not shown (sh)
    section: str

    @property
    def expected_exit(self) -> int:
        """0, unless the command says ``# exit N`` or its shown output ends ``(exit N)``."""
        found = _EXIT.search(self.text)
        if found:
            return int(found.group(1))
        if self.shown:
            last = re.search(r"\(exit (\d+)\)$", self.shown[-1])
            if last:
                return int(last.group(1))
        return 0


def sections(readme: str, titles: tuple[str, ...]) -> dict[str, str]:
    """Each titled section's text, up to the next heading of its level or above."""
    out: dict[str, str] = {}
    for title in titles:
        level = len(title) - len(title.lstrip("#"))
        start = readme.index(f"\n{title}\n")
        ends = [
            found
            for depth in range(2, level + 1)
            if (found := readme.find("\n" + "#" * depth + " ", start + 1)) >= 0
        ]
        out[title] = readme[start : min(ends, default=len(readme))]
    return out


def commands(text: str, section: str) -> list[Command]:
    found: list[Command] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        index += 1
        if fence is None or fence.group(1) not in ("console", "sh"):
            if fence is not None:  # another kind of block: skip it whole
                while index < len(lines) and not lines[index].startswith("```"):
                    index += 1
                index += 1
            continue
        block: list[str] = []
        while not lines[index].startswith("```"):
            block.append(lines[index])
            index += 1
        index += 1
        if fence.group(1) == "console":
            found += _console(block, section)
        else:
            found += _sh(block, section)
    return found


def _console(block: list[str], section: str) -> list[Command]:
    out: list[Command] = []
    index = 0
    while index < len(block):
        assert block[index].startswith("$ "), f"output before a prompt: {block[index]!r}"
        text = [block[index][2:]]
        while text[-1].endswith("\\"):
            index += 1
            text.append(block[index])
        index += 1
        shown: list[str] = []
        while index < len(block) and not block[index].startswith("$ "):
            shown.append(block[index])
            index += 1
        out.append(Command("\n".join(text), tuple(shown), section))
    return out


def _sh(block: list[str], section: str) -> list[Command]:
    out: list[Command] = []
    text: list[str] = []
    for line in block:
        if not text and (not line.strip() or line.lstrip().startswith("#")):
            continue
        text.append(line)
        if not line.endswith("\\"):
            out.append(Command("\n".join(text), None, section))
            text = []
    return out


def normalise(text: str) -> str:
    for pattern, replacement in _VARYING:
        text = pattern.sub(replacement, text)
    return text.rstrip()


def mismatch(shown: tuple[str, ...], actual: str) -> str | None:
    """Why ``actual`` is not what the README shows (``...`` matching any lines), or None."""
    want = [normalise(line) for line in shown]
    got = [normalise(line) for line in actual.rstrip("\n").splitlines()]
    while want and not want[-1]:
        want.pop()

    def match(w: int, g: int) -> bool:
        if w == len(want):
            return g == len(got)
        if want[w] == ELLIPSIS:
            return any(match(w + 1, k) for k in range(g, len(got) + 1))
        return g < len(got) and got[g] == want[w] and match(w + 1, g + 1)

    if match(0, 0):
        return None
    return "README shows:\n" + "\n".join(want) + "\n\nthe command printed:\n" + "\n".join(got)


def readme(path: Path) -> str:
    return path.read_text(encoding="utf-8")
