"""``probe``: the gRPC health check a Kubernetes gRPC probe sends, from a shell.

The chart's liveness and readiness probes are ``grpc.health.v1.Health/Check`` calls on
the health port with a service name; this sends the same call, so the daemon on a
simulated node can be probed exactly as the kubelet probes it on a real one. Exit 0 when
the answer is SERVING, 1 otherwise, as the kubelet counts a probe's success.
"""

from __future__ import annotations

import argparse

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def probe(args: argparse.Namespace) -> int:
    name = args.service or '""'
    with grpc.insecure_channel(f"{args.host}:{args.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=args.service)
        try:
            reply = stub.Check(request, timeout=args.timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            print(f"{name}: {code.name if code else 'failed'} ({args.host}:{args.port})")
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{name}: {status}")
    return 0 if status == "SERVING" else 1
