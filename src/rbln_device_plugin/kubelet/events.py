"""What the kubelet session hears: one event type per thing that happened.

The session's producers (each resource plugin, its servicer, the kubelet.sock watch, and
the scan loop) are handed the session's queue and put these on it; none of them holds a
reference to the session or to the scan loop. A plugin is named by its resource and the
serial the session gave it, so an event from a plugin that was replaced since is known
as stale.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rbln_device_plugin.host.paths import FileIdentity
from rbln_device_plugin.model.inventory import Device


class RegistrationError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class PluginRef:
    """One plugin instance: a restart makes a new instance (a new serial) per resource."""

    resource: str
    serial: int


@dataclass(frozen=True, slots=True)
class StreamLost:
    """The kubelet's ListAndWatch stream of ``plugin`` ended (a restart, or lost alone)."""

    plugin: PluginRef


@dataclass(frozen=True, slots=True)
class StreamLossSettled:
    """The grace after ``StreamLost`` passed: now a restart would have shown itself."""

    plugin: PluginRef


@dataclass(frozen=True, slots=True)
class RegistrationEnded:
    """A registration attempt ended (``failure`` None: registered). The attempt waits
    for ``handled`` before the plugin may start another one."""

    plugin: PluginRef
    kubelet: FileIdentity | None  # the kubelet.sock the attempt talked to
    failure: RegistrationError | None
    handled: asyncio.Future[None] = field(compare=False)


@dataclass(frozen=True, slots=True)
class KubeletSocketRecreated:
    """The kubelet.sock watch saw a new socket: a kubelet restart."""


@dataclass(frozen=True, slots=True)
class RescanWanted:
    """Allocate found the node's devices changed since the last scan."""

    resource: str


@dataclass(frozen=True, slots=True)
class RestartDue:
    """The scan loop asks whether a kubelet restart waits to be acted on (the session
    looks at kubelet.sock first, unless ``look`` is false and the watch runs on inotify);
    ``done`` gets the answer."""

    done: asyncio.Future[bool] = field(compare=False)
    look: bool = True


@dataclass(frozen=True, slots=True)
class RestartNow:
    """The scan loop did its own part of a restart (the instance lock's check): every
    plugin stops and the transient CDI specs go; the next ``Reconcile`` starts them."""

    done: asyncio.Future[None] = field(compare=False)


@dataclass(frozen=True, slots=True)
class Reconcile:
    """The scan's answer: serve exactly ``offered`` (resource -> its devices), but for the
    device IDs ``withheld`` (held by DRA claims' pods, see ``runtime.otherholds``)."""

    offered: Mapping[str, Sequence[Device]]
    done: asyncio.Future[None] = field(compare=False)
    withheld: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class HandoverNews:
    """The other instance of this installation did something (see ``runtime.handover``):
    ``handed_over`` True once a successor serves (register nothing again), False once it
    is gone (register as usual); ``predecessor_leaving``: the previous instance began to
    leave (a stream it cuts is registered again at once); ``restart``: the successor is
    gone, so every plugin starts again and registers anew (a kubelet with one endpoint
    per resource may still point at the successor's)."""

    handed_over: bool | None = None
    predecessor_leaving: bool = False
    restart: bool = False


SessionEvent = (
    HandoverNews
    | StreamLost
    | StreamLossSettled
    | RegistrationEnded
    | KubeletSocketRecreated
    | RescanWanted
    | RestartDue
    | RestartNow
    | Reconcile
)
Events = asyncio.Queue[SessionEvent]
