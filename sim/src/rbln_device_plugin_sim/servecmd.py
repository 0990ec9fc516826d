"""``serve``: the node, a kubelet stand-in, and a banner of commands to paste next."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from collections.abc import Callable

from rbln_device_plugin.model.inventory import RESOURCE_NPU, VF_RESOURCES, is_supported_product
from rbln_device_plugin_sim import control, shell
from rbln_device_plugin_sim.controlserver import ControlServer
from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import Layout, SimDevice
from rbln_device_plugin_sim.node import SimError, SimNode
from rbln_device_plugin_sim.nodecmds import open_or_build


def serve(args: argparse.Namespace) -> int:
    root = args.root.absolute()
    if control.in_use(root):
        raise SimError(f"a `serve` is already running on {root}; use that one or stop it first")
    node, done = open_or_build(args, reopen=True)

    def event(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')}  {text}", flush=True)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with KubeletStub(node.kubelet_dir, on_event=event) as stub:
            controller = ControlServer(node.root, stub, event)
            await controller.start()
            # Only now: everything the banner names is listening.
            print(banner(node, done), flush=True)
            watcher = asyncio.create_task(_report_lists(stub, event))
            try:
                await stop.wait()
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
                await controller.stop()

    asyncio.run(run())
    print(f"stopped; the node stays under {node.root}")
    return 0


def banner(node: SimNode, done: str) -> str:
    root = str(node.root)
    where = " (from this directory)" if shell.relative() else ""
    lines = [
        f"node {node.layout.name}: {len(node.layout.devices)} devices under {root}, {done}",
        f"kubelet stand-in: {node.kubelet_dir}/kubelet.sock",
        "",
        f"In a second shell{where}, start the daemon against this node:",
        "",
        shell.daemon(node.daemon_args(), indent="  "),
        "",
        f"In a third shell{where}, act as the kubelet or change the node, for example:",
        "",
    ]
    device = advertised_example(node.layout)
    if device is not None:
        resource = resource_of(node.layout, device)
        size = str(min(2, len([d for d in node.layout.devices if _advertised(node.layout, d)
                               and resource_of(node.layout, d) == resource])))  # fmt: skip
        extra = [] if resource == RESOURCE_NPU else ["--resource", resource]
        lines += [
            shell.sim("allocate", "--root", root, "--size", size, *extra, indent="  "),
            shell.sim("set-status", "--root", root, device.name, "4", indent="  ")
            + f"   # {device.name} FAULT",
        ]
    lines += [
        shell.sim("restart-kubelet", "--root", root, indent="  "),
        "",
        "Kubelet stand-in events follow; Ctrl-C stops it (the node stays).",
    ]
    return "\n".join(lines)


def advertised_example(layout: Layout) -> SimDevice | None:
    """A device the daemon advertises on this node: a plain PF first, else a VF."""
    candidates = [d for d in layout.devices if _advertised(layout, d)]
    return next((d for d in candidates if not d.is_vf), candidates[0] if candidates else None)


def resource_of(layout: Layout, device: SimDevice) -> str:
    if device.physfn is None:
        return RESOURCE_NPU
    parent = layout.by_bus_id(device.physfn)
    count = (parent.sriov_numvfs if parent is not None else None) or 0
    return VF_RESOURCES.get(count, f"{RESOURCE_NPU}-vf{count or '?'}")


def _advertised(layout: Layout, device: SimDevice) -> bool:
    """The plugin's rules, as far as the layout shows them (a test checks with inspect)."""
    if not device.listed or not is_supported_product(device.product):
        return False
    if device.physfn is None:
        return not device.sriov_numvfs
    parent = layout.by_bus_id(device.physfn)
    return parent is not None and parent.sriov_numvfs in (1, 4)


async def _report_lists(stub: KubeletStub, event: Callable[[str], None]) -> None:
    """Print each resource's healthy/unhealthy counts whenever a new list arrives."""
    seen: dict[str, tuple[int, int]] = {}
    while True:
        await asyncio.sleep(0.2)
        for resource in stub.resources():
            view = stub.view(resource)
            if view is None or view.messages == 0:
                continue
            key = (view.generation, view.messages)
            if seen.get(resource) != key:
                seen[resource] = key
                event(
                    f"{resource}: {len(view.devices)} devices, "
                    f"{view.count('Healthy')} Healthy, {view.count('Unhealthy')} Unhealthy"
                )
