"""The running process: lifecycle, the scan loop, one instance per node, the probes.

``daemon`` owns signals and the shutdown order; ``manager`` runs the scan loop and keeps
one ``kubelet.plugin.ResourcePlugin`` per advertised resource; ``instancelock`` makes a
second daemon wait; ``healthcheck`` serves the gRPC health service the chart probes;
``cdicheck`` says whether the runtimes can resolve the CDI device the answers name.
"""
