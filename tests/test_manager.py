"""The scan loop in-process: scheduling, failure handling, reconciliation."""

from __future__ import annotations

import asyncio
from pathlib import Path

from structlog.testing import capture_logs

from rbln_device_plugin.host.scan import DiscoveryError, ScanResult
from rbln_device_plugin.model.inventory import RESOURCE_NPU, Device

from .inprocess import ScriptedScanner, managing, run_manager, until


def device(index: int) -> Device:
    bdf = f"0000:{index + 5:02x}:00.0"
    return Device(f"rbln{index}", "RBLN-CA25", "1250", bdf, 0, "", None, None)


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
