"""``preferred``, ``allocate``, ``restart-kubelet``: the kubelet's calls, sent through the
kubelet stand-in of the ``serve`` running on ``--root`` (see ``control``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rbln_device_plugin_sim import control
from rbln_device_plugin_sim.node import SimNode

# What a reader needs to know about the RSD group's device spec, said once.
RSD_NOTE = "the RSD group just made for this container"
GROUP0_NOTE = "the default group: every NPU not allocated"


def _ids(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def preferred(args: argparse.Namespace) -> int:
    answer = control.request(
        args.root,
        {
            "op": "preferred",
            "resource": args.resource,
            "size": args.size,
            "available": _ids(args.available),
            "mustInclude": _ids(args.must_include),
        },
    )
    print(_preferred_line(answer, args.size))
    return 0


def _preferred_line(answer: dict[str, Any], size: int) -> str:
    chosen = ", ".join(answer["chosen"]) or "[] (no preference: the kubelet picks alone)"
    return (
        f"GetPreferredAllocation {answer['resource']}, size {size} of "
        f"{len(answer['available'])} available: {chosen}"
    )


def allocate(args: argparse.Namespace) -> int:
    answer = control.request(
        args.root,
        {
            "op": "allocate",
            "resource": args.resource,
            "size": args.size,
            "containers": [_ids(c) for c in args.containers],
        },
    )
    resource = answer["resource"]
    if answer["chosen"] is not None:
        print(_preferred_line(answer, args.size))
    for index, container in enumerate(answer["containers"]):
        print(f"Allocate {resource}, container {index}:")
        width = max(len(spec[0]) for spec in container["devices"])
        for container_path, host_path, _permissions in container["devices"]:
            note = f"   {RSD_NOTE}" if container_path == "/dev/rsd0" else ""
            print(f"  {container_path:<{width}} -> {host_path}{note}")
        for key, value in sorted(container["annotations"].items()):
            print(f"  annotation {key}={value}")
        for key, value in sorted(container["envs"].items()):
            print(f"  env {key}={value}")
    print("RSD groups now:")
    for line in _groups(args.root):
        print(f"  {line}")
    return 0


def _groups(root: Path) -> list[str]:
    found = SimNode.open(root).groups()
    return [
        f"{gid}: {' '.join(names)}" if gid != "0" else f"0: {len(names)} devices ({GROUP0_NOTE})"
        for gid, names in sorted(found.items(), key=lambda item: int(item[0]))
    ]


def restart_kubelet(args: argparse.Namespace) -> int:
    answer = control.request(
        args.root, {"op": "restart", "wait": args.wait}, timeout=args.wait + 30
    )
    deleted = answer["deleted"]
    print(f"kubelet stand-in restarted: {len(deleted)} plugin socket(s) deleted, new kubelet.sock")
    back: dict[str, float] = answer["registeredAgain"]
    before: list[str] = answer["registeredBefore"]
    if not before:
        print("no plugin was registered before; none to wait for")
        return 0
    for resource in before:
        if resource in back:
            print(f"  {resource}: registered again after {back[resource]:.2f} s")
        else:
            print(f"  {resource}: not registered again within {answer['waited']:g} s")
    return 0 if set(back) == set(before) else 1
