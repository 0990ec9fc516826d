"""The demo's narrative and verdicts: once with the real daemon, then with stand-ins.

The stand-ins exercise each outcome the demo must report: every step OK, a feature
answering UNIMPLEMENTED (SKIPPED), a daemon that never registers (SKIPPED), and one that
crashes (FAILED, non-zero exit). Lines are matched word by word: the narrative's column
padding is presentation, not what it says.
"""

from __future__ import annotations

import io
import re
import shutil
import sys
from pathlib import Path

import pytest

from rbln_device_plugin_sim.demo import DemoConfig, run_demo
from rbln_device_plugin_sim.node import SimNode

# A minimal device plugin speaking the real API: enough to walk through the demo.
FAKE_DAEMON = r"""
import asyncio, json, os, signal, subprocess, sys
import grpc
from grpc import aio
from rbln_device_plugin.api.v1beta1 import api_pb2 as pb, api_pb2_grpc as rpc

args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
SYS, DEV, KDIR, SMI = (args[k] for k in
    ("--sysfs-root", "--dev-root", "--kubelet-device-plugin-path", "--rbln-smi"))
SOCK = "rbln-device-plugin-rebellions-ai-npu.sock"
PREFERRED = os.environ.get("FAKE_PREFERRED", "yes")

def smi(*a):
    return subprocess.run([SMI, *a], capture_output=True, text=True, check=True).stdout

records = json.loads(smi("-j"))["devices"]

def listing():
    out = []
    for r in records:
        try:
            ok = open(f"{SYS}/class/rebellions/{r['device']}/status").read().strip() == "0"
        except OSError:
            ok = True
        out.append(pb.Device(ID=r["device"], health="Healthy" if ok else "Unhealthy"))
    return out

class Plugin(rpc.DevicePluginServicer):
    async def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)
    async def ListAndWatch(self, request, context):
        last = None
        while True:
            now = listing()
            if now != last:
                yield pb.ListAndWatchResponse(devices=now)
                last = now
            await asyncio.sleep(0.1)
    async def GetPreferredAllocation(self, request, context):
        if PREFERRED != "yes":
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not yet")
        req = request.container_requests[0]
        ids = sorted(req.available_deviceIDs, key=lambda i: int(i[4:]))[: req.allocation_size]
        return pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=ids)])
    async def Allocate(self, request, context):
        ids = list(request.container_requests[0].devices_ids)
        npus = [str(r["npu"]) for r in records if r["device"] in ids]
        smi("group", "-c", "1", "-a", ",".join(npus))
        specs = [pb.DeviceSpec(container_path="/dev/rsd0", host_path=f"{DEV}/rsd1",
                               permissions="rw")]
        specs += [pb.DeviceSpec(container_path=f"/dev/{i}", host_path=f"{DEV}/{i}",
                                permissions="rw") for i in ids]
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(
            devices=specs,
            annotations={"cdi.k8s.io/rebellions.ai_npu": "rebellions.ai/npu=runtime"})])

async def serve():
    server = aio.server()
    rpc.add_DevicePluginServicer_to_server(Plugin(), server)
    server.add_insecure_port(f"unix:{KDIR}/{SOCK}")
    await server.start()
    async with aio.insecure_channel(f"unix:{KDIR}/kubelet.sock") as ch:
        await rpc.RegistrationStub(ch).Register(pb.RegisterRequest(
            version="v1beta1", endpoint=SOCK, resource_name="rebellions.ai/npu"), timeout=10)
    return server, os.stat(f"{KDIR}/kubelet.sock").st_ino

async def main():
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    server, inode = await serve()
    while not stop.is_set():
        await asyncio.sleep(0.1)
        try:
            now = os.stat(f"{KDIR}/kubelet.sock").st_ino
        except FileNotFoundError:
            continue
        if now != inode:
            await server.stop(0)
            server, inode = await serve()
    await server.stop(0)

asyncio.run(main())
"""


def says(text: str, *words: str) -> bool:
    """``words`` appear in ``text`` in this order, separated by any amount of blank."""
    return re.search(r"[ \t]+".join(re.escape(w) for w in words), text) is not None


def _config(tmp_path: Path, out: io.StringIO, script: str, **changes: object) -> DemoConfig:
    path = tmp_path / "daemon.py"
    path.write_text(script)

    def command(node: SimNode) -> list[str]:
        return [sys.executable, str(path), *node.daemon_args()]

    values: dict[str, object] = {
        "daemon_command": command,
        "daemon_available": True,
        "out": out,
        "register_timeout": 10.0,
        "health_timeout": 5.0,
        # The stand-in daemons write none of the real daemon's records: do not wait long.
        "records_timeout": 0.2,
    }
    values.update(changes)
    return DemoConfig(**values)  # type: ignore[arg-type]


def test_demo_narrates_every_step_against_a_working_daemon(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_demo(_config(tmp_path, out, FAKE_DAEMON)) == 0, out.getvalue()
    text = out.getvalue()
    assert says(text, "rebellions.ai/npu", "32 devices", "32 Healthy")
    assert says(text, "preferred", "rbln0 rbln1 rbln2 rbln3", "(one card, NUMA 0)")
    assert "/dev/rsd0" in text and "rsd1" in text
    assert "cdi.k8s.io/rebellions.ai_npu=rebellions.ai/npu=runtime" in text
    assert "kubelet sees rbln31 Unhealthy: 31 Healthy, 1 Unhealthy" in text
    # After the restart the plugin registered again, still showing the faulted device.
    assert says(text, "32 devices", "31 Healthy", "1 Unhealthy")
    assert "kubelet.sock recreated" in text
    assert "SKIPPED" not in text and "FAILED" not in text
    assert "7 ok, 0 skipped" in text
    # The real inspect runs first, read-only, and sees what the daemon will advertise.
    assert text.index("[1] Inspect the node before starting the daemon") < text.index(
        "[2] Start the daemon"
    )
    assert says(text, "rebellions.ai/npu", "32", "32", "0\n")
    assert "OK: 32 devices advertised, 0 errors, 0 warnings (exit 0)" in text
    root = text.split("under ")[1].split()[0]
    assert not Path(root).exists()  # the node is removed afterwards


def test_unimplemented_features_are_skipped_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_PREFERRED", "no")
    out = io.StringIO()
    assert run_demo(_config(tmp_path, out, FAKE_DAEMON)) == 0, out.getvalue()
    assert says(out.getvalue(), "SKIPPED", "GetPreferredAllocation is not implemented yet")
    assert "6 ok, 1 skipped" in out.getvalue()


@pytest.mark.parametrize(
    ("on_sigterm", "code", "last"),
    [
        ("signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))", 0, "SIGTERM -> exit code 0"),
        # A daemon that dies of the signal is reported, not hidden.
        ("pass", 1, "FAILED the daemon exited with code -15 after SIGTERM"),
    ],
)
def test_a_daemon_that_never_registers_is_skipped_and_stopped(
    tmp_path: Path, on_sigterm: str, code: int, last: str
) -> None:
    out = io.StringIO()
    sleeper = f"import signal, sys, time\n{on_sigterm}\ntime.sleep(60)\n"
    config = _config(tmp_path, out, sleeper, register_timeout=0.5, stop_timeout=5.0)
    assert run_demo(config) == code, out.getvalue()
    text = out.getvalue()
    assert says(text, "SKIPPED", "rebellions.ai/npu did not register within 0.5 s")
    assert text.count("needs: Register with the kubelet") == 3
    assert says(text, *last.split(" ", 1))


def test_a_crashing_daemon_fails_the_demo_naming_the_step(tmp_path: Path) -> None:
    out = io.StringIO()
    crash = (
        'print(\'{"level": "error", "msg": "Boom", "err": "no devices"}\')\nraise SystemExit(3)\n'
    )
    assert run_demo(_config(tmp_path, out, crash)) == 1
    text = out.getvalue()
    assert says(text, "FAILED", "the daemon exited with code 3 before registering")
    assert says(text, "error", "Boom", 'err="no devices"')
    assert "Demo FAILED at: Register with the kubelet" in text


def test_a_missing_daemon_skips_everything(tmp_path: Path) -> None:
    out = io.StringIO()
    config = _config(tmp_path, out, "", daemon_available=False)
    assert run_demo(config) == 0
    assert "the daemon is not built yet" in out.getvalue()
    assert out.getvalue().count("SKIPPED") == 7


def _steps(text: str) -> dict[str, str]:
    """Step title -> the lines printed under it."""
    out: dict[str, str] = {}
    for chunk in text.split("\n[")[1:]:
        head, _, body = chunk.partition("\n")
        out[head.split("] ", 1)[1]] = body
    return out


def test_the_real_daemon_narrates_each_step_with_its_own_records() -> None:
    out = io.StringIO()
    # The real daemon end to end; the demo's own waits made generous: this test is about
    # what happens, not how fast.
    config = DemoConfig(
        daemon_available=True, out=out, keep=True,
        register_timeout=60.0, health_timeout=60.0, stop_timeout=60.0,
    )  # fmt: skip
    assert run_demo(config) == 0, out.getvalue()
    text = out.getvalue()
    assert "SKIPPED" not in text and "FAILED" not in text, text
    steps_run = len(re.findall(r"^\[\d+\] ", text, re.MULTILINE))
    assert steps_run >= 7 and says(text, f"{steps_run} ok, 0 skipped"), text
    kept = Path(text.split("Kept under ")[1].split(":")[0])
    try:
        node = SimNode.open(kept / "node")
        log = (kept / "node" / "daemon.log").read_text().splitlines()
        steps = _steps(text)
        start = steps["Start the daemon"]
        # The whole command line, every flag, in a form that pastes into a shell.
        shown = start.split("started as:\n")[1].split("\n    its log")[0]
        words = " ".join(shown.replace("\\\n", " ").split())
        assert words.endswith(" ".join(node.daemon_args()))
        assert says(start, "daemon", "info", "Starting rbln-device-plugin")
        assert "Registered device plugin" not in start  # each record under its own step
        register = steps["Register with the kubelet"]
        assert says(register, "info", "Registered device plugin with kubelet", "deviceCount=32")
        assert "... and 31 more 'Device exposed'" in register
        allocate = steps["A pod asks for 4 NPUs"]
        assert says(allocate, "info", "Completed container allocation")
        assert "(/dev/rsd0 is how the container sees rsd1, the RSD group just made" in allocate
        assert "(group 0 is the default group every NPU is in until allocated)" in allocate
        assert says(steps["A device faults"], "warn", "Device state changed", "device=rbln9")
        restart = steps["The kubelet restarts"]
        assert says(restart, "info", "Detected kubelet socket recreation")
        assert says(steps["Stop the daemon"], "info", "Shutdown complete")
        # --keep: the node and the daemon's log stay, and the output says where.
        assert len(log) >= 70 and all(line.startswith("{") for line in log)
        assert says(text, f"rm -r {kept}")
        assert "daemon.log" in text.split("Kept under ")[1]
    finally:
        shutil.rmtree(kept, ignore_errors=True)
    assert "Node removed" not in text


def test_without_keep_the_node_goes_and_the_output_says_how_to_keep_it(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_demo(_config(tmp_path, out, FAKE_DAEMON)) == 0
    text = out.getvalue()
    assert "demo --keep keeps it and the log)" in text
    root = text.split("under ")[1].split()[0]
    assert not Path(root).exists()
