"""What an idle daemon looks at between changes, and that a change is still looked at.

The in-process runtime against a simulated node; every host access goes through
``HostIO`` (a rule of the daemon), whose calls are named by the path they touch, so a
spy on it lists what each scan looked at. Between changes an idle scan reads only the
devices' status files and runs rbln-smi: the sockets, the instance lock files and the
CDI spec directories are followed by inotify and looked at again when a watch reports
a change, when no watch is live, and once a backup period.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from rbln_device_plugin.host import inotify
from rbln_device_plugin.host.hostio import Call, HostIO
from rbln_device_plugin.model import looks

from .inprocess import InProcess, running

NPU = "rebellions.ai/npu"
SCAN = "Reconciled device inventory"


@pytest.fixture
def looked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every key (path) of every host access, in order, from now on."""
    keys: list[str] = []
    original = HostIO.map

    async def spy(self: HostIO, calls: Sequence[Call[Any]]) -> list[Any]:
        keys.extend(call.key for call in calls)
        return await original(self, calls)

    monkeypatch.setattr(HostIO, "map", spy)
    yield keys


async def scans(h: InProcess, count: int) -> None:
    done = len(h.daemon.find(SCAN))
    await h.daemon.await_log(SCAN, count=done + count)


def besides_status(keys: list[str]) -> set[str]:
    return {key for key in keys if not key.endswith("/status")}


async def settled(h: InProcess) -> None:
    """Registered, and past the scans that follow the watches' start."""
    await h.kubelet.wait_for(NPU, lambda v: len(v.devices) > 0 and v.messages > 0, 15)
    await scans(h, 3)


async def test_an_idle_scan_reads_the_status_files_and_nothing_else(looked: list[str]) -> None:
    async with running("atom-max-8", interval="100ms") as h:
        await settled(h)
        looked.clear()
        await scans(h, 8)
        statuses = [key for key in looked if key.endswith("/status")]
        assert len(statuses) >= 8 * 8  # the spy sees every scan's reads (8 devices or more)
        assert besides_status(looked) == set()


async def test_a_change_in_a_watched_directory_is_looked_at_by_the_next_scan(
    looked: list[str],
) -> None:
    async with running("atom-max-8", interval="100ms") as h:
        await settled(h)
        looked.clear()
        (h.node.cdi_static_dir / "notes.txt").write_text("not a spec\n")
        await scans(h, 2)
        assert str(h.node.cdi_static_dir) in looked
        looked.clear()
        (h.node.kubelet_dir / "other-vendor.sock").write_bytes(b"")
        await scans(h, 2)
        kubelet_dir = str(h.node.kubelet_dir)
        assert any(key.startswith(kubelet_dir) for key in besides_status(looked)), looked
        looked.clear()
        await scans(h, 4)  # one look per change, then quiet again
        assert besides_status(looked) == set()


async def test_an_in_place_rewrite_of_the_spec_is_seen_without_a_new_name() -> None:
    """``cp -p`` over the toolkit's spec (same name, size and mtime): the directory's
    watch reports the write, the check reads the file again and finds it unusable."""
    async with running("atom-max-8", interval="100ms") as h:
        await settled(h)
        spec = h.node.cdi_spec_path
        text = spec.read_text()
        stat = spec.stat()
        broken = text.replace("cdiVersion", "cdiVersiox", 1)
        assert len(broken) == len(text)
        with open(spec, "r+") as rewrite:  # in place: no new directory entry
            rewrite.write(broken)
        os.utime(spec, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        await h.daemon.await_log(
            "No CDI spec defines the NPU CDI device; CDI-enabled container runtimes will "
            "refuse NPU containers until one is written"
        )


async def test_without_inotify_every_scan_looks_as_before(
    looked: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(*_: object, **__: object) -> None:
        raise inotify.InotifyUnavailable(95, "operation not supported")

    monkeypatch.setattr(inotify.DirectoryWatch, "__init__", unavailable)
    async with running("atom-max-8", interval="100ms") as h:
        await settled(h)
        looked.clear()
        await scans(h, 4)
        others = besides_status(looked)
        assert str(h.node.cdi_static_dir) in others
        assert str(h.node.kubelet_dir / "kubelet.sock") in others
        assert looked.count(str(h.node.cdi_static_dir)) >= 3


async def test_the_backup_look_comes_although_no_watch_reports_anything(
    looked: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(looks, "BACKUP_S", 0.5)  # scans every 0.1 s: about one in five
    async with running("atom-max-8", interval="100ms") as h:
        await settled(h)
        looked.clear()
        first = len(h.daemon.find(SCAN))
        spec_dir = str(h.node.cdi_static_dir)
        async with asyncio.timeout(15):
            while looked.count(spec_dir) < 3:
                await scans(h, 1)
        scanned = len(h.daemon.find(SCAN)) - first
        assert scanned >= 2 * 3, "each backup look came with the scans between them"
        assert "rbln-smi lookup" in looked
        assert str(h.node.kubelet_dir / "kubelet.sock") in looked
