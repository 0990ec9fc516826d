"""The kubelet's DRA device-health stream (generated ``v1`` and ``v1alpha1`` stubs) and the
names a plugin announces for it in ``PluginInfo.supported_versions``.

Vendored from ``k8s.io/kubelet``'s ``pkg/apis/dra-health`` (``drahealth`` here: a Python
package name has no hyphen).
"""

from typing import Final

DRA_RESOURCE_HEALTH_V1: Final = "v1.DRAResourceHealth"
DRA_RESOURCE_HEALTH_V1ALPHA1: Final = "v1alpha1.DRAResourceHealth"
