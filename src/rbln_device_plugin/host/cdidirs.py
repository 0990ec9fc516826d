"""The CDI spec directories the container runtimes read: what each defines, cheaply.

What an idle check costs (``docs/cdi.md``): per directory one open and ``fstat`` of the
directory, and one ``lstat`` per spec-named entry (``*.json``, ``*.yaml``; at most
``MAX_SPEC_FILES``) and per symlink hop (``host.cdientry``, which never opens an entry
before its type is known). The directory is listed again only when its own signature
(device, inode, modification and change times) changed, so thousands of unrelated files
cost nothing; a file is read again only when its signature (device, inode, type, size,
modification and change times, of the entry and each hop) changed: an in-place rewrite
that keeps size and modification time (``cp -p``, ``rsync -t``) still moves the change
time. A signature taken within ``RACY_NS`` of a change is not trusted (a second change in
the same clock tick would leave it equal): that listing or file is read again at the
next check.

The reading is host access, the decoding CPU work, and they are bounded apart:
``read_spec_dirs`` runs each directory's survey and each changed file's read through
``HostIO`` (its 1 s bound per access, its record when a mount hangs), and decodes the
files on a thread of their own, waiting ``PARSE_BUDGET_S`` at most for one file and, all
files together, for one check. A file whose decoding outlasts it is "not checked", said
as the check's CPU work, never as host access, until that decoding ends and what it
found is remembered; a file not decoded for want of time waits for the next check.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final

from rbln_device_plugin import aiotasks
from rbln_device_plugin.host import cdientry
from rbln_device_plugin.host.cdientry import Hop, ToRead
from rbln_device_plugin.host.hostio import Call, HostIO, Stalled
from rbln_device_plugin.model.cdispec import (
    PASS_UNITS,
    Budget,
    FileState,
    SpecDir,
    SpecFile,
    check_spec_file,
)
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import call_soon_threadsafe, set_result_threadsafe

MAX_SPEC_FILES: Final = 128  # per directory, checked in name order
# A signature whose change time is this close to the look is not trusted (see above).
# Local file systems stamp with a clock tick of at most 10 ms; 1 s leaves room.
RACY_NS: Final = 1_000_000_000
PARSE_BUDGET_S: Final = 1.0  # waited for one file's decoding, and for all of one check's

# A directory's own: (st_dev, st_ino, st_mtime_ns, st_ctime_ns).
DirSignature = tuple[int, int, int, int]

log = get_logger()


@dataclass(frozen=True, slots=True)
class Survey:
    """One directory as looked at: each candidate settled (``SpecFile``) or to read."""

    path: str
    entries: tuple[SpecFile | ToRead, ...]
    truncated: int


@dataclass(slots=True)
class _Memo:
    listed: DirSignature | None  # None: the listing is racy, list again
    names: tuple[str, ...]  # spec-named entries that are not directories, in name order
    files: dict[str, tuple[tuple[Hop, ...], SpecFile]] = field(default_factory=dict)
    last: SpecDir | None = None


def _dir_error(path: str, exc: OSError) -> SpecDir:
    if exc.errno == errno.ENOENT:
        why = "does not exist here (not mounted into the plugin's container?)"
    elif exc.errno == errno.ENOTDIR:
        why = "is not a directory"
    else:
        why = f"cannot be listed: {cdientry.describe(exc)}"
    return SpecDir(path, error=why)


# The decoding work one directory's changed files may take in one check (half a pass over
# both directories, see ``cdispec.PASS_UNITS``): any set of files costs a bounded time.
DIR_UNITS: Final = PASS_UNITS // 2


def _budget_spent(path: str) -> SpecFile:
    return SpecFile(
        path, FileState.UNCHECKED,
        reason="not decoded yet: the files before it used this check's decoding budget "
        "(CPU work); decoded at a later check",
    )  # fmt: skip


def _kept(result: SpecFile, budget: Budget) -> bool:
    """Whether a file's verdict is its own (remembered until the file changes), not the
    check's: an unchecked file once the check's budget ran out is decoded again later."""
    return result.state is not FileState.UNCHECKED or budget.left > 0


class SpecDirReader:
    """Reads spec directories, remembering what each listing and file said.

    One instance per daemon (``inspect`` makes its own). Each directory is surveyed by at
    most one thread at a time (``HostIO`` never starts a second call on a key that is
    still running); the memo is shared with the decoding thread under a lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memo: dict[str, _Memo] = {}
        self._decoding: str | None = None  # a file whose decoding outlasted its check

    # ---------------------------------------------------------------- host access
    def survey(self, path: str) -> Survey | SpecDir:
        """The directory's candidates, each settled from memory or its type, or to read."""
        trusted_before = time.time_ns() - RACY_NS
        try:
            with cdientry.opened_dir(path) as fd:
                info = os.fstat(fd)
                signature = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)
                with self._lock:
                    memo = self._memo.get(path)
                if memo is None or memo.listed != signature:
                    names = cdientry.spec_names(fd)
                    listed = None if info.st_ctime_ns >= trusted_before else signature
                    with self._lock:
                        kept = {} if memo is None else memo.files
                        memo = _Memo(
                            listed, names, {n: kept[n] for n in names if n in kept},
                            None if memo is None else memo.last,
                        )  # fmt: skip
                        self._memo[path] = memo
                entries: list[SpecFile | ToRead] = []
                for name in memo.names[:MAX_SPEC_FILES]:
                    item = cdientry.probe(fd, path, name, trusted_before)
                    if isinstance(item, ToRead):
                        with self._lock:
                            known = memo.files.get(name)
                        if known is not None and known[0] == item.signature:
                            entries.append(known[1])
                            continue
                    if item is not None:
                        entries.append(item)
        except OSError as exc:
            with self._lock:
                self._memo.pop(path, None)
            return _dir_error(path, exc)
        return Survey(path, tuple(entries), max(0, len(memo.names) - MAX_SPEC_FILES))

    # ---------------------------------------------------------------- memory
    def remember(self, item: ToRead, spec_file: SpecFile, stable: bool) -> None:
        if not stable or item.racy:
            return
        with self._lock:
            memo = self._memo.get(item.directory)
            if memo is not None:
                memo.files[item.name] = (item.signature, spec_file)

    def finish(self, survey: Survey, files: Sequence[SpecFile]) -> SpecDir:
        """The directory's answer; the same object as last time when nothing changed."""
        result = SpecDir(survey.path, tuple(files), truncated=survey.truncated)
        with self._lock:
            memo = self._memo.get(survey.path)
            if memo is None:
                return result
            if memo.last is not None and memo.last == result:
                return memo.last
            memo.last = result
        return result

    # ---------------------------------------------------------------- one thread, no bound
    def read(self, path: str) -> SpecDir:
        """Survey, read and decode one directory on this thread (tests, benchmarks)."""
        survey = self.survey(path)
        if isinstance(survey, SpecDir):
            return survey
        files: list[SpecFile] = []
        budget = Budget(DIR_UNITS)
        for item in survey.entries:
            if isinstance(item, SpecFile):
                files.append(item)
                continue
            if budget.left <= 0:
                files.append(_budget_spent(item.path))
                continue
            loaded = cdientry.load(item)
            done = (
                loaded.data
                if isinstance(loaded.data, SpecFile)
                else check_spec_file(item.path, loaded.data, budget)
            )
            if _kept(done, budget):
                self.remember(item, done, loaded.stable)
            files.append(done)
        return self.finish(survey, files)

    # ---------------------------------------------------------------- CPU work, bounded
    async def decode(self, item: ToRead, data: bytes, stable: bool, budget: Budget) -> SpecFile:
        """Decode ``data`` on a thread of its own, taking its work from ``budget`` and
        waiting at most ``PARSE_BUDGET_S``; a decoding that outlasts it goes on, and what
        it finds is remembered then."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[SpecFile] = loop.create_future()
        with self._lock:
            self._decoding = item.path

        def work() -> None:
            try:
                result = check_spec_file(item.path, data, budget)
                if _kept(result, budget):
                    self.remember(item, result, stable)
            except BaseException as exc:  # a bug: raised in the check that waits, if any
                call_soon_threadsafe(loop, _fail, done, exc)
                return
            finally:
                with self._lock:
                    self._decoding = None
            set_result_threadsafe(loop, done, result)

        threading.Thread(target=work, name="cdi-decode", daemon=True).start()
        if await aiotasks.wait_for_end(done, PARSE_BUDGET_S):
            return done.result()
        log.warning(
            "CDI spec check: decoding a spec file did not finish in time; the file counts as "
            "not checked until it does",
            path=item.path, budgetSeconds=PARSE_BUDGET_S, bytes=len(data),
        )  # fmt: skip
        return SpecFile(
            item.path, FileState.UNCHECKED,
            reason=f"its decoding did not finish within {PARSE_BUDGET_S:g} s (the CDI "
            "check's own CPU work, not host access); checked when it ends",
        )  # fmt: skip

    def decoding(self) -> str | None:
        with self._lock:
            return self._decoding


def _fail(future: asyncio.Future[SpecFile], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


async def read_spec_dirs(io: HostIO, reader: SpecDirReader, paths: Sequence[str]) -> list[SpecDir]:
    """Every directory: its survey and each changed file's read through ``io`` (host
    access, one bounded call each), then its decoding (CPU work): files are decoded one
    at a time until this check has waited ``PARSE_BUDGET_S`` for decodings (the rest
    wait for the next check), and one file's decoding is waited for at most as long, so
    a check waits at most twice that for decoding."""
    surveys = await io.map([Call(path, partial(reader.survey, path)) for path in paths])
    loop = asyncio.get_running_loop()
    spent = 0.0  # seconds of decoding waited for in this check
    dirs: list[SpecDir] = []
    for path, survey in zip(paths, surveys, strict=True):
        if isinstance(survey, Stalled):
            dirs.append(SpecDir(path, error=f"not listed: {survey}"))
            continue
        if isinstance(survey, SpecDir):
            dirs.append(survey)
            continue
        files: list[SpecFile] = []
        budget = Budget(DIR_UNITS)
        for item in survey.entries:
            if isinstance(item, SpecFile):
                files.append(item)
                continue
            if budget.left <= 0:  # not even read: its decoding would be refused
                files.append(_budget_spent(item.path))
                continue
            busy = reader.decoding()
            if busy is not None or spent >= PARSE_BUDGET_S:
                why = (
                    f"not decoded yet: the decoding of {busy} is still running (CPU work)"
                    if busy is not None
                    else f"not decoded yet: this check's {PARSE_BUDGET_S:g} s of decoding "
                    "was spent (CPU work); decoded at the next"
                )
                files.append(SpecFile(item.path, FileState.UNCHECKED, reason=why))
                continue
            loaded = await io.call(item.path, partial(cdientry.load, item))
            if isinstance(loaded, Stalled):
                files.append(SpecFile(item.path, FileState.UNCHECKED, reason=f"not read: {loaded}"))
                continue
            if isinstance(loaded.data, SpecFile):
                reader.remember(item, loaded.data, loaded.stable)
                files.append(loaded.data)
                continue
            started = loop.time()
            files.append(await reader.decode(item, loaded.data, loaded.stable, budget))
            spent += loop.time() - started
        dirs.append(reader.finish(survey, files))
    return dirs
