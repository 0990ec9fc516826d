"""Every place the daemon leans on what a library does not promise, in one module.

Each function below relies on an import side effect, a private name of the standard
library or a C library's extension, and says what it buys. tests/test_processtweaks.py
checks that each still holds (run it after upgrading Python or the C library): a change
there shows up as a failing test, not as a daemon that quietly grows or loses a record.

Memory figures: the idle daemon's resident memory (VmRSS) with every tweak against the
same with one turned off, ``python -m bench.bench_tweaks --rounds 5`` (the real daemon
against a simulated node of 32 NPUs, after Register; medians of five), 2026-12-03 on this
project's 2-core development machine, Python 3.11.7, glibc: 39.00 MiB with every tweak
(44.99 MiB with OTLP export on).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Final, NoReturn

# Modules loaded only because a module the daemon needs can use them, and that this
# process never does: asyncio imports ssl (and OpenSSL with it) for TLS streams, which
# this daemon never opens (gRPC, the OTLP exporters' too, has its own TLS); with OTLP
# export on, the OpenTelemetry SDK imports importlib.metadata, hence zipfile and shutil,
# and these bz2 and lzma, for archives the daemon never reads.
NEVER_USED: Final[tuple[str, ...]] = ("ssl", "bz2", "lzma")


# The one setting that brings TLS into the process: dra mode's API server client
# (lightkube over httpx) opens TLS streams through asyncio. tests/test_processtweaks.py
# checks these against config.OPTIONS.
MODE_FLAG: Final = "mode"
MODE_ENV: Final = "RBLN_MODE"
MODE_WITHOUT_TLS: Final = "device-plugin"


def needs_tls(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether this command line may run with TLS: ``inspect`` (it may read the API
    server), or any mode setting other than ``device-plugin``, on the command line (one
    dash or two, ``=value`` or the next argument) or in the environment. A setting that
    options later refuses costs 4 MiB here, never a daemon without TLS that needs it."""
    if argv[:1] == ["inspect"]:
        return True
    if environ.get(MODE_ENV, MODE_WITHOUT_TLS) != MODE_WITHOUT_TLS:
        return True
    for index, arg in enumerate(argv):
        if arg == "--":
            break
        name, equals, value = arg.lstrip("-").partition("=")
        if not arg.startswith("-") or name != MODE_FLAG:
            continue
        if not equals:
            value = argv[index + 1] if index + 1 < len(argv) else ""
        if value != MODE_WITHOUT_TLS:
            return True
    return False


def keep_out_unused_modules(tls: bool = False) -> None:
    """Mark the modules in ``NEVER_USED`` as not installed, before asyncio is imported;
    with ``tls``, all of them but ssl (asyncio decides at import whether it has TLS).

    Saves 4.12 MiB for ssl (43.12 MiB without it) and 8-13 ms of start-up (``python -X
    importtime -c 'import asyncio'``: ssl's cumulative import time); bz2 and lzma: 0.30
    MiB with OTLP export on (45.29 MiB without), 0.05 MiB with it off, where the help
    formatter below already keeps shutil out.

    Relies on: asyncio (and shutil, for bz2 and lzma) treating ``ImportError`` from
    ``import ssl`` as "not available", and on a ``None`` entry in ``sys.modules`` raising
    that ``ImportError``. A process that already has asyncio (a test run) is left as it
    is. Must run before anything imports asyncio.
    """
    if "asyncio" in sys.modules:
        return
    for name in NEVER_USED:
        if not (tls and name == "ssl"):
            sys.modules.setdefault(name, None)  # type: ignore[arg-type]


# Held by the first thread that starts the process's exit: the main thread's orderly exit
# or a second signal's forced one. The exit code and the last record then agree.
_EXIT_CLAIM: Final = threading.Lock()


def claim_exit() -> bool:
    """True for the first caller: it ends the process; every later caller must not."""
    return _EXIT_CLAIM.acquire(blocking=False)


def exit_now(code: int) -> NoReturn:
    """Exit without the interpreter's finalisation, which puts every signal back to its
    default action: a second SIGTERM in that last moment would kill the process without
    its record. Everything that matters is written by now (records, stderr); the exit
    handlers registered with atexit still run, as at a normal exit.

    Saves no memory: it keeps the last record of a stop that a second signal
    interrupts. Relies on: ``atexit._run_exitfuncs`` (private) running the registered
    handlers.
    """
    if not claim_exit():
        # A second signal's forced exit began first: its record is out, its code is the
        # process's. Wait for it rather than exit with another code.
        threading.Event().wait()
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def terminal_columns() -> int:
    """The width help is wrapped to, found as ``shutil.get_terminal_size`` finds it
    ($COLUMNS, else stdout's terminal, else 80) without importing ``shutil``: argparse
    builds a formatter for every flag it adds, and its own lookup imports ``shutil``,
    which loads ``bz2`` and ``lzma`` (modules the daemon would keep for life)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class ShutilFreeHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter with argparse's own width, found without ``shutil``.

    Saves 0.12 MiB (39.12 MiB without it): shutil's own share, bz2 and lzma being kept
    out anyway; 0.52 MiB if they were not (39.52 MiB without either). Kept although the
    two overlap: it spares the daemon shutil too, and ``tests/test_cli.py`` holds parsing
    the daemon's flags to loading none of shutil, bz2 and lzma. Relies on: the parameters of
    ``HelpFormatter.__init__`` and argparse's default width,
    ``shutil.get_terminal_size().columns - 2``, staying as they are.
    """

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        width = terminal_columns() - 2 if width is None else width
        super().__init__(prog, indent_increment, max_help_position, width)


def value_flags(parser: argparse.ArgumentParser) -> frozenset[str]:
    """Every option string of ``parser`` that takes a value (a plain store action).

    Saves no memory: it lets ``--flag -1s`` mean ``--flag=-1s`` as with Go's flag package
    (see ``goflags``). Relies on: ``ArgumentParser._actions`` and
    ``argparse._StoreAction`` (both private); argparse has no public way to list the
    actions a parser holds.
    """
    return frozenset(
        flag
        for action in parser._actions
        if isinstance(action, argparse._StoreAction)
        for flag in action.option_strings
    )


def switch_flags(parser: argparse.ArgumentParser) -> frozenset[str]:
    """Every option string of ``parser`` that takes no value (``-h``, ``--help``,
    ``--version``).

    Saves no memory: with ``value_flags`` it lets the command line be read by Go's flag
    rules (see ``goflags``). Relies on: ``ArgumentParser._actions`` (private).
    """
    return frozenset(
        flag for action in parser._actions if action.nargs == 0 for flag in action.option_strings
    )


def release_free_heap() -> bool:
    """``malloc_trim(0)`` where the C library has it (glibc); False where it does not.

    Start-up (imports, the first scan's listing and tables, the servers' set-up) frees
    much of what it allocated, but glibc keeps freed heap pages mapped for reuse;
    ``malloc_trim`` returns every whole free page to the system. Call it once, after
    start-up (the servicer does, after Register). Saves 0.79 MiB (39.79 MiB without it).
    Relies on: glibc's ``malloc_trim`` extension.
    """
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # musl and other C libraries: nothing to do
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True
