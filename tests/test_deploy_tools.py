"""deployments/fetch-tools.sh: skips cleanly without npm, refuses binaries that fail the pin."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "deployments" / "fetch-tools.sh"
if not SCRIPT.is_file():  # e.g. a source tree without deployments/
    pytest.skip("deployments/fetch-tools.sh is not in this source tree", allow_module_level=True)
# What the script needs besides npm; npm itself is provided (or not) per test.
HOST_TOOLS = ("bash", "uname", "mktemp", "rm", "tar", "gzip", "unzip", "sha256sum", "chmod",
              "mkdir", "mv", "dirname", "cat", "cp", "python3")  # fmt: skip


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A scratch repository holding only the script, so .tools/ lands in tmp_path."""
    (tmp_path / "repo" / "deployments").mkdir(parents=True)
    shutil.copy2(SCRIPT, tmp_path / "repo" / "deployments" / "fetch-tools.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in HOST_TOOLS:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return tmp_path / "repo"


def fetch(checkout: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(checkout.parent / "bin"), "HOME": str(checkout.parent)}
    return subprocess.run(
        ["bash", str(checkout / "deployments" / "fetch-tools.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def install_fake_npm(checkout: Path, tarball: Path | None) -> None:
    """An npm whose `pack` drops the given tarball in the current directory (or fails)."""
    npm = checkout.parent / "bin" / "npm"
    action = f'cp "{tarball}" ./package.tgz' if tarball else 'echo "npm must not run" >&2; exit 9'
    npm.write_text(f"#!/bin/sh\n{action}\n")
    npm.chmod(0o755)


def tampered_package(tmp_path: Path) -> Path:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as archive:
        archive.writestr("helm/helm", "#!/bin/sh\necho not helm\n")
        archive.writestr("kubectl/kubectl", "#!/bin/sh\necho not kubectl\n")
    tarball = tmp_path / "fake.tgz"
    with tarfile.open(tarball, "w:gz") as tar:
        info = tarfile.TarInfo("package/lib/layer.zip")
        info.size = len(layer.getvalue())
        tar.addfile(info, io.BytesIO(layer.getvalue()))
    return tarball


def test_without_npm_it_explains_and_leaves_nothing(checkout: Path) -> None:
    done = fetch(checkout)
    assert done.returncode == 0, done.stderr
    assert "npm not found" in done.stderr
    assert "chart tests will be skipped" in done.stderr
    assert not (checkout / ".tools").exists()


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the pinned binaries are x86_64")
def test_binaries_that_differ_from_the_pin_are_refused(checkout: Path, tmp_path: Path) -> None:
    install_fake_npm(checkout, tampered_package(tmp_path))
    done = fetch(checkout)
    assert done.returncode != 0
    assert "checksum mismatch" in done.stderr
    assert not (checkout / ".tools" / "helm").exists()


def test_present_tools_are_not_fetched_again(checkout: Path) -> None:
    helm = checkout / ".tools" / "helm" / "helm"
    helm.parent.mkdir(parents=True)
    helm.write_text("#!/bin/sh\n")
    helm.chmod(0o755)
    install_fake_npm(checkout, None)
    done = fetch(checkout)
    assert done.returncode == 0, done.stderr
    assert "npm must not run" not in done.stderr
