"""The one definition of each resource, and what derives from it."""

from __future__ import annotations

from pathlib import Path

from rbln_device_plugin.model import inventory, resources
from rbln_device_plugin_sim import tree

CHART = Path(__file__).resolve().parents[1] / "deployments" / "helm" / "k8s-device-plugin-chart"


def test_resources_give_names_sockets_and_vf_modes() -> None:
    assert resources.RESOURCE_NAMES == (
        "rebellions.ai/npu",
        "rebellions.ai/npu-vf1",
        "rebellions.ai/npu-vf4",
    )
    assert resources.NPU_VF4.socket_name == "rbln-device-plugin-rebellions-ai-npu-vf4.sock"
    assert resources.socket_name("Example.com/a_b") == "rbln-device-plugin-example-com-a-b.sock"
    assert dict(resources.VF_RESOURCES) == {1: "rebellions.ai/npu-vf1", 4: "rebellions.ai/npu-vf4"}
    assert resources.NPU_VF4.socket_name == resources.LONGEST_SOCKET_NAME


def test_inventory_and_simulator_derive_from_the_definition() -> None:
    assert inventory.VF_RESOURCES is resources.VF_RESOURCES
    assert resources.NPU.name == inventory.RESOURCE_NPU
    assert tree.LONGEST_SOCKET == resources.LONGEST_SOCKET_NAME


def test_chart_documents_every_resource() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    readme = (CHART / "README.md").read_text()
    for name in resources.RESOURCE_NAMES:
        assert name in notes, name
        assert f"`{name}`" in readme, name
