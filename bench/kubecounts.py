"""The API server's side of the scale benchmark (``bench/bench_dra_scale.py``): its own
request counters, a GET of a slice as the floor, and a node's taints as listed."""

from __future__ import annotations

import ssl
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.resource_v1 import ResourceSlice
from prometheus_client.parser import text_string_to_metric_families

from tests import kubeapi


def metrics_text(server: kubeapi.ApiServer) -> str:
    """The API server's own ``/metrics`` (its serving certificate is self-signed)."""
    request = urllib.request.Request(
        f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.token}"}
    )
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        return str(answer.read().decode())


def apiserver_counts(server: kubeapi.ApiServer) -> tuple[Counter[str], int]:
    """``apiserver_request_total`` as ``VERB resource`` for slices and nodes, and the
    slice watches open now (``apiserver_longrunning_requests``)."""
    text = metrics_text(server)
    counts: Counter[str] = Counter()
    watches = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            resource = sample.labels.get("resource")
            if resource not in ("resourceslices", "nodes"):
                continue
            key = f"{sample.labels.get('verb')} {resource}"
            if sample.name == "apiserver_request_total":
                counts[key] += int(sample.value)
            elif sample.name == "apiserver_longrunning_requests" and key.startswith("WATCH r"):
                watches += int(sample.value)
    return counts, watches


def delta(after: Counter[str], before: Counter[str]) -> Counter[str]:
    return Counter({k: after[k] - before[k] for k in after if after[k] != before[k]})


def shown(counts: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items()) if n) or "none"


async def floor_get_ms(kubeconfig: Path, name: str, runs: int) -> list[float]:
    client = AsyncClient(KubeConfig.from_file(kubeconfig))
    try:
        samples = []
        for _ in range(runs):
            began = time.perf_counter()
            await client.get(ResourceSlice, name)
            samples.append((time.perf_counter() - began) * 1000)
        return samples
    finally:
        await client.close()


async def taint_times(kubeconfig: Path, node: str) -> list[Any]:
    """The node's tainted devices with each taint's value and timeAdded."""
    client = AsyncClient(KubeConfig.from_file(kubeconfig))
    try:
        return [
            (d.name, [(t.value, t.timeAdded) for t in d.taints or []])
            async for s in client.list(ResourceSlice, fields={"spec.nodeName": node})
            for d in s.spec.devices or []
            if d.taints
        ]
    finally:
        await client.close()
