"""The ``serve`` side of the control socket (see ``control``): requests become kubelet calls."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

import grpc

from rbln_device_plugin.model import resources
from rbln_device_plugin_sim.control import REREGISTER_WAIT_S, Answer, socket_path
from rbln_device_plugin_sim.kubelet import KubeletStub, ResourceView
from rbln_device_plugin_sim.tree import SimError

_MAX_REQUEST: Final = 1 << 20
_REQUEST_WAIT_S: Final = 30.0


class ControlServer:
    """Answers control requests with the kubelet stand-in; ``event`` narrates each one."""

    def __init__(self, root: Path, stub: KubeletStub, event: Callable[[str], None]) -> None:
        self.path = socket_path(root)
        self.stub = stub
        self.event = event
        # Devices allocated through this stand-in, per resource: like the kubelet for
        # running pods, it never offers them again (and, like its checkpoint, keeps them
        # across a restart). A new `serve` starts with none.
        self.in_use: dict[str, set[str]] = {}
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self.path.unlink(missing_ok=True)  # a dead serve's socket (the caller checked)
        self._server = await asyncio.start_unix_server(
            self._handle, path=str(self.path), limit=_MAX_REQUEST
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.path.unlink(missing_ok=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(_REQUEST_WAIT_S):  # a client that never writes
                    line = await reader.readline()
                answer = await self.answer(json.loads(line))
            except (ValueError, LookupError, TypeError, SimError, TimeoutError) as exc:
                answer = {"ok": False, "error": str(exc) or type(exc).__name__}
            except Exception as exc:  # a bug here must not end serve, only this request
                answer = {"ok": False, "error": f"internal error in serve: {exc!r}"}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except OSError:
            pass  # the client went away; nobody to answer
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def answer(self, req: dict[str, Any]) -> Answer:
        op = req.get("op")
        if op == "status":
            return {"ok": True, "resources": self._resources()}
        if op == "preferred":
            resource = self._resource(req.get("resource"), req.get("available") or ())
            available = req.get("available") or self._free(resource)
            must = list(req.get("mustInclude") or ())
            chosen = await _call(
                "GetPreferredAllocation",
                self.stub.preferred(resource, available, must, int(req["size"])),
            )
            self.event(f"GetPreferredAllocation {resource} size {req['size']} -> {_names(chosen)}")
            return {"ok": True, "resource": resource, "available": available, "chosen": chosen}
        if op == "allocate":
            return await self._allocate(req)
        if op == "restart":
            return await self._restart(float(req.get("wait", REREGISTER_WAIT_S)))
        raise ValueError(f"unknown request {op!r}")

    async def _allocate(self, req: dict[str, Any]) -> Answer:
        containers: list[list[str]] = [list(c) for c in req.get("containers") or ()]
        ids = [i for c in containers for i in c]
        resource = self._resource(req.get("resource"), ids)
        chosen: list[str] | None = None
        free: list[str] = []
        if req.get("size") is not None:
            size = int(req["size"])
            free = self._free(resource)
            chosen = await self._pick(resource, free, size)
            containers = [chosen]
        response = await _call("Allocate", self.stub.allocate(resource, containers))
        self.in_use.setdefault(resource, set()).update(i for c in containers for i in c)
        answers = [
            {
                "devices": [[d.container_path, d.host_path, d.permissions] for d in c.devices],
                "annotations": dict(c.annotations),
                "envs": dict(c.envs),
            }
            for c in response.container_responses
        ]
        rsd = [d[1] for a in answers for d in a["devices"] if d[0] == "/dev/rsd0"]
        shown = "; ".join(_names(c) for c in containers)
        self.event(f"Allocate {resource} {shown} -> {', '.join(Path(p).name for p in rsd)}")
        return {
            "ok": True,
            "resource": resource,
            "chosen": chosen,
            "available": free,
            "containers": answers,
        }

    async def _pick(self, resource: str, free: list[str], size: int) -> list[str]:
        """The kubelet's choice of ``size`` free devices: the plugin's preference, topped
        up from the rest when it answers fewer (pkg/kubelet/cm/devicemanager,
        devicesToAllocate, without topology hints)."""
        if len(free) < size:
            raise SimError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {size}, Available: {len(free)}"
            )
        preferred = await _call(
            "GetPreferredAllocation", self.stub.preferred(resource, free, [], size)
        )
        chosen = [i for i in preferred if i in free][:size]
        chosen += [i for i in free if i not in chosen][: size - len(chosen)]
        return chosen

    async def _restart(self, wait: float) -> Answer:
        before = {r: v.generation for r in self.stub.resources() if (v := self.stub.view(r))}
        sockets = sorted(
            p.name
            for p in self.stub.directory.iterdir()
            if p.is_socket() and p != self.stub.socket_path
        )
        started = time.monotonic()
        await self.stub.restart()
        back: dict[str, float] = {}
        for resource, generation in sorted(before.items()):
            remaining = wait - (time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                await self.stub.wait_for(
                    resource, partial(_registered_after, generation), max(0.0, remaining)
                )
                back[resource] = round(time.monotonic() - started, 2)
        return {
            "ok": True,
            "deleted": sockets,
            "registeredBefore": sorted(before),
            "registeredAgain": back,
            "waited": wait,
        }

    # ------------------------------------------------------------------- helpers

    def _resources(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for resource in self.stub.resources():
            view = self.stub.view(resource)
            if view is not None:
                out[resource] = {
                    "devices": [[d.ID, d.health] for d in view.devices],
                    "generation": view.generation,
                    "ended": view.ended,
                }
        return out

    def _resource(self, given: str | None, ids: Sequence[str]) -> str:
        """The resource asked for; else the one that lists ``ids``; else rebellions.ai/npu."""
        registered = self.stub.resources()
        if given:
            resource = given
        else:
            holding = [r for r in registered if ids and set(ids) <= set(_ids(self.stub.view(r)))]
            resource = holding[0] if holding else resources.NPU.name
        if resource not in registered:
            listed = ", ".join(registered) or "none yet; is the daemon running?"
            raise SimError(
                f"{resource} is not registered with the kubelet stand-in (registered: {listed})"
            )
        return resource

    def _free(self, resource: str) -> list[str]:
        """Healthy devices not allocated through this stand-in, as the kubelet offers them."""
        view = self.stub.view(resource)
        if view is None:
            return []
        used = self.in_use.get(resource, set())
        return [d.ID for d in view.devices if d.health == "Healthy" and d.ID not in used]


T = TypeVar("T")


async def _call(name: str, call: Awaitable[T]) -> T:
    """A kubelet call; a gRPC error becomes a SimError naming the call and the code."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise SimError(f"{name} refused: {exc.code().name}: {exc.details()}") from None


def _registered_after(generation: int, view: ResourceView) -> bool:
    """Registered again since ``generation``, with a device list sent."""
    return view.generation > generation and view.messages > 0


def _names(ids: Sequence[str]) -> str:
    return ", ".join(ids) or "[]"


def _ids(view: ResourceView | None) -> list[str]:
    return view.ids if view is not None else []
