"""The hand-over's messages and the holder's decision (pure), and the socket names."""

from __future__ import annotations

import pytest

from rbln_device_plugin.model import handover as proto
from rbln_device_plugin.model.resources import instance_token_of, socket_name

NPU = "rebellions.ai/npu"


@pytest.mark.parametrize(
    "message",
    [
        proto.Hello("kube-system/rbln", 42, "0a1b"),
        proto.Accept(7, "", (True, True, False)),
        proto.Accept(7, "ffff", (True,)),
        proto.Refuse("why"),
        proto.Serving(),
        proto.Leaving(),
    ],
)
def test_every_message_reads_back_as_sent(message: proto.Message) -> None:
    line = proto.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert proto.decode(line[:-1]) == message


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"[]",
        b'{"kind":"hello","installation":"a","pid":1,"token":"0a1b"}',  # no version
        b'{"version":1,"kind":"hello","installation":"a","pid":0,"token":"0a1b"}',
        b'{"version":1,"kind":"hello","installation":"a","pid":true,"token":"0a1b"}',
        b'{"version":1,"kind":"hello","installation":"a","pid":1,"token":""}',
        b'{"version":1,"kind":"hello","installation":"a","pid":1,"token":"../x"}',
        b'{"version":1,"kind":"accept","pid":1,"token":"","locks":[1]}',
        b'{"version":1,"kind":"other"}',
        b"x" * (proto.MAX_LINE + 1),
    ],
)
def test_anything_else_is_a_protocol_error(line: bytes) -> None:
    with pytest.raises(proto.ProtocolError):
        proto.decode(line)


def test_only_the_same_installation_takes_over_and_one_at_a_time() -> None:
    hello = proto.Hello("kube-system/rbln", 42, "0a1b")
    assert proto.answer("kube-system/rbln", hello, busy=False) is None
    assert proto.answer("kube-system/rbln", hello, busy=True) is not None
    assert proto.answer("gpu-operator/rbln", hello, busy=False) is not None
    assert proto.answer("", hello, busy=False) is not None
    assert proto.answer("", proto.Hello("", 42, "0a1b"), busy=False) is not None


def test_socket_names_carry_the_instance_token_and_nothing_else_matches() -> None:
    assert socket_name(NPU) == "rbln-device-plugin-rebellions-ai-npu.sock"
    assert socket_name(NPU, "0a1b") == "rbln-device-plugin-rebellions-ai-npu.0a1b.sock"
    assert instance_token_of(socket_name(NPU, "0a1b")) == "0a1b"
    assert instance_token_of(socket_name(NPU)) == ""
    for foreign in (
        "kubelet.sock",
        "rbln-device-plugin-rebellions-ai-npu.0A1B.sock",
        "rbln-device-plugin-rebellions-ai-npu.0a1b2.sock",
        "rbln-device-plugin-other.0a1b.sock",
        "rbln-device-plugin-rebellions-ai-npu.0a1b.sock.bak",
    ):
        assert instance_token_of(foreign) is None, foreign
