"""Commands printed for a reader to paste: spelled the way this program was started.

Started as ``.venv/bin/rbln-device-plugin-sim`` from a clone, the banners print
``.venv/bin/rbln-device-plugin ...``; started from ``PATH`` (an activated venv), the bare
names; started some other way (``python -m``, a test), the interpreter and the module. So
whatever the reader typed to get here, what they are told to type next works in the same
shell, from the same directory.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

SIM_PROG: Final = "rbln-device-plugin-sim"
DAEMON_PROG: Final = "rbln-device-plugin"
_MODULES: Final = {SIM_PROG: "rbln_device_plugin_sim", DAEMON_PROG: "rbln_device_plugin"}
# Past this width a command is printed one flag and value per continuation line.
_WIDTH: Final = 88


def program(name: str, argv0: str | None = None) -> list[str]:
    """The words that run console script ``name`` (one of ours) from here."""
    started = sys.argv[0] if argv0 is None else argv0
    if Path(started).name == SIM_PROG:
        sibling = Path(started).parent / name
        on_path = shutil.which(name)
        if on_path is not None and _same_file(on_path, sibling):
            return [name]
        if os.access(sibling, os.X_OK):
            return [str(sibling)]
    return [sys.executable, "-m", _MODULES[name]]


def relative() -> bool:
    """True when the printed commands only work from the current directory."""
    return not Path(program(SIM_PROG)[0]).is_absolute() and "/" in program(SIM_PROG)[0]


def command(name: str, args: Sequence[str], indent: str = "") -> str:
    """One pasteable command running our program ``name``; see ``wrap``."""
    return wrap([*program(name), *args], indent, head=len(program(name)))


def wrap(words: Sequence[str], indent: str = "", head: int = 1) -> str:
    """``words`` quoted for a shell; past _WIDTH, continued with backslashes, never
    splitting a flag from its value (the first ``head`` words start the first line)."""
    line = indent + shlex.join(words)
    if len(line) <= _WIDTH:
        return line
    args = list(words[head:])
    # Units that stay on one line: a flag with its value, or one word.
    units: list[str] = []
    index = 0
    while index < len(args):
        pair = args[index : index + 2]
        if len(pair) == 2 and pair[0].startswith("--") and not pair[1].startswith("--"):
            units.append(shlex.join(pair))
            index += 2
        else:
            units.append(shlex.quote(args[index]))
            index += 1
    lines = [indent + shlex.join(words[:head])]
    for unit in units:
        if len(lines[-1]) + 1 + len(unit) + 2 > _WIDTH:
            lines[-1] += " \\"
            lines.append(f"{indent}    {unit}")
        else:
            lines[-1] += f" {unit}"
    return "\n".join(lines)


def sim(*args: str, indent: str = "") -> str:
    return command(SIM_PROG, args, indent)


def daemon(args: Sequence[str], indent: str = "") -> str:
    return command(DAEMON_PROG, args, indent)


def _same_file(a: str, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
