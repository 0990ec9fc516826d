"""The kubelet's DRA plugin service (generated ``v1`` and ``v1beta1`` stubs) and the names
a plugin announces in ``PluginInfo.supported_versions``.

Vendored from ``k8s.io/kubelet``'s ``pkg/apis/dra``. The announced names are not the gRPC
service names (``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``): the kubelet matches the
plugin's list, in the plugin's order, against its own (``pkg/kubelet/cm/dra/plugin``).
"""

from typing import Final

DRA_PLUGIN_V1: Final = "v1.DRAPlugin"
DRA_PLUGIN_V1BETA1: Final = "v1beta1.DRAPlugin"
