"""The scan loop in-process: scheduling, failure handling, reconciliation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from rbln_device_plugin import options
from rbln_device_plugin.host.scan import DiscoveryError, ScanResult
from rbln_device_plugin.model.inventory import RESOURCE_NPU, Device
from rbln_device_plugin.runtime.manager import Manager
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


async def run_manager(
    tmp: Path, scanner: ScriptedScanner, until: Callable[[], bool], interval: str = "50ms"
) -> tuple[Manager, KubeletStub]:
    config = options.parse(
        ["--kubelet-device-plugin-path", str(tmp / "kubelet"), "--cdi-root", str(tmp / "cdi"),
         "--sysfs-root", str(tmp / "sys"), "--dev-root", str(tmp / "dev"),
         f"--device-scan-interval={interval}"],
        {},
    )  # fmt: skip
    kubelet = KubeletStub(config.kubelet_dir)
    await kubelet.start()
    ready = asyncio.Event()

    async def first_scan() -> None:
        ready.set()

    manager = Manager(config, disabled().tracer, first_scan, scanner=scanner)  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        async with asyncio.timeout(10):
            while not until():  # noqa: ASYNC110 - polling a plain predicate
                await asyncio.sleep(0.02)
        assert ready.is_set()
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await kubelet.stop()
    return manager, kubelet


async def test_unexpected_scan_error_is_a_discovery_failure_not_a_crash(short_tmp: Path) -> None:
    def answer(call: int) -> ScanResult:
        if call <= 2:
            raise RuntimeError("bug on odd input")
        return ScanResult({RESOURCE_NPU: (device(0), device(1))})

    scanner = ScriptedScanner(answer)
    manager, kubelet = await run_manager(short_tmp, scanner, lambda: scanner.calls >= 4)
    assert manager.plugins == {}  # stopped at shutdown
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
    def answer(call: int) -> ScanResult:
        if call == 3:
            raise DiscoveryError("rbln-smi gone")
        return ScanResult({RESOURCE_NPU: (device(0),)})

    scanner = ScriptedScanner(answer)
    _, kubelet = await run_manager(short_tmp, scanner, lambda: scanner.calls >= 5)
    accepted = [r for r in kubelet.registrations if r.accepted]
    assert len(accepted) == 2  # registered, stopped by the failure, registered again
