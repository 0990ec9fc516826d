"""The daemon's client channels to the kubelet's unix sockets (registration, PodResources).

Each gets a subchannel of its own. gRPC's process-wide subchannel pool shares one
connection among every open channel to the same address, with its reconnect backoff: a
channel opened while another to the same socket is still failing (a registration of
another resource during a kubelet restart) fails at once with the old error, although
the kubelet answers by then. Its own subchannel connects afresh. Each call here opens a
channel for one RPC and closes it, so nothing is lost by not sharing.
"""

from __future__ import annotations

from pathlib import Path

import grpc

OWN_SUBCHANNEL = ("grpc.use_local_subchannel_pool", 1)


def kubelet_channel(socket: Path) -> grpc.aio.Channel:
    """A channel to ``socket`` that connects on its own (use as ``async with``)."""
    return grpc.aio.insecure_channel(f"unix:{socket}", options=[OWN_SUBCHANNEL])
