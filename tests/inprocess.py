"""The daemon's own runtime on the test's event loop, against a simulated node.

In the style of uvicorn's ``run_server`` test helper: ``running`` starts
``runtime.daemon.serve`` (health service, metrics, instance lock, manager, plugins: the
same code the process runs once its options are parsed) as a task with a stop event of
its own, next to the simulator's kubelet on real unix sockets and the simulator's real
``rbln-smi`` executable over a sysfs tree in a temporary directory. Leaving the block sets
the stop event, as a SIGTERM would, and waits for the orderly shutdown.

The daemon's records go through the daemon's own logger (``telemetry.logs``: the same
processors and JSON renderer as on stdout) into a line stream that parses them back:
``h.daemon.records`` holds them as the process would have written them, ``h.daemon.lines``
the raw lines. Several in-process daemons may run at once (a module's shared daemon and
a test's own): each record is routed to the daemon whose task wrote it by a context
variable that every task and ``to_thread`` call of the daemon inherits.

A module's tests share one daemon where they only read, or touch nothing another test
sees (``shared`` in the test modules: a module-scoped fixture on the module's loop, and
``InProcess.for_test`` for each test's view of it); a test that faults a device or
changes the node gets its own.

``managing`` (at the end) is the layer under it: the scan loop alone with scripted scans.

What only a process shows (exit codes, signals, the stderr relay, a blocked stdout, the
lock between processes, ``cli``'s start-up records) stays with ``simnode.running``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import structlog

from rbln_device_plugin import options
from rbln_device_plugin.config import Config
from rbln_device_plugin.host.scan import ScanResult
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.runtime import daemon as runtime
from rbln_device_plugin.runtime.manager import Manager, ScanHooks
from rbln_device_plugin.telemetry import logs
from rbln_device_plugin.telemetry.tracing import disabled
from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import Layout, preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir

Record = dict[str, Any]

# The context variable structlog merges into each record (merge_contextvars is the
# first processor of the daemon's chain); stripped again before a test sees the record.
_ROUTE_KEY = "_inprocess_daemon"
_ROUTE_FIELD = re.compile(r',"' + _ROUTE_KEY + r'":(\d+)')
_ids = count(1)
STOP_TIMEOUT_S = 15.0  # a hang guard: the runtime's own budget is SHUTDOWN_BUDGET_S + 5 s


class _Store:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.records: list[Record] = []
        self.lock = threading.Lock()


class DaemonRecords:
    """One in-process daemon's records, with ``DaemonProcess``'s way of finding them.

    ``since_now`` gives a view that starts at the current record: a test on a shared
    daemon sees only what was written during it.
    """

    def __init__(self, level: str) -> None:
        self.id = next(_ids)
        self.level = level
        self.exit_code: int | None = None
        self.config: Config
        self.task: asyncio.Task[int]
        self._store = _Store()
        self._offset = 0

    def since_now(self) -> DaemonRecords:
        view = DaemonRecords.__new__(DaemonRecords)
        view.__dict__.update(self.__dict__)
        with self._store.lock:
            view._offset = len(self._store.records)
        return view

    @property
    def lines(self) -> list[str]:
        with self._store.lock:
            return self._store.lines[self._offset :]

    @property
    def records(self) -> list[Record]:
        with self._store.lock:
            return self._store.records[self._offset :]

    def _add(self, line: str) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            record = {"msg": "<<not json>>", "raw": line}
        with self._store.lock:
            self._store.lines.append(line)
            self._store.records.append(record)

    def find(self, msg: str | None, **fields: Any) -> list[Record]:
        """Records with this ``msg`` (any when None) and these field values."""
        return [
            r
            for r in self.records
            if (msg is None or r.get("msg") == msg)
            and all(r.get(k) == v for k, v in fields.items())
        ]

    async def await_log(
        self,
        msg: str | None,
        timeout: float = 15.0,
        count: int = 1,
        where: Callable[[Record], bool] = lambda _: True,
        **fields: Any,
    ) -> list[Record]:
        """At least ``count`` matching records; fails after ``timeout`` (a hang guard)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            found = [r for r in self.find(msg, **fields) if where(r)]
            if len(found) >= count:
                return found
            if loop.time() >= deadline:
                raise AssertionError(
                    f"no {count}x {msg!r} {fields} within {timeout}s; "
                    f"exit={self.exit_code}; last records: {self.records[-15:]}"
                )
            await asyncio.sleep(0.01)


class _Router:
    """The line stream every in-process daemon's logger writes to; one per process."""

    def __init__(self) -> None:
        self.active: dict[int, DaemonRecords] = {}
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        for line in text.splitlines():
            match = _ROUTE_FIELD.search(line)
            with self._lock:
                if match is not None:
                    owner = self.active.get(int(match.group(1)))
                    targets = [owner] if owner is not None else []
                else:  # a thread outside any daemon's context: every running daemon's
                    targets = list(self.active.values())
            clean = _ROUTE_FIELD.sub("", line, count=1)
            for target in targets:
                target._add(clean)
        return len(text)

    def flush(self) -> None:
        pass


_ROUTER = _Router()


def install_logging(level: str) -> None:
    """The daemon's logger, writing into the router (conftest resets structlog per test)."""
    logs.install({logs.LEVEL_ENV: level}, stream=_ROUTER)  # type: ignore[arg-type]


@dataclass
class InProcess:
    node: SimNode
    kubelet: KubeletStub
    daemon: DaemonRecords

    @property
    def config(self) -> Config:
        return self.daemon.config

    def serving(self) -> bool:
        """The runtime has not returned (a crash or an early exit ends it)."""
        return not self.daemon.task.done()

    def for_test(self) -> InProcess:
        """This daemon for one test of many: its records from now on, its logger back.

        conftest resets structlog after every test; the shared daemon's records would
        go nowhere without this.
        """
        install_logging(self.daemon.level)
        return dataclasses.replace(self, daemon=self.daemon.since_now())

    def sockets(self) -> list[str]:
        return sorted(p.name for p in self.node.kubelet_dir.iterdir() if p.is_socket())


@contextmanager
def _routed(records: DaemonRecords) -> Iterator[None]:
    with _ROUTER._lock:
        _ROUTER.active[records.id] = records
    try:
        yield
    finally:
        with _ROUTER._lock:
            _ROUTER.active.pop(records.id, None)


@asynccontextmanager
async def daemon_on(
    node: SimNode,
    interval: str = "300ms",
    extra_args: Sequence[str] = (),
    level: str = "debug",
) -> AsyncIterator[DaemonRecords]:
    """The daemon's runtime on ``node`` until the block ends; it must then exit with 0."""
    async with daemon_with([*node.daemon_args(interval), *extra_args], level) as records:
        yield records


@asynccontextmanager
async def daemon_with(args: Sequence[str], level: str = "debug") -> AsyncIterator[DaemonRecords]:
    """The daemon's runtime configured by these flags (no environment) until the block ends."""
    config = options.parse(args, {})
    records = DaemonRecords(level)
    records.config = config
    install_logging(level)
    stop = asyncio.Event()

    async def daemon() -> int:
        # Bound in this task's context only: its tasks and threads inherit it.
        structlog.contextvars.bind_contextvars(**{_ROUTE_KEY: records.id})
        return await runtime.serve(config, stop)

    with _routed(records):
        records.task = asyncio.create_task(daemon(), name=f"in-process daemon {records.id}")
        try:
            yield records
        finally:
            install_logging(level)  # a shared daemon's shutdown records, after conftest's reset
            stop.set()
            try:
                records.exit_code = await asyncio.wait_for(records.task, STOP_TIMEOUT_S)
            finally:
                logs.flush()
        assert records.exit_code == options.EXIT_OK, records.records[-15:]
        # A fault the daemon handles gets its documented records; a traceback or a line
        # that is not JSON means it broke instead, whatever the test looked at.
        broken = [r for r in records.records if "exception" in r or r.get("msg") == "<<not json>>"]
        assert not broken, broken[:3]


@asynccontextmanager
async def serving(
    node: SimNode,
    kubelet: KubeletStub,
    interval: str = "300ms",
    extra_args: Sequence[str] = (),
    level: str = "debug",
) -> AsyncIterator[InProcess]:
    """The daemon's runtime against ``node`` and ``kubelet`` until the block ends."""
    async with daemon_on(node, interval, extra_args, level) as records:
        yield InProcess(node, kubelet, records)


@asynccontextmanager
async def running(
    layout: str | Layout,
    interval: str = "300ms",
    extra_args: Sequence[str] = (),
    level: str = "debug",
    prepare: Callable[[SimNode], None] = lambda _: None,
) -> AsyncIterator[InProcess]:
    """A fresh simulated node, its kubelet stub and the daemon's runtime, in-process.

    ``simnode.running``'s signature without ``env`` (the in-process runtime reads no
    environment: pass flags); ``prepare`` changes the node before the daemon starts.
    """
    root = short_tempdir()
    node = materialize(preset(layout) if isinstance(layout, str) else layout, root)
    prepare(node)
    kubelet = KubeletStub(node.kubelet_dir)
    await kubelet.start()
    try:
        async with serving(node, kubelet, interval, extra_args, level) as harness:
            yield harness
    finally:
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- the scan loop alone
# The layer under ``running``: only the Manager (scan loop, plugins, kubelet
# registration) on the test's loop against the kubelet stub, its scans answered by a
# script instead of rbln-smi and sysfs, for what no simulated node can be made to do on
# cue (a scanner that raises a bug's exception, scans slower than the interval). Records
# go to structlog's own capture (``structlog.testing.capture_logs``).


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
    tmp: Path,
    scanner: ScriptedScanner,
    interval: str = "50ms",
    services: Callable[[Config], SharedServices] | None = None,
) -> AsyncIterator[tuple[Manager, KubeletStub]]:
    """A Manager running its scan loop against a kubelet stub until the block ends
    (``services``: what its plugins share, made from its settings)."""
    config = options.parse(
        ["--kubelet-device-plugin-path", str(tmp / "kubelet"), "--cdi-root", str(tmp / "cdi"),
         "--sysfs-root", str(tmp / "sys"), "--dev-root", str(tmp / "dev"),
         f"--device-scan-interval={interval}"],
        {},
    )  # fmt: skip
    kubelet = KubeletStub(config.kubelet_dir)
    await kubelet.start()
    shared = services(config) if services else SharedServices(config, disabled().tracer)
    manager = Manager(
        shared,
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
