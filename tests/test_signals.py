"""Every catchable signal at every moment of a real daemon's life, judged by outcome only:
the exit code, the records and the sockets left behind (never by how long anything took).

From the daemon's first line on (``entry``, before its imports), a first SIGTERM, SIGINT,
SIGHUP or SIGQUIT is always the orderly shutdown (exit 0, ``Shutdown complete``, no plugin
socket left, no traceback), and a second one is always the forced exit (128 + n, with its
record once the logger exists), until the process has ended. The signals Go's runtime
ignores leave the daemon serving; the rest do what they do to the Go plugin (see
``signalcatch`` and docs/reliability.md). Moments inside the imports are reached with an
import gate (``import_gate.py``): the daemon waits inside one import while the signal is
sent, so no timing decides where it lands.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from rbln_device_plugin.runtime.signals import FORCED_EXIT_MSG, RECEIVED_MSG

from . import import_gate
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


# ------------------------------------------------------------------ every catchable signal
SHUTDOWN = "orderly shutdown"
SURVIVES = "survives"
STOPS = "stops until SIGCONT"
DIES = "dies by the signal"

# What each catchable signal does to the daemon: what it does to the Go plugin (its
# runtime's table below, and its signal.Notify of the four shutdown signals).
_BY_NAME = {
    "SIGHUP": SHUTDOWN, "SIGINT": SHUTDOWN, "SIGTERM": SHUTDOWN, "SIGQUIT": SHUTDOWN,
    "SIGUSR1": SURVIVES, "SIGUSR2": SURVIVES, "SIGPIPE": SURVIVES, "SIGALRM": SURVIVES,
    "SIGCHLD": SURVIVES, "SIGCONT": SURVIVES, "SIGURG": SURVIVES, "SIGXCPU": SURVIVES,
    "SIGXFSZ": SURVIVES, "SIGVTALRM": SURVIVES, "SIGPROF": SURVIVES, "SIGWINCH": SURVIVES,
    "SIGIO": SURVIVES, "SIGPWR": SURVIVES,
    "SIGTSTP": STOPS, "SIGTTIN": STOPS, "SIGTTOU": STOPS,
    "SIGILL": DIES, "SIGTRAP": DIES, "SIGABRT": DIES, "SIGBUS": DIES, "SIGFPE": DIES,
    "SIGSEGV": DIES, "SIGSTKFLT": DIES, "SIGSYS": DIES, "SIGRTMIN": DIES,
}  # fmt: skip
EXPECTED: dict[int, str] = {
    **{getattr(signal, name).value: outcome for name, outcome in _BY_NAME.items()},
    **{n: SURVIVES for n in range(signal.SIGRTMIN + 1, signal.SIGRTMAX + 1)},
}
CATCHABLE = sorted(int(s) for s in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP})
GO_SHUTDOWN = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT}  # signal.Notify


def _go_outcomes() -> dict[int, str]:
    """What Go's runtime does with each signal, read from its own table
    (runtime/sigtab_linux_generic.go), with the Go plugin's signal.Notify applied."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go toolchain not found on PATH: no table to compare with")
    goroot = subprocess.run([go, "env", "GOROOT"], capture_output=True, text=True, check=True)
    table = Path(goroot.stdout.strip(), "src/runtime/sigtab_linux_generic.go").read_text()
    outcomes = {}
    for number, flags in re.findall(r"/\* (\d+) \*/ \{([^,]*),", table):
        n = int(number)
        if n in GO_SHUTDOWN:
            outcomes[n] = SHUTDOWN
        elif "_SigThrow" in flags or "_SigPanic" in flags or "_SigKill" in flags:
            outcomes[n] = DIES
        elif "_SigDefault" in flags:
            # Go leaves it to the kernel's default action: SIGCONT continues the
            # process, SIGTSTP, SIGTTIN and SIGTTOU stop it.
            outcomes[n] = SURVIVES if n == signal.SIGCONT else STOPS
        elif "_SigNotify" in flags:
            outcomes[n] = SURVIVES  # caught, and nothing done
        else:
            outcomes[n] = DIES  # no handler: the default action (SIGRTMIN), or uncatchable
    return outcomes


def test_every_catchable_signal_does_what_it_does_to_the_go_plugin() -> None:
    assert sorted(EXPECTED) == CATCHABLE  # none left untested below
    go = _go_outcomes()
    assert {n: go[n] for n in CATCHABLE} == EXPECTED


def _pending(pid: int, which: str = "ShdPnd") -> int:
    """Signals sent and not delivered yet: to the process (``ShdPnd``) or to its main
    thread (``SigPnd``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{which}:"):
                return int(line.split()[1], 16)
    raise AssertionError(f"no {which} line")


def _to_main_thread(pid: int, signum: int) -> None:
    """tgkill(2): a signal for the main thread alone (kill(2) lets any thread take it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(pid, pid, signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {signum}")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0]


async def _until(
    condition: Callable[[], bool], what: str, h: FaultHarness, *, alive: bool = True
) -> None:
    """Polls ``condition`` (a hang guard, not a measurement: the limit is far away); with
    ``alive``, the daemon must not exit meanwhile."""
    deadline = time.monotonic() + 20
    while not condition():
        if alive:
            code = h.daemon.proc.poll()
            assert code is None, (what, code, h.daemon.stderr[-2000:])
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _serves_then_stops_in_order(h: FaultHarness) -> None:
    """The daemon answers the kubelet, and a SIGTERM still stops it in order."""
    assert len(await h.kubelet.preferred(NPU, ["rbln0", "rbln1"], [], 1)) == 1
    h.daemon.send(signal.SIGTERM)
    code = await asyncio.to_thread(_exit_code, h)
    assert code == 0, (code, h.daemon.records[-5:], h.daemon.stderr[-2000:])
    assert [r["signal"] for r in h.daemon.find(RECEIVED_MSG)] == ["SIGTERM"]
    assert h.daemon.find("Shutdown complete") and _plugin_sockets(h) == []
    assert "Traceback" not in h.daemon.stderr


async def test_the_signals_go_ignores_leave_the_daemon_serving() -> None:
    ignored = [n for n in CATCHABLE if EXPECTED[n] == SURVIVES]
    async with launch("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        pid = h.daemon.proc.pid
        for signum in ignored:
            os.kill(pid, signum)
            await _until(lambda: _pending(pid) == 0, f"signal {signum} delivered", h)
        # All of them at once to the main thread, three times over (real-time signals
        # queue): sent while the daemon is stopped, they are delivered together on
        # SIGCONT, each handler nested in the one before. Six nested ones overflowed the
        # small alternate signal stack faulthandler gave the main thread (SIGSEGV, or a
        # heap-corruption abort).
        os.kill(pid, signal.SIGSTOP)
        await _until(lambda: _state(pid) == "T", "stopped", h)
        for _ in range(3):
            for signum in ignored:
                _to_main_thread(pid, signum)
        os.kill(pid, signal.SIGCONT)
        await _until(lambda: _pending(pid) == 0 == _pending(pid, "SigPnd"), "burst delivered", h)
        assert h.daemon.proc.poll() is None
        assert not [r for r in h.daemon.records if r.get("level") == "error"]
        await _serves_then_stops_in_order(h)


_BURST = """
import signal, threading
from rbln_device_plugin import signalcatch
from rbln_device_plugin.telemetry import grpc_relay, logs
logs.install({})
grpc_relay.install()  # as the daemon: Python's fault handler on
signalcatch.install()
ignored = sorted(signalcatch.IGNORED)
main = threading.main_thread().ident
signal.pthread_sigmask(signal.SIG_BLOCK, ignored)
for _ in range(3):
    for signum in ignored:
        signal.pthread_kill(main, signum)
signal.pthread_sigmask(signal.SIG_UNBLOCK, ignored)  # all delivered now, nested
print("served", flush=True)
"""


def test_a_burst_of_ignored_signals_on_the_main_thread_is_survived() -> None:
    # Every ignored signal pending on the main thread at once: each handler runs nested
    # in the one before. faulthandler's alternate stack on the main thread held five.
    done = subprocess.run(
        [sys.executable, "-c", _BURST], capture_output=True, text=True, timeout=60
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "served\n"), done.stderr[-2000:]


async def test_the_stop_signals_stop_the_daemon_until_sigcont() -> None:
    # In a process group of its own, whose parent (this test) is in another group of the
    # same session. The kernel discards SIGTSTP, SIGTTIN and SIGTTOU sent to an orphaned
    # group (POSIX), and the test's own group is orphaned whenever the shell that started
    # the run has exited (a CI job started in the background): then nothing would stop.
    async with launch("rebel-4", process_group=0) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        pid = h.daemon.proc.pid
        for signum in (n for n in CATCHABLE if EXPECTED[n] == STOPS):
            os.kill(pid, signum)
            await _until(lambda: _state(pid) == "T", f"stopped by {signum}", h)
            os.kill(pid, signal.SIGCONT)
            await _until(lambda: _state(pid) != "T", "continued", h)
        await _serves_then_stops_in_order(h)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT], ids=lambda s: s.name)
async def test_sighup_and_sigquit_are_an_orderly_shutdown(sig: signal.Signals) -> None:
    await _signal_during_start_up(0.0, sig)


# The fatal signals faulthandler reports on before the process ends (see grpc_relay).
FAULT_HANDLED = {signal.SIGILL, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGSEGV}


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def _no_gate(fifo: Path) -> tuple[str, ...]:
    return (sys.executable, import_gate.__file__, "-", str(fifo))


@pytest.mark.parametrize(
    "signum",
    [pytest.param(n, marks=() if n == signal.SIGABRT else pytest.mark.slow) for n in CATCHABLE
     if EXPECTED[n] == DIES],
    ids=lambda n: _name(n),
)  # fmt: skip
async def test_the_signals_that_end_the_go_plugin_end_the_daemon(
    signum: int, tmp_path: Path
) -> None:
    # As the Go plugin (a crash with a goroutine dump, or the default action): the process
    # ends at once, by the signal itself. The kubelet and the next start deal with the rest.
    async with launch("rebel-4", command=_no_gate(tmp_path / "gate")) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        os.kill(h.daemon.proc.pid, signum)
        assert await asyncio.to_thread(_exit_code, h) == -signum
        if signum in FAULT_HANDLED:  # Go prints its goroutines; here Python's stacks
            assert "Fatal Python error" in h.daemon.stderr, h.daemon.stderr[-2000:]


# ------------------------------------------------------------------ inside the imports
async def _at_gate(h: FaultHarness, module: str) -> None:
    marker = f"{import_gate.PREFIX}{module}\n"
    await _until(lambda: marker in h.daemon.stderr, f"the gate at {module}", h)


def _open_gate(h: FaultHarness, fifo: Path) -> None:
    """Let the held import go on (nothing to do if a signal ended the process)."""
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO or h.daemon.proc.poll() is not None:
                return
            time.sleep(0.002)  # the gate wrote its marker and opens the FIFO next
            continue
        with os.fdopen(fd, "wb") as gate:
            gate.write(b"x")
        return


async def _signals_inside_an_import(
    module: str, signals: Sequence[signal.Signals], tmp_path: Path
) -> tuple[FaultHarness, list[str]]:
    """The daemon held inside ``module``'s import while ``signals`` are sent; once it has
    exited: its harness and the plugin sockets it left."""
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    command = (sys.executable, import_gate.__file__, module, str(fifo))
    async with launch("rebel-sriov", command=command) as h:
        await _at_gate(h, module)
        for sig in signals:
            h.daemon.send(sig)
        pid = h.daemon.proc.pid
        # Delivered (or the process ended by them: then the old code's defaults ruled).
        await _until(
            lambda: h.daemon.proc.poll() is not None or _pending(pid) == 0,
            "signals delivered", h, alive=False,
        )  # fmt: skip
        _open_gate(h, fifo)
        await asyncio.to_thread(_exit_code, h)
        return h, _plugin_sockets(h)


# The modules the daemon's start-up imports, in order: all after entry's first line.
START_IMPORTS = (
    "rbln_device_plugin.cli",
    "rbln_device_plugin.processtweaks",
    "rbln_device_plugin.config",
    "structlog",
    "rbln_device_plugin.telemetry.grpc_relay",
    "rbln_device_plugin.runtime.signals",
    "rbln_device_plugin.runtime.daemon",
)
FAST_GATES = {("rbln_device_plugin.config", signal.SIGINT), ("structlog", signal.SIGTERM)}


@pytest.mark.parametrize(
    ("module", "sig"),
    [pytest.param(m, s, marks=() if (m, s) in FAST_GATES else pytest.mark.slow)
     for m in START_IMPORTS for s in (signal.SIGINT, signal.SIGTERM)],
    ids=lambda x: x.name if isinstance(x, signal.Signals) else x,
)  # fmt: skip
async def test_a_signal_inside_the_start_up_imports_is_an_orderly_shutdown(
    module: str, sig: signal.Signals, tmp_path: Path
) -> None:
    h, sockets = await _signals_inside_an_import(module, [sig], tmp_path)
    code = h.daemon.proc.returncode
    assert code == 0, (module, sig, code, h.daemon.records[-5:], h.daemon.stderr[-2000:])
    assert "Traceback" not in h.daemon.stderr and "KeyboardInterrupt" not in h.daemon.stderr
    (received,) = h.daemon.find(RECEIVED_MSG)
    assert received["signal"] == sig.name
    assert h.daemon.find("Shutdown complete") and sockets == []


@pytest.mark.parametrize(
    "module", ["rbln_device_plugin.cli", pytest.param("structlog", marks=pytest.mark.slow)]
)
async def test_a_second_signal_before_the_logger_exists_exits_at_once(
    module: str, tmp_path: Path
) -> None:
    # Nothing can write a record yet: the exit code alone says what happened.
    h, _ = await _signals_inside_an_import(module, [signal.SIGINT, signal.SIGTERM], tmp_path)
    assert h.daemon.proc.returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM)
    assert "Traceback" not in h.daemon.stderr and not h.daemon.records
