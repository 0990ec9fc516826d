"""The kubelet session: one state machine for everything between this daemon and the
kubelet, driven by the events on one queue.

State, all of it owned here and changed only by ``run``'s task, one event at a time:

- the kubelet: ``SERVING``; ``RESTARTED`` (a new kubelet.sock: every plugin starts
  again before anything registers); ``DOWN`` (its streams ended and its socket refuses
  connections: nothing registers until it serves again or a successor appears);
- one ``ResourcePlugin`` per offered resource (socket, registration, device state),
  each with a serial, so an event from a replaced instance is recognised as stale;
- per resource, the streaks of failed starts and failed registrations (said once per
  reason; see ``model.streaks``).

Producers put events and never wait for the session, except the scan loop, whose
``restart_due``, ``restart`` and ``reconcile`` wait until their event was handled (the
loop runs its own part of a restart, the instance lock's check, between the first two:
the session calls nothing above it). A lost stream is
judged after a grace (``STREAM_LOSS_GRACE_S``): a kubelet restart ends every stream
first, and its new socket shows up within it.

Nothing here waits for the kubelet: each registration is a task of its own with the
kubelet API's 10 s limit, so a kubelet that accepts ``Register`` and never answers
delays neither the other resources nor the scans.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Final, TypeVar

from rbln_device_plugin import aiotasks
from rbln_device_plugin.host.kubeletdir import KubeletDirectory
from rbln_device_plugin.kubelet import cdi
from rbln_device_plugin.kubelet.events import (
    Events,
    HandoverNews,
    KubeletSocketRecreated,
    PluginRef,
    Reconcile,
    RegistrationEnded,
    RescanWanted,
    RestartDue,
    RestartNow,
    SessionEvent,
    StreamLossSettled,
    StreamLost,
)
from rbln_device_plugin.kubelet.plugin import ResourcePlugin
from rbln_device_plugin.kubelet.plugins import DeviceStates, PluginSet
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.kubelet.watch import KubeletSocketWatch, kubelet_serving
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.model.looks import LookSchedule
from rbln_device_plugin.model.streaks import FailureStreak
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

# A kubelet restart also ends every stream. Wait this long for its new socket before
# treating an ended stream as lost on its own (and saying so).
STREAM_LOSS_GRACE_S: Final = 0.5
# After the other instance of this installation leaves or is gone: a kubelet with one
# endpoint per resource cuts this instance's streams with its own within this long, and
# such a stream is registered again at once (no restart to wait for).
OTHER_LEAVING_S: Final = 10.0

log = get_logger()


class Kubelet(enum.Enum):
    SERVING = "serving"
    RESTARTED = "restarted"  # a new kubelet.sock not acted on yet
    DOWN = "down"


T = TypeVar("T")


def _answer(done: asyncio.Future[T], value: T) -> None:
    if not done.done():  # a scan loop that stopped waiting cancelled it
        done.set_result(value)


class KubeletSession:
    def __init__(
        self,
        services: SharedServices,
        states: DeviceStates,
        wake_scan: asyncio.Event,
    ) -> None:
        config = services.config
        self._hostio = services.hostio
        self._metrics = services.metrics
        self._cdi_root = config.cdi_root
        self._wake_scan = wake_scan  # set: scan now, keep the schedule
        self.events: Events = asyncio.Queue()
        self.watch = KubeletSocketWatch(config.kubelet_dir, services.hostio)
        self._kubelet_dir = KubeletDirectory(config.kubelet_dir, services.hostio)
        self._plugins = PluginSet(services, states, self.events, self._kubelet_dir)
        self.kubelet = Kubelet.SERVING
        self._restarts_seen = 0
        self._registration_failures: dict[str, FailureStreak] = {}
        self._grace_timers: set[asyncio.TimerHandle] = set()
        # kubelet.sock's stat and the plugins' socket looks, per scan only while the
        # directory's watch is not live or reported a change (see ``model.looks``).
        self._socket_looks = LookSchedule(self.watch.state)
        self._plugin_looks = LookSchedule(self.watch.state)
        # A successor of this installation serves: nothing registers again (see
        # runtime.handover), so the kubelet keeps the successor's endpoints alone.
        self.handed_over = False
        self._other_leaving_until = 0.0
        self._reconciled = False
        # True while ``run`` waits for the next event: nothing is being handled.
        self._waiting = False
        # Set once every offered resource is registered (after the first reconcile).
        self.registered = asyncio.Event()

    # ----------------------------------------------------------------- the scan loop's
    async def begin(self) -> None:
        """Before the first scan: the kubelet.sock found now is no restart, and the
        transient CDI specs a previous instance left are removed."""
        await self.watch.prime()
        await self.clean_cdi()

    async def restart_due(self, *, look: bool = True) -> bool:
        """Whether a kubelet restart waits to be acted on (kubelet.sock looked at first).

        ``look=False``: no look of its own while the watch runs on inotify, which sees a
        new socket by itself (a scan's second question, right after rbln-smi ran). With
        ``look`` the watch is relied on likewise until it reports a change or the backup
        look is due (``model.looks``).

        Without a look due, and with the session handling nothing and nothing queued,
        the answer is given here: the event would be handled at once with the same
        answer, and its trip through the queue costs two turns of the loop a question.
        """
        if self._waiting and self.events.empty() and not self._socket_look_due(look):
            self._note_restarts()
            return self.kubelet is Kubelet.RESTARTED
        event = RestartDue(asyncio.get_running_loop().create_future(), look)
        self.events.put_nowait(event)
        return await event.done

    async def restart(self) -> None:
        """Act on a kubelet restart: every plugin stops; the next reconcile starts them."""
        event = RestartNow(asyncio.get_running_loop().create_future())
        self.events.put_nowait(event)
        await event.done

    async def reconcile(
        self, offered: Mapping[str, Sequence[Device]], withheld: frozenset[str] = frozenset()
    ) -> None:
        """Serve exactly ``offered``: start, update, stop and register plugins; the device
        IDs ``withheld`` stay out of what the kubelet is sent."""
        event = Reconcile(offered, asyncio.get_running_loop().create_future(), withheld)
        self.events.put_nowait(event)
        await event.done

    def handover(self, news: HandoverNews) -> None:
        """Tell the session what the other instance of this installation did."""
        self.events.put_nowait(news)

    @property
    def plugins(self) -> Mapping[str, ResourcePlugin]:
        return self._plugins.by_resource

    @property
    def open_streams(self) -> int:
        return self._plugins.open_streams

    # ----------------------------------------------------------------- the machine
    async def run(self, stop: asyncio.Event) -> None:
        """Handle events until ``stop``; the kubelet.sock watch runs beside it."""
        watcher = aiotasks.start(self.watch.run(stop, self.events), "kubelet-watch")
        try:
            while True:
                self._waiting = True
                event = await self.events.get()
                self._waiting = False
                await self._handle(event)
        finally:
            self._waiting = False
            await aiotasks.cancel_and_wait(watcher, title="kubelet session")

    async def _handle(self, event: SessionEvent) -> None:
        try:
            await self._dispatch(event)
        except Exception as exc:
            if isinstance(event, RestartDue | RestartNow | Reconcile):
                if not event.done.done():
                    event.done.set_exception(exc)  # the scan loop's own failure
            else:  # a bug must not end the session: the next event comes
                log.error("Kubelet session event failed", sessionEvent=repr(event), exc_info=True)
        finally:
            if isinstance(event, RegistrationEnded) and not event.handled.done():
                event.handled.set_result(None)

    async def _dispatch(self, event: SessionEvent) -> None:
        self._note_restarts()
        match event:
            case RestartDue(done=due, look=look):
                if self._socket_look_due(look):
                    self._socket_looks.looking(asyncio.get_running_loop().time())
                    await self._check_kubelet_socket()
                else:
                    self._note_restarts()
                _answer(due, self.kubelet is Kubelet.RESTARTED)
            case RestartNow(done=done):
                await self._restart()
                _answer(done, None)
            case Reconcile(offered=offered, done=done, withheld=withheld):
                await self._reconcile(offered, withheld)
                _answer(done, None)
            case RegistrationEnded():
                await self._registration_ended(event)
            case StreamLost(plugin=ref):
                self._after_grace(ref)
            case StreamLossSettled(plugin=ref):
                await self._stream_loss_settled(ref)
            case RescanWanted():
                self._wake_scan.set()
            case KubeletSocketRecreated():
                pass  # counted by _note_restarts, like a restart any check found
            case HandoverNews(handed_over=handed_over, predecessor_leaving=leaving, restart=again):
                if leaving or again:
                    loop = asyncio.get_running_loop()
                    self._other_leaving_until = loop.time() + OTHER_LEAVING_S
                if handed_over is not None:
                    self.handed_over = handed_over
                    if not handed_over:
                        if again:
                            await self.stop_plugins()
                        self._wake_scan.set()  # register whatever is not registered

    def _socket_look_due(self, look: bool) -> bool:
        """Whether a scan's question looks at kubelet.sock itself (see ``restart_due``)."""
        if self.watch.mode != "inotify":
            return True
        return look and self._socket_looks.due(asyncio.get_running_loop().time())

    def _note_restarts(self) -> None:
        """Every new kubelet.sock any check found (the watch's, a scan's, a judgement's):
        the scan loop restarts the plugins, in one go."""
        while self._restarts_seen < self.watch.restarts:
            self._restarts_seen += 1
            self.kubelet = Kubelet.RESTARTED
            self._metrics.kubelet_restart()
            self._wake_scan.set()

    async def _check_kubelet_socket(self) -> None:
        await self.watch.check()
        self._note_restarts()

    # ----------------------------------------------------------------- restarts
    async def _restart(self) -> None:
        if self.kubelet is Kubelet.RESTARTED:
            self.kubelet = Kubelet.SERVING
            await self.stop_plugins()
            await self.clean_cdi()

    async def clean_cdi(self) -> None:
        root = self._cdi_root
        await self._hostio.call(str(root), partial(cdi.remove_transient_specs, root))

    # ----------------------------------------------------------------- reconciling
    async def _reconcile(
        self, offered: Mapping[str, Sequence[Device]], withheld: frozenset[str]
    ) -> None:
        if self.kubelet is Kubelet.DOWN and await self._kubelet_serving():
            self.kubelet = Kubelet.SERVING  # serving again on the same socket: register
        for resource in await self._plugins.stop_absent(offered):
            self._registration_failures.pop(resource, None)
        # New plugin sockets go into the kubelet's directory, which only the kubelet makes:
        # looked at once a plugin is to start (an idle scan starts none, and looks not).
        can_start = _Once(self._kubelet_dir.present)
        now = asyncio.get_running_loop().time()
        look = self._plugin_looks.due(now)
        if look:
            self._plugin_looks.looking(now)
        for resource in sorted(offered):
            try:
                await self._sync_plugin(resource, offered[resource], can_start, look, withheld)
            except Exception as exc:  # one resource's trouble must not cost the others
                log.error(
                    "Cannot update device plugin; retrying next scan",
                    resourceName=resource, err=exc, exc_info=True,
                )  # fmt: skip
        self._reconciled = True
        self._note_registered()

    def _note_registered(self) -> None:
        if self._reconciled and all(plugin.registered for plugin in self._plugins):
            self.registered.set()

    async def _sync_plugin(
        self, resource: str, devices: Sequence[Device], can_start: _Once, look: bool,
        withheld: frozenset[str],
    ) -> None:  # fmt: skip
        plugin = self._plugins.get(resource)
        if plugin is not None and look and not await plugin.socket_intact():
            # With the kubelet down this is its successor cleaning the directory.
            emit = log.debug if self.kubelet is Kubelet.DOWN else log.warning
            emit(
                "Device plugin socket was removed; restarting the plugin",
                resourceName=resource, socketPath=str(plugin.socket_path),
            )  # fmt: skip
            await self._plugins.stop(resource)
            plugin = None
        if plugin is None:
            if not await can_start():
                return
            plugin = await self._plugins.start(resource)
            if plugin is None:
                return
        await plugin.state.withhold(withheld)  # before the update: never sent at all
        await plugin.update(devices)
        if self.kubelet is not Kubelet.DOWN and not self.handed_over:
            plugin.register_in_background(self.watch.identity)  # the kubelet it talks to

    # ----------------------------------------------------------------- registration
    async def _registration_ended(self, event: RegistrationEnded) -> None:
        resource, failure = event.plugin.resource, event.failure
        streak = self._registration_failures.setdefault(resource, FailureStreak())
        plugin = self._plugins.current(event.plugin)
        if failure is None:
            self._metrics.registration(resource, m.OK)
            if plugin is not None:
                plugin.announce(failed_attempts=streak.succeeded())
            self._note_registered()
            return
        self._metrics.registration(resource, m.REGISTRATION_FAILED)
        if await self._registration_overtaken(event):
            # A kubelet that restarts cleans its directory, our socket with it, and its
            # call back to us fails: the restart's own records say what happens next.
            # Still a failed attempt, as the registration metric counts it.
            streak.failed_quietly()
            log.debug(
                "Device plugin registration overtaken by a kubelet restart or a removed socket",
                resourceName=resource, err=failure, failedAttempts=streak.failures,
            )  # fmt: skip
            return
        # A kubelet that is not there fails every scan: say it once per reason.
        emit = log.error if streak.failed(str(failure)) else log.debug
        emit(
            "Device plugin registration failed; retrying next scan",
            resourceName=resource, err=failure, failedAttempts=streak.failures,
        )  # fmt: skip

    async def _registration_overtaken(self, event: RegistrationEnded) -> bool:
        """True when the kubelet the attempt talked to went away or restarted under it,
        or the plugin's socket is gone: each is said on its own and starts it again."""
        if await self._superseded(event.plugin) or self.kubelet is Kubelet.DOWN:
            return True
        if event.kubelet is not None and self.watch.identity != event.kubelet:
            return True
        plugin = self._plugins.current(event.plugin)  # not superseded: still this one
        return plugin is None or not await plugin.socket_intact()

    async def _superseded(self, ref: PluginRef) -> bool:
        """Looks at kubelet.sock first: True when a kubelet restart is pending or under
        way, or ``ref`` is no longer the resource's plugin (either starts it again)."""
        await self._check_kubelet_socket()
        return self.kubelet is Kubelet.RESTARTED or self._plugins.current(ref) is None

    # ----------------------------------------------------------------- lost streams
    def _after_grace(self, ref: PluginRef) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() < self._other_leaving_until:
            # The kubelet cut this stream with the other instance's (see
            # OTHER_LEAVING_S): no restart to wait for.
            self.events.put_nowait(StreamLossSettled(ref))
            return

        def settle() -> None:
            self._grace_timers.discard(timer)
            self.events.put_nowait(StreamLossSettled(ref))

        timer = loop.call_later(STREAM_LOSS_GRACE_S, settle)
        self._grace_timers.add(timer)

    async def _stream_loss_settled(self, ref: PluginRef) -> None:
        if await self._superseded(ref):
            return  # a kubelet restart: every plugin starts again, nothing was lost
        plugin = self._plugins.current(ref)
        if plugin is not None:  # not superseded: still this one
            plugin.registration_lost()
        if not await self._kubelet_serving():
            if self.kubelet is not Kubelet.DOWN:  # once per outage, whatever the streams
                self.kubelet = Kubelet.DOWN
                log.info(
                    "Kubelet is not serving; waiting for it to start again",
                    kubeletSocket=str(self.watch.socket_path),
                )
            return
        if self.handed_over:
            log.debug("ListAndWatch stream ended; a successor serves, so it stays unregistered",
                      resourceName=ref.resource)  # fmt: skip
            return
        # The kubelet never reopens a stream on its own: register again.
        loop = asyncio.get_running_loop()
        if plugin is not None and loop.time() < self._other_leaving_until:
            log.debug("ListAndWatch stream ended with the other instance's; registering "
                      "again", resourceName=ref.resource)  # fmt: skip
            plugin.register_in_background(self.watch.identity)
            return
        log.warning("ListAndWatch stream ended; registering again", resourceName=ref.resource)
        self._wake_scan.set()

    async def _kubelet_serving(self) -> bool:
        path = self.watch.socket_path
        serving = await self._hostio.call(str(path), partial(kubelet_serving, path))
        return serving is not False  # a stalled probe: assume serving, registration says

    # ----------------------------------------------------------------- stopping
    async def stop_plugins(self) -> None:
        """Stop every plugin, all at once, and forget the pending stream-loss judgements."""
        for timer in self._grace_timers:
            timer.cancel()
        self._grace_timers.clear()
        await self._plugins.stop_all()


class _Once:
    """A look taken at most once, on first need; its answer kept."""

    __slots__ = ("_answer", "_look")

    def __init__(self, look: Callable[[], Awaitable[bool]]) -> None:
        self._look: Callable[[], Awaitable[bool]] | None = look
        self._answer = False

    async def __call__(self) -> bool:
        if self._look is not None:
            look, self._look = self._look, None
            self._answer = await look()
        return self._answer
