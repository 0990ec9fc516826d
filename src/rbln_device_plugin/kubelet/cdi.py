"""CDI wiring: how each container's CDI device is named, and stale-spec cleanup.

The plugin writes no CDI spec of its own: the container toolkit provides ``rbln.yaml``
(kind ``rebellions.ai/npu``, device ``runtime``). Each container answer names that device
as ``--cdi-mode`` says: the ``cdi.k8s.io/...`` annotation (as the Go plugin does), the
device plugin API's ``cdi_devices`` field (the kubelet hands it to the runtime as CRI
``CDIDevices``), or both. Transient specs that an older plugin generation left behind
are removed at start and after a kubelet restart.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from rbln_device_plugin.api.v1beta1 import api_pb2
from rbln_device_plugin.model.cdispec import REFERENCED_DEVICES, RUNTIME_DEVICE
from rbln_device_plugin.telemetry.logs import get_logger

ANNOTATION_KEY: Final = "cdi.k8s.io/rebellions.ai_npu"
ANNOTATION_VALUE: Final = RUNTIME_DEVICE
TRANSIENT_SPEC_PREFIX: Final = "rebellions.ai-npu_"

log = get_logger()


def container_annotations() -> dict[str, str]:
    return {ANNOTATION_KEY: ANNOTATION_VALUE}


def container_response(mode: str) -> api_pb2.ContainerAllocateResponse:
    """An answer carrying the CDI device as ``mode`` (a ``config.CDI_MODES`` value) says."""
    response = api_pb2.ContainerAllocateResponse()
    if mode in ("annotation", "both"):
        response.annotations.update(container_annotations())
    if mode in ("field", "both"):
        for name in REFERENCED_DEVICES:
            response.cdi_devices.add(name=name)
    return response


def remove_transient_specs(cdi_root: Path) -> int:
    """Delete regular files named ``rebellions.ai-npu_*`` in the CDI root; return the count.

    Symlinks and directories are left alone; a failure is logged and does not stop the
    daemon (a stale spec only matters to the runtime, not to scheduling).
    """
    removed = 0
    try:
        entries = list(os.scandir(cdi_root))
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.warning("Cannot list CDI root; stale specs not cleaned", path=str(cdi_root), err=exc)
        return 0
    for entry in entries:
        if not entry.name.startswith(TRANSIENT_SPEC_PREFIX):
            continue
        try:
            if not stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
                continue
            os.unlink(entry.path)
            removed += 1
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("Cannot remove stale CDI spec", path=entry.path, err=exc)
    if removed:
        log.info("Removed stale CDI specs", path=str(cdi_root), count=removed)
    return removed
