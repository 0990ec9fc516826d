"""The core: scan -> inventory -> per-resource device state, for any front end.

``devices.NodeDevices`` runs each scan's discovery (through ``host.scan``) and keeps one
health history per offered resource; ``devices.Discovery`` is a scan's answer (what each
resource offers now). ``devicestate.DeviceState`` is one resource's devices as one front
end serves them: the table and its health verdicts, the observe lock, the published
view (``wait_for_view``), request validation (``validate``) and the final status check
that gives an allocation snapshot (``final_check``). ``requests`` holds the pure
validation and ``AllocationError``.

A front end (the device plugin in ``kubelet/``; DRA later) opens a state per resource
with ``NodeDevices.open_state``, feeds it each scan's devices with ``update``, streams
its view, and allocates through ``validate`` and ``final_check``. Nothing here imports
a front end or the runtime.
"""
