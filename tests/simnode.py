"""A simulated node + kubelet stub + the real daemon process, for end-to-end tests."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import grpc
import pytest

from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import Layout, preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir

from .daemon_process import DaemonProcess


@dataclass
class Harness:
    node: SimNode
    kubelet: KubeletStub
    daemon: DaemonProcess

    def sockets(self) -> list[str]:
        return sorted(p.name for p in self.node.kubelet_dir.iterdir() if p.is_socket())


@asynccontextmanager
async def running(
    layout: str | Layout,
    interval: str = "300ms",
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    level: str = "debug",
    prepare: Callable[[SimNode], None] = lambda _: None,
) -> AsyncIterator[Harness]:
    """``prepare`` changes the node before the daemon starts."""
    root = short_tempdir()
    node = materialize(preset(layout) if isinstance(layout, str) else layout, root)
    prepare(node)
    kubelet = KubeletStub(node.kubelet_dir)
    await kubelet.start()
    daemon = DaemonProcess([*node.daemon_args(interval), *extra_args], env=env, level=level)
    try:
        yield Harness(node, kubelet, daemon)
    finally:
        daemon.kill()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


class WithKubelet(Protocol):
    kubelet: KubeletStub


async def rejected(h: WithKubelet, resource: str, containers: list[list[str]]) -> str:
    """Allocate through the kubelet stub, expecting INVALID_ARGUMENT; returns its message."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await h.kubelet.allocate(resource, containers)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return caught.value.details() or ""
