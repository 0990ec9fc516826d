"""Shared fixtures: short temporary directories (unix socket paths are limited to 107
bytes, so pytest's deep tmp_path is not always usable) and a loaded machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rbln-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """Tests that install the daemon's logger must not change what the next test sees."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def loaded_machine() -> Iterator[int]:
    """One busy-loop process per core for the test's duration: timing bounds that only
    hold on an idle machine fail here. Yields the number of busy processes."""
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield len(busy)
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
