"""Static checks of the container image sources, and the lock file's generator.

    python deployments/container/checks.py lock        # regenerate requirements.lock (PyPI)
    python deployments/container/checks.py lock-fresh  # offline: lock matches pyproject.toml
    python deployments/container/checks.py labels      # final stage carries every label
    python deployments/container/checks.py no-pip      # final stage drops pip and setuptools

Only `lock` needs a network (uv resolves against PyPI). The freshness check compares a
digest of pyproject.toml's runtime requirements, recorded in the lock's header, and checks
each pin against those requirements; it never re-resolves, so a new upstream release does
not make an unchanged lock "stale".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PYTHON_VERSION = "3.11"  # the image's interpreter (python:3.11-slim-bookworm)
DIGEST_PREFIX = "# inputs-sha256: "
REGENERATE = "make -f deployments/container/Makefile lock"

# Labels the final stage must set: OCI annotations plus the ones OpenShift bundles read.
REQUIRED_LABELS = (
    "org.opencontainers.image.title",
    "org.opencontainers.image.description",
    "org.opencontainers.image.licenses",
    "org.opencontainers.image.vendor",
    "org.opencontainers.image.version",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.source",
    "io.k8s.display-name",
    "name",
    "vendor",
    "version",
    "release",
    "summary",
    "description",
)


class CheckError(Exception):
    pass


def runtime_inputs(pyproject: Path) -> tuple[list[str], str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return sorted(project.get("dependencies", [])), project.get("requires-python", "")


def inputs_digest(pyproject: Path) -> str:
    dependencies, requires_python = runtime_inputs(pyproject)
    inputs = {"dependencies": dependencies, "requires-python": requires_python}
    canonical = json.dumps({**inputs, "python": PYTHON_VERSION}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (pinned version, hashes). Continuation lines are joined first."""
    pins: dict[str, tuple[str, list[str]]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^;\s]+)", words[0])
        if match is None:
            raise CheckError(f"not an exact pin: {words[0]!r}")
        name = canonicalize_name(match.group(1))
        if name in pins:
            raise CheckError(f"{name} is pinned twice")
        hashes = [w.split("=", 1)[1] for w in words[1:] if w.startswith("--hash=")]
        if not hashes or not all(h.startswith("sha256:") for h in hashes):
            raise CheckError(f"{name}=={match.group(2)} has no sha256 hash")
        pins[name] = (match.group(2), hashes)
    return pins


def check_lock(pyproject: Path, lock: Path) -> str:
    if not lock.is_file():
        raise CheckError(f"{lock} is missing; run `{REGENERATE}`")
    text = lock.read_text()
    recorded = next(
        (line[len(DIGEST_PREFIX) :].strip() for line in text.splitlines()
         if line.startswith(DIGEST_PREFIX)),
        None,
    )  # fmt: skip
    if recorded != inputs_digest(pyproject):
        raise CheckError(
            f"{lock.name} was generated from other runtime requirements than pyproject.toml "
            f"now declares; run `{REGENERATE}`"
        )
    pins = parse_lock(text)
    dependencies, _ = runtime_inputs(pyproject)
    for spec in dependencies:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        if name not in pins:
            raise CheckError(f"{requirement.name} is required but not in {lock.name}")
        version = pins[name][0]
        if not requirement.specifier.contains(version, prereleases=True):
            raise CheckError(f"{lock.name} pins {name}=={version}, outside {requirement}")
    return f"{lock.name}: {len(pins)} pinned packages, current with pyproject.toml"


def generate_lock(pyproject: Path, lock: Path, uv: str) -> str:
    command = [
        uv, "pip", "compile", str(pyproject.name),
        "--generate-hashes", "--no-header",
        "--python-version", PYTHON_VERSION, "--python-platform", "linux",
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=pyproject.parent, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise CheckError(f"uv pip compile failed:\n{done.stderr}")
    header = (
        "# Runtime requirements of the container image, with hashes. Generated from\n"
        "# pyproject.toml by uv; do not edit. Regenerate with:\n"
        f"#   {REGENERATE}\n"
        f"{DIGEST_PREFIX}{inputs_digest(pyproject)}\n"
    )
    lock.write_text(header + done.stdout)
    return f"wrote {lock} ({len(parse_lock(done.stdout))} packages)"


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """Instructions per build stage as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    result: list[list[tuple[str, str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, args = line.partition(" ")
        if op.upper() == "FROM":
            result.append([])
        if result:
            result[-1].append((op.upper(), args.strip()))
    return result


def final_labels(dockerfile: Path) -> dict[str, str]:
    labels: dict[str, str] = {}
    for op, args in stages(dockerfile)[-1]:
        if op == "LABEL":
            try:
                items = shlex.split(args)
            except ValueError as exc:
                raise CheckError(f"cannot read LABEL {args!r}: {exc}") from None
            for item in items:
                key, _, value = item.partition("=")
                labels[key] = value
    return labels


def check_labels(dockerfile: Path) -> str:
    labels = final_labels(dockerfile)
    missing = [key for key in REQUIRED_LABELS if not labels.get(key)]
    if missing:
        raise CheckError(f"final stage of {dockerfile.name} lacks labels: {', '.join(missing)}")
    return f"{dockerfile.name}: final stage sets all {len(REQUIRED_LABELS)} required labels"


def check_no_pip(dockerfile: Path) -> str:
    final = stages(dockerfile)[-1]
    runs = " && ".join(args for op, args in final if op == "RUN")
    if not re.search(r"pip uninstall -y pip setuptools\b", runs):
        raise CheckError(f"final stage of {dockerfile.name} does not uninstall pip and setuptools")
    if "ensurepip/_bundled" not in runs:
        raise CheckError(f"final stage of {dockerfile.name} keeps ensurepip's bundled pip")
    after = runs.split("pip uninstall", 1)[1]
    if re.search(r"pip[0-9.]* install", after) or "ensurepip" in after.replace(
        "ensurepip/_bundled", ""
    ):
        raise CheckError(f"final stage of {dockerfile.name} installs packages after removing pip")
    return f"{dockerfile.name}: final stage ships without pip or setuptools"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=["lock", "lock-fresh", "labels", "no-pip"])
    parser.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    parser.add_argument("--lock", type=Path, default=HERE / "requirements.lock")
    parser.add_argument("--dockerfile", type=Path, default=HERE / "Dockerfile")
    parser.add_argument("--uv", default=os.environ.get("UV", "uv"))
    args = parser.parse_args(argv)
    try:
        if args.check == "lock":
            message = generate_lock(args.pyproject, args.lock, args.uv)
        elif args.check == "lock-fresh":
            message = check_lock(args.pyproject, args.lock)
        elif args.check == "labels":
            message = check_labels(args.dockerfile)
        else:
            message = check_no_pip(args.dockerfile)
    except CheckError as exc:
        print(f"{args.check}: {exc}", file=sys.stderr)
        return 1
    print(message)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
