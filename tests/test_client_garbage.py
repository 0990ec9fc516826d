"""A client that sends bytes which are no protobuf: its fault, not the daemon's."""

from __future__ import annotations

import grpc

from rbln_device_plugin.model.resources import socket_name

from .fault_helpers import NPU, launch

UNDECODABLE = "Undecodable request from a client; gRPC answered it with an error"
METHODS = ("/v1beta1.DevicePlugin/Allocate", "/v1beta1.DevicePlugin/GetPreferredAllocation")


async def test_undecodable_requests_are_answered_and_logged_as_the_clients_fault() -> None:
    async with launch("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        target = f"unix:{h.node.kubelet_dir / socket_name(NPU)}"
        codes: set[grpc.StatusCode] = set()
        async with grpc.aio.insecure_channel(target) as channel:
            for method in METHODS:
                call = channel.unary_unary(method)  # raw bytes in, raw bytes out
                for _ in range(11):
                    try:
                        await call(b"\xff\xff\xff garbage", timeout=10)
                    except grpc.aio.AioRpcError as exc:
                        codes.add(exc.code())
                    else:
                        raise AssertionError(f"{method} accepted garbage")
        assert codes == {grpc.StatusCode.UNKNOWN}  # what grpc.aio answers for it
        for method in METHODS:
            debug = await h.daemon.await_log(
                f"Unexpected [DecodeError] raised by servicer method [{method}]", count=11
            )
            assert {r["level"] for r in debug} == {"debug"}
        warns = h.daemon.find(UNDECODABLE)
        assert sorted(r["method"] for r in warns) == sorted(METHODS)  # one each per minute
        assert all(r["level"] == "warn" and "Error parsing message" in r["err"] for r in warns)
        assert not [r for r in h.daemon.records if r.get("level") == "error"]
        # The daemon serves on.
        response = await h.kubelet.allocate(NPU, [["rbln0"]])
        assert len(response.container_responses) == 1
