"""What this plugin prepared, kept across its restarts (pure encoding and decoding).

One JSON document: a version, a SHA-256 checksum of the claims' canonical JSON, and per
claim UID its namespace, name, state and prepared devices. A claim is recorded as
``PrepareStarted`` before any host change and ``PrepareCompleted`` once its CDI spec is
written: after a restart a completed claim is answered from here (its RSD group is not
made again), a started one is prepared again, and an unprepare finds what to remove
either way. ``decode`` refuses a document that does not check out (``CheckpointError``
names what is wrong): a restart must not forget claims silently.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

VERSION: Final = 1
State = Literal["PrepareStarted", "PrepareCompleted"]
STARTED: Final[State] = "PrepareStarted"
COMPLETED: Final[State] = "PrepareCompleted"


class CheckpointError(Exception):
    """The checkpoint file cannot be used; the message names the file and the fault."""


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    namespace: str
    name: str
    state: State
    devices: tuple[PreparedDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    claims: Mapping[str, ClaimEntry] = field(default_factory=dict)

    def with_claim(self, uid: str, entry: ClaimEntry) -> Checkpoint:
        return Checkpoint({**self.claims, uid: entry})

    def without(self, uid: str) -> Checkpoint:
        return Checkpoint({k: v for k, v in self.claims.items() if k != uid})


def _claims_json(claims: Mapping[str, ClaimEntry]) -> dict[str, Any]:
    return {
        uid: {
            "namespace": entry.namespace,
            "name": entry.name,
            "state": entry.state,
            "devices": [
                {
                    "request": d.request,
                    "pool": d.pool,
                    "device": d.device,
                    "cdiDeviceIDs": list(d.cdi_device_ids),
                }
                for d in entry.devices
            ],
        }
        for uid, entry in sorted(claims.items())
    }


def _checksum(claims: Mapping[str, Any]) -> str:
    # Imported here: hashlib maps OpenSSL's libcrypto (about 4 MiB resident), and the
    # device-plugin mode imports this module to look for a checkpoint it rarely finds.
    import hashlib

    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


def encode(checkpoint: Checkpoint) -> bytes:
    claims = _claims_json(checkpoint.claims)
    document = {"version": VERSION, "checksum": _checksum(claims), "claims": claims}
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise CheckpointError(f"{where} is not a string")
    return value


def decode(data: bytes, where: str) -> Checkpoint:
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{where}: not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise CheckpointError(f"{where}: not a JSON object")
    if document.get("version") != VERSION:
        raise CheckpointError(
            f"{where}: version {document.get('version')!r}, this plugin reads {VERSION}"
        )
    claims = document.get("claims")
    if not isinstance(claims, dict):
        raise CheckpointError(f"{where}: no claims object")
    if document.get("checksum") != _checksum(claims):
        raise CheckpointError(f"{where}: checksum mismatch (the file was changed or cut)")
    entries: dict[str, ClaimEntry] = {}
    for uid, raw in claims.items():
        at = f"{where}: claim {uid}"
        if not isinstance(raw, dict) or raw.get("state") not in (STARTED, COMPLETED):
            raise CheckpointError(f"{at}: no valid state")
        devices = []
        for device in raw.get("devices") or []:
            if not isinstance(device, dict) or not isinstance(device.get("cdiDeviceIDs"), list):
                raise CheckpointError(f"{at}: a device is malformed")
            devices.append(
                PreparedDevice(
                    _text(device.get("request"), f"{at}: request"),
                    _text(device.get("pool"), f"{at}: pool"),
                    _text(device.get("device"), f"{at}: device"),
                    tuple(_text(i, f"{at}: CDI device ID") for i in device["cdiDeviceIDs"]),
                )
            )
        entries[uid] = ClaimEntry(
            _text(raw.get("namespace"), f"{at}: namespace"),
            _text(raw.get("name"), f"{at}: name"),
            raw["state"],
            tuple(devices),
        )
    return Checkpoint(entries)
