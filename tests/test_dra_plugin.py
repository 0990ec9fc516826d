"""The DRA kubelet plugin in-process, driven the way the kubelet drives it, on a simulated
node (its sysfs, its /dev, its real ``rbln-smi`` subprocess and RSD groups).

``KubeletSide`` follows the kubelet's own code step by step (k8s.io/kubernetes@v1.37.2):
``pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go`` (dial the
registration socket, GetInfo within 1 s, a handler for the type, the endpoint defaulting
to the socket, NotifyRegistrationStatus within 5 s), ``pkg/kubelet/cm/dra/plugin/
dra_plugin_manager.go`` (the service is the first of the plugin's list the kubelet knows;
the plugin is dialled at ``unix:`` + endpoint) and ``pkg/kubelet/cm/dra/manager.go`` (each
requested claim must have an entry; a non-empty error fails the pod).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rbln_device_plugin import options
from rbln_device_plugin.core.devices import NodeDevices
from rbln_device_plugin.dra import checkpoint as cp
from rbln_device_plugin.dra import names
from rbln_device_plugin.dra.claims import ClaimProblem, ClaimRef
from rbln_device_plugin.dra.prepare import DraDevices, Preparer
from rbln_device_plugin.dra.server import DraPlugin
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.scan import Scanner
from rbln_device_plugin.model.cdispec import FileState, check_spec_file
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir

from .dra_kubelet import KubeletSide

NODE = "node-a"


@dataclass
class Claims:
    """The API server as a table: claim JSON by namespace/name, with a read count."""

    table: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    reads: int = 0

    async def get(self, ref: ClaimRef) -> Mapping[str, Any]:
        self.reads += 1
        claim = self.table.get(str(ref))
        if claim is None:
            raise ClaimProblem(f"reading ResourceClaim {ref} from the API server: 404 NotFound")
        return claim

    def allocate(self, ref: ClaimRef, devices: list[str], request: str = "npus") -> None:
        self.table[str(ref)] = {
            "metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": request, "driver": names.DRIVER_NAME, "pool": NODE,
                             "device": d}
                            for d in devices
                        ]
                    }
                }
            },
        }  # fmt: skip


@dataclass
class Node:
    sim: SimNode
    root: Path
    claims: Claims
    hostio: HostIO
    devices: DraDevices
    config: options.Config

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_root / "plugins" / names.DRIVER_NAME

    def plugin(self) -> DraPlugin:
        """A plugin instance (a fresh one per call: a restart keeps only the files)."""
        preparer = Preparer(
            self.config, self.devices, self.claims, node_name=NODE,
            plugin_dir=self.plugin_dir, hostio=self.hostio,
        )  # fmt: skip
        registry = self.kubelet_root / "plugins_registry"
        registry.mkdir(parents=True, exist_ok=True)  # the kubelet's, made by the kubelet
        return DraPlugin(preparer, registry, self.plugin_dir, self.hostio)

    def spec_path(self, uid: str) -> Path:
        return self.config.cdi_root / names.spec_file_name(uid)


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    root = short_tempdir()
    sim = materialize(preset("atom-max-8"), root / "sim")
    config = options.parse(sim.daemon_args("1h"), {})
    hostio = HostIO()
    scanner = Scanner(sysfs_root=config.sysfs_root, smi_path=config.rbln_smi, hostio=hostio)
    found = NodeDevices(config, scanner, hostio, m.NOOP)
    devices = DraDevices(found.open_state)
    await devices.update((await found.discover()).offered)
    try:
        yield Node(sim, root, Claims(), hostio, devices, config)
    finally:
        hostio.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def serving(node: Node) -> AsyncIterator[tuple[DraPlugin, KubeletSide]]:
    plugin = node.plugin()
    await plugin.start()
    kubelet = KubeletSide(plugin.registration_socket)
    try:
        yield plugin, kubelet
    finally:
        await kubelet.close()
        await plugin.stop()


CLAIM = ClaimRef("default", "two-npus", "0b6f9c1e-4a7d-4c51-9a7e-1f3c2d4e5a61")


async def test_registration_follows_the_plugin_watchers_protocol(
    node: Node, serving: tuple[DraPlugin, KubeletSide]
) -> None:
    plugin, kubelet = serving
    assert plugin.registration_socket == (
        node.kubelet_root / "plugins_registry" / "npu.rebellions.ai-reg.sock"
    )
    await kubelet.register()
    assert kubelet.info is not None
    assert kubelet.info.name == "npu.rebellions.ai"
    assert kubelet.info.endpoint == str(node.plugin_dir / "dra.sock")
    assert list(kubelet.info.supported_versions) == [
        "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth",
    ]  # fmt: skip
    assert kubelet.service == "v1.DRAPlugin"
    assert plugin.registration.registered is True
    # The endpoint serves the moment GetInfo answered (the kubelet may call it at once).
    assert await kubelet.prepare() == {}


async def test_stop_removes_the_registration_socket_then_the_endpoint(node: Node) -> None:
    plugin = node.plugin()
    await plugin.start()
    assert plugin.registration_socket.is_socket() and plugin.endpoint.is_socket()
    await plugin.stop()
    assert not plugin.registration_socket.exists() and not plugin.endpoint.exists()


@pytest.mark.parametrize("service", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
async def test_prepare_makes_the_claims_rsd_group_and_cdi_spec(
    node: Node, serving: tuple[DraPlugin, KubeletSide], service: str
) -> None:
    _plugin, kubelet = serving
    await kubelet.register()
    kubelet.service = service  # as a kubelet that knows only this one would choose
    node.claims.allocate(CLAIM, ["rbln0", "rbln1"])
    answer = (await kubelet.prepare(CLAIM))[CLAIM.uid]
    assert answer.error == ""
    ids = [list(d.cdi_device_ids) for d in answer.devices]
    assert [(d.device_name, d.pool_name, list(d.request_names)) for d in answer.devices] == [
        ("rbln0", NODE, ["npus"]), ("rbln1", NODE, ["npus"]),
    ]  # fmt: skip
    assert ids == [
        [f"k8s.npu.rebellions.ai/npu={CLAIM.uid}-rbln0", "rebellions.ai/npu=runtime"],
        [f"k8s.npu.rebellions.ai/npu={CLAIM.uid}-rbln1"],
    ]
    # One RSD group holds exactly the claim's devices.
    groups = {g: sorted(d) for g, d in node.sim.groups().items() if g != "0"}
    assert list(groups.values()) == [["rbln0", "rbln1"]]
    (group,) = groups
    # The spec defines the answered devices as containerd's CDI library reads it.
    path = node.spec_path(CLAIM.uid)
    checked = check_spec_file(str(path), path.read_bytes())
    assert checked.state is FileState.USABLE, checked
    assert checked.spec is not None
    assert checked.spec.devices == {ids[0][0], ids[1][0]}
    spec = json.loads(path.read_bytes())
    assert spec["kind"] == "k8s.npu.rebellions.ai/npu"
    nodes = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert nodes[f"{CLAIM.uid}-rbln1"] == [
        {"path": "/dev/rsd0", "hostPath": str(node.config.dev_root / f"rsd{group}")},
        {"path": "/dev/rbln1", "hostPath": str(node.config.dev_root / "rbln1")},
    ]


async def test_prepare_and_unprepare_are_idempotent(
    node: Node, serving: tuple[DraPlugin, KubeletSide]
) -> None:
    _plugin, kubelet = serving
    await kubelet.register()
    node.claims.allocate(CLAIM, ["rbln2"])
    first = (await kubelet.prepare(CLAIM))[CLAIM.uid]
    groups = node.sim.groups()
    again = (await kubelet.prepare(CLAIM))[CLAIM.uid]
    assert again == first
    assert node.sim.groups() == groups  # no second group
    assert node.claims.reads == 1  # answered from what was prepared
    assert await kubelet.unprepare(CLAIM) == {CLAIM.uid: ""}
    assert not node.spec_path(CLAIM.uid).exists()
    assert await kubelet.unprepare(CLAIM) == {CLAIM.uid: ""}


async def test_a_restart_neither_loses_nor_repeats_a_prepared_claim(node: Node) -> None:
    node.claims.allocate(CLAIM, ["rbln3"])
    plugin = node.plugin()
    await plugin.start()
    kubelet = KubeletSide(plugin.registration_socket)
    await kubelet.register()
    first = (await kubelet.prepare(CLAIM))[CLAIM.uid]
    await kubelet.close()
    await plugin.stop()
    groups = node.sim.groups()
    del node.claims.table[str(CLAIM)]  # the claim is gone from the API server meanwhile

    restarted = node.plugin()
    await restarted.start()
    kubelet = KubeletSide(restarted.registration_socket)
    try:
        await kubelet.register()
        assert (await kubelet.prepare(CLAIM))[CLAIM.uid] == first  # not repeated
        assert node.sim.groups() == groups
        assert node.claims.reads == 1
        assert await kubelet.unprepare(CLAIM) == {CLAIM.uid: ""}  # not lost
        assert not node.spec_path(CLAIM.uid).exists()
        assert restarted.preparer.checkpoint.claims == {}
    finally:
        await kubelet.close()
        await restarted.stop()


async def test_a_claim_started_before_a_crash_is_prepared_again(node: Node) -> None:
    # The checkpoint says PrepareStarted: the plugin died between its first host change
    # and the CDI spec. The retry does it all; an unprepare would have found it too.
    node.plugin_dir.mkdir(parents=True)
    started = cp.Checkpoint({CLAIM.uid: cp.ClaimEntry(CLAIM.namespace, CLAIM.name, cp.STARTED)})
    (node.plugin_dir / "checkpoint.json").write_bytes(cp.encode(started))
    node.claims.allocate(CLAIM, ["rbln4"])
    plugin = node.plugin()
    await plugin.start()
    try:
        outcome = await plugin.preparer.prepare(CLAIM)
        assert outcome.error == "" and [d.device for d in outcome.devices] == ["rbln4"]
        assert node.spec_path(CLAIM.uid).is_file()
        assert plugin.preparer.checkpoint.claims[CLAIM.uid].state == cp.COMPLETED
    finally:
        await plugin.stop()


async def test_a_faulted_device_is_refused_by_name_before_any_host_change(
    node: Node, serving: tuple[DraPlugin, KubeletSide]
) -> None:
    _plugin, kubelet = serving
    await kubelet.register()
    node.claims.allocate(CLAIM, ["rbln5", "rbln6"])
    groups = node.sim.groups()
    node.sim.set_status("rbln6", 4)  # faulted after the last scan: the final check sees it
    answer = (await kubelet.prepare(CLAIM))[CLAIM.uid]
    assert "rbln6" in answer.error and "unhealthy" in answer.error, answer.error
    assert "npu.rebellions.ai" in answer.error and str(CLAIM) in answer.error
    assert not answer.devices
    assert node.sim.groups() == groups
    assert not node.spec_path(CLAIM.uid).exists()
    assert CLAIM.uid not in _serving_checkpoint(node)


def _serving_checkpoint(node: Node) -> Mapping[str, cp.ClaimEntry]:
    path = node.plugin_dir / "checkpoint.json"
    return cp.decode(path.read_bytes(), str(path)).claims if path.exists() else {}


@pytest.mark.parametrize(
    ("claim", "wanted"),
    [
        ({"metadata": {"uid": CLAIM.uid}, "status": {}}, "is not allocated"),
        ({"metadata": {"uid": "another"}, "status": {}}, "got replaced"),
    ],
)
async def test_a_claim_that_cannot_be_prepared_says_why(
    node: Node, serving: tuple[DraPlugin, KubeletSide], claim: dict[str, Any], wanted: str
) -> None:
    _plugin, kubelet = serving
    await kubelet.register()
    node.claims.table[str(CLAIM)] = claim
    missing = ClaimRef("default", "nowhere", "1b6f9c1e-4a7d-4c51-9a7e-1f3c2d4e5a61")
    answers = await kubelet.prepare(CLAIM, missing)
    assert wanted in answers[CLAIM.uid].error
    assert "404" in answers[missing.uid].error  # every claim gets its entry


async def test_a_vanished_device_is_refused_by_name(
    node: Node, serving: tuple[DraPlugin, KubeletSide]
) -> None:
    _plugin, kubelet = serving
    await kubelet.register()
    node.sim.remove_device("rbln7")
    await node.devices.update((await _rescan(node)).offered)
    node.claims.allocate(CLAIM, ["rbln7"])
    error = (await kubelet.prepare(CLAIM))[CLAIM.uid].error
    assert "device rbln7 is not offered on this node now" in error, error


async def _rescan(node: Node) -> Any:
    scanner = Scanner(
        sysfs_root=node.config.sysfs_root, smi_path=node.config.rbln_smi, hostio=node.hostio
    )
    return await NodeDevices(node.config, scanner, node.hostio, m.NOOP).discover()


async def test_a_bad_claim_uid_never_names_a_file(
    node: Node, serving: tuple[DraPlugin, KubeletSide]
) -> None:
    _plugin, kubelet = serving
    await kubelet.register()
    hostile = ClaimRef("default", "x", "../../etc/passwd")
    error = (await kubelet.prepare(hostile))[hostile.uid].error
    assert "is not a Kubernetes UID" in error
    assert node.claims.reads == 0


async def test_a_corrupt_checkpoint_stops_the_start_with_its_name(node: Node) -> None:
    node.plugin_dir.mkdir(parents=True)
    good = cp.encode(cp.Checkpoint({CLAIM.uid: cp.ClaimEntry("default", "x", cp.COMPLETED)}))
    (node.plugin_dir / "checkpoint.json").write_bytes(good.replace(b'"x"', b'"y"'))
    plugin = node.plugin()
    with pytest.raises(cp.CheckpointError, match=r"checkpoint\.json: checksum mismatch"):
        await plugin.start()
    await plugin.stop()


async def test_concurrent_prepares_of_one_claim_make_one_group(
    node: Node, serving: tuple[DraPlugin, KubeletSide]
) -> None:
    _plugin, kubelet = serving
    await kubelet.register()
    node.claims.allocate(CLAIM, ["rbln0"])
    answers = await asyncio.gather(kubelet.prepare(CLAIM), kubelet.prepare(CLAIM))
    assert answers[0] == answers[1]
    assert len([g for g in node.sim.groups() if g != "0"]) == 1
