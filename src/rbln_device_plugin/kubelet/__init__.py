"""Everything the kubelet talks to: one DevicePlugin server per resource name.

``plugin`` owns one resource's socket and registration and assembles its parts:
``devicestate`` (the device table, health history, observe lock, Allocate's final check
and the change records), ``servicer`` (the gRPC service: ListAndWatch, Allocate,
GetPreferredAllocation) and ``allocate`` (request validation; preparing containers from
a checked snapshot: device nodes, RSD group, CDI annotation, through ``host``).
``services`` is what every plugin of a daemon shares; ``preferred`` answers
GetPreferredAllocation with ``topology``; ``cdi`` owns the annotation and stale-spec
cleanup; ``watch`` notices a kubelet restart. Allocate runs one way: servicer -> device
state (validate, final check, snapshot) -> allocator -> an outcome the servicer acts on.
"""
