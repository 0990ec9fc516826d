"""Ending a helper process that tests and benchmarks started."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``; reaped either way."""
    proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
