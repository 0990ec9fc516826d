"""Everything the kubelet talks to: one DevicePlugin server per resource name.

``plugin`` serves the device-plugin API (registration, ListAndWatch); ``allocate``
prepares a container's devices (RSD group, device nodes, CDI annotation, through
``host``); ``preferred`` answers GetPreferredAllocation with ``topology``; ``cdi`` owns
the annotation and stale-spec cleanup; ``watch`` notices a kubelet restart.
"""
