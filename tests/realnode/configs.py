"""What the node's components are configured with: kubelet, containerd, CNI. Data only;
``cluster`` writes them (with the simulator's stand-in for the RBLN container toolkit's
CDI spec, ``rbln_device_plugin_sim.node.TOOLKIT_CDI_SPEC``, in the node's ``/etc/cdi``)."""

from __future__ import annotations

from typing import Any, Final

from . import artifacts

NODE_IP: Final = "10.88.0.1"
BRIDGE: Final = "rbln-br0"
API_SERVER_PORT: Final = 6443


def in_cluster_api_env() -> list[dict[str, str]]:
    """Container env entries that point a pod's in-cluster client configuration
    (``KUBERNETES_SERVICE_HOST``/``PORT`` with the service account's token and
    ``ca.crt``, as lightkube's ``KubeConfig.from_service_account()`` reads them) at the
    API server on the node's address.

    The kubelet sets both variables to the ``kubernetes`` Service's ClusterIP, which
    only a service proxy makes reachable; none runs here (docs/testing.md says why). A
    container's own env entries win over the kubelet's service variables, so a chart's
    ``extraEnv`` carrying these changes nothing else of its in-cluster configuration.
    The serving certificate names NODE_IP and chains to ``kube-root-ca.crt``.
    """
    return [
        {"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(API_SERVER_PORT)},
    ]


def kubelet_config(cgroup_root: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroup v1 and no systemd on this machine; a cgroup root of the test's own.
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        # Node status follows the plugin quickly (allocatable, device health).
        "nodeStatusUpdateFrequency": "1s",
        "nodeStatusReportFrequency": "1s",
        # A pod whose claim the plugin refused at prepare (a faulted device) is tried
        # again only at the periodic sync (1 min, jittered up to 1.5); the test node's
        # 10 s shows the same retry about a minute sooner.
        "syncFrequency": "10s",
        "address": NODE_IP,
        "readOnlyPort": 0,
        # The node's network is private to the test: the API server may call in.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        # A shared build machine's disk must not evict the test's pods.
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "resolvConf": "",
        "serializeImagePulls": False,
    }


CONTAINERD_CONFIG: Final = """\
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{sandbox}"

[plugins.'io.containerd.cri.v1.runtime']
  # No AppArmor here; the machine's own oom_score_adj floor is kept.
  disable_apparmor = true
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni}"]
    conf_dir = "/etc/cni/net.d"
""".replace("{sandbox}", artifacts.PAUSE_IMAGE)

# containerd 1.6 (the legacy pairing): the same node in its version-2 format, at debug
# level, where its CRI plugin logs each container's OCI spec.
CONTAINERD_16_CONFIG: Final = """\
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[debug]
  level = "debug"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  # containerd 1.7's CDI switch, as an operator upgrading from 1.7 might leave it: 1.6
  # has no CDI code, and its config loader drops keys it does not know without a word.
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "/etc/cni/net.d"
""".replace("{sandbox}", artifacts.PAUSE_IMAGE)

CNI_CONFIG: Final = {
    "cniVersion": "1.0.0",
    "name": "realnode",
    "plugins": [
        {
            "type": "macvlan",
            "master": BRIDGE,
            "mode": "bridge",
            "ipam": {
                "type": "host-local",
                "ranges": [
                    [
                        {
                            "subnet": "10.88.0.0/16",
                            "rangeStart": "10.88.1.1",
                            "rangeEnd": "10.88.1.250",
                            "gateway": NODE_IP,
                        }
                    ]
                ],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }
    ],
}
