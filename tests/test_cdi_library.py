"""The daemon's CDI verdicts against the CDI library containerd 2.x uses, built from its
Go source (``tests/cdi-checker``: tags.cncf.io/container-device-interface v1.1.1, as
containerd v2.4.2 pins it).

Each example is written to a real file in a temporary directory, the library's
``cdi.ReadSpec`` and cache read it there, and the daemon's ``parse_spec`` and
``resolve_cdi_devices`` read the same bytes: the verdicts must agree. The daemon may say
"cannot tell" where the library rejects a file only for a cdiVersion newer than the
library knows (a newer library on the node may accept it).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rbln_device_plugin.model.cdispec import (
    FileState,
    SpecDir,
    check_spec_file,
    resolve_cdi_devices,
)

from . import cdi_checker
from .cdi_checker import Answer, CdiChecker
from .cdi_specgen import CANNOT_TELL, EDGE_CASES, SpecFileText, spec_files
from .test_cdi_spec import ISSUE_CASES

pytestmark = pytest.mark.cdi_library


@pytest.fixture(scope="module")
def library() -> Iterator[CdiChecker]:
    build = cdi_checker.build(lambda _text: None)
    if build.skip:
        pytest.skip(f"CDI checker: {build.skip}")
    if build.error:
        pytest.fail(build.error)
    assert build.binary is not None
    checker = CdiChecker(build.binary)
    try:
        yield checker
    finally:
        checker.close()


def _ask(library: CdiChecker, files: list[SpecFileText]) -> tuple[Path, Answer]:
    directory = Path(tempfile.mkdtemp(prefix="rbln-cdi-lib-"))
    for index, spec in enumerate(files):
        (directory / f"{index}-{spec.name}").write_bytes(spec.data)
    return directory, library.ask([directory])


def _compare_one(library: CdiChecker, spec: SpecFileText, cannot_tell: bool = False) -> None:
    directory, answer = _ask(library, [spec])
    try:
        path = str(directory / f"0-{spec.name}")
        go = answer.files[path]
        ours = check_spec_file(path, spec.data)
        shown = spec.data.decode(errors="replace")
        if cannot_tell:
            assert ours.state is FileState.UNCHECKED, f"library: {go}; daemon: {ours}\n{shown}"
        elif go.ok:
            assert ours.state is FileState.USABLE, f"library: usable; daemon: {ours}\n{shown}"
            assert ours.spec is not None and ours.spec.devices == go.devices, shown
        elif ours.state is FileState.UNCHECKED:
            assert spec.newer, f"library: {go.error}; daemon cannot tell: {ours.reason}\n{shown}"
        else:
            assert ours.state is FileState.MALFORMED, (
                f"library: {go.error}; daemon: {ours}\n{shown}"
            )
    finally:
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=spec_files())
def test_one_file_verdicts_match_the_library(library: CdiChecker, spec: SpecFileText) -> None:
    _compare_one(library, spec)


@pytest.mark.parametrize("case", ISSUE_CASES, ids=[case[0] for case in ISSUE_CASES])
def test_every_case_of_the_issue_matches_the_library(
    library: CdiChecker, case: tuple[str, str, str, str]
) -> None:
    _label, name, text, _expected = case
    _compare_one(library, SpecFileText(name, text.encode(), newer="1.2.0" in text))


# A few files of two directories, often defining the same devices: the cache's conflicts
# (same directory: the device is dropped) and precedence (the later directory wins).
_DEVICE_NAMES = st.sampled_from(["runtime", "r1", "r2"])


@st.composite
def _dir_files(draw: st.DrawFn) -> list[SpecFileText]:
    files = []
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.integers(0, 4)) == 0:
            files.append(draw(spec_files()))
            continue
        names = draw(st.lists(_DEVICE_NAMES, min_size=1, max_size=2, unique=True))
        devices = ", ".join(f'{{name: {n}, containerEdits: {{env: ["A=1"]}}}}' for n in names)
        text = f"cdiVersion: 0.6.0\nkind: rebellions.ai/npu\ndevices: [{devices}]\n"
        files.append(SpecFileText("a.yaml", text.encode(), newer=False))
    return files


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(etc=_dir_files(), run=_dir_files())
def test_resolved_devices_match_the_library_cache(
    library: CdiChecker, etc: list[SpecFileText], run: list[SpecFileText]
) -> None:
    root = Path(tempfile.mkdtemp(prefix="rbln-cdi-cache-"))
    try:
        dirs = []
        for label, files in (("etc", etc), ("run", run)):
            directory = root / label
            directory.mkdir()
            for index, spec in enumerate(files):
                (directory / f"{index}-{spec.name}").write_bytes(spec.data)
            dirs.append(directory)
        answer = library.ask(dirs)
        if any(spec.newer for spec in etc + run):
            return  # "cannot tell" there is the intended answer, not the library's
        ours = [
            SpecDir(
                str(d), tuple(check_spec_file(str(p), p.read_bytes()) for p in sorted(d.iterdir()))
            )
            for d in dirs
        ]
        wanted = sorted(
            {f"rebellions.ai/npu={n}" for n in ("runtime", "r1", "r2")} | answer.devices
        )
        verdict = resolve_cdi_devices(ours, wanted)
        assert set(verdict.found) == answer.devices, (verdict, answer)
    finally:
        for directory in root.iterdir():
            for child in directory.iterdir():
                child.unlink()
            directory.rmdir()
        root.rmdir()


@pytest.mark.parametrize("label", sorted(EDGE_CASES))
def test_go_yaml_edge_cases_match_the_library(library: CdiChecker, label: str) -> None:
    case = EDGE_CASES[label]
    text, name = case if isinstance(case, tuple) else (case, "a.yaml")
    data = text.encode() if isinstance(text, str) else text
    if label in CANNOT_TELL:
        _compare_one(library, SpecFileText(name, data, newer=True), cannot_tell=True)
    else:
        _compare_one(library, SpecFileText(name, data, newer=False))
