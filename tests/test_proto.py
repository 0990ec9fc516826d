"""The committed kubelet API stubs must equal a fresh generation from the proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = "rbln_device_plugin/api/v1beta1/api.proto"
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "proto"),
            f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
            f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}", f"--mypy_out={tmp_path}",
            f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
            f"--mypy_grpc_out={tmp_path}",
            str(ROOT / "proto" / PROTO),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    fresh_dir = tmp_path / "rbln_device_plugin" / "api" / "v1beta1"
    committed_dir = ROOT / "src" / "rbln_device_plugin" / "api" / "v1beta1"
    stale = [
        name
        for name in GENERATED
        if (fresh_dir / name).read_bytes() != (committed_dir / name).read_bytes()
    ]
    assert not stale, f"stale generated stubs {stale}: run `make proto` and commit the result"


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
