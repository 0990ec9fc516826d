"""``make demo``: the real daemon on a simulated ATOM-Max node, narrated step by step.

Each step shows what the kubelet stand-in saw and then the daemon's own records for it
(``demolog``). A step whose daemon feature is missing (no registration in time,
UNIMPLEMENTED) is shown as SKIPPED with the reason, and the steps that need it are
skipped too. Only a FAILED step makes the exit status non-zero. ``--keep`` leaves the
node and the daemon's log in place afterwards.
"""

from __future__ import annotations

import asyncio
import shutil

from rbln_device_plugin_sim import shell
from rbln_device_plugin_sim.demosteps import Demo, DemoConfig, inspect_args
from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import materialize, short_tempdir

__all__ = ["DemoConfig", "run_demo", "run_demo_async"]


async def run_demo_async(config: DemoConfig) -> int:
    root = short_tempdir("rbln-demo-")
    out = config.out
    demo: Demo | None = None
    try:
        node = materialize(preset(config.preset), root / "node")
        layout = node.layout
        cards = len({d.sid for d in layout.devices})
        print(
            f"Simulated node '{layout.name}': {len(layout.devices)} x "
            f"{layout.devices[0].product} on {cards} cards, under {node.root}",
            file=out,
        )
        async with KubeletStub(node.kubelet_dir) as stub:
            demo = Demo(config, node, stub)
            try:
                await demo.step("Inspect the node before starting the daemon", demo.inspect_node)
                await demo.step("Start the daemon", demo.start_daemon, records="start")
                started = ["Start the daemon"]
                await demo.step(
                    "Register with the kubelet", demo.registration, started, records="register"
                )
                registered = [*started, "Register with the kubelet"]
                await demo.step(
                    "A pod asks for 4 NPUs", demo.allocation, registered, records="allocate"
                )
                await demo.step("A device faults", demo.fault, registered, records="fault")
                await demo.step(
                    "The kubelet restarts", demo.kubelet_restart, registered, records="restart"
                )
                await demo.step("Stop the daemon", demo.stop_daemon, started, records="stop")
            finally:
                await demo.cleanup()
            failed = [title for title, outcome in demo.results if outcome == "FAILED"]
            skipped = [title for title, outcome in demo.results if outcome == "SKIPPED"]
            if failed:
                print("\nLast daemon log lines:", file=out)
                for line in demo.log_tail():
                    print(f"    {line}", file=out)
    finally:
        if not config.keep:
            shutil.rmtree(root, ignore_errors=True)
    assert demo is not None
    summary = f"{len(demo.results) - len(failed) - len(skipped)} ok, {len(skipped)} skipped"
    if failed:
        print(f"\nDemo FAILED at: {', '.join(failed)} ({summary})", file=out)
    else:
        print(f"\nDemo finished: {summary}.", file=out)
    if config.keep:
        print(f"Kept under {root}: the node, and the daemon's log at", file=out)
        print(f"  {demo.log_path}", file=out)
        print("Look at the node as the daemon saw it:", file=out)
        print(shell.daemon(inspect_args(node), indent="  "), file=out)
        print("Remove it all with:", file=out)
        print(f"  rm -r {root}", file=out)
    else:
        print(f"Node removed ({shell.sim('demo', '--keep')} keeps it and the log).", file=out)
    return 1 if failed else 0


def run_demo(config: DemoConfig | None = None) -> int:
    return asyncio.run(run_demo_async(config or DemoConfig()))
