"""The daemon reads integers, durations and booleans exactly as the Go plugin does, checked
against Go itself: a tiny Go program (``tests/goparse``, built once into a cache directory)
runs ``time.ParseDuration``, ``strconv.ParseInt(s, 0, 64)`` and ``strconv.ParseBool`` on
every generated string, and the daemon's parsers must give the same verdict and the same
value (booleans as a boolean setting's variable and flag read them)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rbln_device_plugin import options
from rbln_device_plugin.durations import parse_duration_ns
from rbln_device_plugin.goints import parse_go_int

SOURCE = Path(__file__).parent / "goparse"
BUILD_TIMEOUT_S = 300


def _binary() -> Path:
    go = subprocess.run(["go", "version"], capture_output=True, text=True, check=True).stdout
    digest = hashlib.sha256(go.encode() + (SOURCE / "main.go").read_bytes()).hexdigest()[:16]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    target = Path(base) / "rbln-device-plugin" / "goparse" / digest / "goparse"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".goparse.{os.getpid()}")
    # Standard library only: no module download, GOFLAGS keeps it that way.
    env = {**os.environ, "GO111MODULE": "off", "GOFLAGS": "-mod=mod"}
    subprocess.run(
        ["go", "build", "-o", str(partial), str(SOURCE / "main.go")],
        check=True, env=env, timeout=BUILD_TIMEOUT_S, capture_output=True,
    )  # fmt: skip
    partial.replace(target)
    return target


class GoOracle:
    def __init__(self, binary: Path) -> None:
        self.proc = subprocess.Popen(
            [str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            encoding="utf-8",
        )  # fmt: skip

    def ask(self, text: str) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(text) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, object] = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def go() -> Iterator[GoOracle]:
    if shutil.which("go") is None:
        pytest.skip("Go toolchain not found on PATH: no oracle to compare with")
    oracle = GoOracle(_binary())
    try:
        yield oracle
    finally:
        oracle.close()


def _ours_duration(text: str) -> int | None:
    try:
        return parse_duration_ns(text)
    except ValueError:
        return None


def _ours_int(text: str) -> int | None:
    try:
        return parse_go_int(text)
    except ValueError:
        return None


def _ours_bool(text: str, *, flag: bool) -> bool | None:
    """A boolean setting as the daemon reads it: from its flag or from its variable."""
    argv, environ = ([f"--test-file-device-nodes={text}"], {}) if flag else (
        [], {"RBLN_TEST_FILE_DEVICE_NODES": text}
    )  # fmt: skip
    try:
        return options.parse(argv, environ).test_file_device_nodes
    except options.UsageError:
        return None


def _check(go: GoOracle, text: str) -> None:
    answer = go.ask(text)
    go_duration = answer["nanos"] if answer["durationOk"] else None
    assert _ours_duration(text) == go_duration, f"duration {text!r}: Go says {go_duration}"
    go_int = int(str(answer["int"])) if answer["intOk"] else None
    assert _ours_int(text) == go_int, f"integer {text!r}: Go says {go_int}"
    go_bool = answer["bool"] if answer["boolOk"] else None
    # urfave/cli v2.25.3's BoolFlag.Apply (flag_bool.go) reads a variable with ParseBool,
    # except an empty one, which it takes for false.
    go_variable = False if text == "" else go_bool
    assert _ours_bool(text, flag=False) == go_variable, (
        f"boolean variable {text!r}: Go says {go_variable}"
    )
    if "\x00" not in text:  # a command line cannot carry NUL
        assert _ours_bool(text, flag=True) == go_bool, f"boolean flag {text!r}: Go says {go_bool}"


# What the grammars are made of, plus look-alikes Go refuses (full-width digits, spaces).
_PIECES = st.sampled_from([
    "true", "True", "TRUE", "tRUE", "false", "False", "FALSE", "t", "T", "yes", "on", "\n",
    *"0123456789", ".", "+", "-", "_", "x", "X", "o", "O", "b", "B", "a", "f", "F", "e",
    "ns", "us", "µs", "μs", "ms", "s", "m", "h", " ", "\t", "\uff15", "٣", "0x", "0o", "0b",
    "9223372036854775807", "9223372036854775808", "18446744073709551616", "000000000000001",
])  # fmt: skip
_NUMBER = st.one_of(
    st.integers(min_value=0, max_value=10**20).map(str),
    st.tuples(st.integers(0, 10**6), st.text("0123456789", min_size=0, max_size=25)).map(
        lambda t: f"{t[0]}.{t[1]}"
    ),
    st.text("0123456789", min_size=1, max_size=25).map(lambda t: "." + t),
)
_TERM = st.tuples(_NUMBER, st.sampled_from(["ns", "us", "µs", "μs", "ms", "s", "m", "h"]))
_DURATION = st.tuples(st.sampled_from(["", "+", "-"]), st.lists(_TERM, min_size=1, max_size=4)).map(
    lambda t: t[0] + "".join(n + u for n, u in t[1])
)
_INTEGER = st.tuples(
    st.sampled_from(["", "+", "-"]),
    st.sampled_from(["", "0", "0x", "0X", "0o", "0b"]),
    st.text("0123456789abcdefABCDEF_", min_size=0, max_size=24),
).map("".join)
_BOOL = st.tuples(
    st.sampled_from(["", " ", "\t", "\n", "\r", "\u00a0", "\u3000"]),
    st.sampled_from(["1", "t", "T", "true", "TRUE", "True", "0", "f", "F", "false", "False"]),
    st.sampled_from(["", " ", "\t", "\n", "\r\n", "\u00a0"]),
).map("".join)
_TEXT = st.one_of(
    st.lists(_PIECES, max_size=8).map("".join),
    _BOOL,
    _DURATION,
    _INTEGER,
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=10),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT)
def test_durations_and_integers_parse_exactly_as_go_parses_them(go: GoOracle, text: str) -> None:
    _check(go, text)


@pytest.mark.parametrize(
    "text",
    ["", "0", "-0", "+0", "00", "0s", "5", "5s", "-5s", "+5s", ".5s", "5.s", ".s", "1.5h",
     "1h1m1s1ms1us1ns", "5µs", "5μs", "\uff15s", " 5s", "5s ", "5 s", "1__0", "0x", "0x_1f",
     "_1", "1_", "08", "0o17", "017", "0b101", "0B1", "-0x8000000000000000",
     "9223372036854775807", "9223372036854775808", "-9223372036854775808",
     "9223372036854775807ns", "9223372036854775808ns", "-9223372036854775808ns",
     "2562047h47m16.854775807s", "2562047h47m16.854775808s", "0.0000000001s",
     "1.00000000000000000000000000001s", "3.6e3s", "1e3", "\uff18\uff10", "0x1F90", "1sm", "1ms5",
     "true", "True", "TRUE", "tRUE", "t", "T", "1", "false", "F", "0", " true", "true ",
     "\ttrue", "false\n", " 0 ", "\u00a0T", "yes", "on"],
)  # fmt: skip
def test_edge_cases_match_go(go: GoOracle, text: str) -> None:
    _check(go, text)
