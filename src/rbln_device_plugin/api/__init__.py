"""The kubelet device-plugin API: generated stubs (``v1beta1``) and its fixed names.

The names are the protocol's, shared by the daemon and the kubelet stand-in so the two
can never disagree on them.
"""

from typing import Final

# The API version a plugin announces in Register (the kubelet refuses any other).
API_VERSION: Final = "v1beta1"
# The kubelet's registration socket, inside its device-plugin directory.
KUBELET_SOCKET: Final = "kubelet.sock"
