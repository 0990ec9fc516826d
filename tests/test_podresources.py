"""The devices a mode keeps back on a node switched between the two modes
(``runtime.otherholds`` over ``kubelet.podresources``), against a PodResources server on a real
unix socket (``tests/podresources_server.py``, answering as the kubelet's server_v1.go):
held devices are kept back until their pods end, a PodResources API that cannot be read
never lets a device that may be held through, and reads stop once nothing is held."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

from rbln_device_plugin import config
from rbln_device_plugin.dra import checkpoint as cp
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.kubelet.podresources import PodResourcesError, list_pods
from rbln_device_plugin.model.holds import ClaimUse, ContainerUse, PodUse
from rbln_device_plugin.runtime.otherholds import (
    CHECKPOINT_FAILED_MSG,
    HELD_MSG,
    READ_FAILED_MSG,
    RELEASED_MSG,
    OtherModeHolds,
)
from rbln_device_plugin.telemetry import metrics as m

from .inprocess import running
from .podresources_server import FakePod, serving

NPU, VF4 = "rebellions.ai/npu", "rebellions.ai/npu-vf4"
DRIVER = "npu.rebellions.ai"


def _offered() -> dict[str, list[Any]]:
    return {
        NPU: [SimpleNamespace(name=f"rbln{i}") for i in range(4)],
        VF4: [SimpleNamespace(name=f"rbln4-{i}") for i in range(4)],
    }


class Counting(m.Metrics):
    def __init__(self) -> None:
        self.reads: list[str] = []
        self.withheld: dict[str, int] = {}

    def pod_resources_read(self, result: str) -> None:
        self.reads.append(result)

    def withheld_devices(self, counts: Any) -> None:
        self.withheld = dict(counts)


@pytest.fixture
def node(short_tmp: Path) -> Iterator[SimpleNamespace]:
    plugins = short_tmp / "plugins"
    (plugins / DRIVER).mkdir(parents=True)
    yield SimpleNamespace(
        socket=short_tmp / "kubelet.sock",
        plugins=plugins,
        checkpoint=plugins / DRIVER / "checkpoint.json",
    )


def _holds(node: SimpleNamespace, mode: str, hostio: HostIO, metrics: m.Metrics) -> OtherModeHolds:
    cfg = config.config_from_settings(
        {
            "mode": mode,
            "node_name": "node-a",
            "kubelet_plugins_path": str(node.plugins),
            "kubelet_pod_resources_socket": str(node.socket),
        },
        {},
    )
    return OtherModeHolds(cfg, hostio, metrics)


def _prepared(node: SimpleNamespace, claims: dict[str, list[str]]) -> None:
    state = cp.Checkpoint()
    for uid, devices in claims.items():
        prepared = tuple(
            cp.PreparedDevice("npus", "node-a", d, (f"k8s.{DRIVER}/npu={uid}-{d}",))
            for d in devices
        )
        state = state.with_claim(uid, cp.ClaimEntry("ml", uid, cp.COMPLETED, prepared))
    node.checkpoint.write_bytes(cp.encode(state))


async def test_the_client_reads_what_the_kubelet_lists(node: SimpleNamespace) -> None:
    async with serving(node.socket) as kubelet:
        kubelet.active = [
            FakePod("ml", "dp", devices={"main": [(NPU, ["rbln0", "rbln1"])]}),
            FakePod("ml", "dra", claims={"main": [("c0", [(DRIVER, "node-a", "rbln2")])]}),
        ]
        pods = await list_pods(node.socket)
    assert pods == [
        PodUse("ml", "dp", (ContainerUse("main", ((NPU, ("rbln0", "rbln1")),)),)),
        PodUse("ml", "dra", (
            ContainerUse("main", claims=(ClaimUse("ml", "c0", ((DRIVER, "node-a", "rbln2"),)),)),
        )),
    ]  # fmt: skip


async def test_a_missing_socket_is_an_error_that_says_so(node: SimpleNamespace) -> None:
    with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
        await list_pods(node.socket, wait_s=2.0)


async def test_dra_mode_keeps_back_device_plugin_pods_devices_until_they_end(
    node: SimpleNamespace, hostio: HostIO
) -> None:
    metrics = Counting()
    holds = _holds(node, "dra", hostio, metrics)
    async with serving(node.socket) as kubelet:
        kubelet.active = [
            FakePod("ml", "a", devices={"c": [(NPU, ["rbln1"])]}),
            FakePod("ml", "b", devices={"c": [(VF4, ["rbln4-2"])], "d": [("x.com/gpu", ["g"])]}),
            # its own DRA claims are not the other mode's
            FakePod("ml", "dra", claims={"c": [("c0", [(DRIVER, "node-a", "rbln3")])]}),
        ]
        with capture_logs() as logs:
            assert await holds.withheld(_offered()) == {"rbln1", "rbln4-2"}
        held = [r for r in logs if r["event"] == HELD_MSG]
        assert {(r["device"], tuple(r["holders"])) for r in held} == {
            ("rbln1", ("ml/a/c",)), ("rbln4-2", ("ml/b/c",)),
        }  # fmt: skip
        assert metrics.withheld == {NPU: 1, VF4: 1}
        kubelet.active = kubelet.active[1:]  # pod a ended
        with capture_logs() as logs:
            assert await holds.withheld(_offered()) == {"rbln4-2"}
        assert [r["device"] for r in logs if r["event"] == RELEASED_MSG] == ["rbln1"]
        kubelet.active = kubelet.active[1:]  # pod b ended
        assert await holds.withheld(_offered()) == set()
        lists = kubelet.lists
    # Settled: nothing read again, even with the API gone.
    assert await holds.withheld(_offered()) == set()
    assert (kubelet.lists, metrics.reads) == (lists, [m.OK] * 3)


async def test_dra_mode_publishes_nothing_until_the_kubelet_answers(
    node: SimpleNamespace, hostio: HostIO
) -> None:
    metrics = Counting()
    holds = _holds(node, "dra", hostio, metrics)
    with capture_logs() as logs:
        assert await holds.withheld(_offered()) == {
            d.name for ds in _offered().values() for d in ds
        }
        await holds.withheld(_offered())
    failed = [r for r in logs if r["event"] == READ_FAILED_MSG]
    assert len(failed) == 1 and failed[0]["log_level"] == "error"  # said once per reason
    assert metrics.reads == [m.POD_RESOURCES_FAILED] * 2
    assert metrics.withheld == {NPU: 4, VF4: 4}
    async with serving(node.socket) as kubelet:
        kubelet.active = [FakePod("ml", "a", devices={"c": [(NPU, ["rbln0", "rbln2"])]})]
        with capture_logs() as answered:
            withheld = await holds.withheld(_offered())
        # On a failure, the read's own error says why (the records name it).
        assert withheld == {"rbln0", "rbln2"}, [r for r in answered if "err" in r]
    # The API gone again: the last answer stands (holdings only shrink meanwhile).
    assert await holds.withheld(_offered()) == {"rbln0", "rbln2"}


async def test_device_plugin_mode_never_reads_without_a_dra_checkpoint(
    node: SimpleNamespace, hostio: HostIO
) -> None:
    metrics = Counting()
    holds = _holds(node, "device-plugin", hostio, metrics)
    assert await holds.withheld(_offered()) == set()  # no socket either: nothing asked
    assert metrics.reads == [] and holds.reads == 0


async def test_device_plugin_mode_keeps_back_claims_devices_in_use(
    node: SimpleNamespace, hostio: HostIO
) -> None:
    _prepared(node, {"u1": ["rbln0", "rbln1"], "u2": ["rbln4-0"]})
    metrics = Counting()
    holds = _holds(node, "device-plugin", hostio, metrics)
    # Unreadable API: the checkpoint's devices, not more.
    assert await holds.withheld(_offered()) == {"rbln0", "rbln1", "rbln4-0"}
    async with serving(node.socket) as kubelet:
        # Claim u2's pod ended: it stays prepared (no DRA plugin to unprepare it) but no
        # active pod holds its device.
        kubelet.active = [
            FakePod("ml", "a", claims={"c": [("u1", [(DRIVER, "node-a", "rbln0"),
                                                      (DRIVER, "node-a", "rbln1")])]}),
            FakePod("ml", "dp", devices={"c": [(NPU, ["rbln2"])]}),  # this mode's own
        ]  # fmt: skip
        assert await holds.withheld(_offered()) == {"rbln0", "rbln1"}
        kubelet.active = kubelet.active[1:]
        assert await holds.withheld(_offered()) == set()
    assert metrics.reads == [m.POD_RESOURCES_FAILED, m.OK, m.OK]


async def test_device_plugin_mode_with_an_unusable_checkpoint_keeps_back_everything(
    node: SimpleNamespace, hostio: HostIO
) -> None:
    node.checkpoint.write_text("{not json")
    holds = _holds(node, "device-plugin", hostio, Counting())
    with capture_logs() as logs:
        assert len(await holds.withheld(_offered())) == 8
    assert [r["event"] for r in logs if r["log_level"] == "error"] == [
        CHECKPOINT_FAILED_MSG, READ_FAILED_MSG,
    ]  # fmt: skip


async def test_an_empty_setting_turns_the_look_off(node: SimpleNamespace, hostio: HostIO) -> None:
    cfg = config.config_from_settings({"mode": "dra", "node_name": "n"}, {
        "KUBELET_POD_RESOURCES_SOCKET": ""})  # fmt: skip
    assert cfg.kubelet_pod_resources_socket is None
    holds = OtherModeHolds(cfg, hostio, Counting())
    assert await holds.withheld(_offered()) == set() and holds.reads == 0


async def test_the_device_plugin_mode_advertises_a_claims_device_once_its_pod_ends(
    short_tmp: Path,
) -> None:
    """A node moved back from dra mode (its checkpoint holds a claim of rbln1 whose pod
    runs): the kubelet is never sent rbln1, an Allocate of it is refused, and it is
    advertised at the scan after the pod ended."""
    plugins, socket = short_tmp / "plugins", short_tmp / "pr.sock"
    (plugins / DRIVER).mkdir(parents=True)
    _prepared(SimpleNamespace(checkpoint=plugins / DRIVER / "checkpoint.json"), {"u1": ["rbln1"]})
    args = ["--kubelet-plugins-path", str(plugins), "--kubelet-pod-resources-socket", str(socket)]
    async with serving(socket) as kubelet_pr:
        kubelet_pr.active = [
            FakePod("ml", "a", claims={"c": [("u1", [(DRIVER, "node-a", "rbln1")])]})
        ]
        async with running("rebel-4", extra_args=args, interval="200ms") as h:
            first = await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 3)
            assert first.messages == 1  # the first view sent already lacked rbln1
            assert {d.ID for d in first.devices} == {"rbln0", "rbln2", "rbln3"}
            with pytest.raises(grpc.aio.AioRpcError, match="unknown device IDs"):
                await h.kubelet.allocate(NPU, [["rbln1"]])
            kubelet_pr.active = []
            await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
            (released,) = await h.daemon.await_log(RELEASED_MSG)
            assert released["device"] == "rbln1" and released["otherMode"] == "dra"
