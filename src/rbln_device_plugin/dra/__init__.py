"""The DRA front end: the same NPUs as ResourceClaims, served from the same core.

A kubelet plugin in the DRA sense: registered through the kubelet's plugin watcher
(``registration``), serving the DRAPlugin service v1 and v1beta1 (``service``), whose
NodePrepareResources reads each claim's allocation from the API server (``apiclaims``,
mapped by the pure ``claims``) and runs the final status check and the RSD sequence of
the core (``core.devicestate``, ``core.rsdgroups``) exactly as the device plugin's
Allocate does (``prepare``), writes one CDI spec per claim (``cdispec``, ``files``) and
remembers what it prepared across restarts (``checkpoint``). Names shared with
Rebellions' own DRA driver are in ``names``.
"""
