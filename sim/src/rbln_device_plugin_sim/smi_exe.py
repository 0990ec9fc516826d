"""The fake ``rbln-smi`` executable's entry point: the common listing, answered quickly.

The daemon runs ``rbln-smi -j`` on every scan, and the tests' daemons scan every few
hundred milliseconds, so this interpreter starts some thousand times in a test run. A bare
``python -S`` costs about 10 ms of CPU here, ``json`` (with ``re`` and ``enum``) about
10 ms more, and ``smi_tool`` (with ``state``: dataclasses, pathlib, typing) more again.
So a listing, ``-j`` or ``-g -j``, is answered from the listings sidecar that
``StateStore`` writes beside every fault-free state it saves, with ``os`` and ``fcntl``
only, when that sidecar was rendered from exactly the state text now on disk. Anything
else (another command, a fault, a state written behind the store's back, a missing or
damaged sidecar) goes to ``smi_tool.main``, which is the definition of every behaviour:
the sidecar holds what ``smi_tool`` itself rendered (``tests/test_sim_smi.py`` checks
the two agree).
"""

from __future__ import annotations

import fcntl
import os
import sys


def _listing(argv: list[str]) -> bool | None:
    """True for ``-g -j``, False for ``-j``, None for any other command."""
    if argv == ["-j"]:
        return False
    if sorted(argv) == ["-g", "-j"]:
        return True
    return None


def _parts(sidecar: str) -> list[str] | None:
    """The length-prefixed parts of a listings sidecar (``state.listings_text``)."""
    parts = []
    rest = sidecar
    while rest:
        size, newline, rest = rest.partition("\n")
        if not newline or not size.isascii() or not size.isdigit() or len(rest) < int(size):
            return None
        parts.append(rest[: int(size)])
        rest = rest[int(size) :]
    return parts


def answer_from_sidecar(state_text: str, sidecar: str, with_groups: bool) -> str | None:
    """The listing the sidecar holds for this state text, or None when it holds none."""
    parts = _parts(sidecar)
    if parts is None or len(parts) != 3 or parts[0] != state_text:
        return None
    return parts[2] if with_groups else parts[1]


def quick_listing(argv: list[str], state_path: str) -> str | None:
    """The listing ``smi_tool`` would print, or None when it must decide itself."""
    with_groups = _listing(argv)
    if with_groups is None:
        return None
    try:
        # The lock StateStore.read takes: the state and its sidecar are read as one.
        fd = os.open(state_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            with open(state_path, encoding="utf-8") as state_file:
                state_text = state_file.read()
            with open(state_path + ".listings", encoding="utf-8") as sidecar_file:
                sidecar = sidecar_file.read()
        finally:
            os.close(fd)
    except (OSError, ValueError):  # ValueError: not UTF-8
        return None  # smi_tool says what is wrong, with its exit code
    return answer_from_sidecar(state_text, sidecar, with_groups)


def main(argv: list[str], state_path: str) -> int:
    answer = quick_listing(argv, state_path)
    if answer is None:
        from rbln_device_plugin_sim.smi_tool import main as full

        return full(argv, state_path)
    sys.stdout.write(answer)
    return 0
