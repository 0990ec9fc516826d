"""CDI spec files as the runtimes read them: the library's name rules, one file's checks,
the directories' precedence, and hostile files on a real directory (never a crash)."""

from __future__ import annotations

import asyncio
import os
import string
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rbln_device_plugin import config
from rbln_device_plugin.host import cdidirs
from rbln_device_plugin.host.cdidirs import SpecDirReader
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.model import cdispec
from rbln_device_plugin.model.cdispec import (
    CdiState,
    FileState,
    SpecError,
    parse_spec,
    resolve_cdi_devices,
    validate_device_name,
    validate_vendor_or_class,
)
from rbln_device_plugin.runtime.cdicheck import CdiSpecCheck
from rbln_device_plugin.telemetry.metrics import NOOP

RUNTIME = "rebellions.ai/npu=runtime"
GOOD = """\
cdiVersion: 0.6.0
kind: rebellions.ai/npu
devices:
  - name: runtime
    containerEdits:
      env: [RBLN_CDI=1]
"""


def spec_text(
    kind: str = "rebellions.ai/npu", name: str = "runtime", version: str = "0.6.0"
) -> str:
    return (
        f'cdiVersion: "{version}"\nkind: "{kind}"\ndevices:\n'
        f'  - name: "{name}"\n    containerEdits: {{env: [A=1]}}\n'
    )


# ---------------------------------------------------------------- names (pkg/parser)
LETTERS = set(string.ascii_letters)
ALNUM = LETTERS | set(string.digits)


def go_vendor_or_class_ok(name: str) -> bool:
    """validateVendorOrClassName, character by character as the Go source walks it."""
    if not name or name[0] not in LETTERS:
        return False
    if any(c not in ALNUM | set("_-.") for c in name[1:-1]):
        return False
    return name[-1] in ALNUM


def go_device_name_ok(name: str) -> bool:
    if not name or name[0] not in ALNUM:
        return False
    if len(name) == 1:
        return True
    if any(c not in ALNUM | set("_-.:") for c in name[1:-1]):
        return False
    return name[-1] in ALNUM


NAME_CHARS = st.text(alphabet=string.ascii_letters[:6] + "09_-.:/= é\n", max_size=8)


@given(NAME_CHARS)
def test_vendor_and_class_rules_match_the_go_parser(name: str) -> None:
    try:
        validate_vendor_or_class(name, "vendor")
        ours = True
    except SpecError:
        ours = False
    assert ours == go_vendor_or_class_ok(name)


@given(NAME_CHARS)
def test_device_name_rules_match_the_go_parser(name: str) -> None:
    try:
        validate_device_name(name)
        ours = True
    except SpecError:
        ours = False
    assert ours == go_device_name_ok(name)


# ---------------------------------------------------------------- one file
def test_the_toolkit_spec_defines_the_runtime_device() -> None:
    spec = parse_spec(GOOD)
    assert spec.kind == "rebellions.ai/npu" and spec.devices == {RUNTIME}
    assert parse_spec('{"cdiVersion":"0.5.0","kind":"rebellions.ai/npu","devices":'
                      '[{"name":"runtime","containerEdits":{"deviceNodes":[{"path":"/dev/rsd0"}]}}]}'
                      ).devices == {RUNTIME}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("   \n# only a comment\n", "empty"),
        ("{{{ not yaml", "not YAML or JSON"),
        ("\xc3\x28 invalid UTF-8", "not YAML or JSON"),
        ("- a\n- b\n", "not a mapping"),
        (spec_text(kind="npu"), "invalid kind"),
        (spec_text(kind="rebellions.ai/"), "invalid kind"),
        (spec_text(kind="9vendor/npu"), "should start with a letter"),
        (spec_text(name="a/b"), "invalid device name 'a/b'"),
        (spec_text(name="-x"), "invalid device name"),
        (spec_text(name="runtime:"), "invalid device name"),
        (spec_text(version="0.9.0"), "invalid cdiVersion"),
        (spec_text(version="0.2.0").replace("npu", "npu.v2", 1), "at least v0.6.0"),
        ("cdiVersion: 0.6\nkind: rebellions.ai/npu\ndevices: []\n", "invalid cdiVersion '0.6'"),
        ("cdiVersion: 0.6.0\nkind: rebellions.ai/npu\ndevices: []\n", "no devices"),
        ("cdiVersion: 0.6.0\nkind: rebellions.ai/npu\n", "no devices"),
        (GOOD + "extra: 1\n", "unknown field 'extra'"),
        (GOOD.replace("      env: [RBLN_CDI=1]", "      env: [NOEQUALS]"), "environment"),
        (GOOD.replace("    containerEdits:\n      env: [RBLN_CDI=1]\n", ""), "empty device edits"),
        (GOOD + "  - name: runtime\n    containerEdits: {env: [A=1]}\n", "multiple device"),
        (GOOD.replace("env: [RBLN_CDI=1]", "hooks: [{hookName: later, path: /x}]"), "hook"),
        (GOOD.replace("env: [RBLN_CDI=1]", "mounts: [{hostPath: /x}]"), "containerPath"),
    ],
)
def test_unusable_files_say_why(text: str, why: str) -> None:
    with pytest.raises(SpecError, match=None) as caught:
        parse_spec(text.encode("latin-1") if text.startswith("\xc3") else text)
    assert why in str(caught.value), caught.value


def test_alias_bombs_stop_at_the_budget() -> None:
    # 15 KB of YAML: one env list of 1000 entries, referenced by 200 devices. Walking it
    # would visit 200,000 values; the check stops at its budget instead.
    env = ", ".join(["A=1"] * 1000)
    devices = "".join(f"  - {{name: d{i}, containerEdits: {{env: *e}}}}\n" for i in range(200))
    text = f"cdiVersion: 0.6.0\nkind: rebellions.ai/npu\ncontainerEdits: {{env: &e [{env}]}}\n"
    text += f"devices:\n{devices}"
    assert len(text) < 16_000
    with pytest.raises(SpecError, match="too complex"):
        parse_spec(text)


# ---------------------------------------------------------------- the issue's cases
# Each case of issue 49 with the verdict the CDI library containerd 2.4.2 uses gives
# (test_cdi_library.py checks each against the library itself): (label, file name, text,
# "usable" | "malformed" | "unchecked").
def _spec(edits: str, version: str = "0.7.0", extra: str = "") -> str:
    return (
        f"cdiVersion: {version}\nkind: rebellions.ai/npu\n{extra}devices:\n"
        f"  - name: runtime\n    containerEdits:\n{edits}"
    )


_NODE = "      deviceNodes:\n        - path: /dev/rsd0\n"
_MOUNT = "      mounts:\n        - hostPath: /a\n          containerPath: /b\n"
_HOOK = "      hooks:\n        - hookName: createContainer\n          path: /bin/hook\n"
ISSUE_CASES: list[tuple[str, str, str, str]] = [
    ("duplicate-key", "a.yaml", _NODE + "          permissions: rw\n          permissions: r\n",
     "malformed"),
    ("duplicate-top-key", "a.yaml", _NODE, "malformed"),
    ("duplicate-json-key", "a.json",
     '{"cdiVersion": "0.5.0", "kind": "rebellions.ai/npu", "kind": "rebellions.ai/npu", '
     '"devices": [{"name": "runtime", "containerEdits": {"env": ["A=1"]}}]}', "malformed"),
    ("unknown-in-deviceNodes", "a.yaml", _NODE + "          bogus: 1\n", "malformed"),
    ("unknown-in-mounts", "a.yaml", _MOUNT + "          readOnly: true\n", "malformed"),
    ("unknown-in-hooks", "a.yaml", _HOOK + "          timeoutSeconds: 5\n", "malformed"),
    ("unknown-in-intelRdt", "a.yaml", "      intelRdt: {closID: a, bogus: 1}\n", "malformed"),
    ("options-ro", "a.yaml", _MOUNT + "          options: ro\n", "malformed"),
    ("major-text", "a.yaml", _NODE + '          major: "236"\n', "malformed"),
    ("fileMode-text", "a.yaml", _NODE + '          fileMode: "0666"\n', "malformed"),
    ("fileMode-octal", "a.yaml", _NODE + "          fileMode: 0666\n", "usable"),
    ("negative-gid", "a.yaml", "      additionalGids: [-1]\n", "malformed"),
    ("timeout-text", "a.yaml", _HOOK + '          timeout: "5"\n', "malformed"),
    ("netDevices-1.0.0", "a.yaml",
     "      netDevices: [{hostInterfaceName: eth0, name: net0}]\n",
     "malformed"),
    ("netDevices-1.1.0", "a.yaml",
     "      netDevices: [{hostInterfaceName: eth0, name: net0}]\n", "usable"),
    ("closID-slash", "a.yaml", "      intelRdt: {closID: a/b}\n", "malformed"),
    ("closID-dotdot", "a.yaml", '      intelRdt: {closID: ".."}\n', "malformed"),
    ("version-1.0.0", "a.yaml", _NODE, "usable"),
    ("version-1.1.0", "a.yaml", _NODE, "usable"),
    ("version-v1.1.0", "a.yaml", _NODE, "usable"),
    ("version-newer", "a.yaml", _NODE, "unchecked"),
    ("version-newer-new-field", "a.yaml", _NODE + "          futureField: 1\n", "unchecked"),
    ("capitalised-key", "a.yaml", _NODE.replace("path:", "Path:"), "malformed"),
    ("multi-document", "a.yaml", _NODE + "---\nanother: document\n", "usable"),
    ("numbers-as-strings", "a.yaml",
     "      env: [A=1]\n      hooks: [{hookName: prestart, path: 5, args: [--n, 5, 1.5]}]\n",
     "usable"),
    ("null-deviceNode", "a.yaml", _NODE + "        - null\n", "malformed"),
    ("json-slash-escape", "a.json",
     '{"cdiVersion": "0.5.0", "kind": "rebellions.ai/npu", '
     '"devices": [{"name": "runtime", "containerEdits": {"env": ["A=\\/x"]}}]}', "malformed"),
]  # fmt: skip
_VERSIONS = {"netDevices-1.0.0": "1.0.0", "netDevices-1.1.0": "1.1.0", "version-1.0.0": "1.0.0",
             "version-1.1.0": "1.1.0", "version-v1.1.0": "v1.1.0", "version-newer": "1.2.0",
             "version-newer-new-field": "1.2.0"}  # fmt: skip
_EXTRA = {"duplicate-top-key": "kind: rebellions.ai/npu\n"}
ISSUE_CASES = [
    (label, name, text if name.endswith(".json") else
     _spec(text, _VERSIONS.get(label, "0.7.0"), _EXTRA.get(label, "")), verdict)
    for label, name, text, verdict in ISSUE_CASES
]  # fmt: skip


def _verdict(data: bytes, json_format: bool) -> str:
    try:
        parse_spec(data, json_format=json_format) if json_format else parse_spec(data)
    except SpecError as exc:
        return "unchecked" if type(exc).__name__ == "SpecUnchecked" else "malformed"
    return "usable"


@pytest.mark.parametrize("case", ISSUE_CASES, ids=[case[0] for case in ISSUE_CASES])
def test_each_case_of_the_issue_gets_the_library_verdict(case: tuple[str, str, str, str]) -> None:
    _label, name, text, expected = case
    assert _verdict(text.encode(), name.endswith(".json")) == expected, text


# ---------------------------------------------------------------- precedence
def usable(path: str, *devices: str) -> cdispec.SpecFile:
    return cdispec.SpecFile(path, FileState.USABLE, cdispec.Spec("rebellions.ai/npu",
                                                                   frozenset(devices)))  # fmt: skip


def test_precedence_conflicts_and_what_cannot_be_told() -> None:
    etc, run = "/etc/cdi", "/var/run/cdi"
    found = resolve_cdi_devices([cdispec.SpecDir(etc, (usable(f"{etc}/rbln.yaml", RUNTIME),)),
                                 cdispec.SpecDir(run)])  # fmt: skip
    assert found.state is CdiState.PRESENT and found.found == {RUNTIME: f"{etc}/rbln.yaml"}
    # A later directory's definition wins; both are fine.
    both = resolve_cdi_devices([
        cdispec.SpecDir(etc, (usable(f"{etc}/a.yaml", RUNTIME),)),
        cdispec.SpecDir(run, (usable(f"{run}/b.yaml", RUNTIME),)),
    ])  # fmt: skip
    assert both.found == {RUNTIME: f"{run}/b.yaml"}
    # Two files of one directory: the library drops the device, even if another defines it.
    clash = resolve_cdi_devices([
        cdispec.SpecDir(etc, (usable(f"{etc}/a.yaml", RUNTIME), usable(f"{etc}/b.yaml", RUNTIME))),
        cdispec.SpecDir(run, (usable(f"{run}/c.yaml", RUNTIME),)),
    ])  # fmt: skip
    assert clash.state is CdiState.MISSING and RUNTIME in clash.conflicts
    # Not visible: cannot tell, never missing.
    unseen = resolve_cdi_devices(
        [cdispec.SpecDir(etc, error="does not exist here"), cdispec.SpecDir(run)]
    )
    assert unseen.state is CdiState.UNKNOWN and unseen.unseen == {etc: "does not exist here"}
    # A file that could not be checked: cannot tell either; a malformed one is no excuse.
    skipped = cdispec.SpecFile(f"{run}/big.yaml", FileState.UNCHECKED, reason="too large")
    bad = cdispec.SpecFile(f"{run}/bad.yaml", FileState.MALFORMED, reason="not YAML")
    assert resolve_cdi_devices([cdispec.SpecDir(etc), cdispec.SpecDir(run, (skipped,))]).state is (
        CdiState.UNKNOWN
    )
    missing = resolve_cdi_devices([cdispec.SpecDir(etc), cdispec.SpecDir(run, (bad,))])
    assert missing.state is CdiState.MISSING
    assert missing.malformed == {f"{run}/bad.yaml": "not YAML"}
    # Another vendor's device does not count.
    other = resolve_cdi_devices(
        [cdispec.SpecDir(etc, (usable(f"{etc}/x.yaml", "vendor.com/gpu=all"),))]
    )
    assert other.state is CdiState.MISSING and other.missing == (RUNTIME,)


# ---------------------------------------------------------------- a real directory
@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """A spec directory with one of every hostile file, and no usable spec."""
    d = tmp_path / "cdi"
    d.mkdir()
    (d / "empty.yaml").write_text("")
    (d / "garbage.yaml").write_bytes(b"\x00\x01{{{: not yaml ]]]")
    (d / "other.yaml").write_text(spec_text(kind="vendor.com/gpu", name="all"))
    (d / "slash.yaml").write_text(spec_text(name="npu/runtime"))
    with open(d / "huge.yaml", "wb") as handle:
        handle.truncate(10 * 1024 * 1024)  # 10 MB
    os.symlink("loop-b.yaml", d / "loop-a.yaml")
    os.symlink("loop-a.yaml", d / "loop-b.yaml")
    os.symlink("/etc/passwd", d / "outside.yaml")
    os.symlink("missing.yaml", d / "dangling.yaml")
    os.mkfifo(d / "fifo.yaml")
    (d / "subdir.yaml").mkdir()
    (d / "subdir.yaml" / "rbln.yaml").write_text(GOOD)  # subdirectories are skipped
    (d / "rbln.yml").write_text(GOOD)  # .yml is not a spec file to the library
    unreadable = d / "unreadable.yaml"
    unreadable.write_text(GOOD)
    unreadable.chmod(0)
    return d


def states(directory: cdispec.SpecDir) -> dict[str, tuple[FileState, str]]:
    return {Path(f.path).name: (f.state, f.reason) for f in directory.files}


def test_hostile_files_are_reported_and_never_read_unsafely(hostile: Path) -> None:
    seen = states(SpecDirReader().read(str(hostile)))
    malformed = {name for name, (state, _) in seen.items() if state is FileState.MALFORMED}
    assert {"empty.yaml", "garbage.yaml", "slash.yaml", "loop-a.yaml", "loop-b.yaml",
            "dangling.yaml"} <= malformed  # fmt: skip
    assert seen["fifo.yaml"][0] is FileState.HANGS
    assert seen["huge.yaml"][0] is FileState.UNCHECKED and "larger" in seen["huge.yaml"][1]
    assert seen["outside.yaml"][0] is FileState.UNCHECKED
    assert "leaves the directory" in seen["outside.yaml"][1]
    assert seen["other.yaml"][0] is FileState.USABLE
    assert "subdir.yaml" not in seen and "rbln.yml" not in seen
    assert "FIFO" in seen["fifo.yaml"][1] and "loop" in seen["loop-a.yaml"][1]
    if os.geteuid() != 0:  # root reads a mode-0 file anyway, as the runtime would
        assert seen["unreadable.yaml"][0] is FileState.UNCHECKED
    verdict = resolve_cdi_devices([SpecDirReader().read(str(hostile))])
    # root reads the mode-0 copy of the good spec, which defines the device; but the
    # runtimes' read would block on the FIFO (and the files not checked may clash).
    assert verdict.state is CdiState.UNKNOWN
    assert verdict.hangs == (str(hostile / "fifo.yaml"),)


def test_a_sibling_symlink_is_followed_and_changes_are_noticed(tmp_path: Path) -> None:
    d = tmp_path / "cdi"
    d.mkdir()
    (d / "rbln-v2").write_text(GOOD)
    os.symlink("./rbln-v2", d / "rbln.yaml")
    reader = SpecDirReader()
    first = reader.read(str(d))
    assert resolve_cdi_devices([first]).found == {RUNTIME: str(d / "rbln.yaml")}
    assert reader.read(str(d)) is first  # nothing changed: the same answer
    (d / "rbln-v2").write_text(spec_text(name="other"))  # the target changes alone
    assert resolve_cdi_devices([reader.read(str(d))]).state is CdiState.MISSING


def test_a_directory_that_cannot_be_seen_is_not_missing(tmp_path: Path) -> None:
    gone = SpecDirReader().read(str(tmp_path / "absent"))
    assert "does not exist here" in gone.error
    (tmp_path / "file").write_text("")
    assert "not a directory" in SpecDirReader().read(str(tmp_path / "file")).error
    assert resolve_cdi_devices([gone]).state is CdiState.UNKNOWN


def test_the_listing_cap_leaves_the_rest_unchecked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cdidirs, "MAX_SPEC_FILES", 3)
    for index in range(5):
        (tmp_path / f"x{index}.yaml").write_text(spec_text(kind="vendor.com/gpu"))
    listed = SpecDirReader().read(str(tmp_path))
    assert len(listed.files) == 3 and listed.truncated == 2
    assert resolve_cdi_devices([listed]).state is CdiState.UNKNOWN


# ---------------------------------------------------------------- the daemon's check
class HangingReader(SpecDirReader):
    """A spec directory on a hung mount: listing it never returns until released."""

    def __init__(self, hung: str) -> None:
        super().__init__()
        self.hung, self.release = hung, threading.Event()

    def survey(self, path: str) -> cdidirs.Survey | cdispec.SpecDir:
        if path == self.hung:
            self.release.wait(30)
        return super().survey(path)


async def test_a_hung_spec_directory_is_cannot_tell_within_the_host_io_bound(
    tmp_path: Path,
) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    cfg = config.config_from_settings({"cdi_static_dir": str(etc), "cdi_root": str(run)}, {})
    check = CdiSpecCheck(cfg, HostIO(timeout=0.3), NOOP)
    reader = HangingReader(str(etc))
    check._reader = reader  # the hung mount stands in for a real one
    try:
        verdict = await asyncio.wait_for(check.check(), 10)
        assert verdict.state is CdiState.UNKNOWN
        assert "did not finish" in verdict.unseen[str(etc)]
        # While it is still stuck, the next check answers at once, still "cannot tell".
        again = await asyncio.wait_for(check.check(), 10)
        assert "still blocked" in again.unseen[str(etc)]
    finally:
        reader.release.set()
    (run / "rbln.yaml").write_text(GOOD)
    for _ in range(100):  # the released read returns; then the spec in run/ is found
        verdict = await check.check()
        if verdict.state is CdiState.PRESENT:
            break
        await asyncio.sleep(0.05)
    assert verdict.state is CdiState.PRESENT


def test_a_file_the_library_panics_on_leaves_no_device_resolved(tmp_path: Path) -> None:
    # The library dereferences a null deviceNodes entry: containerd's refresh (at start
    # and at every change) panics, so not even another file's good definition resolves.
    good = cdispec.check_spec_file(f"{tmp_path}/rbln.yaml", GOOD.encode())
    crashing = cdispec.check_spec_file(
        f"{tmp_path}/other.yaml",
        b"cdiVersion: 0.3.0\nkind: other.com/x\ndevices:\n- name: a\n"
        b"  containerEdits: {deviceNodes: [null]}\n",
    )
    assert good.state is FileState.USABLE
    assert crashing.state is FileState.MALFORMED and crashing.panics
    assert "containerd crashes" in crashing.reason
    verdict = resolve_cdi_devices([cdispec.SpecDir(str(tmp_path), (good, crashing))])
    assert verdict.state is CdiState.MISSING and verdict.missing == (RUNTIME,)


# ---------------------------------------------------------------- bounded work
MIB = 1 << 20
NESTED_LISTS = (b"[" + b"[]," * (MIB // 3))[: MIB - 3] + b"[]]"  # issue 49's file
NULL_KEY_LISTS = b"{~: [" + (b"[]," * (MIB // 3))[: MIB - 20] + b"[]]}\n"  # skipped, not refused


def test_a_1_mib_file_of_nested_lists_is_refused_at_its_first_node() -> None:
    budget = cdispec.Budget(10**9)
    checked = cdispec.check_spec_file("/etc/cdi/hostile.yaml", NESTED_LISTS, budget)
    assert checked.state is FileState.MALFORMED
    assert "not a mapping at the top level" in checked.reason
    assert 10**9 - budget.left <= 5  # events read: stream, document, the list's start
    as_json = cdispec.check_spec_file("/etc/cdi/hostile.json", NESTED_LISTS, budget)
    assert as_json.state is FileState.MALFORMED


def test_a_file_beyond_the_budget_is_one_the_daemon_cannot_tell() -> None:
    # go-yaml skips the value of a null key without decoding it: only the budget ends it.
    budget = cdispec.Budget(10**9)
    checked = cdispec.check_spec_file("/etc/cdi/hostile.yaml", NULL_KEY_LISTS, budget)
    assert checked.state is FileState.UNCHECKED and "too complex to check" in checked.reason
    assert 10**9 - budget.left <= cdispec.MAX_FILE_UNITS + 1


def test_one_pass_shares_one_budget_and_the_rest_is_unchecked() -> None:
    budget = cdispec.Budget(cdispec.PASS_UNITS)
    states = [
        cdispec.check_spec_file(f"/etc/cdi/{i:03d}.yaml", NULL_KEY_LISTS, budget)
        for i in range(2 * cdidirs.MAX_SPEC_FILES)
    ]
    assert all(s.state is FileState.UNCHECKED for s in states)
    assert cdispec.PASS_UNITS - budget.left <= cdispec.PASS_UNITS + 1
    assert "this pass's budget" in states[-1].reason
    # The toolkit's own small spec still gets its verdict while budget is left.
    fresh = cdispec.Budget(cdispec.PASS_UNITS)
    assert cdispec.check_spec_file("/etc/cdi/rbln.yaml", GOOD.encode(), fresh).state is (
        FileState.USABLE
    )


_PEAK_RSS = """
import sys
from rbln_device_plugin.model.cdispec import SpecError, parse_spec
data = open(sys.argv[1], "rb").read()
try:
    parse_spec(data)
    print("usable")
except SpecError as exc:
    print(type(exc).__name__)
with open("/proc/self/status") as status:  # VmHWM: ru_maxrss keeps the parent's peak
    print(next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")))
"""


def _peak_kib(path: Path) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", _PEAK_RSS, str(path)], capture_output=True,
                          text=True, check=True, timeout=120)  # fmt: skip
    verdict, peak = done.stdout.split()
    return verdict, int(peak)


@pytest.mark.parametrize("kind", ["nested", "null-key"])
def test_one_hostile_file_raises_peak_memory_by_under_10_mib(tmp_path: Path, kind: str) -> None:
    # Issue 49: the 1 MiB [[],[],...] file raised the daemon's peak RSS from 43 to 292 MiB
    # (PyYAML built the whole node tree before any budget applied).
    (tmp_path / "trivial.yaml").write_text(GOOD)
    hostile = tmp_path / "hostile.yaml"
    hostile.write_bytes(NESTED_LISTS if kind == "nested" else NULL_KEY_LISTS)
    idle_verdict, idle = _peak_kib(tmp_path / "trivial.yaml")
    verdict, peak = _peak_kib(hostile)
    assert idle_verdict == "usable"
    assert verdict in ("SpecError", "SpecUnchecked", "BudgetSpent")
    assert peak - idle < 10 * 1024, f"peak {peak} KiB, idle {idle} KiB"
