"""A real Kubernetes API server for tests that talk to one: etcd and kube-apiserver (the
binaries tests/realnode builds, 1.37.2) on loopback in a temporary directory, no node, no
kubelet, no controllers.

``running_apiserver`` starts both on free ports, waits for ``/readyz`` and yields an
``ApiServer`` with a token that may do anything (``--authorization-mode AlwaysAllow``:
tests only) and a kubeconfig for it; it stops both processes by their PIDs. Tests that
use it carry the ``apiserver`` marker; ``missing`` says why they are skipped when the
binaries or openssl are absent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from .gobuild import cache_root

BIN_DIR = cache_root("realnode", "RBLN_REALNODE_CACHE") / "bin"
START_TIMEOUT_S = 90.0


def missing() -> str | None:
    """Why no API server can be started here, or None."""
    absent = [name for name in ("etcd", "kube-apiserver") if not (BIN_DIR / name).is_file()]
    if absent:
        return (
            f"{', '.join(absent)} not built in {BIN_DIR} (make e2e builds them: tests/realnode, "
            "root and Go)"
        )
    if shutil.which("openssl") is None:
        return "openssl not found (the service-account key is made with it)"
    return None


@dataclass(frozen=True)
class ApiServer:
    url: str  # https://127.0.0.1:PORT
    token: str
    kubeconfig: Path
    logs: Path

    def tail(self) -> str:
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _ready(url: str, token: str) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(f"{url}/readyz", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.wait(10)


@contextlib.contextmanager
def running_apiserver(state: Path) -> Iterator[ApiServer]:
    reason = missing()
    if reason is not None:
        raise RuntimeError(reason)
    logs = state / "logs"
    logs.mkdir(parents=True)
    pki = state / "pki"
    pki.mkdir()
    sa_key, sa_pub = pki / "sa.key", pki / "sa.pub"
    subprocess.run(
        ["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True
    )
    subprocess.run(
        ["openssl", "rsa", "-in", str(sa_key), "-pubout", "-out", str(sa_pub)],
        check=True, capture_output=True,
    )  # fmt: skip
    token = os.urandom(16).hex()
    (pki / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
    client, peer, secure = free_port(), free_port(), free_port()
    url = f"https://127.0.0.1:{secure}"
    kubeconfig = pki / "admin.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [
                    {"name": "test", "cluster": {"server": url, "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "admin", "user": {"token": token}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
            }
        )
    )
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, argv: list[str]) -> None:
        with (logs / f"{name}.log").open("ab") as out:
            processes.append(
                subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=state,
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(state)},
                    start_new_session=True,
                )
            )

    try:
        spawn(
            "etcd",
            [
                str(BIN_DIR / "etcd"), "--data-dir", str(state / "etcd"), "--name", "test",
                "--listen-client-urls", f"http://127.0.0.1:{client}",
                "--advertise-client-urls", f"http://127.0.0.1:{client}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"test=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync", "--log-level", "warn",
            ],
        )  # fmt: skip
        spawn(
            "kube-apiserver",
            [
                str(BIN_DIR / "kube-apiserver"),
                "--etcd-servers", f"http://127.0.0.1:{client}",
                "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                "--secure-port", str(secure), "--cert-dir", str(pki / "apiserver"),
                "--service-cluster-ip-range", "10.96.0.0/16",
                "--token-auth-file", str(pki / "tokens.csv"),
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-key-file", str(sa_pub),
                "--service-account-signing-key-file", str(sa_key),
                # Tests only, on loopback: every request is allowed.
                "--authorization-mode", "AlwaysAllow",
                # The kubernetes Service cannot point at a loopback address.
                "--endpoint-reconciler-type", "none",
                # As real clusters: the chart's DaemonSet runs privileged.
                "--allow-privileged=true",
            ],
        )  # fmt: skip
        server = ApiServer(url, token, kubeconfig, logs)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ready(url, token):
            exited = [p.args[0] for p in processes if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                raise RuntimeError(f"API server not ready ({exited} exited):\n{server.tail()}")
            time.sleep(0.3)
        yield server
    finally:
        for process in reversed(processes):
            _stop(process)
