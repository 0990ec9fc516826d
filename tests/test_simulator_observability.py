"""The simulator page's metrics and health commands run as printed against the daemon on
a fresh simulated node, and print what the page shows.

As in tests/test_readme_commands.py (whose fixture and helpers this uses): a fresh
directory laid out like a clone, one shell per command in page order, ``serve`` and the
daemon in the background. The page's root becomes a fresh directory of the same length,
and its two ports (the chart's defaults) become free ones, so parallel runs never meet.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from .readme_blocks import commands, mismatch, readme, sections
from .test_readme_commands import (
    BANNER_END,
    REGISTERED,
    RUN_ELSEWHERE,
    Background,
    environment,
    start,
)
from .test_readme_commands import fresh as fresh

REPO = Path(__file__).resolve().parent.parent
PAGE = "docs/simulator.md"
ROOT = "/tmp/rbln-obs"
PORTS = ("51515", "9464")
TIMEOUT_S = 120.0


def fresh_root() -> str:
    """A new directory as long as the page's root, so wrapped lines stay as printed."""
    while True:
        candidate = "/tmp/" + secrets.token_hex(16)[: len(ROOT) - len("/tmp/")]
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def test_the_page_names_the_charts_ports() -> None:
    text = sections(readme(REPO / PAGE), (RUN_ELSEWHERE[PAGE],))[RUN_ELSEWHERE[PAGE]]
    assert "--healthcheck-port 51515" in text and "--metrics-port 9464" in text
    values = (REPO / "deployments/helm/k8s-device-plugin-chart/values.yaml").read_text()
    assert "healthcheckPort: 51515" in values and "port: 9464" in values


@pytest.mark.slow  # a serve, a daemon and a curl per command
def test_metrics_and_health_commands_run_as_printed(fresh: Path) -> None:
    title = RUN_ELSEWHERE[PAGE]
    found = commands(sections(readme(REPO / PAGE), (title,))[title], title)
    assert len(found) >= 6
    root = fresh_root()
    replacements = {ROOT: root, **{port: free_port() for port in PORTS}}

    def mapped(text: str) -> str:
        for old, new in replacements.items():
            text = text.replace(old, new)
        return text

    env = environment(fresh)
    background: list[Background] = []
    try:
        for command in found:
            script = mapped(command.text)
            if " serve " in script:
                background.append(start(script, fresh, env))
                background[0].wait_for(BANNER_END)
            elif script.startswith(".venv/bin/rbln-device-plugin "):
                background.append(start(script, fresh, env))
                background[0].wait_for(*REGISTERED)
            else:
                done = subprocess.run(
                    ["bash", "-c", script],
                    cwd=fresh,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=TIMEOUT_S,
                    check=False,
                )
                assert done.returncode == command.expected_exit, f"$ {script}\n{done.stdout}"
                shown = tuple(mapped(line) for line in command.shown or ())
                problem = mismatch(shown, done.stdout)
                assert problem is None, f"$ {script}\n{problem}"
        assert len(background) == 2, "the page starts serve and the daemon"
        for process in reversed(background):
            assert process.interrupt() == 0, process.lines[-20:]
    finally:
        for process in background:
            if process.proc.poll() is None:
                process.proc.kill()
                process.proc.wait()
        shutil.rmtree(root, ignore_errors=True)
