"""The scan loop in-process: scheduling, failure handling, reconciliation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from structlog.testing import capture_logs

from rbln_device_plugin import options
from rbln_device_plugin.host.scan import DiscoveryError, ScanResult
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.model.inventory import RESOURCE_NPU, Device
from rbln_device_plugin.runtime.manager import Manager, ScanHooks
from rbln_device_plugin.telemetry.tracing import disabled
from rbln_device_plugin_sim.kubelet import KubeletStub


def device(index: int) -> Device:
    bdf = f"0000:{index + 5:02x}:00.0"
    return Device(f"rbln{index}", "RBLN-CA25", "1250", bdf, 0, "", None, None)


class ScriptedScanner:
    """Answers scans from a script: a list of results, exceptions or delays."""

    def __init__(self, answer: Callable[[int], ScanResult]) -> None:
        self.answer = answer
        self.calls = 0
        self.running = 0
        self.max_running = 0

    async def scan(self) -> ScanResult:
        self.calls += 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(0)
            return self.answer(self.calls)
        finally:
            self.running -= 1


@asynccontextmanager
async def managing(
    tmp: Path, scanner: ScriptedScanner, interval: str = "50ms"
) -> AsyncIterator[tuple[Manager, KubeletStub]]:
    """A Manager running its scan loop against a kubelet stub until the block ends."""
    config = options.parse(
        ["--kubelet-device-plugin-path", str(tmp / "kubelet"), "--cdi-root", str(tmp / "cdi"),
         "--sysfs-root", str(tmp / "sys"), "--dev-root", str(tmp / "dev"),
         f"--device-scan-interval={interval}"],
        {},
    )  # fmt: skip
    kubelet = KubeletStub(config.kubelet_dir)
    await kubelet.start()
    manager = Manager(
        SharedServices(config, disabled().tracer),
        ScanHooks(first_scan=_nothing),
        scanner,  # type: ignore[arg-type]
    )
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        yield manager, kubelet
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)  # a hang guard: the loop stops at once
        await kubelet.stop()


async def _nothing() -> None:
    pass


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll a counter of the scripted scanner (nothing announces it)."""
    try:
        async with asyncio.timeout(30):  # a hang guard, not a claim about speed
            while not condition():  # noqa: ASYNC110 - polling a plain predicate
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"no {what} within 30 s") from None


async def run_manager(
    tmp: Path, scanner: ScriptedScanner, stop_when: Callable[[], bool], interval: str = "50ms"
) -> tuple[Manager, KubeletStub]:
    async with managing(tmp, scanner, interval) as (manager, kubelet):
        await until(stop_when, "the scripted scans")
    return manager, kubelet


async def test_unexpected_scan_error_is_a_discovery_failure_not_a_crash(short_tmp: Path) -> None:
    def answer(call: int) -> ScanResult:
        if call <= 2:
            raise RuntimeError("bug on odd input")
        return ScanResult({RESOURCE_NPU: (device(0), device(1))})

    scanner = ScriptedScanner(answer)
    with capture_logs() as logs:
        async with managing(short_tmp, scanner) as (_, kubelet):
            # The plugin registers beside the scans, not within one: wait for it too (a
            # loaded machine can take longer than a scan interval or two to register).
            await until(
                lambda: scanner.calls >= 4 and any(r.accepted for r in kubelet.registrations),
                "the scripted scans and a registration",
            )
    # Both bugs were reported as failed scans, and the loop went on to register.
    failures = [e for e in logs if e["event"].startswith("Device discovery failed")]
    assert [(e["log_level"], e["err"]) for e in failures] == [
        ("error", "internal error: RuntimeError('bug on odd input')")
    ] * 2
    assert [r.resource for r in kubelet.registrations if r.accepted] == [RESOURCE_NPU]


async def test_slow_scans_never_overlap(short_tmp: Path) -> None:
    class Slow(ScriptedScanner):
        async def scan(self) -> ScanResult:
            self.calls += 1
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            try:
                await asyncio.sleep(0.12)  # longer than the 50 ms interval
                return ScanResult({})
            finally:
                self.running -= 1

    scanner = Slow(lambda _: ScanResult({}))
    await run_manager(short_tmp, scanner, lambda: scanner.calls >= 5)
    assert scanner.max_running == 1


async def test_discovery_failure_stops_plugins_and_resets_history(short_tmp: Path) -> None:
    failing = False

    def answer(_: int) -> ScanResult:
        if failing:
            raise DiscoveryError("rbln-smi gone")
        return ScanResult({RESOURCE_NPU: (device(0),)})

    status = short_tmp / "sys" / "class" / "rebellions" / "rbln0" / "status"
    status.parent.mkdir(parents=True)
    status.write_text("4\n")  # FAULT
    scanner = ScriptedScanner(answer)
    async with managing(short_tmp, scanner) as (_, kubelet):
        await kubelet.wait_for(RESOURCE_NPU, lambda v: v.health("rbln0") == "Unhealthy")
        # Unreadable after FAULT: the history keeps it Unhealthy, scan after scan.
        status.unlink()
        calls = scanner.calls
        await until(lambda: scanner.calls >= calls + 2, "two scans of the unreadable status")
        view = kubelet.view(RESOURCE_NPU)
        assert view is not None and view.generation == 1 and view.health("rbln0") == "Unhealthy"
        # A discovery failure stops the plugin ...
        failing = True
        await kubelet.wait_for(RESOURCE_NPU, lambda v: v.ended is not None)
        # ... and the one registered after it starts with an empty history.
        failing = False
        view = await kubelet.wait_for(RESOURCE_NPU, lambda v: v.generation == 2 and v.messages > 0)
        assert view.health("rbln0") == "Healthy"
    accepted = [r for r in kubelet.registrations if r.accepted]
    assert len(accepted) == 2  # registered, stopped by the failure, registered again
