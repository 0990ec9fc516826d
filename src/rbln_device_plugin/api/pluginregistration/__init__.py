"""The kubelet's plugin watcher: the registration every socket under
``<kubelet root>/plugins_registry/`` answers (generated ``v1`` stubs) and its fixed names.

Package ``pluginregistration`` on the wire (the kubelet calls
``/pluginregistration.Registration/GetInfo``), vendored from ``k8s.io/kubelet``'s
``pkg/apis/pluginregistration/v1``.
"""

from typing import Final

# PluginInfo.type of a DRA kubelet plugin (k8s.io/kubelet pluginregistration/v1 constants.go).
DRA_PLUGIN_TYPE: Final = "DRAPlugin"
# The kubelet's registration directory and the DRA plugins' data directory, inside its root.
PLUGINS_REGISTRY_DIR: Final = "plugins_registry"
PLUGINS_DIR: Final = "plugins"
