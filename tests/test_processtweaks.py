"""Each tweak in processtweaks still works with the libraries installed now: each leans on
something its library does not promise, so an upgrade of Python or of the C library that
breaks one fails here."""

from __future__ import annotations

import argparse
import atexit
import inspect
import json
import platform
import subprocess
import sys

import pytest

from rbln_device_plugin import processtweaks


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )


_KEPT_OUT_PROBE = """
import sys
from rbln_device_plugin import processtweaks
assert "asyncio" not in sys.modules
processtweaks.keep_out_unused_modules()
import asyncio, json, os, tempfile
import shutil  # what argparse would import: it tries bz2 and lzma
import grpc.aio
import rbln_device_plugin.cli, rbln_device_plugin.runtime.daemon
# What OTLP export loads (importlib.metadata, zipfile: they try bz2 and lzma).
import opentelemetry.exporter.otlp.proto.grpc.metric_exporter
import opentelemetry.exporter.otlp.proto.grpc.trace_exporter
import opentelemetry.sdk.metrics.export, opentelemetry.sdk.resources, opentelemetry.sdk.trace
import zipfile

async def round_trip(path):
    async def echo(reader, writer):
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()
    server = await asyncio.start_unix_server(echo, path)
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"ping\\n")
    answer = await reader.readline()
    writer.close()
    server.close()
    return answer.decode().strip()

with tempfile.TemporaryDirectory() as root:
    answer = asyncio.run(round_trip(os.path.join(root, "s")))
loaded = [n for n in processtweaks.NEVER_USED if sys.modules.get(n) is not None]
print(json.dumps({"answer": answer, "loaded": loaded}))
"""


def test_asyncio_and_grpc_work_without_the_modules_kept_out_and_never_load_them() -> None:
    # asyncio (and shutil) must keep treating a failed `import ssl` (or bz2, lzma) as
    # "not available"; the daemon's whole import graph must load with them missing.
    done = run_python(_KEPT_OUT_PROBE)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"answer": "ping", "loaded": []}


def test_a_process_that_already_has_asyncio_is_left_as_it_is() -> None:
    done = run_python(
        "import asyncio, ssl, sys; from rbln_device_plugin import processtweaks; "
        "processtweaks.keep_out_unused_modules(); print(sys.modules['ssl'] is ssl)"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "True"


def test_exit_now_runs_the_exit_handlers_and_exits_with_the_code() -> None:
    assert callable(getattr(atexit, "_run_exitfuncs", None))
    done = run_python(
        "import atexit, sys; from rbln_device_plugin import processtweaks; "
        "atexit.register(lambda: sys.stderr.write('handler ran\\n')); "
        "sys.stdout.write('unflushed'); processtweaks.exit_now(7)"
    )
    assert done.returncode == 7
    assert done.stderr == "handler ran\n"
    assert done.stdout == "unflushed"


def test_a_forced_exit_that_began_first_decides_the_exit_code() -> None:
    """A second signal's forced exit claimed the exit before the orderly one reached its
    end: the orderly exit waits, and the process ends with the forced code."""
    done = run_python(
        "import os, threading, time; from rbln_device_plugin import processtweaks; "
        "assert processtweaks.claim_exit(); "
        "threading.Timer(0.3, lambda: os._exit(143)).start(); "
        "processtweaks.exit_now(0)"
    )
    assert done.returncode == 143


def test_a_second_signal_after_the_orderly_exit_began_changes_nothing() -> None:
    """The orderly exit claimed first (its stop complete, its records out): a second
    signal then forces nothing and logs nothing, so the code and the records agree."""
    done = run_python(
        "import signal; from rbln_device_plugin import processtweaks; "
        "from rbln_device_plugin.runtime.signals import ShutdownSignals; "
        "assert processtweaks.claim_exit(); "
        "ShutdownSignals._exit_now(signal.SIGTERM); print('still here')"
    )
    assert (done.returncode, done.stdout, "Second shutdown" in done.stderr) == (
        0,
        "still here\n",
        False,
    )


def test_the_help_formatter_takes_argparse_s_parameters() -> None:
    ours = list(inspect.signature(processtweaks.ShutilFreeHelpFormatter.__init__).parameters)
    theirs = inspect.signature(argparse.HelpFormatter.__init__).parameters
    assert list(theirs)[: len(ours)] == ours
    # Any parameter argparse added after ours has a default, so the parser can build it.
    # (That the width is argparse's own: tests/test_cli.py, through options' formatter.)
    added = [theirs[name] for name in list(theirs)[len(ours) :]]
    assert all(p.default is not inspect.Parameter.empty for p in added), added


def test_value_flags_are_the_store_actions_flags() -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--value", "-v")
    parser.add_argument("--number", type=int)
    parser.add_argument("--switch", action="store_true")
    parser.add_argument("--many", action="append")
    parser.add_argument("--version", action="version", version="1")
    group = parser.add_argument_group("more")
    group.add_argument("--grouped")
    assert processtweaks.value_flags(parser) == {"--value", "-v", "--number", "--grouped"}


def test_switch_flags_are_the_flags_that_take_no_value() -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--value", "-v")
    parser.add_argument("--version", action="version", version="1")
    assert processtweaks.switch_flags(parser) == {"-h", "--help", "--version"}


@pytest.mark.parametrize(
    "argv",
    [["--mode=dra"], ["-mode=dra"], ["--mode", "dra"], ["-mode", "dra"],
     ["-node-name", "n1", "-mode", "dra"], ["--node-name=n1", "--mode=dra"],
     ["-installation", "--mode", "-mode", "dra"], ["-metrics-port=7", "--mode", "dra"],
     ["-mode=device-plugin"], ["--mode", "device-plugin", "-node-name", "--mode"],
     ["-node-name", "-mode"], []],
)  # fmt: skip
def test_tls_is_kept_wherever_options_reads_dra_mode(argv: list[str]) -> None:
    """needs_tls runs before options exists and reads less; where options reads dra mode
    from a command line (one dash or two, either value form), TLS must be there."""
    from rbln_device_plugin import options

    mode = options.parse(argv, {"NODE_NAME": "n1"}).mode
    if mode == "dra":
        assert processtweaks.needs_tls(argv, {}) is True
    else:
        assert mode == processtweaks.MODE_WITHOUT_TLS


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_malloc_trim_is_found_on_glibc() -> None:
    assert processtweaks.release_free_heap() is True


def test_the_preferred_allocation_search_loads_only_after_register() -> None:
    """The servicer's deferred import: the daemon's runtime, the servicer included, loads
    without the topology package, and ``load_deferred`` (run after Register) loads it."""
    code = (
        "import sys\n"
        "import rbln_device_plugin.runtime.daemon\n"
        "from rbln_device_plugin.kubelet import servicer\n"
        "before = 'rbln_device_plugin.topology' in sys.modules\n"
        "servicer.load_deferred()\n"
        "print(before, 'rbln_device_plugin.topology' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["False", "True"], done.stdout + done.stderr


@pytest.mark.parametrize(
    ("argv", "environ", "tls"),
    [
        ([], {}, False),
        (["--mode=device-plugin"], {}, False),
        (["-mode", "device-plugin", "--device-scan-interval", "5s"], {}, False),
        ([], {"RBLN_MODE": "device-plugin"}, False),
        (["--kubeconfig", "/k"], {}, False),  # no mode: the default needs no TLS
        (["--mode=dra"], {}, True),
        (["-mode=dra"], {}, True),
        (["--mode", "dra"], {}, True),
        (["-mode", "dra"], {}, True),
        (["--mode"], {}, True),  # options refuses it; TLS kept all the same
        ([], {"RBLN_MODE": "dra"}, True),
        ([], {"RBLN_MODE": ""}, True),
        (["--", "--mode=dra"], {}, False),
        (["inspect"], {}, True),
    ],
)
def test_tls_is_kept_for_every_way_of_asking_for_dra_mode(
    argv: list[str], environ: dict[str, str], tls: bool
) -> None:
    assert processtweaks.needs_tls(argv, environ) is tls


def test_the_mode_setting_names_are_the_configurations() -> None:
    from rbln_device_plugin import config

    (mode,) = [o for o in config.OPTIONS if o.field == "mode"]
    assert mode.flag == f"--{processtweaks.MODE_FLAG}"
    assert mode.env == processtweaks.MODE_ENV
    assert mode.default == processtweaks.MODE_WITHOUT_TLS


def test_with_tls_asyncio_keeps_ssl_and_the_other_modules_stay_out() -> None:
    done = run_python(
        "import sys; from rbln_device_plugin import processtweaks; "
        "processtweaks.keep_out_unused_modules(tls=True); "
        "import asyncio.sslproto, ssl; "
        "print(asyncio.sslproto.ssl is ssl, sys.modules['bz2'], sys.modules['lzma'])"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "None", "None"]
