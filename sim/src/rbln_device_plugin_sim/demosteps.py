"""The demo's steps against one node, daemon and kubelet stand-in (see ``demo``).

Each step returns the lines it shows; a missing daemon feature raises Skipped, a daemon
that does something wrong raises Failed. After a step, the daemon's own records for it
are shown (``demolog``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

import grpc

from rbln_device_plugin.model import resources
from rbln_device_plugin_sim import shell
from rbln_device_plugin_sim.demolog import DaemonLog, folded
from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.node import SimNode

RESOURCE: Final = resources.NPU.name
CDI_KEY: Final = "cdi.k8s.io/rebellions.ai_npu"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
REGISTERED: Final = "Registered device plugin with kubelet"
EXPOSED: Final = "Device exposed"
# The daemon's records each step causes, in the order it writes them (msg, how many);
# the device count is filled in per node.
STEP_RECORDS: Final[dict[str, tuple[tuple[str, int], ...]]] = {
    "start": (
        ("Metrics disabled; no metrics port or OTLP metrics configured", 1),
        ("Distributed tracing disabled; no OTLP endpoint configured", 1),
    ),
    "register": ((REGISTERED, 1), (EXPOSED, -1)),
    "allocate": (("Completed container allocation", 1),),
    "fault": (("Device state changed", 1),),
    "restart": ((REGISTERED, 1), (EXPOSED, -1)),
    "stop": (("Shutdown complete", 1),),
}


def inspect_args(node: SimNode) -> list[str]:
    """``inspect`` with the daemon flags that change its report."""
    return [
        "inspect", "--sysfs-root", str(node.sysfs_root), "--rbln-smi", str(node.smi_path),
        "--cdi-root", str(node.cdi_root), "--cdi-static-dir", str(node.cdi_static_dir),
    ]  # fmt: skip


class Skipped(Exception):
    """The daemon lacks the feature this step shows."""


class Failed(Exception):
    """The daemon did something wrong."""


@dataclass(frozen=True, slots=True)
class DemoConfig:
    preset: str = "atom-max-8"
    register_timeout: float = 15.0
    health_timeout: float = 8.0
    stop_timeout: float = 10.0
    # The daemon's argv for a node; tests substitute stand-ins. None: the real daemon.
    daemon_command: Callable[[SimNode], list[str]] | None = None
    # The read-only report shown before the daemon starts.
    inspect_command: Callable[[SimNode], list[str]] = field(
        default=lambda node: [sys.executable, "-m", "rbln_device_plugin", *inspect_args(node)]
    )
    inspect_timeout: float = 60.0
    # Whether the daemon exists at all; None: look for rbln_device_plugin.cli.
    daemon_available: bool | None = None
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    keep: bool = False  # leave the node and the daemon's log in place
    # How long a step waits for the daemon's records it is known to produce.
    records_timeout: float = 5.0


class Demo:
    def __init__(self, config: DemoConfig, node: SimNode, stub: KubeletStub) -> None:
        self.config = config
        self.node = node
        self.stub = stub
        self.log_path = node.root / "daemon.log"
        self.log = DaemonLog(self.log_path)
        self.proc: asyncio.subprocess.Process | None = None
        self.results: list[tuple[str, str]] = []  # (step, OK / SKIPPED / FAILED)
        self.chosen: list[str] = []

    def say(self, text: str = "") -> None:
        print(text, file=self.config.out, flush=True)

    async def step(
        self,
        title: str,
        body: Callable[[], Awaitable[list[str]]],
        needs: Sequence[str] = (),
        records: str | None = None,
    ) -> bool:
        number = len(self.results) + 1
        self.say(f"\n[{number}] {title}")
        blocked = [n for n, outcome in self.results if n in needs and outcome != "OK"]
        if blocked:
            self.results.append((title, "SKIPPED"))
            self.say(f"    SKIPPED  needs: {', '.join(blocked)}")
            return False
        started = time.monotonic()
        try:
            lines = await body()
        except Skipped as exc:
            self.results.append((title, "SKIPPED"))
            self.say(f"    SKIPPED  {exc}")
            return False
        except Failed as exc:
            self.results.append((title, "FAILED"))
            self.say(f"    FAILED   {exc}")
            return False
        except Exception as exc:  # a surprise is a failure of this step, not a traceback
            self.results.append((title, "FAILED"))
            self.say(f"    FAILED   {type(exc).__name__}: {exc}")
            return False
        for line in lines:
            self.say(f"    {line}" if line else "")
        if records is not None:
            await self.show_records(records)
        self.results.append((title, "OK"))
        self.say(f"    ok ({time.monotonic() - started:.1f} s)")
        return True

    async def show_records(self, step: str) -> None:
        devices = len(self.node.layout.devices)
        expected = [(msg, devices if n < 0 else n) for msg, n in STEP_RECORDS[step]]
        records = await self.log.take(expected, self.config.records_timeout, self._running)
        shown = folded(records, hidden=frozenset({"resourceName"}))
        for index, line in enumerate(shown):
            self.say(f"    {'daemon' if index == 0 else '':<6}  {line}")

    # ---------------------------------------------------------------- steps

    def _require_daemon(self) -> None:
        available = self.config.daemon_available
        if available is None:
            available = importlib.util.find_spec("rbln_device_plugin.cli") is not None
        if not available:
            raise Skipped("the daemon is not built yet (no rbln_device_plugin.cli module)")

    async def inspect_node(self) -> list[str]:
        """``rbln-device-plugin inspect``: the node as the daemon will see it, read-only."""
        self._require_daemon()
        argv = self.config.inspect_command(self.node)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(self.config.inspect_timeout):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise Failed(
                f"inspect did not finish within {self.config.inspect_timeout:g} s"
            ) from None
        report = out.decode(errors="replace")
        if proc.returncode != 0:
            detail = _short(err.decode(errors="replace").strip() or report.strip(), 300)
            raise Failed(f"inspect exited with code {proc.returncode}: {detail}")
        shown = shell.daemon(inspect_args(self.node))
        return [f"$ {line}" if i == 0 else f"  {line}" for i, line in enumerate(
            shown.splitlines())] + _excerpt(report)  # fmt: skip

    async def start_daemon(self) -> list[str]:
        self._require_daemon()
        if self.config.daemon_command is None:
            argv = [sys.executable, "-m", "rbln_device_plugin", *self.node.daemon_args()]
            shown = shell.daemon(self.node.daemon_args())  # as the reader would start it
        else:
            argv = self.config.daemon_command(self.node)
            shown = shell.wrap(argv)
        log = self.log_path.open("wb")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
            )
        finally:
            log.close()
        return [
            f"pid {self.proc.pid}, started as:",
            *(f"  {line}" for line in shown.splitlines()),
            f"its log (one JSON record per line): {self.log_path}",
        ]

    async def _await_registration(self, what: str) -> list[str]:
        view_task = asyncio.ensure_future(
            self.stub.wait_for(RESOURCE, lambda v: v.messages > 0, self.config.register_timeout)
        )
        exit_task = asyncio.ensure_future(self._daemon_exit())
        done, _ = await asyncio.wait({view_task, exit_task}, return_when=asyncio.FIRST_COMPLETED)
        exit_task.cancel()
        if view_task not in done:
            view_task.cancel()
            raise Failed(f"the daemon exited with code {exit_task.result()} {what}")
        try:
            view_task.result()
        except TimeoutError:
            raise Skipped(
                f"{RESOURCE} did not register within {self.config.register_timeout:g} s"
            ) from None
        lines = []
        for resource in self.stub.resources():
            v = self.stub.view(resource)
            if v is not None:
                lines.append(
                    f"{resource:<26}{len(v.devices):>3} devices {v.count(HEALTHY):>3} Healthy"
                    f" {v.count(UNHEALTHY):>3} Unhealthy"
                )
        return lines

    async def registration(self) -> list[str]:
        return await self._await_registration("before registering")

    async def allocation(self) -> list[str]:
        view = self.stub.view(RESOURCE)
        assert view is not None
        available = [d.ID for d in view.devices if d.health == HEALTHY]
        try:
            chosen = await self.stub.preferred(RESOURCE, available, [], 4)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise Skipped("GetPreferredAllocation is not implemented yet") from None
            raise Failed(f"GetPreferredAllocation: {exc.code().name} {exc.details()}") from None
        if len(chosen) != 4:
            raise Failed(f"preferred set has {len(chosen)} devices, expected 4: {chosen}")
        lines = [f"preferred   {' '.join(chosen)}   {self._placement(chosen)}"]
        try:
            response = await self.stub.allocate(RESOURCE, [chosen])
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise Skipped("Allocate is not implemented yet") from None
            raise Failed(f"Allocate: {exc.code().name} {exc.details()}") from None
        if len(response.container_responses) != 1:
            raise Failed(f"{len(response.container_responses)} container answers for 1 container")
        answer = response.container_responses[0]
        label = "allocate"
        for spec in answer.devices:
            lines.append(f"{label:<12}{spec.container_path:<12} -> {spec.host_path}")
            label = ""
        rsd = [s for s in answer.devices if s.container_path == "/dev/rsd0"]
        if not rsd or not _exists(rsd[0].host_path):
            raise Failed("no /dev/rsd0 device whose host node exists")
        group = Path(rsd[0].host_path).name
        lines.append(
            f"{'':<12}(/dev/rsd0 is how the container sees {group}, the RSD group just made "
            f"for these {len(chosen)} NPUs)"
        )
        lines.append(f"{'annotation':<12}{CDI_KEY}={answer.annotations.get(CDI_KEY, '(missing)')}")
        lines.append(f"{'RSD groups':<12}{self._groups()}")
        lines.append(f"{'':<12}(group 0 is the default group every NPU is in until allocated)")
        self.chosen = chosen
        return lines

    async def fault(self) -> list[str]:
        view = self.stub.view(RESOURCE)
        assert view is not None
        healthy = [d.ID for d in view.devices if d.health == HEALTHY and d.ID not in self.chosen]
        if not healthy:
            raise Failed("no healthy device left to fault")
        target, before = healthy[-1], view.messages
        self.node.set_status(target, 4)
        lines = [f"{target}: status file now reads 4 (FAULT)"]
        try:
            after = await self.stub.wait_for(
                RESOURCE, lambda v: v.health(target) == UNHEALTHY, self.config.health_timeout
            )
        except TimeoutError:
            current = self.stub.view(RESOURCE)
            if current is not None and current.messages == before:
                raise Skipped(
                    f"no ListAndWatch update within {self.config.health_timeout:g} s"
                    " (periodic health scan not built yet?)"
                ) from None
            raise Failed(f"{target} still not Unhealthy at the kubelet") from None
        lines.append(
            f"kubelet sees {target} {UNHEALTHY}: {after.count(HEALTHY)} Healthy,"
            f" {after.count(UNHEALTHY)} Unhealthy"
        )
        return lines

    async def kubelet_restart(self) -> list[str]:
        await self.stub.restart()
        lines = ["kubelet.sock recreated, plugin sockets deleted"]
        lines += await self._await_registration("after the kubelet restart")
        return lines

    async def stop_daemon(self) -> list[str]:
        if self.proc is None or self.proc.returncode is not None:
            # Already reported by the step that saw it go.
            raise Skipped(f"the daemon had already exited (code {self._code()})")
        self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(self.config.stop_timeout):
                code = await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise Failed(f"no exit within {self.config.stop_timeout:g} s of SIGTERM") from None
        if code != 0:
            raise Failed(f"the daemon exited with code {code} after SIGTERM")
        return ["SIGTERM -> exit code 0"]

    # ---------------------------------------------------------------- helpers

    async def _daemon_exit(self) -> int | None:
        return await self.proc.wait() if self.proc is not None else None

    def _running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def _code(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def _placement(self, ids: Sequence[str]) -> str:
        devs = [self.node.layout.device(i) for i in ids if _known(self.node, i)]
        sids, numas = {d.sid for d in devs}, {d.numa for d in devs}
        cards = "one card" if len(sids) == 1 else f"{len(sids)} cards"
        return f"({cards}, NUMA {'/'.join(sorted(numas))})"

    def _groups(self) -> str:
        groups = self.node.groups()
        return "  ".join(f"{g}: {len(n)} devices" for g, n in sorted(groups.items()))

    async def cleanup(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    def log_tail(self, lines: int = 8) -> list[str]:
        return self.log.tail(lines)


def _excerpt(report: str, rows: int = 4) -> list[str]:
    """The inspect table with only its first device rows; every other section whole."""
    blocks = report.rstrip("\n").split("\n\n")
    out: list[str] = []
    for index, block in enumerate(blocks):
        lines = block.splitlines()
        if index == 1 and len(lines) > rows + 1:
            hidden = len(lines) - 1 - rows
            lines = [*lines[: rows + 1], f"... {hidden} more device rows"]
        if out:
            out.append("")
        out += lines
    return out


def _exists(path: str) -> bool:
    return Path(path).exists()


def _known(node: SimNode, name: str) -> bool:
    return any(d.name == name for d in node.layout.devices)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
