"""The CDI spec check in the real daemon: records, the gauge and inspect, with the
toolkit's spec, without it, when it appears, next to hostile files, and with a spec
directory the daemon cannot see; and what Allocate answers in each --cdi-mode."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from rbln_device_plugin_sim.node import TOOLKIT_CDI_SPEC, SimNode

from .inprocess import running
from .metrics_helpers import metrics_port, scrape_until, value
from .test_inspect_cli import inspect_process as inspect
from .test_inspect_cli import report_process as report

NPU = "rebellions.ai/npu"
RUNTIME = "rebellions.ai/npu=runtime"
ANNOTATION = {"cdi.k8s.io/rebellions.ai_npu": RUNTIME}
MISSING = (
    "No CDI spec defines the NPU CDI device; CDI-enabled container runtimes will refuse "
    "NPU containers until one is written"
)
FOUND = "CDI spec found for the NPU CDI device"
UNKNOWN = "Cannot tell whether a CDI spec defines the NPU CDI device"
HANG = "A FIFO in a CDI spec directory would hang the container runtimes' CDI library; remove it"
METRICS = ["--metrics-port", "0"]


def cdi_states(samples: Any) -> dict[str, float | None]:
    return {s: value(samples, "cdi_spec", state=s) for s in ("present", "missing", "unknown")}


def answer(response: Any) -> tuple[Any, ...]:
    """Everything a container answer carries, in a comparable form."""
    (container,) = response.container_responses
    return (
        sorted((d.container_path, d.permissions) for d in container.devices),
        dict(container.annotations),
        [d.name for d in container.cdi_devices],
        dict(container.envs),
        list(container.mounts),
    )


def spill_hostile_files(node: SimNode) -> None:
    """Every kind of hostile file, in both spec directories."""
    for directory in (node.cdi_static_dir, node.cdi_root):
        (directory / "empty.yaml").write_text("")
        (directory / "garbage.json").write_bytes(b"\x00{{{ ]]]")
        (directory / "slash.yaml").write_text(
            "cdiVersion: 0.6.0\nkind: rebellions.ai/npu\ndevices:\n"
            "  - name: npu/runtime\n    containerEdits: {env: [A=1]}\n"
        )
        (directory / "other.yaml").write_text(
            "cdiVersion: 0.6.0\nkind: vendor.com/gpu\ndevices:\n"
            "  - name: runtime\n    containerEdits: {env: [A=1]}\n"
        )
        with open(directory / "huge.yaml", "wb") as handle:
            handle.truncate(10 * 1024 * 1024)
        os.symlink("loop-b.yaml", directory / "loop-a.yaml")
        os.symlink("loop-a.yaml", directory / "loop-b.yaml")
        os.mkfifo(directory / "fifo.yaml")


def hostile_node(node: SimNode) -> None:
    node.remove_cdi_spec()
    spill_hostile_files(node)


def without_static_dir(node: SimNode) -> None:
    node.remove_cdi_spec()
    node.cdi_static_dir.rmdir()


async def test_with_the_toolkit_spec_one_info_and_the_gauge_say_present() -> None:
    async with running("rebel-4", extra_args=METRICS) as h:
        (found,) = await h.daemon.await_log(FOUND)
        assert found["level"] == "info" and found["cdiMode"] == "annotation"
        assert found["specFiles"] == {RUNTIME: str(h.node.cdi_spec_path)}
        port = await metrics_port(h.daemon)
        samples = await scrape_until(port, lambda s: value(s, "cdi_spec", state="present") == 1)
        assert cdi_states(samples) == {"present": 1, "missing": 0, "unknown": 0}
        await h.daemon.await_log("Reconciled device inventory", count=5)
        assert len(h.daemon.find(FOUND)) == 1 and not h.daemon.find(MISSING)


async def test_missing_spec_warns_once_and_its_arrival_ends_it_without_a_restart() -> None:
    async with running("rebel-4", extra_args=METRICS, prepare=SimNode.remove_cdi_spec) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        (warn,) = await h.daemon.await_log(MISSING)
        assert warn["level"] == "warn"
        assert warn["missing"] == [RUNTIME]
        assert warn["specDirs"] == [str(h.node.cdi_static_dir), str(h.node.cdi_root)]
        assert "containerd 2.x" in warn["refusedBy"] and "unresolvable CDI" in warn["refusedBy"]
        assert "RBLN container toolkit" in warn["writtenBy"] and "operator" in warn["writtenBy"]
        port = await metrics_port(h.daemon)
        samples = await scrape_until(port, lambda s: value(s, "cdi_spec", state="missing") == 1)
        assert cdi_states(samples) == {"present": 0, "missing": 1, "unknown": 0}
        # inspect, next to the running daemon, says so too (on a thread: the daemon runs
        # on this loop and keeps scanning meanwhile).
        document, code = await asyncio.to_thread(report, h.node)
        assert code == 0 and document["cdi"]["state"] == "missing"
        kinds = [p["kind"] for p in document["problems"]]
        assert kinds == ["cdi-spec-missing"]
        table = (await asyncio.to_thread(inspect, h.node)).stdout
        assert f"cdi:      {RUNTIME} MISSING from every spec directory (see problems)" in table
        assert "OK: 4 devices advertised, 0 errors, 1 warning (exit 0)" in table
        # Allocate answers as it always does: runtimes without CDI work without the spec.
        without_spec = answer(await h.kubelet.allocate(NPU, [["rbln0"]]))
        assert without_spec[1] == ANNOTATION
        # Scans go on; the warning is not repeated.
        await h.daemon.await_log("Reconciled device inventory", count=8)
        assert len(h.daemon.find(MISSING)) == 1

        h.node.write_cdi_spec()
        (found,) = await h.daemon.await_log(FOUND)
        assert found["level"] == "info" and found["missingSeconds"] > 0
        assert found["specFiles"] == {RUNTIME: str(h.node.cdi_spec_path)}
        samples = await scrape_until(port, lambda s: value(s, "cdi_spec", state="present") == 1)
        assert cdi_states(samples)["missing"] == 0
        with_spec = answer(await h.kubelet.allocate(NPU, [["rbln0"]]))
        assert with_spec == without_spec
        # Nothing restarted: one registration per resource, the runtime still serving.
        assert len(h.daemon.find("Registered device plugin with kubelet")) == 1
        assert h.serving()
        document, _ = await asyncio.to_thread(report, h.node)
        assert document["cdi"]["state"] == "present" and document["problems"] == []


async def test_hostile_spec_files_are_reported_and_change_no_answer() -> None:
    async with running("rebel-4", extra_args=METRICS) as clean:
        await clean.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        expected = answer(await clean.kubelet.allocate(NPU, [["rbln1"]]))
    async with running("rebel-4", extra_args=METRICS, prepare=hostile_node) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        # The 10 MB files were not checked; the FIFOs were not opened: the runtimes' read
        # would block on them for good.
        (said,) = await h.daemon.await_log(UNKNOWN)
        fifos = [str(d / "fifo.yaml") for d in (h.node.cdi_static_dir, h.node.cdi_root)]
        assert set(said["notChecked"]) == {
            str(h.node.cdi_static_dir / "huge.yaml"),
            str(h.node.cdi_root / "huge.yaml"),
            *fifos,
        }
        assert "blocks opening it for good" in said["notChecked"][fifos[0]]
        (hang,) = await h.daemon.await_log(HANG)
        assert hang["level"] == "warn" and hang["files"] == fifos
        unusable = set(said["unusable"])
        for directory in (h.node.cdi_static_dir, h.node.cdi_root):
            for name in ("empty.yaml", "garbage.json", "slash.yaml", "loop-a.yaml"):
                assert str(directory / name) in unusable
        assert answer(await h.kubelet.allocate(NPU, [["rbln1"]])) == expected
        # Without the unreadable giants and the FIFOs, the verdict is plain: missing.
        for directory in (h.node.cdi_static_dir, h.node.cdi_root):
            (directory / "huge.yaml").unlink()
            (directory / "fifo.yaml").unlink()
        (warn,) = await h.daemon.await_log(MISSING)
        assert "slash.yaml" in " ".join(warn["unusable"])
        # The toolkit's spec next to the junk: found.
        h.node.write_cdi_spec()
        await h.daemon.await_log(FOUND)
        assert answer(await h.kubelet.allocate(NPU, [["rbln1"]])) == expected
        document, _ = await asyncio.to_thread(report, h.node)
        assert document["cdi"]["state"] == "present"
        assert {p["kind"] for p in document["problems"]} == {"cdi-spec-unusable"}
        assert h.serving()
        assert not h.daemon.find(None, level="error")


async def test_a_spec_directory_it_cannot_see_is_cannot_tell_never_missing() -> None:
    # As under the operator's DaemonSet, which mounts only the CDI root.
    async with running("rebel-4", extra_args=METRICS, prepare=without_static_dir) as h:
        (said,) = await h.daemon.await_log(UNKNOWN)
        assert said["level"] == "info"
        assert said["notVisible"] == {
            str(h.node.cdi_static_dir): "does not exist here (not mounted into the plugin's "
            "container?)"
        }
        samples = await scrape_until(
            await metrics_port(h.daemon), lambda s: value(s, "cdi_spec", state="unknown") == 1
        )
        assert cdi_states(samples) == {"present": 0, "missing": 0, "unknown": 1}
        await h.daemon.await_log("Reconciled device inventory", count=5)
        assert not h.daemon.find(MISSING) and len(h.daemon.find(UNKNOWN)) == 1
        document, _ = await asyncio.to_thread(report, h.node)
        assert [p["kind"] for p in document["problems"]] == ["cdi-spec-unknown"]
        table = (await asyncio.to_thread(inspect, h.node)).stdout
        assert f"cdi:      {RUNTIME}: cannot tell (see problems)" in table
        # The toolkit writes its spec into the visible directory: found.
        (h.node.cdi_root / "rbln.yaml").write_text(TOOLKIT_CDI_SPEC)
        (found,) = await h.daemon.await_log(FOUND)
        assert found["specFiles"] == {RUNTIME: str(h.node.cdi_root / "rbln.yaml")}


@pytest.mark.parametrize(
    ("mode", "annotations", "cdi_devices"),
    [("annotation", ANNOTATION, []), ("field", {}, [RUNTIME]), ("both", ANNOTATION, [RUNTIME])],
)
async def test_cdi_mode_decides_how_the_device_is_named(
    mode: str, annotations: dict[str, str], cdi_devices: list[str]
) -> None:
    async with running("rebel-4", extra_args=["--cdi-mode", mode]) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        devices, got_annotations, got_cdi, envs, mounts = answer(
            await h.kubelet.allocate(NPU, [["rbln2", "rbln3"]])
        )
        assert (got_annotations, got_cdi) == (annotations, cdi_devices)
        assert devices == [("/dev/rbln2", "rw"), ("/dev/rbln3", "rw"), ("/dev/rsd0", "rw")]
        assert envs == {} and mounts == []
        # What cli's "Starting rbln-device-plugin" record shows (test_cli checks the record).
        assert h.config.describe()["cdiMode"] == mode
