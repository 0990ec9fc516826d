"""A real one-node Kubernetes cluster in private namespaces, driven as an operator would.

``Node`` is the namespace: ``unshare`` runs ``nodeinit.py`` as PID 1 of a new mount, PID
and network namespace. ``Cluster`` starts etcd, the API server, the controller manager,
the scheduler, containerd and the kubelet in it (each with ``nsenter``, each tracked by
its PID, each logging to a file), behind a simulated node (``rbln_device_plugin_sim``
with real character devices) that reaches the plugin's pod through chart values. Tests
then use the real ``helm`` and ``kubectl`` (``make tools``), run on the node's network.

``running_cluster()`` is the context manager other test files use; ``stop()`` kills the
namespace's PID 1 by PID, which ends every process in it, then removes the kubelet's
cgroups and the state directory, on success, failure or interrupt alike.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from rbln_device_plugin_sim.layout import Layout
from rbln_device_plugin_sim.node import (
    TOOLKIT_CDI_SPEC,
    TOOLKIT_CDI_SPEC_NAME,
    SimNode,
    materialize,
)

from .. import gobuild
from . import artifacts
from .configs import (
    API_SERVER_PORT,
    BRIDGE,
    CNI_CONFIG,
    CONTAINERD_16_CONFIG,
    CONTAINERD_CONFIG,
    NODE_IP,
    kubelet_config,
)

HERE: Final = Path(__file__).parent
REPO: Final = HERE.parent.parent
TOOLS: Final = REPO / ".tools"
HELM: Final = TOOLS / "helm" / "helm"
KUBECTL: Final = TOOLS / "kubectl" / "kubectl"
CHART: Final = REPO / "deployments" / "helm" / "k8s-device-plugin-chart"
NODE_NAME: Final = "realnode"
CGROUP_FS: Final = Path("/sys/fs/cgroup")
# The image's own Python runs the simulated rbln-smi inside the plugin's container.
IMAGE_PYTHON: Final = "/opt/rbln-device-plugin/bin/python"
SYSTEM_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Diagnosis only: how long a wait may take before the test reports what it saw. Every
# wait ends on its outcome; these are generous on purpose (2 cores run the whole cluster).
START_TIMEOUT_S: Final = 240.0
WAIT_TIMEOUT_S: Final = 180.0
# The simulated node's character devices: a major from the range Linux reserves for
# local use that no driver on this machine registered (see /proc/devices).
LOCAL_MAJORS: Final = range(240, 255)

Say = Callable[[str], None]


class ClusterError(RuntimeError):
    """A component did not come up, or a command failed; carries what it printed."""


def unavailable() -> str:
    """Why the real node cannot run here, or "" when it can."""
    if os.geteuid() != 0:
        return "not root: the real node needs private mount, PID and network namespaces"
    if shutil.which("go") is None:
        return "Go toolchain not found on PATH (the real node builds Kubernetes, containerd, etcd)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) not found"
    missing = artifacts.missing_host_tools()
    if missing:
        return f"missing Debian packages: {' '.join(missing)} (make e2e installs them)"
    if not HELM.is_file() or not KUBECTL.is_file():
        return "helm/kubectl not fetched (make tools)"
    if not (CGROUP_FS / "devices").is_dir():
        return "no cgroup v1 devices hierarchy at /sys/fs/cgroup/devices"
    probe = subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", "--net", "true"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"unshare --mount --pid --net failed: {probe.stderr.strip() or probe.returncode}"
    return ""


def run_captured(
    argv: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``argv`` to its end, its output as text, its exit status for the caller to judge."""
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env=dict(env) if env is not None else None,
        input=input,
    )


def free_char_major() -> int:
    used = set()
    section = ""
    for line in Path("/proc/devices").read_text().splitlines():
        if line.endswith(":"):
            section = line
        elif section.startswith("Character") and line.strip():
            used.add(int(line.split()[0]))
    for major in reversed(LOCAL_MAJORS):
        if major not in used:
            return major
    raise ClusterError(f"every local character major {LOCAL_MAJORS} is registered")


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = WAIT_TIMEOUT_S,
    interval: float = 0.2,
    diagnose: Callable[[], str] = lambda: "",
) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        try:
            result = check()
        except (ClusterError, subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
            result, last_error = None, str(exc)[-1500:]
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no {what} within {timeout:g} s; last error: {last_error or '-'}\n{diagnose()}"
            )
        time.sleep(interval)


@dataclass
class Process:
    """One component: the ``nsenter`` on the host side and its child in the node."""

    name: str
    launcher: subprocess.Popen[bytes]
    log: Path
    pid: int = 0  # host PID of the component itself

    def alive(self) -> bool:
        return self.launcher.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


PR_SET_PDEATHSIG: Final = 1


class Node:
    """The namespaces: PID 1 is nodeinit.py; everything else enters with nsenter."""

    def __init__(self, state: Path) -> None:
        self.state = state
        (state / "node.json").write_text(
            json.dumps({"node_ip": NODE_IP, "node_name": NODE_NAME, "bridge": BRIDGE})
        )
        self.unshare = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--pid",
                "--fork",
                "--mount-proc",
                "--net",
                "--kill-child=SIGKILL",
                "--",
                "python3",
                "-S",
                str(HERE / "nodeinit.py"),
                str(state),
            ],
            stdout=(state / "nodeinit.log").open("wb"),
            stderr=subprocess.STDOUT,
            # If the test process dies (SIGKILL included), unshare dies, and with it
            # (--kill-child) the namespace's PID 1 and so every process in the node.
            preexec_fn=_die_with_parent,
        )
        self.init_pid = 0
        wait_for(
            "node namespace",
            lambda: (state / "node.ready").exists() or self._failed(),
            timeout=60,
        )
        self.init_pid = wait_for("node init pid", lambda: children(self.unshare.pid)[0], 10)

    def _failed(self) -> bool:
        failed = self.state / "node.failed"
        if failed.exists():
            raise AssertionError(f"node setup failed: {failed.read_text()}")
        if self.unshare.poll() is not None:
            raise AssertionError(f"node init exited: {(self.state / 'nodeinit.log').read_text()}")
        return False

    def enter(self, net: bool = True, pid: bool = True) -> list[str]:
        flags = ["--mount"] + (["--net"] if net else []) + (["--pid"] if pid else [])
        return ["nsenter", "--target", str(self.init_pid), *flags, "--"]

    def run(
        self,
        argv: Sequence[str],
        *,
        net: bool = True,
        timeout: float = 600,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> str:
        """Run a command in the node and return its output; fail with its stderr."""
        done = run_captured([*self.enter(net=net), *argv], timeout, env, input)
        if done.returncode != 0:
            raise ClusterError(
                f"{' '.join(argv)} (in the node) failed ({done.returncode}):\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            )
        return done.stdout

    def stop(self) -> None:
        if self.init_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
        if self.unshare.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.unshare.wait(30)
        if self.unshare.poll() is None:
            self.unshare.kill()
            self.unshare.wait(10)


@dataclass
class Pki:
    token: str
    kubeconfig: Path
    sa_key: Path
    sa_pub: Path
    token_file: Path
    cert_dir: Path


@dataclass
class Cluster:
    """The running cluster; ``running_cluster`` builds and tears it down."""

    state: Path
    arts: artifacts.Artifacts
    say: Say
    node: Node = field(init=False)
    sim: SimNode = field(init=False)
    pki: Pki = field(init=False)
    processes: dict[str, Process] = field(default_factory=dict)
    cgroup_root: str = field(init=False)
    char_major: int = field(init=False)
    started_at: float = field(default_factory=time.monotonic)
    peak_memory: dict[str, float] = field(default_factory=dict)
    # The 1.34 kubelet and containerd 1.6 (artifacts.LEGACY_TARGETS) instead of 1.37.2's
    # kubelet and containerd 2.x; the control plane is the same.
    legacy: bool = False

    @property
    def runtime_bin_dir(self) -> Path:
        """Where the node's kubelet, containerd, ctr and runc shim come from."""
        if not self.legacy:
            return self.arts.bin_dir
        if self.arts.legacy_bin_dir is None:
            raise ClusterError("the legacy kubelet and containerd were not built")
        return self.arts.legacy_bin_dir

    # ------------------------------------------------------------------ start
    def start(self, layout: Layout) -> None:
        self.cgroup_root = f"/rbln-realnode-{os.getpid()}-{self.state.name[-6:]}"
        self.char_major = free_char_major()
        self.sim = materialize(
            layout, self.state / "sim", char_major=self.char_major, smi_interpreter=IMAGE_PYTHON
        )
        _remove_stale_cgroups()
        self.place_cdi_spec(TOOLKIT_CDI_SPEC_NAME, TOOLKIT_CDI_SPEC)
        self.node = Node(self.state)
        self.pki = self._pki()
        self._etcd()
        self._apiserver()
        self._containerd()
        self._controllers()
        self._kubelet()
        wait_for("Ready node", self.node_ready, START_TIMEOUT_S, diagnose=self.diagnose)
        # As an operator labels an NPU node (the chart's and the operator's selectors).
        self.kubectl(
            "label",
            "node",
            NODE_NAME,
            "--overwrite",
            "rebellions.ai/npu.present=true",
            "rebellions.ai/npu.deploy.device-plugin=true",
        )
        wait_for(
            "default service account",
            lambda: self.kubectl("get", "serviceaccount", "default", "-o", "name", check=False),
        )

    def spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> Process:
        log = self.state / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        full_env = {
            # The runtime's directory first: its kubelet, containerd and shim win.
            "PATH": f"{self.runtime_bin_dir}:{self.arts.bin_dir}:{SYSTEM_PATH}",
            "HOME": str(self.state),
            **(env or {}),
        }
        with log.open("ab") as out:
            launcher = subprocess.Popen(
                [*self.node.enter(), *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=self.state,
                start_new_session=True,
            )
        process = Process(name, launcher, log)

        def started() -> int:
            found = children(launcher.pid)
            if found:
                return found[0]
            if launcher.poll() is not None:
                raise AssertionError(f"{name} exited at once:\n{process.tail()}")
            return 0

        process.pid = wait_for(f"{name} process", started, 30)
        self.processes[name] = process
        return process

    def kill(self, name: str, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
        """Stop one component by its PID (SIGTERM: as a service manager stops it)."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sig)
        try:
            process.launcher.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.launcher.wait(30)

    def _pki(self) -> Pki:
        pki = self.state / "pki"
        pki.mkdir()
        sa_key, sa_pub = pki / "sa.key", pki / "sa.pub"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True
        )
        subprocess.run(
            ["openssl", "rsa", "-in", str(sa_key), "-pubout", "-out", str(sa_pub)],
            check=True,
            capture_output=True,
        )
        token = os.urandom(16).hex()
        token_file = pki / "tokens.csv"
        token_file.write_text(f'{token},admin,admin,"system:masters"\n')
        kubeconfig = pki / "admin.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "realnode",
                    "clusters": [
                        {
                            "name": "realnode",
                            "cluster": {
                                "server": f"https://127.0.0.1:{API_SERVER_PORT}",
                                "insecure-skip-tls-verify": True,
                            },
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": token}}],
                    "contexts": [
                        {"name": "realnode", "context": {"cluster": "realnode", "user": "admin"}}
                    ],
                }
            )
        )
        return Pki(token, kubeconfig, sa_key, sa_pub, token_file, pki / "apiserver")

    def _etcd(self) -> None:
        self.spawn(
            "etcd",
            [
                "etcd",
                "--data-dir",
                str(self.state / "etcd"),
                "--name",
                "realnode",
                "--listen-client-urls",
                "http://127.0.0.1:2379",
                "--advertise-client-urls",
                "http://127.0.0.1:2379",
                "--listen-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-cluster",
                "realnode=http://127.0.0.1:2380",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
        )

    def _apiserver(self) -> None:
        self.spawn(
            "kube-apiserver",
            [
                "kube-apiserver",
                "--etcd-servers",
                "http://127.0.0.1:2379",
                # Every address of the node's private network namespace: loopback for the
                # admin kubeconfig, NODE_IP for pods (configs.in_cluster_api_env). The
                # self-signed serving certificate names the advertise address (NODE_IP) and
                # "localhost"; the controller manager publishes it as kube-root-ca.crt.
                "--bind-address",
                "0.0.0.0",
                "--advertise-address",
                NODE_IP,
                "--secure-port",
                str(API_SERVER_PORT),
                "--cert-dir",
                str(self.pki.cert_dir),
                "--service-cluster-ip-range",
                "10.96.0.0/16",
                "--token-auth-file",
                str(self.pki.token_file),
                "--service-account-issuer",
                "https://kubernetes.default.svc",
                "--service-account-key-file",
                str(self.pki.sa_pub),
                "--service-account-signing-key-file",
                str(self.pki.sa_key),
                # As kubeadm sets it: a pod's service account may do only what RBAC grants
                # (a chart's ClusterRole is tested for real). The admin token, which the
                # kubelet, scheduler and controller manager use too, is in system:masters.
                "--authorization-mode",
                "Node,RBAC",
                "--allow-privileged=true",
                # No service proxy runs here, so the kubernetes Service's ClusterIP leads
                # nowhere whatever its endpoints; pods use NODE_IP directly instead.
                "--endpoint-reconciler-type",
                "none",
                "--kubelet-preferred-address-types",
                "InternalIP",
            ],
        )
        wait_for(
            "API server /readyz",
            lambda: self.kubectl("get", "--raw", "/readyz") == "ok",
            START_TIMEOUT_S,
            interval=0.5,
            diagnose=lambda: self.processes["kube-apiserver"].tail(),
        )

    def _controllers(self) -> None:
        kubeconfig = str(self.pki.kubeconfig)
        auth = [
            "--kubeconfig",
            kubeconfig,
            "--authentication-kubeconfig",
            kubeconfig,
            "--authorization-kubeconfig",
            kubeconfig,
            "--leader-elect=false",
            "--bind-address",
            "127.0.0.1",
        ]
        self.spawn(
            "kube-controller-manager",
            [
                "kube-controller-manager",
                *auth,
                "--secure-port",
                "10257",
                "--service-account-private-key-file",
                str(self.pki.sa_key),
                "--root-ca-file",
                str(self.pki.cert_dir / "apiserver.crt"),
                "--use-service-account-credentials=false",
            ],
        )
        self.spawn("kube-scheduler", ["kube-scheduler", *auth, "--secure-port", "10259"])

    def _containerd(self) -> None:
        config = self.state / "containerd.toml"
        template = CONTAINERD_16_CONFIG if self.legacy else CONTAINERD_CONFIG
        config.write_text(template.format(cni=artifacts.CNI_DIR))
        (self.state / "cni.conflist").write_text(json.dumps(CNI_CONFIG))
        self.node.run(
            ["cp", str(self.state / "cni.conflist"), "/etc/cni/net.d/10-realnode.conflist"]
        )
        self.spawn("containerd", ["containerd", "--config", str(config)])
        ctr = [
            str(self.runtime_bin_dir / "ctr"),
            "--address",
            "/run/containerd/containerd.sock",
            "-n",
            "k8s.io",
        ]
        wait_for(
            "containerd",
            lambda: self.node.run([*ctr, "version"], timeout=30),
            START_TIMEOUT_S,
            interval=0.5,
            diagnose=lambda: self.processes["containerd"].tail(),
        )
        for archive in (self.arts.pause, self.arts.busybox, self.arts.plugin):
            self.node.run([*ctr, "images", "import", "--digests", str(archive)])

    def _kubelet(self) -> None:
        self._make_cgroup_root()
        config = self.state / "kubelet.yaml"
        config.write_text(yaml.safe_dump(kubelet_config(self.cgroup_root)))
        self.spawn(
            "kubelet",
            [
                "kubelet",
                "--config",
                str(config),
                "--kubeconfig",
                str(self.pki.kubeconfig),
                "--hostname-override",
                NODE_NAME,
                "--node-ip",
                NODE_IP,
                "--v",
                "2",
            ],
        )

    def start_kubelet(self) -> None:
        self._kubelet()

    def _make_cgroup_root(self) -> None:
        """The kubelet wants its cgroup root to exist; cpuset needs values to admit tasks."""
        for hierarchy in CGROUP_FS.iterdir():
            if not hierarchy.is_dir() or hierarchy.name == "unified":
                continue
            directory = hierarchy / self.cgroup_root.strip("/")
            directory.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (directory / name).exists() and not (directory / name).read_text().strip():
                    (directory / name).write_text((hierarchy / name).read_text())

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        self.node.stop()
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.launcher.wait(30)
        self.processes.clear()
        self._remove_cgroups()

    def _remove_cgroups(self) -> None:
        if not getattr(self, "cgroup_root", ""):
            return
        for hierarchy in CGROUP_FS.iterdir():
            top = hierarchy / self.cgroup_root.strip("/")
            if not top.is_dir():
                continue
            # Bottom-up; a cgroup whose last task is still exiting refuses for a moment.
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for directory in [*dirs, top]:
                with contextlib.suppress(FileNotFoundError):
                    wait_for(f"removable cgroup {directory}", lambda d=directory: _rmdir(d), 30)

    # ------------------------------------------------------------------ tools
    def _on_node_network(self, *argv: str) -> list[str]:
        """``argv`` run in the node's network namespace only (the host's mounts: the tools
        live in the repository, their state in the test's directory)."""
        return ["nsenter", "--target", str(self.node.init_pid), "--net", "--", *argv]

    def _run_on_node_network(
        self,
        argv: Sequence[str],
        timeout: float,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return run_captured(self._on_node_network(*argv), timeout, env, input)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> str:
        """The real kubectl, on the node's network, with the admin kubeconfig."""
        argv = [str(KUBECTL), "--kubeconfig", str(self.pki.kubeconfig), *args]
        done = self._run_on_node_network(argv, timeout, input=input)
        if done.returncode != 0:
            if not check:
                return ""
            raise ClusterError(f"kubectl {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout.strip()

    def kubectl_stream(self, *args: str) -> subprocess.Popen[str]:
        """A long-running kubectl (``--watch``) whose output the caller reads."""
        argv = self._on_node_network(str(KUBECTL), "--kubeconfig", str(self.pki.kubeconfig), *args)
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def helm(self, *args: str, timeout: float = 300) -> str:
        home = self.state / "helm"
        env = {
            "PATH": SYSTEM_PATH,
            "HOME": str(home),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
            "KUBECONFIG": str(self.pki.kubeconfig),
        }
        done = self._run_on_node_network([str(HELM), *args], timeout, env=env)
        if done.returncode != 0:
            raise ClusterError(f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    # ------------------------------------------------------------------ the chart
    def sim_values(self, extra_env: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
        """Chart values that point the plugin at the simulated node (documented values);
        ``extra_env``: more entries of the plugin container's ``extraEnv`` (a values file
        cannot add to a list, only replace it), e.g. ``configs.in_cluster_api_env()``."""
        root = str(self.sim.root)
        return {
            "devicePlugin": {
                "extraVolumes": [
                    {"name": "simulated-node", "hostPath": {"path": root, "type": "Directory"}}
                ],
                "containers": {
                    "plugin": {
                        "extraEnv": [
                            {"name": "SYSFS_ROOT", "value": str(self.sim.sysfs_root)},
                            {"name": "DEV_ROOT", "value": str(self.sim.dev_root)},
                            {"name": "RBLN_SMI_PATH", "value": str(self.sim.smi_path)},
                            *(dict(entry) for entry in extra_env),
                        ],
                        "extraVolumeMounts": [{"name": "simulated-node", "mountPath": root}],
                    }
                },
            },
        }

    def install_chart(
        self,
        release: str = "rbln",
        namespace: str = "kube-system",
        sets: Sequence[str] = (),
        values: Mapping[str, Any] | None = None,
        extra_args: Sequence[str] = (),
        extra_env: Sequence[Mapping[str, str]] = (),
    ) -> str:
        """``helm upgrade --install`` as the README's Quick Start does, on the simulated node.
        ``extra_env``: see ``sim_values``."""
        repository, tag = self.arts.plugin_image.rsplit(":", 1)
        files = []
        for index, doc in enumerate((self.sim_values(extra_env), values or {})):
            path = self.state / f"values-{release}-{index}.yaml"
            path.write_text(yaml.safe_dump(doc))
            files += ["-f", str(path)]
        return self.helm(
            "upgrade",
            "--install",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--set",
            f"image.repository={repository}",
            "--set",
            f"image.tag={tag}",
            "--set",
            "image.pullPolicy=Never",
            *files,
            *(arg for s in sets for arg in ("--set", s)),
            *extra_args,
        )

    def uninstall_chart(self, release: str = "rbln", namespace: str = "kube-system") -> str:
        return self.helm("uninstall", release, "--namespace", namespace, "--wait")

    # ------------------------------------------------------------------ observations
    def node_object(self) -> Any:
        return self.kubectl_json("get", "node", NODE_NAME)

    def node_ready(self) -> bool:
        node = self.kubectl_json("get", "node", NODE_NAME)
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]
        )

    def allocatable(self) -> dict[str, int]:
        """The node's rebellions.ai/* allocatable, as `kubectl get nodes` shows it."""
        raw = self.kubectl("get", "node", NODE_NAME, "-o", "jsonpath={.status.allocatable}")
        return {
            k: int(v) for k, v in json.loads(raw or "{}").items() if k.startswith("rebellions.ai/")
        }

    def pods(self, namespace: str, selector: str = "") -> list[Any]:
        args = ["get", "pods", "-n", namespace] + (["-l", selector] if selector else [])
        return list(self.kubectl_json(*args)["items"])

    def pod_logs(
        self, namespace: str, pod: str, container: str | None = None, previous: bool = False
    ) -> str:
        args = ["logs", "-n", namespace, pod] + (["-c", container] if container else [])
        return self.kubectl(*args, *(["--previous"] if previous else []))

    def plugin_pods(self, namespace: str = "kube-system") -> list[Any]:
        return self.pods(namespace, "app.kubernetes.io/name=k8s-device-plugin-chart")

    def plugin_logs(self, namespace: str = "kube-system") -> dict[str, str]:
        """Each plugin pod's log, by pod name."""
        return {
            p["metadata"]["name"]: self.pod_logs(namespace, p["metadata"]["name"])
            for p in self.plugin_pods(namespace)
        }

    def serving_plugins(self) -> list[int]:
        """PIDs of this node's plugin processes that own a listening socket in the kubelet's
        device-plugin directory: the instances serving this node right now. Only this
        node's: another cluster's plugin (make test runs two side by side) listens on the
        same path in its own mount namespace."""
        prefix = "/var/lib/kubelet/device-plugins/rbln-device-plugin-"
        serving = []
        for pid in self.processes_in_node():
            entry = Path(f"/proc/{pid}")
            try:
                if b"rbln-device-plugin" not in (entry / "cmdline").read_bytes():
                    continue
                listening = {
                    fields[6]
                    for line in (entry / "net" / "unix").read_text().splitlines()[1:]
                    if len(fields := line.split()) >= 8
                    and fields[7].startswith(prefix)
                    and fields[3] == "00010000"  # __SO_ACCEPTCON: listening
                }
                if not listening:
                    continue
                fds = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
            except OSError:  # exited meanwhile
                continue
            if {f"socket:[{inode}]" for inode in listening} & fds:
                serving.append(pid)
        return sorted(serving)

    def processes_in_node(self) -> dict[int, tuple[str, int]]:
        """Every process of the node but its init, as PID: (program name, resident KiB):
        those in its PID namespace and those below them (containers have namespaces of
        their own). Nothing once the node is gone (a Ctrl-C reaches its processes too)."""
        try:
            node_ns = os.readlink(f"/proc/{self.node.init_pid}/ns/pid")
        except FileNotFoundError:
            return {}
        procs: dict[int, tuple[int, str, int, bool]] = {}  # pid -> ppid, name, KiB, in ns
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = dict(
                    line.split(":", 1) for line in (entry / "status").read_text().splitlines()
                )
                in_ns = os.readlink(entry / "ns" / "pid") == node_ns
            except (OSError, ValueError):
                continue
            rss = int(fields.get("VmRSS", "0 kB").split()[0])
            procs[int(entry.name)] = (int(fields["PPid"]), fields["Name"].strip(), rss, in_ns)

        def in_node(pid: int) -> bool:
            for _ in range(64):  # a bounded walk up the parents
                found = procs.get(pid)
                if found is None or pid <= 1:
                    return False
                if found[3]:
                    return True
                pid = found[0]
            return False

        return {
            pid: (name, rss)
            for pid, (_, name, rss, _) in procs.items()
            if pid != self.node.init_pid and in_node(pid)
        }

    def memory(self) -> dict[str, float]:
        """Resident MiB of every process in the node (``processes_in_node``), by name."""
        by_name: dict[str, float] = {}
        for name, rss in self.processes_in_node().values():
            by_name[name] = by_name.get(name, 0.0) + rss / 1024
        return dict(sorted(by_name.items(), key=lambda kv: -kv[1]))

    def note_memory(self) -> None:
        """Keep the largest memory() seen (``peak_memory``), for the closing report."""
        now = self.memory()
        if sum(now.values()) > sum(self.peak_memory.values()):
            self.peak_memory = now

    def container_log_files(self, namespace: str, pod_prefix: str, container: str) -> str:
        """The node's own log files of a container (what ``kubectl logs`` serves, readable
        while the kubelet is down): CRI lines ``<time> <stream> <tag> <text>``, as text."""
        pods = self.state / "overlay" / "var-log" / "upper" / "pods"
        lines = []
        for log in sorted(pods.glob(f"{namespace}_{pod_prefix}*/{container}/*.log")):
            for line in log.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)
                if len(parts) == 4:
                    lines.append(parts[3])
        return "\n".join(lines)

    def containerd_log(self) -> str:
        return (self.state / "logs" / "containerd.log").read_text(errors="replace")

    def component_log(self, name: str) -> str:
        return (self.state / "logs" / f"{name}.log").read_text(errors="replace")

    # ------------------------------------------------------------------ CDI
    def cdi_dir(self, which: str = "etc") -> Path:
        """The node's /etc/cdi ("etc") or /var/run/cdi ("run"), as a host path."""
        return self.state / "cdi" / which

    def place_cdi_spec(self, name: str, spec: Mapping[str, Any] | str, which: str = "etc") -> Path:
        path = self.cdi_dir(which) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = spec if isinstance(spec, str) else yaml.safe_dump(dict(spec))
        partial = path.with_name(f".{name}.tmp")
        partial.write_text(text)
        partial.replace(path)
        return path

    def remove_cdi_spec(self, name: str, which: str = "etc") -> None:
        (self.cdi_dir(which) / name).unlink(missing_ok=True)

    # ------------------------------------------------------------------ pods
    def apply(self, manifest: Mapping[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        self.kubectl(
            "delete",
            "pod",
            name,
            "-n",
            namespace,
            "--wait=true",
            "--grace-period=1",
            "--ignore-not-found",
        )

    def pod(self, name: str, namespace: str = "default") -> Any:
        return self.kubectl_json("get", "pod", name, "-n", namespace)

    def wait_pod_phase(
        self, name: str, phase: str, namespace: str = "default", timeout: float = WAIT_TIMEOUT_S
    ) -> Any:
        def reached() -> Any:
            pod = self.pod(name, namespace)
            return pod if pod["status"].get("phase") == phase else None

        return wait_for(
            f"pod {name} {phase}", reached, timeout, diagnose=lambda: self.describe(name, namespace)
        )

    def describe(self, name: str, namespace: str = "default") -> str:
        text = self.kubectl("describe", "pod", name, "-n", namespace, check=False)
        kubelet = self.processes.get("kubelet")
        tail = kubelet.tail(15) if kubelet else "(not running)"
        return f"{text[-3000:]}\n--- kubelet ---\n{tail}"

    def container_cgroup(
        self, pod: Any, container: str = "main", controller: str = "devices"
    ) -> Path:
        """The container's cgroup directory on the host (the kubelet's cgroupfs layout)."""
        status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == container)
        container_id = status["containerID"].split("://", 1)[1]
        top = CGROUP_FS / controller / self.cgroup_root.strip("/")
        found = list(top.rglob(f"pod{pod['metadata']['uid']}/{container_id}"))
        if not found:
            raise ClusterError(f"no cgroup for container {container_id} under {top}")
        return found[0]

    def diagnose(self) -> str:
        parts = [f"--- {name} ---\n{p.tail(12)}" for name, p in self.processes.items()]
        return "\n".join(parts)


def _remove_stale_cgroups() -> None:
    """Cgroup roots a killed earlier run left (its PID in the name is gone), if empty."""
    for top in CGROUP_FS.glob("*/rbln-realnode-*"):
        pid = top.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for directory in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
                if directory.is_dir():
                    _rmdir(directory)
            _rmdir(top)


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def prepare(say: Say, legacy: bool = False) -> artifacts.Artifacts:
    """Build (or find cached) everything the node runs; the images need a node namespace.
    ``legacy``: also the 1.34 kubelet and containerd 1.6 (``Cluster.legacy``).

    The Go builds keep both cores busy; beside them run what mostly waits on the network:
    the busybox and plugin images (debootstrap, buildah's pip) and the module downloads
    of the builds after the first. The pause image needs the Kubernetes module's source."""
    lock = threading.Lock()

    def said(text: str) -> None:
        with lock:
            say(text)

    later = artifacts.GO_TARGETS[1:] + (artifacts.LEGACY_TARGETS if legacy else ())
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="realnode-prepare") as pool:
        images = pool.submit(_busybox_and_plugin_images, said)
        pool.submit(gobuild.prefetch_modules, later, artifacts.cache_root() / "go")
        bin_dir, built = artifacts.go_binaries(said)
        legacy_bin_dir = None
        if legacy:
            legacy_bin_dir, legacy_built = artifacts.go_binaries(
                said, artifacts.LEGACY_TARGETS, "bin-legacy"
            )
            built += legacy_built
        pause, pause_built = artifacts.pause_image(said)
        try:  # a look at cached images takes a moment; a build, minutes
            made = images.result(timeout=2.0)
        except concurrent.futures.TimeoutError:
            said("real node: Go builds done; waiting for the image builds")
            made = images.result()
        busybox, busybox_built, plugin, name, plugin_built = made
    built += [
        n
        for n, b in (
            ("pause", pause_built),
            ("busybox", busybox_built),
            ("plugin image", plugin_built),
        )
        if b
    ]
    return artifacts.Artifacts(bin_dir, pause, busybox, plugin, name, tuple(built), legacy_bin_dir)


def _busybox_and_plugin_images(say: Say) -> tuple[Path, bool, Path, str, bool]:
    busybox, busybox_built = artifacts.busybox_image(say)
    state = Path(tempfile.mkdtemp(prefix="rbln-imgbuild-", dir="/tmp"))
    node = None
    try:
        node = Node(state)

        def in_node(argv: Sequence[str]) -> str:
            node_run = node
            assert node_run is not None
            # The host's network (apt, PyPI), the node's mounts.
            return node_run.run(
                list(argv), net=False, timeout=1800, env={"PATH": SYSTEM_PATH, "HOME": str(state)}
            )

        plugin, name, plugin_built = _with_progress(
            say, "image build", lambda: artifacts.plugin_image(in_node, say)
        )
    finally:
        if node is not None:
            node.stop()
        shutil.rmtree(state, ignore_errors=True)
    return busybox, busybox_built, plugin, name, plugin_built


def _with_progress(say: Say, what: str, work: Callable[[], Any]) -> Any:
    """Run ``work`` with a progress line every 25 s (image builds take minutes cold)."""
    done = threading.Event()
    started = time.monotonic()

    def ticker() -> None:
        while not done.wait(25):
            say(f"real node: {what} still running ({time.monotonic() - started:.0f} s)")

    thread = threading.Thread(target=ticker, daemon=True)
    thread.start()
    try:
        return work()
    finally:
        done.set()
        thread.join()


@contextlib.contextmanager
def running_cluster(
    layout: Layout,
    say: Say = print,
    arts: artifacts.Artifacts | None = None,
    legacy: bool = False,
) -> Iterator[Cluster]:
    """A started cluster behind a simulated node of ``layout``; torn down on any exit.
    ``legacy``: the 1.34 kubelet with containerd 1.6 (``Cluster.legacy``)."""
    arts = arts or prepare(say, legacy)
    state = Path(tempfile.mkdtemp(prefix="rbln-realnode-", dir="/tmp"))
    cluster = Cluster(state, arts, say, legacy=legacy)
    try:
        cluster.start(layout)
        yield cluster
    finally:
        with contextlib.suppress(AttributeError):
            cluster.stop()
        if os.environ.get("RBLN_REALNODE_KEEP"):
            say(f"real node: state kept in {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)
