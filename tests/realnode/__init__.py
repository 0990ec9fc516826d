"""A real one-node Kubernetes cluster for the end-to-end tests (``make e2e``).

``artifacts`` builds what the node runs (pinned Go binaries, images), ``nodeinit`` is the
namespace's PID 1, ``cluster`` starts and drives the cluster, ``layouts`` is the
simulated node behind it, ``workloads`` installs the chart and runs consumer pods,
``fixtures`` is the pytest glue. ``python -m tests.realnode up`` starts one by hand.

For another test module (mark it ``pytest.mark.realnode``; the fixtures come from
``tests/conftest.py``):

- ``realnode``: a running ``Cluster`` for the module; ``realnode_plugin``: the same with
  the chart installed and serving.
- ``Cluster.install_chart(release, namespace, sets=[...], values={...})`` is ``helm
  upgrade --install`` with the simulated node's values plus yours (``--set`` strings, a
  values mapping); ``uninstall_chart``.
- ``Cluster.place_cdi_spec(name, spec, which="etc"|"run")`` and ``remove_cdi_spec`` change
  the node's ``/etc/cdi`` and ``/var/run/cdi``; the simulator's stand-in for the toolkit's
  spec (``rbln_device_plugin_sim.node.TOOLKIT_CDI_SPEC``, ``rbln.yaml``) is there from the
  start.
- ``Cluster.containerd_log()``, ``plugin_logs()``, ``pod_logs()``,
  ``container_log_files()`` (readable while the kubelet is down), ``component_log(name)``;
  ``kubectl(...)``, ``kubectl_json(...)``, ``apply(manifest)``, ``pod(name)``,
  ``wait_pod_phase``, ``describe``, ``allocatable()``, ``sim`` (the ``SimNode``).
- ``workloads.Consumer(cluster, name, {resource: count})`` starts a pod and parses what
  it saw (``devices``, ``env``); ``workloads.consumer(...)`` is its bare manifest.
"""
