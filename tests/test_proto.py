"""The committed kubelet API stubs must equal a fresh generation from the protos, and the
vendored DRA protos must equal the kubelet module they came from."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
# Every contract the daemon speaks: the device-plugin API, and the DRA front end's.
PROTOS = (
    "rbln_device_plugin/api/v1beta1/api.proto",
    "rbln_device_plugin/api/pluginregistration/v1/api.proto",
    "rbln_device_plugin/api/dra/v1/api.proto",
    "rbln_device_plugin/api/dra/v1beta1/api.proto",
    "rbln_device_plugin/api/drahealth/v1/api.proto",
    "rbln_device_plugin/api/drahealth/v1alpha1/api.proto",
    "rbln_device_plugin/api/podresources/v1/api.proto",
)
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")
# Where each vendored proto comes from, inside the Go module cache's k8s.io/kubelet.
KUBELET_MODULE = Path.home() / "go" / "pkg" / "mod" / "k8s.io" / "kubelet@v0.37.2"
VENDORED = {
    "rbln_device_plugin/api/pluginregistration/v1/api.proto": "pluginregistration/v1",
    "rbln_device_plugin/api/dra/v1/api.proto": "dra/v1",
    "rbln_device_plugin/api/dra/v1beta1/api.proto": "dra/v1beta1",
    "rbln_device_plugin/api/drahealth/v1/api.proto": "dra-health/v1",
    "rbln_device_plugin/api/drahealth/v1alpha1/api.proto": "dra-health/v1alpha1",
    "rbln_device_plugin/api/podresources/v1/api.proto": "podresources/v1",
}


def test_every_proto_is_generated_by_make_proto() -> None:
    # A proto added under proto/ but not to the Makefile would never get its stubs.
    on_disk = {str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto")}
    assert on_disk == set(PROTOS)
    makefile = (ROOT / "Makefile").read_text()
    listed = re.search(r"^PROTO_SRC := ((?:.*\\\n)*.*)$", makefile, re.MULTILINE)
    assert listed is not None
    names = {word.removeprefix("proto/") for word in listed.group(1).split() if word != "\\"}
    assert names == set(PROTOS)


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", "-I", str(PROTO_ROOT),
            f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
            f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}", f"--mypy_out={tmp_path}",
            f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
            f"--mypy_grpc_out={tmp_path}",
            *(str(PROTO_ROOT / proto) for proto in PROTOS),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    stale = []
    for proto in PROTOS:
        package = Path(proto).parent
        for name in GENERATED:
            fresh = tmp_path / package / name
            committed = ROOT / "src" / package / name
            if not committed.is_file() or fresh.read_bytes() != committed.read_bytes():
                stale.append(str(package / name))
    assert not stale, f"stale generated stubs {stale}: run `make proto` and commit the result"


@pytest.mark.parametrize("proto", sorted(VENDORED))
def test_vendored_protos_equal_the_kubelet_module(proto: str) -> None:
    source = KUBELET_MODULE / "pkg" / "apis" / VENDORED[proto] / "api.proto"
    if not source.is_file():
        pytest.skip(f"{source} is not in the Go module cache (tests/kubelet-peer fetches it)")
    assert (PROTO_ROOT / proto).read_bytes() == source.read_bytes()


def test_wire_contract_names() -> None:
    from rbln_device_plugin.api.v1beta1 import api_pb2

    services = api_pb2.DESCRIPTOR.services_by_name
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    assert set(services) == {"Registration", "DevicePlugin"}
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    fields = api_pb2.ContainerAllocateResponse.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in fields.items()} == {
        "envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5,
    }  # fmt: skip
    request = api_pb2.ContainerPreferredAllocationRequest.DESCRIPTOR.fields_by_name
    assert request["available_deviceIDs"].number == 1
    assert request["must_include_deviceIDs"].number == 2
    assert request["allocation_size"].number == 3


def test_dra_wire_contract_names() -> None:
    from rbln_device_plugin.api import dra, drahealth, pluginregistration
    from rbln_device_plugin.api.dra.v1 import api_pb2 as dra_v1
    from rbln_device_plugin.api.dra.v1beta1 import api_pb2 as dra_v1beta1
    from rbln_device_plugin.api.drahealth.v1 import api_pb2 as health_v1
    from rbln_device_plugin.api.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
    from rbln_device_plugin.api.pluginregistration.v1 import api_pb2 as registration

    # The gRPC paths the kubelet calls: the proto package plus the service name.
    assert registration.DESCRIPTOR.services_by_name["Registration"].full_name == (
        "pluginregistration.Registration"
    )
    for module, package in ((dra_v1, "v1"), (dra_v1beta1, "v1beta1")):
        service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{package}.DRAPlugin"
        assert [m.name for m in service.methods] == [
            "NodePrepareResources",
            "NodeUnprepareResources",
        ]
    for module, package in ((health_v1, "v1"), (health_v1alpha1, "v1alpha1")):
        service = module.DESCRIPTOR.services_by_name["DRAResourceHealth"]
        assert service.full_name == f"{package}.DRAResourceHealth"
    # The names announced in PluginInfo.supported_versions: "<package>.<service>" as the
    # kubelet's pkg/apis/dra*/*/types.go spell them, not the gRPC paths.
    assert dra.DRA_PLUGIN_V1 == "v1.DRAPlugin"
    assert dra.DRA_PLUGIN_V1BETA1 == "v1beta1.DRAPlugin"
    assert drahealth.DRA_RESOURCE_HEALTH_V1 == "v1.DRAResourceHealth"
    assert drahealth.DRA_RESOURCE_HEALTH_V1ALPHA1 == "v1alpha1.DRAResourceHealth"
    assert pluginregistration.DRA_PLUGIN_TYPE == "DRAPlugin"
    device = dra_v1.Device.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in device.items()} == {
        "request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4, "share_id": 5,
    }  # fmt: skip
    assert "share_id" not in dra_v1beta1.Device.DESCRIPTOR.fields_by_name
    info = registration.PluginInfo.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in info.items()} == {
        "type": 1, "name": 2, "endpoint": 3, "supported_versions": 4,
    }  # fmt: skip


def test_announced_names_equal_the_kubelet_module() -> None:
    from rbln_device_plugin.api import dra, drahealth, pluginregistration

    apis = KUBELET_MODULE / "pkg" / "apis"
    sources = {
        apis / "dra" / "v1" / "types.go": f'DRAPluginService = "{dra.DRA_PLUGIN_V1}"',
        apis / "dra" / "v1beta1" / "types.go": f'DRAPluginService = "{dra.DRA_PLUGIN_V1BETA1}"',
        apis / "dra-health" / "v1" / "types.go": (
            f'DRAResourceHealthService = "{drahealth.DRA_RESOURCE_HEALTH_V1}"'
        ),
        apis / "dra-health" / "v1alpha1" / "types.go": (
            f'DRAResourceHealthService = "{drahealth.DRA_RESOURCE_HEALTH_V1ALPHA1}"'
        ),
        apis / "pluginregistration" / "v1" / "constants.go": (
            f'DRAPlugin = "{pluginregistration.DRA_PLUGIN_TYPE}"'
        ),
    }
    if not KUBELET_MODULE.is_dir():
        pytest.skip(f"{KUBELET_MODULE} is not in the Go module cache")
    for path, line in sources.items():
        assert line in " ".join(path.read_text().split()), (path, line)
