"""The device-plugin front end: everything the kubelet talks to, on the core.

``session`` is the kubelet session, one state machine fed by the events (``events``) on
one queue: it owns the plugins, the kubelet's state (serving, restarted, down), the
registration and start streaks and the judgement of a lost stream. ``plugin`` owns one
resource's socket and registration and assembles its parts: the device state the core
opened for it (``core.devicestate``), ``servicer`` (the gRPC service: ListAndWatch,
Allocate, GetPreferredAllocation) and ``allocate`` (preparing containers from a checked
snapshot: device nodes, RSD group, CDI annotation, through ``host``). ``services`` is
what every plugin of a daemon shares; ``preferred`` answers GetPreferredAllocation with
``topology``; ``cdi`` owns the annotation and stale-spec cleanup; ``watch`` notices a
kubelet restart. Allocate runs one way: servicer -> device state (validate) ->
allocator's first host calls -> device state (final check, snapshot) -> allocator ->
an outcome the servicer acts on. The servicer, the plugin and the watch hold the
session's queue, never the session or the scan loop.
"""
