"""Shutdown and the gRPC stderr relay under pressure, through the real daemon."""

from __future__ import annotations

import asyncio
import fcntl
import signal

import grpc

from .fault_helpers import NPU, launch
from .test_instance import health, health_port
from .test_tracing import receiver

F_SETPIPE_SZ = 1031


async def test_a_second_signal_during_shutdown_exits_at_once() -> None:
    # A collector that never answers holds the shutdown in its span flush (up to 5 s).
    async with (
        receiver(hang=True) as (_, port),
        launch("rebel-4", extra_args=["--otlp-endpoint", f"127.0.0.1:{port}"]) as h,
    ):
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        await h.kubelet.allocate(NPU, [["rbln0"]])  # spans to flush
        h.daemon.send(signal.SIGTERM)
        await h.daemon.await_log("Shutdown signal received", signal="SIGTERM")
        h.daemon.send(signal.SIGINT)
        # Generous: "at once" here means well before the flush's own 5 s bound.
        code = await asyncio.to_thread(h.daemon.stop, signal.SIGINT, 3)
        assert code == 128 + signal.SIGINT == 130
        (record,) = h.daemon.find("Second shutdown signal received; exiting at once")
        assert record["level"] == "warn" and record["exitCode"] == 130
        assert record["signal"] == "SIGINT"
        assert not h.daemon.find("Shutdown complete")


async def test_grpc_tracing_to_an_unread_stderr_never_blocks_a_call() -> None:
    """gRPC's C core writes to fd 2 through the relay, a lot with GRPC_TRACE=all, and
    nobody reads the daemon's stderr: every call is still answered. (Counting the lines
    the relay drops: tests/test_grpc_core_log.py.)"""
    env = {
        "GRPC_VERBOSITY": "DEBUG",
        "GRPC_TRACE": "all",  # multi-line C-core output: plenty of raw stderr lines
        "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info",  # abseil INFO lines stay out of stdout
    }
    async with launch("rebel-4", env=env, extra_args=["--healthcheck-port", "0"]) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        port = await health_port(h.daemon)
        assert h.daemon.proc.stderr is not None
        fcntl.fcntl(h.daemon.proc.stderr.fileno(), F_SETPIPE_SZ, 4096)
        h.daemon.pause_stderr()
        try:
            for _ in range(60):
                # A relay stuck on stderr would leave these calls hanging past their deadline.
                # About four raw lines each: far more than the pipes and the queue hold.
                answers = await asyncio.gather(*(health(port, "liveness") for _ in range(10)))
                assert answers == ["SERVING"] * 10
            response = await asyncio.wait_for(h.kubelet.allocate(NPU, [["rbln1"]]), 10)
            assert len(response.container_responses) == 1
        except grpc.aio.AioRpcError as exc:
            raise AssertionError(f"a gRPC call failed while stderr was blocked: {exc}") from None
        finally:
            h.daemon.resume_stderr()
        code = await asyncio.to_thread(h.daemon.stop, signal.SIGTERM, 10)
        assert code == 0
