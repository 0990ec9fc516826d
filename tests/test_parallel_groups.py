"""make test's parallel run keeps together what must not be split (tests/conftest.py)."""

from __future__ import annotations

import pytest

from .conftest import HOST_GLOBAL, MACHINE_LOAD, MACHINE_LOAD_TESTS, SHARED_MODULES, parallel_group


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    """The test uses a fixture of its own module that lives longer than one test."""
    module = item.nodeid.split("::")[0]
    info = getattr(item, "_fixtureinfo", None)
    return any(
        d.baseid == module and d.scope != "function"
        for definitions in getattr(info, "name2fixturedefs", {}).values()
        for d in definitions
    )


def test_every_shared_fixture_module_runs_on_one_worker(request: pytest.FixtureRequest) -> None:
    # Over the tests of this session (the whole suite in make test).
    sharing = {
        item.nodeid.split("::")[0].rsplit("/", 1)[-1]
        for item in request.session.items
        if _shares_a_module_fixture(item) and parallel_group(item.nodeid) != HOST_GLOBAL
    }
    assert sharing <= SHARED_MODULES, f"add to SHARED_MODULES: {sorted(sharing - SHARED_MODULES)}"


def test_every_test_that_loads_the_machine_is_in_its_group(request: pytest.FixtureRequest) -> None:
    loading = [
        item.nodeid
        for item in request.session.items
        if "loaded_machine" in getattr(item, "fixturenames", ())
    ]
    assert all(parallel_group(nodeid) == MACHINE_LOAD for nodeid in loading), loading


def test_groups_of_test_ids() -> None:
    assert parallel_group("tests/test_kubelet_peer.py::test_x[1.34]") == HOST_GLOBAL
    assert parallel_group("tests/test_realnode_cdi.py::test_y") == HOST_GLOBAL
    for test in MACHINE_LOAD_TESTS:
        assert parallel_group(f"tests/{test}") == MACHINE_LOAD
    assert parallel_group("tests/test_hostile.py::test_a") == "test_hostile.py"
    assert parallel_group("tests/test_faults.py::test_b[x]") == "tests/test_faults.py::test_b[x]"
    assert {parallel_group(f"tests/{m}::t") for m in SHARED_MODULES} == SHARED_MODULES
