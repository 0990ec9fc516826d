"""What the real node runs, built once and cached by a digest of what it is made of.

- The pinned Go binaries (``go/``): the Kubernetes control plane and kubelet, containerd
  with ``ctr`` and its runc shim, etcd. Built by ``tests.gobuild`` like the kubelet peer.
- The sandbox ("pause") image, from the pinned Kubernetes module's own ``pause.c``.
- A busybox image for the consumer pods (Debian's ``busybox-static``).
- The plugin's image, from ``deployments/container/Dockerfile`` with buildah, on a Debian
  base made with debootstrap (``BASE`` build argument; no registry is reachable).

Images are OCI archives that ``ctr images import`` loads into the node's containerd.
Image builds run in the node's mount namespace (``Node.host_net``), so buildah's and
debootstrap's writes outside the cache land in the node's overlays, never on the host.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .. import gobuild

HERE: Final = Path(__file__).parent
REPO: Final = HERE.parent.parent
GO_DIR: Final = HERE / "go"
KUBERNETES_VERSION: Final = "v1.37.2"
CONTAINERD_VERSION: Final = "v2.4.2"
ETCD_VERSION: Final = "v3.7.0"
PAUSE_IMAGE: Final = "registry.k8s.io/pause:3.10.2"
BUSYBOX_IMAGE: Final = "localhost/rbln-e2e/busybox:1"
PLUGIN_REPOSITORY: Final = "localhost/rbln-device-plugin"
DEBIAN_SUITE: Final = "bookworm"
DEBIAN_MIRROR: Final = "http://deb.debian.org/debian"
HOST_CA_BUNDLE: Final = "/etc/ssl/certs/ca-certificates.crt"
STALE_ARCHIVE_S: Final = 3600.0
# The base replaces python:3.11-slim-bookworm: Debian's Python 3.11 with pip from its own
# ensurepip (so the Dockerfile's `pip uninstall pip setuptools wheel` works as there).
BASE_PACKAGES: Final = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
# Everything the image is built from (deployments/container/Dockerfile.dockerignore).
IMAGE_INPUTS: Final = (
    "deployments/container/Dockerfile",
    "deployments/container/requirements.lock",
    "deployments/container/entrypoint.sh",
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "src",
)
LEGACY_KUBERNETES_VERSION: Final = "v1.34.0"
LEGACY_CONTAINERD_VERSION: Final = "v1.6.20"


def kube_ldflags(version: str) -> str:
    """The version the release build stamps in: helm checks the chart's kubeVersion
    against it, and `kubectl get nodes` shows it."""
    return (
        gobuild.STRIP_LDFLAGS
        + " "
        + " ".join(
            f"-X k8s.io/component-base/version.{key}={value}"
            for key, value in (
                ("gitVersion", version),
                ("gitMajor", version.split(".")[0].lstrip("v")),
                ("gitMinor", version.split(".")[1]),
                ("gitTreeState", "clean"),
            )
        )
    )


def containerd_ldflags(module: str, version: str) -> str:
    return f"-ldflags={gobuild.STRIP_LDFLAGS} -X {module}/version.Version={version}"


STATIC_TAGS: Final = (
    "no_btrfs",
    "no_devmapper",
    "no_zfs",
    "urfave_cli_no_docs",
    "osusergo",
    "netgo",
    "static_build",
)

GO_TARGETS: Final = (
    gobuild.GoTarget(
        name=f"kubernetes-{KUBERNETES_VERSION}",
        module=GO_DIR / "kubernetes",
        binaries=tuple(
            gobuild.GoBinary(f"k8s.io/kubernetes/cmd/{name}", name)
            for name in ("kubelet", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
        ),
        env=gobuild.STATIC_ENV,
        flags=(*gobuild.TRIM, f"-ldflags={kube_ldflags(KUBERNETES_VERSION)}"),
    ),
    gobuild.GoTarget(
        name=f"containerd-{CONTAINERD_VERSION}",
        module=GO_DIR / "containerd",
        binaries=(
            gobuild.GoBinary(
                "github.com/containerd/containerd/v2/cmd/containerd", "containerd", STATIC_TAGS
            ),
            gobuild.GoBinary("github.com/containerd/containerd/v2/cmd/ctr", "ctr", STATIC_TAGS),
            gobuild.GoBinary(
                "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
                "containerd-shim-runc-v2",
                (*STATIC_TAGS, "no_grpc"),
            ),
        ),
        env=gobuild.STATIC_ENV,
        flags=(
            *gobuild.TRIM,
            containerd_ldflags("github.com/containerd/containerd/v2", CONTAINERD_VERSION),
        ),
    ),
    gobuild.GoTarget(
        name=f"etcd-{ETCD_VERSION}",
        module=GO_DIR / "etcd",
        binaries=(gobuild.GoBinary("go.etcd.io/etcd/server/v3", "etcd"),),
        env=gobuild.STATIC_ENV,
        flags=gobuild.TRIM,
    ),
)
# The older pairing (``pytest.mark.realnode(legacy_runtime=True)``): the 1.34 kubelet
# (three minors below the control plane, the skew policy's limit) with containerd 1.6.20,
# the release Debian bookworm ships. Built only when a collected test asks for it.
LEGACY_TARGETS: Final = (
    gobuild.GoTarget(
        name=f"kubelet-{LEGACY_KUBERNETES_VERSION}",
        module=GO_DIR / "kubelet-1.34",
        binaries=(gobuild.GoBinary("k8s.io/kubernetes/cmd/kubelet", "kubelet"),),
        env=gobuild.STATIC_ENV,
        flags=(*gobuild.TRIM, f"-ldflags={kube_ldflags(LEGACY_KUBERNETES_VERSION)}"),
    ),
    gobuild.GoTarget(
        name=f"containerd-{LEGACY_CONTAINERD_VERSION}",
        module=GO_DIR / "containerd-1.6",
        binaries=tuple(
            gobuild.GoBinary(f"github.com/containerd/containerd/cmd/{name}", name, STATIC_TAGS)
            for name in ("containerd", "ctr", "containerd-shim-runc-v2")
        ),
        env=gobuild.STATIC_ENV,
        flags=(
            *gobuild.TRIM,
            containerd_ldflags("github.com/containerd/containerd", LEGACY_CONTAINERD_VERSION),
        ),
    ),
)

# Debian packages the node needs (installed by `make e2e` / .ci/run).
HOST_TOOLS: Final = {
    "runc": "runc",
    "buildah": "buildah",
    "debootstrap": "debootstrap",
    "umoci": "umoci",
    "busybox": "busybox-static",
    "gcc": "gcc",
    "openssl": "openssl",
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
}
CNI_DIR: Final = Path("/usr/lib/cni")  # containernetworking-plugins
CNI_PLUGINS: Final = ("macvlan", "host-local", "loopback")

Say = Callable[[str], None]
# Runs argv on the host network inside the node's mount namespace.
InNode = Callable[[Sequence[str]], str]


def cache_root() -> Path:
    return gobuild.cache_root("realnode", "RBLN_REALNODE_CACHE")


def missing_host_tools() -> list[str]:
    """Debian packages whose commands are not installed."""
    missing = {pkg for cmd, pkg in HOST_TOOLS.items() if shutil.which(cmd) is None}
    if any(not (CNI_DIR / p).is_file() for p in CNI_PLUGINS):
        missing.add("containernetworking-plugins")
    return sorted(missing)


@dataclass(frozen=True)
class Artifacts:
    bin_dir: Path  # every Go binary, side by side (one PATH entry)
    pause: Path
    busybox: Path
    plugin: Path  # the plugin image archive
    plugin_image: str  # its name:tag
    built: tuple[str, ...]  # what was built now (empty: everything came from the cache)
    # The 1.34 kubelet and containerd 1.6 with ctr and its shim (LEGACY_TARGETS), when
    # a test asked for them.
    legacy_bin_dir: Path | None = None


def go_binaries(
    say: Say, targets: Sequence[gobuild.GoTarget] = GO_TARGETS, link_dir: str = "bin"
) -> tuple[Path, list[str]]:
    """The targets' binaries linked into one directory; the names of those built now."""
    root = cache_root()
    built = []
    bin_dir = root / link_dir
    bin_dir.mkdir(parents=True, exist_ok=True)
    for target in targets:
        directory, seconds, was_cached = gobuild.build(target, root / "go", say)
        if not was_cached:
            built.append(f"{target.name} ({seconds:.0f} s)")
        for binary in target.binaries:
            link = bin_dir / binary.name
            link.unlink(missing_ok=True)
            link.symlink_to(directory / binary.name)
    return bin_dir, built


def _digest(*parts: str | bytes | Path) -> str:
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            files = sorted(p for p in part.rglob("*") if p.is_file()) if part.is_dir() else [part]
            for path in files:
                if "__pycache__" in path.parts:
                    continue
                h.update(
                    str(path.relative_to(REPO) if path.is_relative_to(REPO) else path).encode()
                )
                h.update(path.read_bytes())
        else:
            h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _run(argv: Sequence[str], **kwargs: object) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def _umoci_image(
    layout_dir: Path, tag: str, fill: Callable[[Path], None], config: Sequence[str]
) -> None:
    """An OCI image layout holding one single-layer image: ``fill`` writes its rootfs."""
    shutil.rmtree(layout_dir, ignore_errors=True)
    bundle = layout_dir.with_name(layout_dir.name + ".bundle")
    shutil.rmtree(bundle, ignore_errors=True)
    _run(["umoci", "init", "--layout", str(layout_dir)])
    _run(["umoci", "new", "--image", f"{layout_dir}:{tag}"])
    _run(["umoci", "unpack", "--image", f"{layout_dir}:{tag}", str(bundle)])
    fill(bundle / "rootfs")
    _run(["umoci", "repack", "--image", f"{layout_dir}:{tag}", str(bundle)])
    _run(["umoci", "config", "--image", f"{layout_dir}:{tag}", *config])
    shutil.rmtree(bundle, ignore_errors=True)


def _archive(layout_dir: Path, name: str, archive: Path) -> None:
    """Tar the layout with the full image name as the ref, which ``ctr import`` keeps."""
    index_path = layout_dir / "index.json"
    index = json.loads(index_path.read_text())
    for manifest in index["manifests"]:
        manifest.setdefault("annotations", {})["io.containerd.image.name"] = name
    index_path.write_text(json.dumps(index))
    partial = archive.with_name(f".{archive.name}.{os.getpid()}")
    _run(["tar", "-C", str(layout_dir), "-cf", str(partial), "."])
    partial.replace(archive)


def _one_layer_image(
    stem: str,
    source: Path,
    name: str,
    say: Say,
    fill: Callable[[Path], None],
    config: Sequence[str],
) -> tuple[Path, bool]:
    """The cached archive of image ``name``, one layer whose rootfs ``fill`` writes, keyed
    by ``source`` (what it is made of) and the name; whether it was built now."""
    archive = cache_root() / "images" / f"{stem}-{_digest(source, name)}.tar"
    if archive.is_file():
        return archive, False
    say(f"real node: building the {stem} image {name} from {source}")
    archive.parent.mkdir(parents=True, exist_ok=True)
    work = archive.with_suffix(".work")
    work.mkdir(parents=True, exist_ok=True)
    _umoci_image(work / "layout", name.rsplit(":", 1)[1], fill, config)
    _archive(work / "layout", name, archive)
    shutil.rmtree(work, ignore_errors=True)
    return archive, True


def pause_image(say: Say) -> tuple[Path, bool]:
    """The sandbox image, from the pinned Kubernetes module's own ``pause.c``."""
    modcache = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    pause_c = Path(modcache) / f"k8s.io/kubernetes@{KUBERNETES_VERSION}/build/pause/linux/pause.c"

    def fill(rootfs: Path) -> None:
        _run(
            [
                "gcc",
                "-Os",
                "-static",
                "-o",
                str(rootfs / "pause"),
                str(pause_c),
                '-DVERSION="3.10.2"',
            ]
        )

    return _one_layer_image(
        "pause", pause_c, PAUSE_IMAGE, say, fill, ["--config.entrypoint", "/pause"]
    )


def busybox_image(say: Say) -> tuple[Path, bool]:
    """The consumer pods' image: Debian's static busybox with a link for each applet."""
    busybox = Path(shutil.which("busybox") or "/bin/busybox").resolve()

    def fill(rootfs: Path) -> None:
        applets = subprocess.run(
            [str(busybox), "--list"], capture_output=True, text=True, check=True
        ).stdout.split()
        (rootfs / "bin").mkdir(exist_ok=True)
        shutil.copy2(busybox, rootfs / "bin" / "busybox")
        for applet in applets:
            if applet != "busybox":
                (rootfs / "bin" / applet).symlink_to("busybox")
        for directory in ("tmp", "proc", "sys", "dev", "etc"):
            (rootfs / directory).mkdir(exist_ok=True)

    return _one_layer_image(
        "busybox",
        busybox,
        BUSYBOX_IMAGE,
        say,
        fill,
        ["--config.cmd", "/bin/sh", "--config.env", "PATH=/bin"],
    )


def base_image(in_node: InNode, say: Say) -> tuple[Path, bool]:
    """A Debian bookworm + Python 3.11 base as an OCI layout (the Dockerfile's BASE)."""
    layout = (
        cache_root() / "images" / f"base-{_digest(DEBIAN_SUITE, DEBIAN_MIRROR, *BASE_PACKAGES)}"
    )
    if (layout / "index.json").is_file():
        return layout, False
    say(f"real node: debootstrap {DEBIAN_SUITE} with {', '.join(BASE_PACKAGES)} (a few minutes)")
    rootfs = layout.with_suffix(".rootfs")
    bootstrapped = rootfs / ".bootstrapped"
    if not bootstrapped.exists():
        shutil.rmtree(rootfs, ignore_errors=True)
        in_node(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                DEBIAN_SUITE,
                str(rootfs),
                DEBIAN_MIRROR,
            ]
        )
        bootstrapped.touch()
    # pip and setuptools into /usr/local with their RECORD files, as python:3.11-slim has
    # them (Debian disables ensurepip; its python3-venv ships the same wheels).
    (rootfs / "usr/lib/python3.11/EXTERNALLY-MANAGED").unlink(missing_ok=True)
    wheels = sorted(
        f"/usr/share/python-wheels/{w.name}"
        for w in (rootfs / "usr/share/python-wheels").glob("*.whl")
        if w.name.startswith(("pip-", "setuptools-"))
    )
    pip_wheel = next(w for w in wheels if "/pip-" in w)
    in_node(
        [
            "chroot",
            str(rootfs),
            "python3",
            f"{pip_wheel}/pip",
            "install",
            "--no-index",
            "--no-cache-dir",
            *wheels,
        ]
    )
    in_node(["chroot", str(rootfs), "apt-get", "clean"])
    bootstrapped.unlink()
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
    partial = layout.with_name(f".{layout.name}.{os.getpid()}")

    def fill(target: Path) -> None:
        in_node(["cp", "-a", f"{rootfs}/.", str(target)])

    _umoci_image(
        partial,
        DEBIAN_SUITE,
        fill,
        [
            "--config.env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--config.env",
            "LANG=C.UTF-8",
            "--config.cmd",
            "python3",
        ],
    )
    shutil.rmtree(layout, ignore_errors=True)
    partial.rename(layout)
    shutil.rmtree(rootfs, ignore_errors=True)
    return layout, True


def plugin_image(in_node: InNode, say: Say) -> tuple[Path, str, bool]:
    """The plugin's image from the project's Dockerfile, on the debootstrap base."""
    base, _ = base_image(in_node, say)
    tag = _digest(base / "index.json", *(REPO / p for p in IMAGE_INPUTS))
    name = f"{PLUGIN_REPOSITORY}:e2e-{tag}"
    archive = cache_root() / "images" / f"plugin-{tag}.tar"
    if archive.is_file():
        os.utime(archive)  # in use: see the pruning below
        return archive, name, False
    say(f"real node: building {name} from deployments/container/Dockerfile with buildah")
    storage = cache_root() / "buildah"
    common = [
        "buildah",
        "--root",
        str(storage / "root"),
        "--runroot",
        str(storage / "run"),
        "--storage-driver",
        "vfs",
    ]
    # buildah 1.28 takes no transport in FROM: the base goes into its store by name.
    base_name = f"localhost/rbln-e2e/base:{base.name.removeprefix('base-')}"
    # It also names a pulled layout after its path, which must then be a valid reference
    # (no ".cache"): pull it through a plain-named link.
    # (mkdtemp's random part may hold "_" next to "-", which a reference refuses.)
    link_dir = Path(f"/tmp/rbln-e2e-base-{os.getpid()}")
    shutil.rmtree(link_dir, ignore_errors=True)
    link_dir.mkdir(mode=0o700)
    try:
        (link_dir / "base").symlink_to(base)
        pulled = in_node([*common, "pull", "--quiet", f"oci:{link_dir}/base:{DEBIAN_SUITE}"])
    finally:
        shutil.rmtree(link_dir)
    in_node([*common, "tag", pulled.split()[-1], base_name])
    in_node(
        [
            *common,
            "bud",
            "--isolation",
            "chroot",
            "--pull=never",
            # The host's CA bundle for pip's downloads (a TLS-intercepting egress proxy
            # has its own CA); Debian's pip reads the system bundle. Not part of the image.
            "--volume",
            f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro",
            "--build-arg",
            f"BASE={base_name}",
            "--build-arg",
            "VERSION=0.1.0",
            "-f",
            str(REPO / "deployments/container/Dockerfile"),
            "-t",
            name,
            str(REPO),
        ]
    )
    partial = archive.with_name(f".{archive.name}.{os.getpid()}")
    in_node([*common, "push", name, f"oci-archive:{partial}:{name}"])
    partial.replace(archive)
    # Keep the cache to the base and this archive: vfs storage copies every layer whole.
    in_node([*common, "rmi", name])
    # Only archives unused for an hour: another checkout's run on this machine may be
    # about to import its own archive.
    for stale in archive.parent.glob("plugin-*.tar"):
        with contextlib.suppress(FileNotFoundError):
            if stale != archive and time.time() - stale.stat().st_mtime > STALE_ARCHIVE_S:
                stale.unlink()
    return archive, name, True
