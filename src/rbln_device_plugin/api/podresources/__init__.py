"""The kubelet's PodResources API (generated ``v1`` stubs), vendored from ``k8s.io/kubelet``'s
``pkg/apis/podresources``: which devices the node's running pods hold, through the
device-plugin API and through DRA claims (read by ``kubelet.podresources``)."""
