"""How a second ``rbln-device-plugin-sim`` process drives the kubelet stand-in of ``serve``.

``serve`` listens on ``<root>/sim-control.sock`` (beside the node, outside the kubelet
directory that a kubelet restart empties). A client connects, writes one JSON request
line, reads one JSON answer line and disconnects: no state between requests, nothing to
leak, and a ``serve`` that died leaves a socket nobody answers, which the next ``serve``
on that root replaces. The requests are what a kubelet does to a plugin:
``preferred`` (GetPreferredAllocation), ``allocate`` (optionally choosing the devices
through GetPreferredAllocation first, as the kubelet does) and ``restart`` (a kubelet
restart, waiting for the plugins to register again); ``status`` lists what is registered.
"""

from __future__ import annotations

import json
import shlex
import socket
from pathlib import Path
from typing import Any, Final

from rbln_device_plugin_sim import shell
from rbln_device_plugin_sim.tree import SimError

SOCKET_NAME: Final = "sim-control.sock"
# Allocate can wait 5 s for the RSD lock and 5 s for a device node, then run rbln-smi.
CLIENT_TIMEOUT_S: Final = 60.0
REREGISTER_WAIT_S: Final = 10.0

Answer = dict[str, Any]


def socket_path(root: Path) -> Path:
    return root / SOCKET_NAME


# ----------------------------------------------------------------------------- client


def request(root: Path, payload: dict[str, Any], timeout: float = CLIENT_TIMEOUT_S) -> Answer:
    """Send one request to the ``serve`` running on ``root``; SimError when none runs."""
    path = socket_path(root)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            serve = shlex.join([*shell.program(shell.SIM_PROG), "serve", "--root", str(root)])
            raise SimError(
                f"no `serve` is running on {root} (nothing answers on {path}); start one "
                f"in another shell first: {serve}"
            ) from None
        conn.sendall(json.dumps(payload).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data:
        raise SimError(f"`serve` on {root} closed the connection without an answer")
    answer: Answer = json.loads(data)
    if not answer.get("ok"):
        raise SimError(str(answer.get("error", "unknown error")))
    return answer


def in_use(root: Path) -> bool:
    """True when a live ``serve`` answers on this root's control socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(socket_path(root)))
        except OSError:
            return False
    return True
