"""Where one Allocate's time goes inside the daemon: a per-step breakdown (issue 35).

The daemon runs as usual on the 8-card simulated node with the fast ``rbln-smi``
(``fastsmi``), but started through this module, which first wraps a few of its functions
with timers (``perf_counter_ns``, the same CLOCK_MONOTONIC as the tool's own stamps).
After every Allocate the daemon appends that call's intervals to a file; the client adds
the RPC as it saw it and the tool's own run times. Each step is then the median over
the calls of:

- ``gRPC``: the RPC as the client saw it minus the handler (receive, decode, dispatch,
  encode, send, the client's own side);
- ``checks``: the handler's start to the first container's start (the final status reads
  and the first host checks, one or two thread hops side by side);
- ``lock``: opening and locking the RSD lock file;
- ``spawn``: starting each ``rbln-smi`` (fork/exec as the parent sees it);
- ``tool``: the tool's own time, ``main`` to its last write (not the daemon's);
- ``reap``: from the tool's last write to the daemon holding its output and exit
  (process exit, pipe EOF and exit notification, the loop turns), minus nothing else;
- ``parse``: reading the ``-g -j`` listing and checking the device mapping;
- ``node``: the wait for ``<dev root>/rsd<G>`` (one thread hop when it is already there);
- ``rest``: everything else inside the handler (validation, logging calls, tracing
  calls, the response, the loop's own turns between the steps).

Run: ``python -m bench.allocate_steps [--calls N] [--containers 1|2]``.
The hooks only time; they change nothing the daemon does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import runpy
import signal
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

STEPS_ENV = "RBLN_BENCH_STEPS_FILE"
STEP_ORDER = ("gRPC", "checks", "lock", "spawn", "tool", "reap", "parse", "node", "rest")

# ------------------------------------------------------------------ inside the daemon

_intervals: list[tuple[str, int, int]] = []


def _timed_async(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter_ns()
        try:
            return await fn(*args, **kwargs)
        finally:
            _intervals.append((name, began, time.perf_counter_ns()))

    return wrapper


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            _intervals.append((name, began, time.perf_counter_ns()))

    return wrapper


def _install_hooks(out: Path) -> None:
    from rbln_device_plugin.host import hostio, proc, rsd, smi
    from rbln_device_plugin.kubelet import allocate, servicer

    handler = servicer.DevicePluginServicer.Allocate
    profiled = _profiler()

    @functools.wraps(handler)
    async def allocate_handler(self: Any, request: Any, context: Any) -> Any:
        if profiled is not None:
            profiled()
        _intervals.clear()
        began = time.perf_counter_ns()
        try:
            return await handler(self, request, context)
        finally:
            ended = time.perf_counter_ns()
            with out.open("a") as file:
                file.write(json.dumps([("handler", began, ended), *_intervals]) + "\n")

    servicer.DevicePluginServicer.Allocate = allocate_handler  # type: ignore[method-assign]
    container = allocate.Allocator._container
    allocate.Allocator._container = _timed_async("container", container)  # type: ignore[method-assign]
    proc._start = _timed("spawn", proc._start)
    proc._Child.__init__ = _timed("watch", proc._Child.__init__)  # type: ignore[method-assign]
    proc._Child.collect = _timed_async("collect", proc._Child.collect)  # type: ignore[method-assign]
    smi.parse_groups = _timed("parse", smi.parse_groups)
    rsd.check_mapping = _timed("parse", rsd.check_mapping)
    rsd.wait_for_nodes = _timed_async("node", rsd.wait_for_nodes)
    rsd_lock = rsd.rsd_lock

    @contextlib.asynccontextmanager
    async def timed_lock(*args: Any, **kwargs: Any) -> AsyncIterator[int]:
        began = time.perf_counter_ns()
        async with rsd_lock(*args, **kwargs) as fd:
            _intervals.append(("lock", began, time.perf_counter_ns()))
            yield fd

    rsd.rsd_lock = timed_lock
    hostio.HostIO._run_batch = _timed_async("hop", hostio.HostIO._run_batch)  # type: ignore[method-assign]


def _profiler() -> Callable[[], None] | None:
    """With RBLN_BENCH_PROFILE=<file>: pyinstrument over calls 6 to 5+N (N from
    RBLN_BENCH_PROFILE_CALLS), its text report written to the file. Optional: pyinstrument
    is no dependency of the project (``pip install --target DIR pyinstrument`` and put DIR
    on PYTHONPATH)."""
    out = os.environ.get("RBLN_BENCH_PROFILE")
    if not out:
        return None
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0002, async_mode="disabled")
    last = 5 + int(os.environ.get("RBLN_BENCH_PROFILE_CALLS", "100"))
    seen = 0

    def on_call() -> None:
        nonlocal seen
        seen += 1
        if seen == 6:
            profiler.start()
        elif seen == last + 1:
            profiler.stop()
            Path(out).write_text(profiler.output_text(unicode=False, show_all=True))

    return on_call


def daemon_main() -> None:
    """``python -m bench.allocate_steps --daemon <daemon args>``: the hooked daemon."""
    _install_hooks(Path(os.environ[STEPS_ENV]))
    sys.argv = ["rbln_device_plugin", *sys.argv[2:]]
    runpy.run_module("rbln_device_plugin", run_name="__main__", alter_sys=True)


# ------------------------------------------------------------------ the client side


def breakdown(
    daemon: list[tuple[str, int, int]], client_ms: float, tool_runs: list[tuple[int, int]]
) -> dict[str, float]:
    """One call's steps in ms (see the module docstring)."""
    by_name: dict[str, list[tuple[int, int]]] = {}
    for name, began, ended in daemon:
        by_name.setdefault(name, []).append((began, ended))

    def total(name: str) -> float:
        return sum(e - b for b, e in by_name.get(name, [])) / 1e6

    (handler_start, handler_end), *_ = by_name["handler"]
    handler = (handler_end - handler_start) / 1e6
    containers = by_name.get("container", [])
    checks = ((containers[0][0] if containers else handler_end) - handler_start) / 1e6
    tool = sum(e - b for b, e in tool_runs) / 1e6
    steps = {
        "gRPC": client_ms - handler,
        "checks": checks,
        "lock": total("lock"),
        "spawn": total("spawn"),
        "tool": tool,
        "reap": total("collect") - tool,
        "parse": total("parse"),
        "node": total("node"),
    }
    steps["rest"] = handler - sum(v for k, v in steps.items() if k != "gRPC")
    steps["handler"] = handler
    steps["popen"] = total("spawn") - total("watch")  # spawn minus the pipes' set-up
    steps["total"] = client_ms
    steps["share"] = client_ms - tool
    steps["runs"] = len(tool_runs)
    steps["hops"] = len(by_name.get("hop", []))
    return steps


async def measure(
    calls: int, containers: int, prefix: Sequence[str] = ()
) -> list[dict[str, float]]:
    import grpc

    from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
    from rbln_device_plugin.kubelet.plugin import socket_name
    from rbln_device_plugin_sim.layout import preset

    from . import fastsmi
    from .bench_daemon import node_with_daemon

    npu = "rebellions.ai/npu"
    steps_file = Path(os.environ.setdefault(STEPS_ENV, f"/tmp/rbln-steps-{os.getpid()}.jsonl"))
    steps_file.write_text("")
    tools: list[fastsmi.FastSmi] = []
    command = [*prefix, sys.executable, "-m", "bench.allocate_steps", "--daemon"]
    results = []
    tracees: list[int] = []
    stack = contextlib.ExitStack()
    try:
        async with node_with_daemon(
            preset("atom-max-8"), "1h", lambda node: tools.append(fastsmi.install(node)),
            command=command,
        ) as (node, kubelet, daemon, _):  # fmt: skip
            await kubelet.wait_for(npu, lambda v: len(v.devices) == 32, 30)
            tool = tools[0]
            target = f"unix:{node.kubelet_dir / socket_name(npu)}"
            lock_fd = os.open(node.root / "floor.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
            stack.callback(os.close, lock_fd)
            async with grpc.aio.insecure_channel(target) as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                for _ in range(50):
                    await stub.GetDevicePluginOptions(api_pb2.Empty())
                for call in range(calls + 5):  # the first 5 warm the daemon's paths
                    first = (call * 4) % 32
                    requests = [
                        api_pb2.ContainerAllocateRequest(
                            devices_ids=[f"rbln{(first + 2 * c + k) % 32}" for k in range(2)]
                        )
                        for c in range(containers)
                    ]
                    floor = floors(await unary_ms(stub), spawn_overhead_ms(tool, lock_fd))
                    tool.ungroup()
                    tool.clear()
                    began = time.perf_counter()
                    await stub.Allocate(api_pb2.AllocateRequest(container_requests=requests))
                    client_ms = (time.perf_counter() - began) * 1000
                    await asyncio.sleep(0.02)  # the daemon's record is written after the reply
                    lines = steps_file.read_text().splitlines()
                    if call >= 5:
                        steps = breakdown(json.loads(lines[-1]), client_ms, tool.recorded())
                        results.append({**steps, **floor})
            # Under strace the daemon is strace's child; strace detaches from it when it
            # is stopped, so the daemon is stopped here by its own pid.
            if prefix:
                children = Path(f"/proc/{daemon.pid}/task/{daemon.pid}/children")
                tracees = [int(pid) for pid in children.read_text().split()]
    finally:
        stack.close()
        steps_file.unlink(missing_ok=True)
    for pid in tracees:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return results


async def unary_ms(stub: Any) -> float:
    """One GetDevicePluginOptions on the same channel: the unary RPC floor."""
    from rbln_device_plugin.api.v1beta1 import api_pb2

    began = time.perf_counter()
    await stub.GetDevicePluginOptions(api_pb2.Empty())
    return (time.perf_counter() - began) * 1000


def spawn_overhead_ms(tool: Any, lock_fd: int) -> float:
    """One ``-g -j`` spawned from here with ``subprocess.run`` and the daemon's Popen
    arguments (stdin closed, both pipes, a process group of its own, one inherited
    descriptor), minus the tool's own time: what starting and reaping one run costs a
    plain Python process."""
    import subprocess

    tool.clear()
    began = time.perf_counter()
    subprocess.run(
        [str(tool.path), "-g", "-j"], stdin=subprocess.DEVNULL, capture_output=True,
        process_group=0, pass_fds=(lock_fd,), check=True,
    )  # fmt: skip
    wall = (time.perf_counter() - began) * 1000
    own = sum(end - start for start, end in tool.recorded()) / 1e6
    tool.clear()
    return wall - own


def floors(unary: float, spawn: float) -> dict[str, float]:
    return {"floor unary": unary, "floor spawn": spawn}


def summary(results: list[dict[str, float]]) -> list[tuple[str, float, float]]:
    """(step, p50 ms, mean ms) for each step, then the handler, the total and the share."""
    names = [*STEP_ORDER, "handler", "total", "share", "popen", "floor unary", "floor spawn"]
    return [
        (n, statistics.median(r[n] for r in results), statistics.fmean(r[n] for r in results))
        for n in names
    ]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--daemon"]:
        daemon_main()
        return 0
    p = argparse.ArgumentParser(description=(__doc__ or "").strip().split("\n\n")[0])
    p.add_argument("--calls", type=int, default=100, help="Allocate calls (default 100)")
    p.add_argument("--containers", type=int, default=1, help="containers per call (default 1)")
    p.add_argument(
        "--strace", metavar="FILE",
        help="run the daemon under strace -f -tt -T into FILE (its figures include strace's)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.calls < 1 or args.containers < 1:
        p.error("--calls and --containers must be at least 1")
    calls, containers = args.calls, args.containers
    prefix = ["strace", "-f", "-tt", "-T", "-o", args.strace] if args.strace else []
    results = asyncio.run(measure(calls, containers, prefix))
    runs = statistics.median(r["runs"] for r in results)
    hops = statistics.median(r["hops"] for r in results)
    load = os.getloadavg()[0]
    print(f"Allocate, {containers} container(s) of 2 devices, {calls} calls, load {load:.2f}; "
          f"rbln-smi runs per call {runs:g}, thread hops {hops:g}")  # fmt: skip
    print(f"{'step':<12} {'p50 ms':>8} {'mean ms':>8}")
    rows = summary(results)
    for name, p50, mean in rows:
        print(f"{name:<12} {p50:>8.3f} {mean:>8.3f}")
    p50 = {name: value for name, value, _ in rows}
    share_floor = p50["floor unary"] + runs * p50["floor spawn"]
    print(f"daemon share p50 {p50['share']:.3f} ms; floor {share_floor:.3f} ms (one unary RPC "
          f"{p50['floor unary']:.3f} + {runs:g} x {p50['floor spawn']:.3f} ms to start and reap "
          f"the tool from plain Python, interleaved): {p50['share'] / share_floor:.2f}x; "
          f"against the unary RPC alone {p50['share'] / p50['floor unary']:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
