"""The daemon's own files in shared host directories (host.ownfiles), on real files in a
temporary directory: what sits where a lock file belongs is never opened before its type
is known, moving it aside never replaces or loses anything, and the entries moved aside
stay bounded."""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from rbln_device_plugin.host import noreplace, ownfiles
from rbln_device_plugin.host.ownfiles import (
    KEEP_MOVED_ASIDE,
    MOVED_ASIDE_MSG,
    REMOVED_ASIDE_MSG,
    UnsafeEntry,
)

IN_OPEN = 0x20
IN_DONT_FOLLOW = 0x02000000  # watch a symlink itself
SECONDS = 1_800_000_000  # the moved-aside suffix's clock, fixed: every rename "in one second"


class Opens:
    """Counts the opens (not O_PATH looks) of one inode, through inotify's IN_OPEN: the
    kernel queues the event in the open call itself, so reading after the code under test
    returned sees every open it made."""

    def __init__(self, path: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self._fd >= 0
        watch = libc.inotify_add_watch(self._fd, os.fsencode(path), IN_OPEN | IN_DONT_FOLLOW)
        assert watch >= 0, os.strerror(ctypes.get_errno())

    def count(self) -> int:
        seen = 0
        with contextlib.suppress(BlockingIOError):
            data = os.read(self._fd, 4096)
            while data:
                _, mask, _, size = struct.unpack_from("iIII", data)
                seen += bool(mask & IN_OPEN)
                data = data[16 + size :]
        return seen

    def close(self) -> None:
        os.close(self._fd)


@contextlib.contextmanager
def opens_of(path: Path) -> Iterator[Opens]:
    watch = Opens(path)
    try:
        yield watch
    finally:
        watch.close()


def make_fifo(path: Path) -> None:
    os.mkfifo(path, 0o600)


def make_char_device(path: Path) -> None:
    """A character device node (1:3, what /dev/null is); only root may make one."""
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")


SPECIAL = [
    pytest.param(make_char_device, "character device", id="character-device"),
    pytest.param(make_fifo, "named pipe", id="fifo"),
]


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """The moved-aside suffix's seconds, set by the test."""
    now = [SECONDS]
    monkeypatch.setattr(ownfiles.time, "time_ns", lambda: now[0] * 1_000_000_000)

    def set_seconds(seconds: int) -> None:
        now[0] = seconds

    return set_seconds


def open_own(directory: Path, name: str = "x.lock", **kwargs: object) -> int | None:
    with ownfiles.opened_dir(directory) as dir_fd:
        return ownfiles.open_file(dir_fd, directory, name, **kwargs)  # type: ignore[arg-type]


def asides(directory: Path, name: str = "x.lock") -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(f"{name}.moved-aside."))


# ------------------------------------------------------------ looked at before opened
@pytest.mark.parametrize(("make", "kind"), SPECIAL)
def test_a_device_or_pipe_where_a_lock_file_belongs_is_moved_aside_never_opened(
    tmp_path: Path, make: Callable[[Path], None], kind: str
) -> None:
    """Opening some device nodes has side effects (a watchdog arms on open): the entry is
    looked at through O_PATH, which opens nothing, and moved aside unopened."""
    planted = tmp_path / "x.lock"
    make(planted)
    with opens_of(planted) as opens, structlog.testing.capture_logs() as records:
        fd = open_own(tmp_path)
        assert fd is not None
        os.close(fd)
        assert opens.count() == 0
    (aside,) = asides(tmp_path)
    assert ownfiles.kind_of((tmp_path / aside).lstat().st_mode) == kind
    (moved,) = [r for r in records if r["event"] == MOVED_ASIDE_MSG]
    assert f"is a {kind}, not a regular file" in moved["problem"]
    assert stat.S_ISREG(planted.lstat().st_mode)  # the daemon's own file now


@pytest.mark.parametrize(("make", "kind"), SPECIAL)
def test_a_device_or_pipe_where_the_daemons_directory_belongs_is_never_opened(
    tmp_path: Path, make: Callable[[Path], None], kind: str
) -> None:
    planted = tmp_path / "lockdir"
    make(planted)
    with opens_of(planted) as opens, ownfiles.opened_dir(tmp_path) as dir_fd:
        fd = ownfiles.open_subdir(dir_fd, tmp_path, "lockdir")
        assert fd is not None
        os.close(fd)
        assert opens.count() == 0
    assert planted.is_dir()
    (aside,) = asides(tmp_path, "lockdir")
    assert ownfiles.kind_of((tmp_path / aside).lstat().st_mode) == kind


def test_the_daemons_own_file_is_opened_once_and_is_the_file_looked_at(tmp_path: Path) -> None:
    mine = tmp_path / "x.lock"
    mine.write_text("1234\n")
    mine.chmod(0o644)
    with opens_of(mine) as opens:
        fd = open_own(tmp_path)
        assert fd is not None
        try:
            assert opens.count() == 1  # the open for I/O; the look before it opened nothing
            assert os.fstat(fd).st_ino == mine.stat().st_ino
            assert os.pread(fd, 10, 0) == b"1234\n"
            assert os.get_blocking(fd)
        finally:
            os.close(fd)
    assert asides(tmp_path) == []


@pytest.mark.parametrize(("make", "kind"), SPECIAL)
def test_reading_a_file_as_the_lock_holders_never_opens_a_device_or_pipe(
    tmp_path: Path, make: Callable[[Path], None], kind: str
) -> None:
    planted = tmp_path / "holder"
    make(planted)
    with opens_of(planted) as opens:
        assert ownfiles.open_regular_to_read(planted) is None
        assert opens.count() == 0


# --------------------------------------------------------------- moved aside, never lost
@pytest.mark.parametrize("fallback", [False, True], ids=["renameat2", "without-renameat2"])
def test_two_entries_moved_aside_in_one_second_are_both_kept(
    tmp_path: Path, fixed_clock: Callable[[int], None], monkeypatch: pytest.MonkeyPatch,
    fallback: bool,
) -> None:  # fmt: skip
    """rename(2) onto ``<name>.moved-aside.<secs>`` replaced the first entry with the second."""
    monkeypatch.setattr(noreplace, "_refused", fallback)
    for text in ("first stray\n", "second stray\n"):
        target = tmp_path / "x.lock"
        if target.exists():
            target.unlink()  # the daemon's file from the round before
        target.write_text(text)
        target.chmod(0o666)  # writable by others: not the daemon's to use
        fd = open_own(tmp_path)
        assert fd is not None
        os.close(fd)
    first, second = f"x.lock.moved-aside.{SECONDS}", f"x.lock.moved-aside.{SECONDS}.1"
    assert asides(tmp_path) == [first, second]
    assert (tmp_path / first).read_text() == "first stray\n"
    assert (tmp_path / second).read_text() == "second stray\n"


def test_a_directory_moved_aside_where_a_full_one_was_moved_before_takes_the_next_name(
    tmp_path: Path, fixed_clock: Callable[[int], None]
) -> None:
    """Renaming a directory onto a non-empty one fails (ENOTEMPTY): that used to end the
    daemon (exit 1) instead of taking another name."""
    earlier = tmp_path / f"x.lock.moved-aside.{SECONDS}"
    earlier.mkdir()
    (earlier / "evidence").write_text("kept\n")
    (tmp_path / "x.lock").mkdir()
    (tmp_path / "x.lock" / "content").write_text("also kept\n")
    fd = open_own(tmp_path)
    assert fd is not None
    os.close(fd)
    assert (earlier / "evidence").read_text() == "kept\n"
    moved = tmp_path / f"x.lock.moved-aside.{SECONDS}.1"
    assert (moved / "content").read_text() == "also kept\n"


def test_entries_moved_aside_are_bounded_to_the_newest_per_name(
    tmp_path: Path, fixed_clock: Callable[[int], None]
) -> None:
    """Something that keeps planting a stray file fills nothing: the oldest entries moved
    aside are removed beyond the newest KEEP_MOVED_ASIDE, each removal recorded."""
    rounds = KEEP_MOVED_ASIDE + 3
    with structlog.testing.capture_logs() as records:
        for n in range(rounds):
            fixed_clock(SECONDS + n)
            target = tmp_path / "x.lock"
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            target.write_text(f"stray {n}\n")
            target.chmod(0o666)
            fd = open_own(tmp_path)
            assert fd is not None
            os.close(fd)
    kept = asides(tmp_path)
    assert kept == [f"x.lock.moved-aside.{SECONDS + n}" for n in range(3, rounds)]
    assert [(tmp_path / k).read_text() for k in kept] == [f"stray {n}\n" for n in range(3, rounds)]
    removed = [r for r in records if r["event"] == REMOVED_ASIDE_MSG]
    assert [r["removed"] for r in removed] == [
        [str(tmp_path / f"x.lock.moved-aside.{SECONDS + n}")] for n in range(3)
    ]
    assert all(r["log_level"] == "info" for r in removed)


def test_directories_with_content_moved_aside_are_never_deleted(
    tmp_path: Path, fixed_clock: Callable[[int], None]
) -> None:
    """An empty directory, a symlink and a file moved aside may go to make room; a directory
    with content never does: with the quota full of those, nothing more is moved aside."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "x.lock.moved-aside.1").mkdir()  # empty: removable
    (tmp_path / "x.lock.moved-aside.2").symlink_to(victim)  # removes the link only
    for n in range(3, 3 + KEEP_MOVED_ASIDE):
        full = tmp_path / f"x.lock.moved-aside.{n}"
        full.mkdir()
        (full / "inside").write_text(f"{n}\n")
    (tmp_path / "x.lock").write_text("stray\n")
    (tmp_path / "x.lock").chmod(0o666)
    with pytest.raises(UnsafeEntry) as refused:
        open_own(tmp_path)
    assert "directories with content that the daemon never deletes" in str(refused.value)
    assert victim.read_text() == "precious\n"
    assert asides(tmp_path) == [f"x.lock.moved-aside.{n}" for n in range(3, 3 + KEEP_MOVED_ASIDE)]
    for n in range(3, 3 + KEEP_MOVED_ASIDE):
        assert (tmp_path / f"x.lock.moved-aside.{n}" / "inside").read_text() == f"{n}\n"
    assert (tmp_path / "x.lock").read_text() == "stray\n"  # left where it was


def test_a_name_that_only_looks_moved_aside_is_not_counted(
    tmp_path: Path, fixed_clock: Callable[[int], None]
) -> None:
    for name in ("x.lock.moved-aside.", "x.lock.moved-aside.1.2.3", "x.lock.moved-aside.1x",
                 "y.lock.moved-aside.1", "x.lockmoved-aside.1"):  # fmt: skip
        (tmp_path / name).write_text("not ours\n")
    for n in range(KEEP_MOVED_ASIDE + 2):
        fixed_clock(SECONDS + n)
        with contextlib.suppress(FileNotFoundError):
            (tmp_path / "x.lock").unlink()
        (tmp_path / "x.lock").symlink_to("/nonexistent")
        fd = open_own(tmp_path)
        assert fd is not None
        os.close(fd)
    for name in ("x.lock.moved-aside.", "x.lock.moved-aside.1.2.3", "x.lock.moved-aside.1x",
                 "y.lock.moved-aside.1", "x.lockmoved-aside.1"):  # fmt: skip
        assert (tmp_path / name).read_text() == "not ours\n"


# ----------------------------------------------------------------- a path a setting names
@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda p: p.mkdir(), id="directory"),
        pytest.param(lambda p: p.symlink_to("/nonexistent"), id="symlink"),
        pytest.param(make_fifo, id="fifo"),
        pytest.param(make_char_device, id="character-device"),
        pytest.param(lambda p: (p.write_text("x"), p.chmod(0o666)), id="world-writable"),
    ],
)
def test_what_sits_at_a_configured_path_is_refused_naming_the_setting_never_renamed(
    tmp_path: Path, plant: Callable[[Path], object]
) -> None:
    target = tmp_path / "x.lock"
    plant(target)
    before = target.lstat()
    with opens_of(target) as opens:
        with pytest.raises(UnsafeEntry) as refused:
            open_own(tmp_path, configured_by="--rsd-lock-path (RSD_LOCK_PATH)")
        assert opens.count() == 0
    message = str(refused.value)
    assert message.startswith(f"{target} is a") or message.startswith(f"{target} is writable")
    assert "never moves aside the path --rsd-lock-path (RSD_LOCK_PATH) names" in message
    after = target.lstat()
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert asides(tmp_path) == []


@pytest.mark.parametrize(
    ("plant", "problem"),
    [
        (lambda p: p.mkdir(), "is a directory; name a file inside it, such as"),
        (lambda p: p.symlink_to("/etc/passwd"), "is a symbolic link (to '/etc/passwd')"),
        (make_fifo, "is a named pipe, not a regular file"),
        (lambda p: None, None),
        (lambda p: p.write_text(""), None),
    ],
)
def test_the_start_look_at_a_configured_path_only_looks(
    tmp_path: Path, plant: Callable[[Path], object], problem: str | None
) -> None:
    target = tmp_path / "x.lock"
    plant(target)
    found = ownfiles.configured_file_problem(target)
    assert (found is None) == (problem is None)
    if problem is not None:
        assert found is not None and found.startswith(problem)


# ------------------------------------------------------------- why a directory is unusable
def test_why_a_directory_cannot_be_used_names_the_component_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("")
    (tmp_path / "to-file").symlink_to(tmp_path / "file")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dir").mkdir()
    (tmp_path / "to-dir").symlink_to(tmp_path / "dir")
    why = ownfiles.why_not_a_directory
    assert why(tmp_path / "dangling" / "x") == (
        f"{tmp_path / 'dangling'} is a symbolic link to {str(tmp_path / 'nowhere')!r}, "
        "which does not exist"
    )
    assert why(tmp_path / "file") == f"{tmp_path / 'file'} is a regular file, not a directory"
    assert why(tmp_path / "to-file" / "x") == (
        f"{tmp_path / 'to-file'} is a symbolic link to {str(tmp_path / 'file')!r}, a regular "
        "file, not a directory"
    )
    assert (
        why(tmp_path / "loop")
        == f"{tmp_path / 'loop'} is a symbolic link that leads round in a loop"
    )
    assert why(tmp_path / "to-dir" / "gone") == f"{tmp_path / 'to-dir' / 'gone'} does not exist"
