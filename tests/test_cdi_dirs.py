"""The CDI spec directories on a real file system: files the daemon did not check, entries
it must not open, rewrites that keep size and modification time, directories it need not
list again, and decoding that takes long. Each behaviour as an operator would see it (the
verdict, the records) or as the kernel reports it (inotify's open and access events)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from rbln_device_plugin import config
from rbln_device_plugin.host import cdidirs
from rbln_device_plugin.host.cdidirs import SpecDirReader
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.inotify import parse_events
from rbln_device_plugin.model import cdispec
from rbln_device_plugin.model.cdispec import CdiState, FileState, resolve_cdi_devices
from rbln_device_plugin.runtime.cdicheck import CdiSpecCheck
from rbln_device_plugin.telemetry.metrics import NOOP

from .test_cdi_spec import GOOD, RUNTIME

OTHER = GOOD.replace("rebellions.ai/npu", "vendor.com/gpu")
HANG_RECORD = (
    "A FIFO in a CDI spec directory would hang the container runtimes' CDI library; remove it"
)
UNKNOWN_RECORD = "Cannot tell whether a CDI spec defines the NPU CDI device"
DECODING_RECORD = (
    "CDI spec check: decoding a spec file did not finish in time; the file counts as not "
    "checked until it does"
)
HOST_ACCESS_RECORD = "Host access did not finish in time; treating it as unreadable"
IN_ACCESS, IN_OPEN = 0x1, 0x20
ROOT = os.geteuid() == 0


@pytest.fixture
def cdi(tmp_path: Path) -> Path:
    """A spec directory holding the toolkit's spec."""
    d = tmp_path / "cdi"
    d.mkdir()
    (d / "rbln.yaml").write_text(GOOD)
    return d


def verdict_of(*dirs: Path, reader: SpecDirReader | None = None) -> cdispec.SpecVerdict:
    reader = reader or SpecDirReader()
    return resolve_cdi_devices([reader.read(str(d)) for d in dirs])


class Watch:
    """inotify on one directory: which entries were opened, and whether it was listed."""

    def __init__(self, directory: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0
        assert libc.inotify_add_watch(self.fd, os.fsencode(directory), IN_ACCESS | IN_OPEN) >= 0

    def drain(self) -> tuple[set[str], bool]:
        """(names of entries opened, whether the directory itself was listed) since the
        last drain; opening the directory itself is not counted (a look needs it)."""
        opened: set[str] = set()
        listed = False
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return opened, listed
            for _, event in parse_events(data):
                if event.mask & IN_OPEN and event.name:
                    opened.add(event.name)
                if event.mask & IN_ACCESS and not event.name:
                    listed = True  # getdents on the directory

    def close(self) -> None:
        os.close(self.fd)


Watcher = Callable[[Path], Watch]


@pytest.fixture
def watch() -> Iterator[Watcher]:
    watches: list[Watch] = []

    def start(directory: Path) -> Watch:
        watches.append(Watch(directory))
        return watches[-1]

    yield start
    for w in watches:
        w.close()


def settled(path: Path) -> None:
    """Return once the file system clock has moved past ``path``'s change time: a change
    made afterwards gets a later change time (timestamps come from a coarse clock)."""
    scratch = path.parent / ".clock"
    before = path.stat().st_ctime_ns
    while True:
        scratch.write_text("")
        if scratch.stat().st_ctime_ns > before:
            scratch.unlink()
            return


# ---------------------------------------------------------------- files it did not check
@pytest.mark.parametrize("kind", ["symlink leaving the directory", "larger than the cap",
                                  "past the file-count cap"])  # fmt: skip
def test_a_second_definition_it_could_not_check_makes_a_found_device_cannot_tell(
    cdi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # The library reads each of these (it follows links anywhere and has no caps), sees
    # two definitions in one directory and drops the device (measured with v1.1.1's
    # cache: "conflicting device").
    if kind == "symlink leaving the directory":
        (tmp_path / "elsewhere.yaml").write_text(GOOD)
        os.symlink(tmp_path / "elsewhere.yaml", cdi / "vendor.yaml")
        unchecked = str(cdi / "vendor.yaml")
    elif kind == "larger than the cap":
        (cdi / "vendor.yaml").write_text(GOOD + "#" * (1 << 20) + "\n")
        unchecked = str(cdi / "vendor.yaml")
    else:
        monkeypatch.setattr(cdidirs, "MAX_SPEC_FILES", 1)
        (cdi / "zz.yaml").write_text(GOOD)  # after rbln.yaml in name order
        unchecked = str(cdi)
    verdict = verdict_of(cdi)
    assert verdict.state is CdiState.UNKNOWN
    assert verdict.found == {RUNTIME: str(cdi / "rbln.yaml")}  # still said where it is
    assert unchecked in verdict.unchecked


def test_a_file_it_could_not_check_that_cannot_clash_leaves_the_spec_present(
    cdi: Path, tmp_path: Path
) -> None:
    # Alone in the other directory, an unchecked file can at most define the device once
    # more there, which the library takes over this one: still present.
    run = tmp_path / "run"
    run.mkdir()
    (run / "big.yaml").write_text(GOOD + "#" * (1 << 20) + "\n")
    (cdi / "garbage.yaml").write_text("{{{")  # unusable files never clash
    verdict = verdict_of(cdi, run)
    assert verdict.state is CdiState.PRESENT
    assert str(run / "big.yaml") in verdict.unchecked
    # Two of them there could define it twice: cannot tell.
    (run / "big2.yaml").write_text(GOOD + "#" * (1 << 20) + "\n")
    assert verdict_of(cdi, run).state is CdiState.UNKNOWN


async def test_a_fifo_beside_the_spec_is_reported_as_hanging_the_runtimes(cdi: Path) -> None:
    os.mkfifo(cdi / "fifo.yaml")
    cfg = config.config_from_settings({"cdi_static_dir": str(cdi), "cdi_root": str(cdi)}, {})
    check = CdiSpecCheck(cfg, HostIO(), NOOP)
    with capture_logs() as logs:
        verdict = await asyncio.wait_for(check.check(), 10)
        await asyncio.wait_for(check.check(), 10)
    assert verdict.state is CdiState.UNKNOWN  # the runtimes' refresh would never finish
    fifo = str(cdi / "fifo.yaml")
    assert "blocks opening it for good" in verdict.unchecked[fifo]
    hangs = [r for r in logs if r["event"] == HANG_RECORD]
    assert len(hangs) == 1 and hangs[0]["log_level"] == "warning"  # once, not per check
    assert hangs[0]["files"] == [fifo] and "containerd 2.x" in hangs[0]["hangs"]
    (unknown,) = [r for r in logs if r["event"] == UNKNOWN_RECORD]
    assert fifo in unknown["notChecked"]
    os.unlink(cdi / "fifo.yaml")
    assert (await check.check()).state is CdiState.PRESENT


# ---------------------------------------------------------------- nothing opened unchecked
def test_no_entry_is_opened_before_its_type_is_known(cdi: Path, watch: Watcher) -> None:
    os.mkfifo(cdi / "fifo.yaml")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(cdi / "sock.yaml"))
    if ROOT:  # a character device: /dev/null's numbers, opening which has no effect
        os.mknod(cdi / "null.yaml", 0o600 | 0o020000, os.makedev(1, 3))
    w = watch(cdi)
    reader = SpecDirReader()
    try:
        first = reader.read(str(cdi))
        (cdi / "other.yaml").write_text(OTHER)  # the directory changed: read again
        again = reader.read(str(cdi))
    finally:
        server.close()
    opened, _ = w.drain()
    assert opened == {"rbln.yaml", "other.yaml"}  # never the FIFO, socket or device
    states = {Path(f.path).name: (f.state, f.reason) for f in again.files}
    assert states["sock.yaml"][0] is FileState.MALFORMED  # the runtimes cannot open it
    assert "blocks" in states["fifo.yaml"][1]
    if ROOT:
        # The runtimes would open and read it: what it says is unknown.
        assert states["null.yaml"][0] is FileState.UNCHECKED
        assert "character device: not opened" in states["null.yaml"][1]
    assert resolve_cdi_devices([first]).state is CdiState.UNKNOWN


def test_an_entry_swapped_for_a_fifo_between_the_look_and_the_read_is_not_opened(
    cdi: Path, watch: Watcher
) -> None:
    from rbln_device_plugin.host import cdientry

    survey = SpecDirReader().survey(str(cdi))
    assert isinstance(survey, cdidirs.Survey)
    (item,) = survey.entries
    assert isinstance(item, cdientry.ToRead)
    os.unlink(cdi / "rbln.yaml")
    os.mkfifo(cdi / "rbln.yaml")  # what a hostile writer could do in between
    w = watch(cdi)
    loaded = cdientry.load(item)
    assert isinstance(loaded.data, cdispec.SpecFile) and not loaded.stable
    assert "replaced while read" in loaded.data.reason
    assert w.drain()[0] == set()


# ---------------------------------------------------------------- rewrites in place
def rewrite_in_place(spec: Path, text: str) -> None:
    """``cp -p`` a same-size file over ``spec``: same inode, size and modification time."""
    before = spec.stat()
    source = spec.parent.parent / "replacement"
    source.write_text(text)
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    subprocess.run(["cp", "-p", str(source), str(spec)], check=True)
    after = spec.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns,
    )  # fmt: skip


def test_a_rewrite_keeping_size_and_modification_time_is_noticed(cdi: Path) -> None:
    reader = SpecDirReader()
    assert verdict_of(cdi, reader=reader).state is CdiState.PRESENT
    rewrite_in_place(cdi / "rbln.yaml", GOOD.replace("name: runtime", "name: runtimf"))
    assert verdict_of(cdi, reader=reader).state is CdiState.MISSING


def test_the_change_time_alone_tells_such_a_rewrite(
    cdi: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every signature trusted at once: only the change time can tell the two files apart.
    monkeypatch.setattr(cdidirs, "RACY_NS", 0, raising=False)
    settled(cdi / "rbln.yaml")
    reader = SpecDirReader()
    assert verdict_of(cdi, reader=reader).state is CdiState.PRESENT
    rewrite_in_place(cdi / "rbln.yaml", GOOD.replace("name: runtime", "name: runtimf"))
    assert verdict_of(cdi, reader=reader).state is CdiState.MISSING


def test_changes_in_the_same_clock_tick_as_the_look_are_noticed(cdi: Path) -> None:
    reader = SpecDirReader()
    for _ in range(20):  # each change right after a look, as fast as it can go
        assert verdict_of(cdi, reader=reader).state is CdiState.PRESENT
        (cdi / "second.yaml").write_text(GOOD)  # a clash: dropped
        assert verdict_of(cdi, reader=reader).state is CdiState.MISSING
        (cdi / "second.yaml").unlink()


# ---------------------------------------------------------------- listing only on change
def test_an_unchanged_directory_is_not_listed_again(
    cdi: Path, watch: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cdidirs, "RACY_NS", 0, raising=False)  # trusted at once
    for index in range(1000):
        (cdi / f"unrelated-{index}.txt").write_text("")
    reader = SpecDirReader()
    assert verdict_of(cdi, reader=reader).state is CdiState.PRESENT
    w = watch(cdi)
    for _ in range(3):
        assert verdict_of(cdi, reader=reader).state is CdiState.PRESENT
    assert w.drain() == (set(), False)  # neither listed nor any file opened
    (cdi / "zz.yaml").write_text(OTHER)
    again = reader.read(str(cdi))
    assert w.drain() == ({"zz.yaml"}, True)  # listed; only the new file read
    assert {Path(f.path).name for f in again.files} == {"rbln.yaml", "zz.yaml"}


# ---------------------------------------------------------------- decoding is CPU work
async def test_slow_decoding_is_reported_as_the_checks_cpu_work_not_host_access(
    cdi: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A decoding held back stands in for a file that costs seconds of CPU to decode
    # (how costly a file may be is parse_spec's own bound, tested with it).
    release = threading.Event()
    real = cdispec.check_spec_file

    def slow_check(
        path: str, data: bytes, budget: cdispec.Budget | None = None
    ) -> cdispec.SpecFile:
        release.wait(30)
        return real(path, data, budget)

    monkeypatch.setattr(cdidirs, "check_spec_file", slow_check)
    monkeypatch.setattr(cdidirs, "PARSE_BUDGET_S", 0.3, raising=False)
    cfg = config.config_from_settings({"cdi_static_dir": str(cdi), "cdi_root": str(cdi)}, {})
    io = HostIO(timeout=0.3)
    check = CdiSpecCheck(cfg, io, NOOP)
    spec = str(cdi / "rbln.yaml")
    try:
        with capture_logs() as logs:
            verdict = await asyncio.wait_for(check.check(), 10)
            again = await asyncio.wait_for(check.check(), 10)
        assert verdict.state is CdiState.UNKNOWN and not verdict.unseen
        assert "CPU work, not host access" in verdict.unchecked[spec]
        assert "still running" in again.unchecked[spec]  # not read nor decoded twice
        assert [r["path"] for r in logs if r["event"] == DECODING_RECORD] == [spec]
        assert not [r for r in logs if r["event"] == HOST_ACCESS_RECORD] and not io.stuck
    finally:
        release.set()
    for _ in range(200):  # the decoding ends; what it found is the next verdict
        verdict = await check.check()
        if verdict.state is CdiState.PRESENT:
            break
        await asyncio.sleep(0.02)
    assert verdict.state is CdiState.PRESENT


def _costly_spec(entries: int) -> str:
    """A usable spec whose decoding takes about three units per environment entry."""
    env = "".join(f"        - V{i}=1\n" for i in range(entries))
    return GOOD.replace("      env: [RBLN_CDI=1]\n", f"      env:\n{env}")


async def test_files_past_a_checks_decoding_budget_are_decoded_at_a_later_check(
    cdi: Path,
) -> None:
    # Each file alone fits a file's budget; together they outgrow one check's, so the
    # later ones wait for the next check instead of costing this one unbounded CPU.
    (cdi / "rbln.yaml").unlink()
    for name in ("a.yaml", "b.yaml", "c.yaml"):
        (cdi / name).write_text(_costly_spec(12_000).replace("runtime", name[0]))
    # Past the window in which a file's times are not trusted (it is read again at every
    # check then): what a check decoded is kept from here on.
    await asyncio.sleep(cdidirs.RACY_NS / 1e9 + 0.2)
    cfg = config.config_from_settings({"cdi_static_dir": str(cdi), "cdi_root": str(cdi)}, {})
    check = CdiSpecCheck(cfg, HostIO(), NOOP)
    first = await asyncio.wait_for(check.check(), 30)
    waiting = {Path(p).name for p, why in first.unchecked.items() if "decoding budget" in why}
    assert waiting and len(waiting) < 3, first.unchecked
    checks = 1
    while (verdict := await asyncio.wait_for(check.check(), 30)).unchecked:
        checks += 1
        assert checks < 5, verdict.unchecked  # each check decodes at least one file more
    assert verdict.state is CdiState.MISSING  # all three usable; none defines "runtime"
