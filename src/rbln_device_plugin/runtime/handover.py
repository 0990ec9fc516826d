"""Hand-over between two instances of one installation: a surge successor takes over
from the running instance while both are registered with the kubelet.

Who may take over: an instance started with the same ``--installation`` as the holder
of the instance lock (the chart passes its namespace and DaemonSet name). Any other
instance, and every instance without an installation, waits for the lock as before: two
installations never serve one node together.

How (``model.handover`` has the messages):

1. The holder listens on ``<dir of --rsd-lock-path>/rbln-device-plugin.handover.sock``.
2. A successor finds the instance lock held and connects. The holder checks the peer's
   user and installation and answers with its instance-lock descriptors. A flock belongs
   to the open file, so from this moment the lock is held while either process lives:
   nothing else can take it between the two, whichever of them is killed when.
3. The successor serves on plugin sockets of its own (their names carry its token; an
   instance that took the lock from a free file keeps the fixed names), and the kubelet
   keeps both endpoints (1.37) and sends Allocate to the newest. Once every resource is
   registered, the successor's readiness says so (the ``registered`` health service)
   and it tells the holder ``serving``; the holder then registers nothing again (a
   kubelet restart leaves only the successor registered).
4. On its stop signal the holder says ``leaving``, refuses every Allocate from then on
   (UNAVAILABLE), stops its servers and removes its sockets, and exits; the kubelet
   keeps the successor's endpoint. A kubelet with one endpoint per resource (1.34)
   cuts the successor's stream with the holder's: told ``leaving``, the successor
   registers again at once instead of after the usual grace.

Each side keeps the connection open for as long as it lives; its end means the other
process is gone, however it ended. The survivor then removes the other's plugin sockets
(by its token: a kill -9 leaves them), the holder listens for a successor again, and a
successor becomes the holder and starts listening. A holder that takes the lock from a
free file (no instance alive) removes every instance's leftover sockets first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Final

from rbln_device_plugin import aiotasks
from rbln_device_plugin.config import HANDOVER_SOCKET_NAME, Config
from rbln_device_plugin.host import handoversock, pluginsocket
from rbln_device_plugin.host.handoversock import HandoverSocketError, LineReader
from rbln_device_plugin.host.hostio import HostIO, Stalled
from rbln_device_plugin.model import handover as proto
from rbln_device_plugin.model.resources import INSTANCE_TOKEN_LEN
from rbln_device_plugin.runtime.instancelock import InstanceLock
from rbln_device_plugin.telemetry.logs import get_logger

HELLO_TIMEOUT_S: Final = 2.0
TOOK_OVER_MSG: Final = "Took over from the previous instance of this installation"
HANDED_OVER_MSG: Final = "Handed over to the next instance of this installation"

log = get_logger()


async def _nothing() -> None:
    pass


async def _served_nothing(_: bool) -> None:
    pass


@dataclass(frozen=True, slots=True)
class HandoverHooks:
    """What the daemon does when the other instance does something."""

    successor_serving: Callable[[], Awaitable[None]] = _nothing
    # True when the successor had served (every resource registered) before it went.
    successor_gone: Callable[[bool], Awaitable[None]] = _served_nothing
    predecessor_leaving: Callable[[], Awaitable[None]] = _nothing
    predecessor_gone: Callable[[], Awaitable[None]] = _nothing


@dataclass(slots=True)
class _Link:
    """The connection to the other instance while both live."""

    sock: socket.socket
    reader: LineReader
    pid: int
    token: str
    successor: bool  # the other one is the successor (we are the holder)
    began: float = field(default_factory=time.monotonic)
    serving_since: float | None = None  # when the successor had every resource registered

    def close(self) -> None:
        self.reader.close_fds()
        self.sock.close()


class Handover:
    def __init__(self, config: Config, token: str, hostio: HostIO, lock: InstanceLock) -> None:
        self.installation = config.installation
        self.token = token
        self.path: Path = config.rsd_lock_path.parent / HANDOVER_SOCKET_NAME
        self._kubelet_dir = config.kubelet_dir
        self._hostio = hostio
        self._lock = lock
        # The connection to the other instance while both live; set through _set_link.
        self._link: _Link | None = None
        self._refusal_said: str | None = None
        self._hooks = HandoverHooks()
        self._changed = asyncio.Event()  # the link came or went: the run loop looks again
        self._registered_at: float | None = None
        self.leaving = False

    def _set_link(self, link: _Link | None) -> None:
        self._link = link
        # The instance lock tells the other instance's re-lock of a file from a loss.
        self._lock.partner_pid = link.pid if link is not None else None

    # ----------------------------------------------------------------- the successor
    async def take_over(self) -> list[int | None] | None:
        """Ask the holder for its lock (``InstanceLock.acquire``'s ``take_over``): its
        descriptors, or None when nobody answers or the holder refuses."""
        self.close()  # an earlier answer whose descriptors were no longer the files
        sock = await handoversock.connect(self.path, HELLO_TIMEOUT_S)
        if sock is None:
            return None  # no holder that hands over (another installation, an older one)
        reader = LineReader(sock, proto.MAX_LINE)
        try:
            if not handoversock.same_user(sock):
                raise HandoverSocketError("the holder runs as another user")
            hello = proto.Hello(self.installation, os.getpid(), self.token)
            handoversock.send(sock, proto.encode(hello))
            line = await asyncio.wait_for(reader.line(), HELLO_TIMEOUT_S)
            answer = proto.decode(line) if line is not None else proto.Refuse("no answer")
        except (HandoverSocketError, proto.ProtocolError, OSError, TimeoutError) as exc:
            answer = proto.Refuse(f"the hand-over failed: {exc}")
        if not isinstance(answer, proto.Accept):
            reason = answer.reason if isinstance(answer, proto.Refuse) else "an unexpected answer"
            if reason != self._refusal_said:
                self._refusal_said = reason
                log.info("Hand-over refused; waiting for the instance lock", reason=reason)
            reader.close_fds()
            sock.close()
            return None
        fds: list[int | None] = []
        received = iter(reader.take_fds())
        for attached in answer.locks:
            fds.append(next(received, None) if attached else None)
        for extra in received:
            os.close(extra)
        while self.token == answer.token:  # short tokens: never the holder's names
            self.token = new_token()
        self._set_link(_Link(sock, reader, answer.pid, answer.token, successor=False))
        log.debug("Taking over from the running instance", predecessorPid=answer.pid)
        return fds

    @property
    def socket_token(self) -> str:
        """The token in this instance's socket names: its own once it took over from a
        running instance, else none (the fixed names, as without an installation)."""
        return self.token if self._lock.taken_over else ""

    async def registered(self) -> None:
        """Every resource is registered with the kubelet: a predecessor hears ``serving``."""
        if self._registered_at is None:
            self._registered_at = time.monotonic()
        link = self._link
        if link is not None and not link.successor:
            with contextlib.suppress(OSError, HandoverSocketError):
                handoversock.send(link.sock, proto.encode(proto.Serving()))

    # ----------------------------------------------------------------- both
    async def run(self, stop: asyncio.Event, hooks: HandoverHooks) -> None:
        """Listen for successors (while holding) and follow the link, until ``stop``."""
        self._hooks = hooks
        listener: asyncio.Task[None] | None = None
        try:
            while not stop.is_set():
                if self._link is not None:
                    await self._follow(self._link)
                    continue
                if listener is None:
                    # Sole holder now: the ones before left their sockets if they were
                    # killed, and their names carry tokens no instance uses any more.
                    await self._remove_sockets(None)
                    listener = aiotasks.start(self._listen(stop), "handover-listen")
                self._changed.clear()
                await self._changed.wait()
        finally:
            if listener is not None:
                await aiotasks.cancel_and_wait(listener, title="hand-over")

    async def _follow(self, link: _Link) -> None:
        """Read the other instance's messages until its end (its process is gone)."""
        while True:
            try:
                line = await link.reader.line()
                message = proto.decode(line) if line is not None else None
            except (HandoverSocketError, proto.ProtocolError) as exc:
                log.warning("Hand-over link broken; the other instance is taken as gone",
                            otherPid=link.pid, err=str(exc))  # fmt: skip
                message = None
            if message is None:
                break
            if isinstance(message, proto.Serving) and link.successor:
                link.serving_since = time.monotonic()
                log.debug("The successor serves", successorPid=link.pid)
                await self._hooks.successor_serving()
            elif isinstance(message, proto.Leaving) and not link.successor:
                log.debug("The previous instance is leaving", predecessorPid=link.pid)
                await self._hooks.predecessor_leaving()
        self._set_link(None)
        link.close()
        removed = await self._remove_sockets(link.token)
        if link.successor:
            log.info("The successor ended before this instance stopped; serving on",
                     successorPid=link.pid, successorServed=link.serving_since is not None,
                     removedSockets=removed)  # fmt: skip
            await self._hooks.successor_gone(link.serving_since is not None)
        else:
            both = 0.0
            if self._registered_at is not None:
                both = time.monotonic() - max(self._registered_at, link.began)
            log.info(
                TOOK_OVER_MSG, predecessorPid=link.pid, installation=self.installation,
                bothRegisteredSeconds=round(both, 3), removedSockets=removed,
            )  # fmt: skip
            await self._hooks.predecessor_gone()

    async def _listen(self, stop: asyncio.Event) -> None:
        bound = await self._hostio.call(str(self.path), partial(handoversock.listen, self.path))
        if isinstance(bound, (Stalled, HandoverSocketError)):
            log.error("Cannot listen for a successor; an upgrade waits for this instance to exit",
                      socketPath=str(self.path), err=str(bound))  # fmt: skip
            return
        listener, identity = bound
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                conn, _ = await loop.sock_accept(listener)
                conn.setblocking(False)
                await self._answer(conn)
        finally:
            listener.close()
            await self._hostio.call(str(self.path), partial(handoversock.remove, self.path,
                                                            identity))  # fmt: skip

    async def _answer(self, conn: socket.socket) -> None:
        """One successor's hello, answered within the bound; the link kept on accept."""
        reader = LineReader(conn, proto.MAX_LINE)
        keep = False
        try:
            if not handoversock.same_user(conn):
                return
            line = await asyncio.wait_for(reader.line(), HELLO_TIMEOUT_S)
            hello = proto.decode(line) if line is not None else None
            if not isinstance(hello, proto.Hello):
                return
            refusal = proto.answer(
                self.installation, hello, busy=self._link is not None or self.leaving
            )
            if refusal is not None:
                log.debug("Refused a hand-over", otherPid=hello.pid, reason=refusal.reason)
                handoversock.send(conn, proto.encode(refusal))
                return
            held = self._lock.held_fds()
            attached = [fd for fd in held if fd is not None]
            locks = tuple(fd is not None for fd in held)
            accept = proto.Accept(os.getpid(), self.socket_token, locks)
            handoversock.send(conn, proto.encode(accept), attached)
            self._set_link(_Link(conn, reader, hello.pid, hello.token, successor=True))
            keep = True
            log.debug("Handing over to a successor", successorPid=hello.pid)
            self._changed.set()
        except (HandoverSocketError, proto.ProtocolError, OSError, TimeoutError) as exc:
            log.debug("Hand-over request failed", err=str(exc))
        finally:
            if not keep:
                reader.close_fds()
                conn.close()

    async def _remove_sockets(self, token: str | None) -> list[str]:
        directory = self._kubelet_dir
        removal = partial(pluginsocket.remove_instance_sockets, directory, token, self.socket_token)
        removed = await self._hostio.call(str(directory), removal)
        if isinstance(removed, Stalled):
            return []
        if token is None and removed:
            log.info("Removed plugin sockets left by earlier instances", sockets=removed)
        return removed

    # ----------------------------------------------------------------- the holder
    async def step_down(self) -> None:
        """The stop began: a successor hears ``leaving`` (it registers again at once if
        the kubelet cuts its stream with ours) and nobody new is handed the lock."""
        self.leaving = True
        link = self._link
        if link is not None and link.successor:
            with contextlib.suppress(OSError, HandoverSocketError):
                handoversock.send(link.sock, proto.encode(proto.Leaving()))

    def stepped_down(self) -> None:
        """The servers stopped and the sockets are gone: the holder's record."""
        link = self._link
        if link is None or not link.successor:
            return
        both = time.monotonic() - link.serving_since if link.serving_since is not None else 0.0
        log.info(
            HANDED_OVER_MSG, successorPid=link.pid, installation=self.installation,
            successorRegistered=link.serving_since is not None,
            bothRegisteredSeconds=round(both, 3),
        )  # fmt: skip

    def close(self) -> None:
        if self._link is not None:
            self._link.close()
            self._set_link(None)


def new_token() -> str:
    return os.urandom(INSTANCE_TOKEN_LEN).hex()[:INSTANCE_TOKEN_LEN]
