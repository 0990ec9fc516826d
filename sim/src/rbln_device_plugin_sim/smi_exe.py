"""The fake ``rbln-smi`` executable's entry point: the common listing, answered quickly.

The daemon runs ``rbln-smi -j`` on every scan, and the tests' daemons scan every few
hundred milliseconds, so this interpreter starts some thousand times in a test run.
``smi_tool`` (with ``state``) costs about twice a bare interpreter's start-up in imports
(dataclasses, pathlib, typing). So a listing, ``-j`` or ``-g -j``, from a state file that
holds no fault and has the simulator's own shape is answered here with ``json``, ``os``
and ``fcntl`` only. Anything else, and any state this check is not sure of, goes to
``smi_tool.main``, which is the definition of every behaviour (faults, groups, errors and
their exit codes); this path gives byte for byte what it would have given
(``tests/test_sim_smi.py`` compares the two).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys


def _listing(argv: list[str]) -> bool | None:
    """True for ``-g -j``, False for ``-j``, None for any other command."""
    if argv == ["-j"]:
        return False
    if sorted(argv) == ["-g", "-j"]:
        return True
    return None


def quick_listing(argv: list[str], state_path: str) -> str | None:
    """The listing ``smi_tool`` would print, or None when it must decide itself."""
    with_groups = _listing(argv)
    if with_groups is None:
        return None
    try:
        # The lock StateStore.read takes: a writer's rename is never half seen anyway,
        # but a reader under it also never overtakes a transaction in progress.
        fd = os.open(state_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            with open(state_path, encoding="utf-8") as state_file:
                text = state_file.read()
        finally:
            os.close(fd)
        data = json.loads(text)
    except (OSError, ValueError):
        return None  # smi_tool says what is wrong, with its exit code
    if not (
        type(data) is dict
        and "KMD_version" in data
        and "dev_root" in data
        and type(data.get("devices")) is list
        and all(type(rec) is dict for rec in data["devices"])
        and data.get("faults", []) == []
        and (data.get("char_major") is None or type(data["char_major"]) is int)
    ):
        return None
    devices = []
    for rec in data["devices"]:
        out = dict(rec)
        if not with_groups:
            out.pop("group_id", None)
        devices.append(out)
    listing = {"KMD_version": str(data["KMD_version"]), "devices": devices}
    return json.dumps(listing, indent=4) + "\n"


def main(argv: list[str], state_path: str) -> int:
    answer = quick_listing(argv, state_path)
    if answer is None:
        from rbln_device_plugin_sim.smi_tool import main as full

        return full(argv, state_path)
    sys.stdout.write(answer)
    return 0
