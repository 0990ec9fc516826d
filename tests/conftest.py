"""Shared fixtures: short temporary directories (unix socket paths are limited to 107
bytes, so pytest's deep tmp_path is not always usable) and a daemon subprocess runner."""

from __future__ import annotations

import shutil
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
