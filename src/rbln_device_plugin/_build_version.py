"""The package version, decided when the wheel is built (hatchling's ``code`` version source).

Never imported at run time: the build writes the version into ``_version.py``. The
image build passes its VERSION build argument as RBLN_DEVICE_PLUGIN_VERSION, so ``--version``,
the start record and the traces' ``service.version`` name the version the image is tagged
with. Without the variable the version is DEFAULT.
"""

from __future__ import annotations

import os
import re
from typing import Final

DEFAULT: Final = "0.1.0"
ENV: Final = "RBLN_DEVICE_PLUGIN_VERSION"


def build_version(raw: str | None) -> str:
    """A PEP 440 version for the build VERSION ``raw``.

    A PEP 440 version is used as it is, normalised ("v1.2.0" -> "1.2.0", "1.2.0-rc.1" ->
    "1.2.0rc1"). Anything else (a tag such as "latest" or "main-3f2c1d") becomes a local
    version label on DEFAULT ("0.1.0+main.3f2c1d"), so the build never fails on a tag name
    and the label still shows which build it was.
    """
    from packaging.version import InvalidVersion, Version  # hatchling's own dependency

    text = (raw or "").strip()
    if not text:
        return DEFAULT
    try:
        return str(Version(text))
    except InvalidVersion:
        label = re.sub(r"[^a-z0-9]+", ".", text.lower()).strip(".")
        return f"{DEFAULT}+{label}" if label else DEFAULT


__version__: Final = build_version(os.environ.get(ENV))
