"""The node's ResourceSlices kept on the API server (thin I/O around ``dra.slices``).

``SlicePublisher.publish`` is called after every scan with the offered devices. It
builds the pool (pure) and compares it with what it last wrote: equal means no request
at all, so an idle node costs the API server nothing. A change is written as a new pool
generation: every wanted slice created or replaced, then every other slice of this
driver and node deleted, so the server holds exactly the wanted ones.

The first publish (and the first after a failure or ``forget``) reads the Node's UID
(each slice is owned by its Node, so it goes with it) and lists the node's slices by
``spec.nodeName`` and ``spec.driver``, as the kubelet selects them: when they already
say exactly what is wanted (a restart on an unchanged node), they are kept as they are;
otherwise the new generation is above every one found, so a restart never goes back.

Because an unchanged publish sends nothing, a change made behind the publisher's back
would last: the kubelet deletes every slice of its node when it starts, and a driver's
30 s after its plugin deregistered. ``watch`` follows the node's slices of the driver and,
when one of them is deleted or changed by anyone else (a resource version this publisher
did not write), forgets what it wrote and wakes the scan loop, whose next publish lists
the server and repairs it.

The only verbs used are the ones the chart's RBAC grants: resourceslices get, list,
watch, create, update, delete; nodes get. Failures (no answer, refused, 403, 409 twice) are
logged once per reason and retried at the next publish; nothing is raised to the scan.
lightkube is imported only here and only when used: the device-plugin mode never loads it.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from rbln_device_plugin.dra import slices, taints
from rbln_device_plugin.dra.names import DRIVER_NAME
from rbln_device_plugin.model.devicetable import Entry
from rbln_device_plugin.model.streaks import FailureStreak
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()

# One publish, all its requests together (lightkube's own per-request timeout is 10 s):
# a hung API server delays the caller's next scan by at most this.
PUBLISH_TIMEOUT_S: Final = 30.0
VERBS: Final = ("create", "update", "delete")

PUBLISHED_MSG: Final = "Published ResourceSlices"
CURRENT_MSG: Final = "ResourceSlices on the API server are current"
FAILED_MSG: Final = "Cannot publish ResourceSlices; retrying next scan"
DEVICE_LEFT_OUT_MSG: Final = "Device left out of the ResourceSlices"
ATTRIBUTE_LEFT_OUT_MSG: Final = "Device attribute left out of the ResourceSlices"
REMOVED_MSG: Final = "Removed the node's ResourceSlices"
REMOVE_FAILED_MSG: Final = "Cannot remove the node's ResourceSlices"
CHANGED_ELSEWHERE_MSG: Final = "ResourceSlices changed on the API server; publishing again"
WATCH_FAILED_MSG: Final = "Cannot watch the node's ResourceSlices; retrying"
# A broken watch is opened again after this, doubling up to the cap.
WATCH_RETRY_S: Final = 1.0
# Own writes remembered for their late watch events: several publishes of every slice of
# the largest pool (a device per slice at most 64 with taints: 128 devices, 2 slices).
_ECHOES: Final = 64
WATCH_RETRY_CAP_S: Final = 30.0


def describe_failure(exc: BaseException) -> str:
    """A failed request in one line: the server's answer, or why there was none."""
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        status = exc.status
        return f"{status.code} {status.reason}: {status.message}"
    if isinstance(exc, TimeoutError):
        return f"no answer within {PUBLISH_TIMEOUT_S:g} s"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _status_code(exc: BaseException) -> int | None:
    from lightkube import ApiError

    return exc.status.code if isinstance(exc, ApiError) else None


def _same_entries(
    entries: Mapping[str, Mapping[str, Entry]], last: Mapping[str, Mapping[str, Entry]]
) -> bool:
    if entries.keys() != last.keys():
        return False
    return all(entries[r] == last[r] for r in entries)


class SlicePublisher:
    """Keeps this node's pool of the driver on the API server (see the module's doc).

    ``writes`` counts successful writes by verb, ``failures`` failed publishes and
    removals; ``generation`` is the pool generation the server holds (0: none yet).
    """

    def __init__(
        self,
        client: Any,
        node: str,
        metrics: m.Metrics = m.NOOP,
        *,
        taint_effect: str = taints.NO_SCHEDULE,
        taint_times: taints.TaintTimes | None = None,
    ) -> None:
        if not slices.is_dns_subdomain(node):
            raise ValueError(f"node name {node[:80]!r} is not a DNS subdomain")
        self.taint_effect = taint_effect
        self._times = taint_times or taints.TaintTimes()
        self._taints = taints.TaintLedger(node, metrics)
        self._client = client  # a lightkube AsyncClient
        self.node = node
        self.generation = 0
        self.writes: dict[str, int] = dict.fromkeys(VERBS, 0)
        self._metrics = metrics
        self.failures = 0
        self._lock = asyncio.Lock()
        self._owner: dict[str, Any] | None = None
        # The pool the server holds as last written; with ``_versions`` (our slices on the
        # server: name -> resourceVersion) None, the server's state is not known.
        self._written: slices.Pool | None = None
        self._versions: dict[str, str] | None = None
        # The resource versions of this publisher's latest writes: their watch events may
        # arrive after a later write of the same slice and are not news (resource versions
        # are unique across the API server).
        self._echoes: collections.deque[str] = collections.deque(maxlen=_ECHOES)
        self._streak = FailureStreak()
        self._omitted: frozenset[str] = frozenset()
        self._built: tuple[dict[str, dict[str, Entry]], dict[str, str], slices.Pool] | None = None

    @classmethod
    def from_kubeconfig(cls, path: Path | None, node: str) -> SlicePublisher:
        """A publisher with a client from this kubeconfig, or the pod's service account."""
        from lightkube import AsyncClient, KubeConfig

        config = KubeConfig.from_file(path) if path else KubeConfig.from_service_account()
        return cls(AsyncClient(config), node)

    def forget(self) -> None:
        """The server may have changed behind this publisher's back (the kubelet wipes a
        plugin's slices when it deregisters): the next publish looks and repairs."""
        self._versions = None

    def _pool(self, entries: Mapping[str, Mapping[str, Entry]]) -> slices.Pool:
        """The pool for ``entries``, its taints stamped with their kept times."""
        times = self._times.stamp(slices.tainted(entries))
        # The same entries and times as last time build the same pool: comparing them
        # (frozen dataclasses) costs a fraction of building it.
        built = self._built
        if built is not None and built[1] == times and _same_entries(entries, built[0]):
            return built[2]
        pool = slices.build_pool(self.node, entries, self.taint_effect, times)
        self._built = ({r: dict(m) for r, m in entries.items()}, times, pool)
        self._log_omissions(pool.omissions)
        return pool

    async def publish(self, entries: Mapping[str, Mapping[str, Entry]]) -> None:
        pool = self._pool(entries)
        async with self._lock:
            written = self._written if self._versions is not None else None
            if written is not None and pool.slices == written.slices:
                return
            started = time.monotonic()
            try:
                async with asyncio.timeout(PUBLISH_TIMEOUT_S):
                    done = await self._sync(pool, entries)
            except Exception as exc:  # never into the scan loop; logged
                self._versions = None
                self._taints.forget()
                self.failures += 1
                reason = describe_failure(exc)
                say = log.error if self._streak.failed(reason) else log.debug
                say(FAILED_MSG, node=self.node, err=reason, failedAttempts=self._streak.failures)
                return
        failed_before = self._streak.succeeded()
        extra = {"failedAttempts": failed_before} if failed_before else {}
        if done is None:
            self._taints.holds(pool.taints())
            log.info(
                CURRENT_MSG,
                node=self.node,
                generation=self.generation,
                sliceCount=len(pool.slices),
                deviceCount=pool.device_count,
                **extra,
            )
            return
        self._taints.holds(pool.taints())
        log.info(
            PUBLISHED_MSG,
            node=self.node,
            generation=self.generation,
            sliceCount=len(pool.slices),
            deviceCount=pool.device_count,
            created=done["create"],
            updated=done["update"],
            deleted=done["delete"],
            durationMs=round((time.monotonic() - started) * 1000, 1),
            **extra,
        )

    async def remove_all(self) -> bool:
        """Delete every slice of this driver and node; False (logged) when that failed."""
        async with self._lock:
            self._versions, self._written = None, None
            self._taints.forget()
            try:
                async with asyncio.timeout(PUBLISH_TIMEOUT_S):
                    names = sorted(await self._list())
                    for name in names:
                        await self._delete(name)
            except Exception as exc:  # a cleanup path: logged, never raised
                self.failures += 1
                log.error(REMOVE_FAILED_MSG, node=self.node, err=describe_failure(exc))
                return False
        log.info(REMOVED_MSG, node=self.node, count=len(names))
        return True

    async def close(self) -> None:
        await self._client.close()

    # ----------------------------------------------------------------- the watch
    async def watch(self, stop: asyncio.Event, changed: Callable[[], None]) -> None:
        """Until ``stop``: call ``changed`` (after ``forget``) whenever the server's slices
        of this driver and node are no longer the ones this publisher wrote.

        List, then watch from the list's resource version (as an informer does): what
        changed while no watch was open is seen in the list, nothing after it is missed.
        A broken watch starts again with a list, after a pause that grows to 30 s."""
        streak = FailureStreak()
        delay = WATCH_RETRY_S
        while not stop.is_set():
            try:
                version = await self._list_and_compare(changed)
                if streak.succeeded():
                    delay = WATCH_RETRY_S
                async for kind, found in self._events(version):
                    if await self._changed_elsewhere(kind, found):
                        log.info(
                            CHANGED_ELSEWHERE_MSG, node=self.node, change=kind,
                            slice=found.metadata.name,
                        )  # fmt: skip
                        changed()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server went away, or refused: again later
                reason = describe_failure(exc)
                say = log.warning if streak.failed(reason) else log.debug
                say(WATCH_FAILED_MSG, node=self.node, err=reason, retryInSeconds=delay)
            try:
                async with asyncio.timeout(delay):
                    await stop.wait()
            except TimeoutError:
                pass
            delay = min(delay * 2, WATCH_RETRY_CAP_S)

    async def _list_and_compare(self, changed: Callable[[], None]) -> str:
        """The server's slices now against what was written; the list's resource version."""
        from lightkube.resources.resource_v1 import ResourceSlice

        fields = {"spec.nodeName": self.node, "spec.driver": DRIVER_NAME}
        async with self._lock:
            listing = self._client.list(ResourceSlice, fields=fields)
            found = {s.metadata.name: s.metadata.resourceVersion async for s in listing}
            if self._versions is not None and found != self._versions:
                differ = sorted(
                    name
                    for name in set(found) | set(self._versions)
                    if found.get(name) != self._versions.get(name)
                )
                self.forget()
                log.info(CHANGED_ELSEWHERE_MSG, node=self.node, change="LISTED", slice=differ)
                changed()
            return str(listing.resourceVersion)

    def _events(self, version: str) -> Any:
        from lightkube.resources.resource_v1 import ResourceSlice

        fields = {"spec.nodeName": self.node, "spec.driver": DRIVER_NAME}
        return self._client.watch(ResourceSlice, fields=fields, resource_version=version)

    async def _changed_elsewhere(self, kind: str, found: Any) -> bool:
        """Whether this event is news this publisher did not make. Judged under the
        publish lock, so a publish's own writes are recorded before their events."""
        name, version = found.metadata.name, found.metadata.resourceVersion
        async with self._lock:
            if self._versions is None:
                return False  # the next publish lists the server anyway
            if kind == "DELETED":
                news = name in self._versions
            else:
                news = self._versions.get(name) != version and version not in self._echoes
            if news:
                self.forget()
            return news

    def _log_omissions(self, omissions: tuple[slices.Omission, ...]) -> None:
        """Each thing left out once while it lasts; again if it comes back later."""
        keys = frozenset(o.key for o in omissions)
        for omission in omissions:
            if omission.key in self._omitted:
                continue
            if omission.attribute:
                log.warning(ATTRIBUTE_LEFT_OUT_MSG, device=omission.device,
                            attribute=omission.attribute, reason=omission.reason)  # fmt: skip
            else:
                log.error(DEVICE_LEFT_OUT_MSG, device=omission.device, reason=omission.reason)
        self._omitted = keys

    async def _list(self) -> dict[str, Any]:
        """This driver's slices of this node on the server, by name."""
        from lightkube.resources.resource_v1 import ResourceSlice

        fields = {"spec.nodeName": self.node, "spec.driver": DRIVER_NAME}
        return {s.metadata.name: s async for s in self._client.list(ResourceSlice, fields=fields)}

    async def _sync(
        self, pool: slices.Pool, entries: Mapping[str, Mapping[str, Entry]]
    ) -> dict[str, int] | None:
        """Make the server hold ``pool``; the writes by verb, or None when it already did."""
        if self._owner is None:
            from lightkube.resources.core_v1 import Node

            node = await self._client.get(Node, self.node)
            self._owner = slices.node_owner(self.node, node.metadata.uid)
        if self._versions is None:
            found = await self._list()
            held, times = taints.server_taints(
                device
                for piece in found.values()
                for device in piece.to_dict().get("spec", {}).get("devices") or ()
            )
            self._taints.listed(held)
            if self._times.adopt(times):  # a restart keeps the taints' times
                pool = self._pool(entries)
            generations = [s.spec.pool.generation for s in found.values()]
            if self._holds(found, pool):
                self.generation = generations[0]
                self._versions = {n: s.metadata.resourceVersion for n, s in found.items()}
                self._written = pool
                return None
            current = {n: s.metadata.resourceVersion for n, s in found.items()}
            self.generation = max([self.generation, *generations])
        else:
            current = dict(self._versions)
        # Taken before the first write: a publish cut short never reuses its generation.
        self.generation += 1
        before = dict(self.writes)
        versions: dict[str, str] = {}
        for body in pool.objects(self.generation, self._owner):
            name = body["metadata"]["name"]
            if name in current:
                versions[name] = await self._update(body, current[name])
            else:
                versions[name] = await self._create(body)
        for name in sorted(set(current) - set(versions)):
            await self._delete(name)
        self._echoes.extend(versions.values())
        self._versions, self._written = versions, pool
        return {verb: self.writes[verb] - before[verb] for verb in VERBS}

    def _holds(self, found: Mapping[str, Any], pool: slices.Pool) -> bool:
        """Whether the listed slices are exactly ``pool`` at one complete generation."""
        if set(found) != set(pool.names):
            return False
        generations = {s.spec.pool.generation for s in found.values()}
        if len(generations) != 1:
            return False
        generation = generations.pop()
        for desired in pool.objects(generation, self._owner):
            have = found[desired["metadata"]["name"]].to_dict()
            if have.get("spec") != desired["spec"]:
                return False
            owners = have.get("metadata", {}).get("ownerReferences")
            if owners != desired["metadata"]["ownerReferences"]:
                return False
        return True

    async def _create(self, body: dict[str, Any]) -> str:
        from lightkube.resources.resource_v1 import ResourceSlice

        try:
            made = await self._client.create(ResourceSlice.from_dict(body))
        except Exception as exc:
            if _status_code(exc) != 409:
                self._metrics.dra_slice_write("create", m.DRA_FAILED)
                raise
            # Already there (written by an earlier life of this plugin): replace it.
            existing = await self._client.get(ResourceSlice, body["metadata"]["name"])
            return await self._update(body, existing.metadata.resourceVersion)
        self.writes["create"] += 1
        self._metrics.dra_slice_write("create", m.OK)
        return str(made.metadata.resourceVersion)

    async def _update(self, body: dict[str, Any], version: str) -> str:
        from lightkube.resources.resource_v1 import ResourceSlice

        name = body["metadata"]["name"]
        for attempt in (1, 2):
            body["metadata"]["resourceVersion"] = version
            try:
                replaced = await self._client.replace(ResourceSlice.from_dict(body))
            except Exception as exc:
                code = _status_code(exc)
                if code == 404:  # deleted meanwhile (the kubelet's wipe): create it again
                    del body["metadata"]["resourceVersion"]
                    return await self._create(body)
                if code != 409 or attempt == 2:
                    self._metrics.dra_slice_write("update", m.DRA_FAILED)
                    raise
                # Changed since it was read: read it again and retry once.
                version = (await self._client.get(ResourceSlice, name)).metadata.resourceVersion
                continue
            self.writes["update"] += 1
            self._metrics.dra_slice_write("update", m.OK)
            return str(replaced.metadata.resourceVersion)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _delete(self, name: str) -> None:
        from lightkube.resources.resource_v1 import ResourceSlice

        try:
            await self._client.delete(ResourceSlice, name)
        except Exception as exc:
            if _status_code(exc) != 404:  # already gone is what was wanted
                self._metrics.dra_slice_write("delete", m.DRA_FAILED)
                raise
            return
        self.writes["delete"] += 1
        self._metrics.dra_slice_write("delete", m.OK)
