"""Shutdown signals at every moment of a real daemon's life, judged by outcome only: the
exit code, the records and the sockets left behind (never by how long anything took).

From the first record on, a first SIGTERM or SIGINT is always the orderly shutdown (exit
0, ``Shutdown complete``, no plugin socket left, no traceback), and a second one is
always the forced exit (128 + n, with its record), until the process has ended."""

from __future__ import annotations

import asyncio
import signal

import pytest

from rbln_device_plugin.runtime.signals import FORCED_EXIT_MSG, RECEIVED_MSG

from .fault_helpers import NPU, FaultHarness, launch

# Seconds after the first record (start-up) or after the first signal (shutdown).
START_DELAYS = (0.0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5)
SECOND_DELAYS = (0.0, 0.002, 0.005, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4, 0.8)


def _exit_code(h: FaultHarness) -> int:
    """Wait for the daemon to exit on its own (no further signal), then collect its output."""
    code = h.daemon.proc.wait(20)
    h.daemon.stop()
    return code


def _plugin_sockets(h: FaultHarness) -> list[str]:
    return [name for name in h.sockets() if name != "kubelet.sock"]


async def _signal_during_start_up(delay: float, sig: signal.Signals) -> None:
    async with launch("rebel-sriov") as h:
        await h.daemon.await_log(None)  # the first record, whatever it says
        await asyncio.sleep(delay)
        h.daemon.send(sig)
        code = await asyncio.to_thread(_exit_code, h)
        assert code == 0, (delay, sig, h.daemon.records[-5:], h.daemon.stderr[-2000:])
        (received,) = h.daemon.find(RECEIVED_MSG)
        assert received["signal"] == sig.name
        assert h.daemon.find("Shutdown complete")
        assert "Traceback" not in h.daemon.stderr
        assert _plugin_sockets(h) == []


async def test_a_signal_right_after_the_first_record_is_an_orderly_shutdown() -> None:
    await _signal_during_start_up(0.0, signal.SIGTERM)
    await _signal_during_start_up(0.0, signal.SIGINT)


@pytest.mark.slow
@pytest.mark.parametrize("delay", START_DELAYS)
async def test_a_signal_at_any_moment_of_start_up_is_an_orderly_shutdown(delay: float) -> None:
    await _signal_during_start_up(delay, signal.SIGINT if delay in (0.01, 0.2) else signal.SIGTERM)


async def _second_signal_during_shutdown(delay: float) -> None:
    async with launch("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.daemon.send(signal.SIGTERM)
        await asyncio.sleep(delay)
        if h.daemon.proc.poll() is None:
            h.daemon.send(signal.SIGTERM)
        code = await asyncio.to_thread(_exit_code, h)
        forced = h.daemon.find(FORCED_EXIT_MSG)
        if code == 143:  # the second signal came before the end: its exit, its record
            (record,) = forced
            assert record["exitCode"] == 143 and record["signal"] == "SIGTERM"
        else:  # the shutdown had finished: the orderly exit, complete
            assert code == 0, (delay, code, h.daemon.records[-5:], h.daemon.stderr[-2000:])
            assert not forced and h.daemon.find("Shutdown complete")
            assert _plugin_sockets(h) == []
        assert "Traceback" not in h.daemon.stderr


async def test_a_second_signal_at_once_is_the_forced_exit() -> None:
    await _second_signal_during_shutdown(0.0)


@pytest.mark.slow
@pytest.mark.parametrize("delay", SECOND_DELAYS)
async def test_a_second_signal_at_any_moment_of_shutdown_is_the_forced_exit_or_none(
    delay: float,
) -> None:
    await _second_signal_during_shutdown(delay)
