"""A real one-node Kubernetes cluster for the end-to-end tests (``make e2e``).

``artifacts`` builds what the node runs (pinned Go binaries, images), ``nodeinit`` is the
namespace's PID 1, ``cluster`` starts and drives the cluster, ``layouts`` is the
simulated node behind it. ``python -m tests.realnode up`` starts one by hand.
"""
