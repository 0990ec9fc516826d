"""The kubelet's own device manager as a test peer: build it, run it, talk to it.

``tests/kubelet-peer/`` holds a Go driver per Kubernetes release (``kube-<minor>``)
around the shared protocol in ``peer/``. Each is built once into a cache directory
outside the repository (keyed by a digest of its sources and the Go version), reusing
Go's module and build caches. ``KubeletPeer`` runs one inside a private mount namespace
(``unshare --mount``) where a test's kubelet directory is bound at the fixed
``/var/lib/kubelet/device-plugins``; the daemon, outside that namespace, is pointed at
the same directory through ``--kubelet-device-plugin-path``, so both see one set of
sockets and no test touches a real kubelet directory.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from . import gobuild

GO_ROOT: Final = Path(__file__).parent / "kubelet-peer"
# Kubernetes minor -> driver module directory; the exact release is pinned in its go.mod.
VERSIONS: Final = {"1.34": "kube-1.34", "1.37": "kube-1.37"}
UNSHARE: Final = ("unshare", "--mount", "--propagation", "private", "--")
# Diagnosis only: how long a reply or record may take before the test reports what it
# saw. The waits themselves end on the event.
REPLY_TIMEOUT_S: Final = 60.0

Record = dict[str, Any]


class PeerError(RuntimeError):
    """The driver answered a request with an error (the manager's own message)."""


@dataclass(frozen=True)
class Build:
    """One version's driver: a binary, or why there is none (skip or failure)."""

    version: str
    binary: Path | None = None
    skip: str = ""
    error: str = ""
    seconds: float = 0.0
    cached: bool = False


def cache_root() -> Path:
    return gobuild.cache_root("kubelet-peer", "RBLN_KUBELET_PEER_CACHE")


def target(version: str) -> gobuild.GoTarget:
    module = VERSIONS[version]
    return gobuild.GoTarget(
        name=module,
        module=GO_ROOT / module,
        binaries=(gobuild.GoBinary(".", "kubelet-peer"),),
        # The real node's kubelet's settings, and its module versions in go.mod, so the
        # release's packages compile once for both (tests/test_gobuild.py).
        env=gobuild.STATIC_ENV,
        flags=(*gobuild.TRIM, f"-ldflags={gobuild.STRIP_LDFLAGS}"),
        sources=(GO_ROOT / "peer",),
    )


def unavailable() -> str:
    """Why the peer cannot run on this machine, or "" when it can."""
    if shutil.which("go") is None:
        return "Go toolchain not found on PATH (the kubelet peer builds k8s.io/kubernetes)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) not found: no private mount namespace"
    if os.geteuid() != 0:
        return "not root: a private mount namespace for /var/lib/kubelet/device-plugins needs root"
    probe = subprocess.run(
        [*UNSHARE, "true"], capture_output=True, text=True, check=False, timeout=30
    )
    if probe.returncode != 0:
        return f"unshare --mount failed: {probe.stderr.strip() or probe.returncode}"
    return ""


def build(version: str, say: gobuild.Say = print) -> Build:
    """The version's driver binary, from the cache or built now."""
    reason = unavailable()
    if reason:
        return Build(version, skip=reason)
    try:
        directory, seconds, was_cached = gobuild.build(target(version), cache_root(), say)
    except gobuild.GoBuildError as exc:
        return Build(version, error=str(exc))
    return Build(version, binary=directory / "kubelet-peer", seconds=seconds, cached=was_cached)


class KubeletPeer:
    """One kubelet (device manager + topology manager) process on a kubelet directory."""

    def __init__(self, binary: Path, kubelet_dir: Path) -> None:
        self.kubelet_dir = kubelet_dir
        self.proc = subprocess.Popen(
            [*UNSHARE, str(binary), "-kubelet-dir", str(kubelet_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.records: list[Record] = []  # klog records of the manager, in order
        self.events: list[Record] = []  # every other event line
        self.stderr: list[str] = []
        self._replies: dict[int, Record] = {}
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()
        (ready,) = self.wait_event("ready")
        self.kubernetes: str = ready["kubernetes"]

    # ------------------------------------------------------------------ plumbing
    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                message = {"event": "not-json", "raw": line}
            with self._cond:
                if "id" in message:
                    self._replies[message["id"]] = message
                elif message.get("event") == "log":
                    record = message["record"]
                    record["t"] = message["t"]
                    self.records.append(record)
                else:
                    self.events.append(message)
                self._cond.notify_all()
        with self._cond:
            self.events.append({"event": "exit"})
            self._cond.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def _wait(self, found: Callable[[], Any], what: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                result = found()
                if result:
                    return result
                remaining = deadline - time.monotonic()
                exited = any(e.get("event") == "exit" for e in self.events)
                if remaining <= 0 or exited:
                    raise AssertionError(
                        f"kubelet peer: no {what} within {timeout:g}s (exited: {exited}); "
                        f"events: {self.events[-5:]}; last records: {self.records[-10:]}; "
                        f"stderr: {''.join(self.stderr)[-2000:]}"
                    )
                self._cond.wait(min(remaining, 0.5))

    def request(self, op: str, **args: Any) -> Record:
        """Send one request and return the whole reply (``ok``, ``result`` or ``error``)."""
        request_id = next(self._ids)
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": request_id, "op": op, **args}) + "\n")
        self.proc.stdin.flush()
        reply: Record = self._wait(
            lambda: self._replies.pop(request_id, None), f"reply to {op}", REPLY_TIMEOUT_S
        )
        return reply

    def call(self, op: str, **args: Any) -> Any:
        reply = self.request(op, **args)
        if not reply["ok"]:
            raise PeerError(f"{op}: {reply['error']}")
        return reply.get("result")

    def wait_event(
        self, kind: str, where: Callable[[Record], bool] = lambda _: True, since: int = 0
    ) -> list[Record]:
        """Wait for driver events of ``kind`` (``since``: an index into ``events``)."""

        def found() -> list[Record]:
            fatal = [e for e in self.events if e.get("event") == "fatal"]
            if fatal:
                raise AssertionError(f"kubelet peer failed to start: {fatal[0]['error']}")
            return [e for e in self.events[since:] if e.get("event") == kind and where(e)]

        result: list[Record] = self._wait(found, f"{kind!r} event", REPLY_TIMEOUT_S)
        return result

    def mark(self) -> int:
        """A position in the record stream, for ``find``/``wait_log`` ``since``."""
        with self._cond:
            return len(self.records)

    def find(self, msg: str, since: int = 0, **fields: Any) -> list[Record]:
        with self._cond:
            return [
                r
                for r in self.records[since:]
                if r.get("msg") == msg and all(r.get(k) == v for k, v in fields.items())
            ]

    def wait_log(
        self, msg: str, count: int = 1, since: int = 0, timeout: float = 30.0, **fields: Any
    ) -> list[Record]:
        """Wait for the manager's own klog record(s) ``msg`` with these fields."""

        def found() -> list[Record]:
            hits = [
                r
                for r in self.records[since:]
                if r.get("msg") == msg and all(r.get(k) == v for k, v in fields.items())
            ]
            return hits if len(hits) >= count else []

        result: list[Record] = self._wait(found, f"{count}x {msg!r} {fields}", timeout)
        return result

    def kill(self) -> None:
        """End the process as a crashed or restarted kubelet ends: nothing is stopped."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.close()  # EOF: the driver exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.kill()

    # ------------------------------------------------------------------ the manager
    def start(self, numa_nodes: tuple[int, ...] = (0, 1), policy: str = "none") -> float:
        """Construct and start the managers; returns when (ms) ``Start`` was entered."""
        result = self.call("start", numaNodes=list(numa_nodes), policy=policy)
        return float(result["startedAt"])

    def add_pod(self, pod: Mapping[str, Any]) -> str:
        self.call("pod", pod=pod)
        return str(pod["metadata"]["uid"])

    def admit(self, uid: str) -> Record:
        result: Record = self.call("admit", uid=uid)
        return result

    def capacity(self) -> tuple[dict[str, int], dict[str, int]]:
        result = self.call("capacity")
        return result["capacity"], result["allocatable"]

    def devices(self, uid: str, container: str) -> dict[str, list[str]]:
        """The devices the manager assigned to the container, per resource (sorted)."""
        result = self.call("devices", uid=uid, container=container)
        return {resource: [d["id"] for d in devs] for resource, devs in result.items()}

    def allocatable(self) -> dict[str, list[Record]]:
        result: dict[str, list[Record]] = self.call("allocatable")
        return result

    def options(self, uid: str, container: str) -> Record:
        result: Record = self.call("options", uid=uid, container=container)
        return result

    def hints(self, uid: str, container: str) -> dict[str, list[Record]]:
        result: dict[str, list[Record]] = self.call("hints", uid=uid, container=container)
        return result

    def affinity(self, uid: str, container: str) -> Record:
        result: Record = self.call("affinity", uid=uid, container=container)
        return result

    def status(self, uid: str) -> Record:
        result: Record = self.call("status", uid=uid)
        return result


def pod(
    uid: str,
    containers: Mapping[str, Mapping[str, int]],
    init: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """A v1.Pod manifest: containers by name with their device limits (= requests)."""

    def spec(name: str, limits: Mapping[str, int]) -> dict[str, Any]:
        amounts = {resource: str(count) for resource, count in limits.items()}
        return {"name": name, "resources": {"limits": amounts, "requests": amounts}}

    manifest: dict[str, Any] = {
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "spec": {"containers": [spec(n, lim) for n, lim in containers.items()]},
    }
    if init:
        manifest["spec"]["initContainers"] = [spec(n, lim) for n, lim in init.items()]
    return manifest
