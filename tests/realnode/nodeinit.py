"""PID 1 of the real node: private mounts and network, then reap until killed.

Run by ``cluster.Node`` as ``unshare --mount --propagation private --pid --fork
--mount-proc --net --kill-child=SIGKILL -- python nodeinit.py STATE_DIR``. Everything it
changes lives in that mount and network namespace: overlays over ``/etc``, ``/var/lib``
and ``/var/log`` whose upper layers sit in STATE_DIR, a tmpfs on ``/run``, the kubelet's
and containerd's directories bound from STATE_DIR (ext4, so the overlay snapshotter
works), a bridge for the pods, and files bound over the kernel settings the kubelet would
otherwise rewrite for the whole machine. The components themselves are started by the
harness with ``nsenter`` into this namespace; killing this process by PID ends them all.

Stdlib only, standalone: it runs before anything else exists in the namespace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# The values the kubelet's setupKernelTunables (pkg/kubelet/cm/container_manager_linux.go)
# writes when it finds others: bound here so it reads them and leaves the host's alone.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def overlay(target: str, state: Path) -> None:
    name = target.strip("/").replace("/", "-")
    upper, work = state / "overlay" / name / "upper", state / "overlay" / name / "work"
    upper.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    run(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        f"lowerdir={target},upperdir={upper},workdir={work}",
        target,
    )


def bind(source: Path, target: str) -> None:
    source.mkdir(parents=True, exist_ok=True)
    Path(target).mkdir(parents=True, exist_ok=True)
    run("mount", "--bind", str(source), target)


def mounts(state: Path, config: dict[str, str]) -> None:
    for target in ("/etc", "/var/lib", "/var/log"):
        overlay(target, state)
    run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run")
    bind(state / "kubelet", "/var/lib/kubelet")
    bind(state / "containerd", "/var/lib/containerd")
    # The CDI spec directories come from STATE_DIR too, so tests can place and remove
    # specs from outside (never through an overlay's upper layer while it is mounted).
    bind(state / "cdi" / "etc", "/etc/cdi")
    bind(state / "cdi" / "run", "/run/cdi")
    sysctls = state / "sysctl"
    sysctls.mkdir(exist_ok=True)
    for key, value in KUBELET_SYSCTLS.items():
        fake = sysctls / key.replace("/", ".")
        fake.write_text(value + "\n")
        run("mount", "--bind", "-o", "ro", str(fake), f"/proc/sys/{key}")
    for directory in ("/etc/cni/net.d", "/etc/containerd"):
        Path(directory).mkdir(parents=True, exist_ok=True)
    with open("/etc/hosts", "a", encoding="ascii") as hosts:
        hosts.write(f"\n{config['node_ip']} {config['node_name']}\n")


def network(config: dict[str, str]) -> None:
    """A bridge without ports as the pods' segment: each pod gets a macvlan on it (the
    CNI config), and the node its own macvlan, since macvlan children cannot reach
    their parent's address."""
    run("ip", "link", "set", "lo", "up")
    run("ip", "link", "add", config["bridge"], "type", "bridge")
    run("ip", "link", "set", config["bridge"], "up")
    run("ip", "link", "add", "node0", "link", config["bridge"], "type", "macvlan", "mode", "bridge")
    run("ip", "addr", "add", f"{config['node_ip']}/16", "dev", "node0")
    run("ip", "link", "set", "node0", "up")


def main() -> int:
    state = Path(sys.argv[1])
    config = json.loads((state / "node.json").read_text())
    try:
        mounts(state, config)
        network(config)
    except subprocess.CalledProcessError as exc:
        (state / "node.failed").write_text(f"{exc.cmd}: {exc.stderr}")
        return 1
    except OSError as exc:
        (state / "node.failed").write_text(str(exc))
        return 1
    (state / "node.ready").write_text(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:  # the namespace's init: reap every orphan until killed
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
