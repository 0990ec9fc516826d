"""The hand-over protocol between two instances of one installation: its messages and
the holder's decision. Pure: bytes in, plain data out (the sockets are ``runtime.handover``'s).

One JSON object per line. The successor opens with ``hello``; the holder answers
``accept`` (with its instance-lock descriptors attached) or ``refuse``. While both live,
the successor says ``serving`` once every resource is registered, and the holder says
``leaving`` when it begins to step down. The end of the connection means the other
process is gone (each keeps it open for as long as it lives).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from rbln_device_plugin.model.resources import INSTANCE_TOKEN_LEN

VERSION: Final = 1
MAX_LINE: Final = 4096  # a hello with the longest installation name is far below this


class ProtocolError(ValueError):
    """A line that is not a message of this protocol."""


@dataclass(frozen=True, slots=True)
class Hello:
    installation: str
    pid: int
    token: str


@dataclass(frozen=True, slots=True)
class Accept:
    pid: int
    token: str  # its sockets' token: "" for the fixed names
    locks: tuple[bool, ...]  # per instance-lock file: whether its descriptor is attached


@dataclass(frozen=True, slots=True)
class Refuse:
    reason: str


@dataclass(frozen=True, slots=True)
class Serving:
    pass


@dataclass(frozen=True, slots=True)
class Leaving:
    pass


Message = Hello | Accept | Refuse | Serving | Leaving


def encode(message: Message) -> bytes:
    body: dict[str, object]
    match message:
        case Hello(installation=installation, pid=pid, token=token):
            body = {"kind": "hello", "installation": installation, "pid": pid, "token": token}
        case Accept(pid=pid, token=token, locks=locks):
            body = {"kind": "accept", "pid": pid, "token": token, "locks": list(locks)}
        case Refuse(reason=reason):
            body = {"kind": "refuse", "reason": reason}
        case Serving():
            body = {"kind": "serving"}
        case Leaving():
            body = {"kind": "leaving"}
    body["version"] = VERSION
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Message:
    """One line (without its newline) as a message; ProtocolError for anything else."""
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a line of {len(line)} bytes")
    try:
        body = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("version") != VERSION:
        raise ProtocolError("not a version 1 message")
    kind = body.get("kind")
    if kind == "hello":
        return Hello(_text(body, "installation"), _pid(body), _token(body))
    if kind == "accept":
        locks = body.get("locks")
        if not isinstance(locks, list) or not all(isinstance(x, bool) for x in locks):
            raise ProtocolError("accept without its locks")
        return Accept(_pid(body), _token(body, fixed=True), tuple(locks))
    if kind == "refuse":
        return Refuse(_text(body, "reason"))
    if kind == "serving":
        return Serving()
    if kind == "leaving":
        return Leaving()
    raise ProtocolError(f"unknown kind {kind!r}")


def _text(body: dict[str, object], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise ProtocolError(f"{key} is not a string")
    return value


def _pid(body: dict[str, object]) -> int:
    pid = body.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise ProtocolError("pid is not a positive integer")
    return pid


def _token(body: dict[str, object], *, fixed: bool = False) -> str:
    """An instance token; with ``fixed`` also "" (a holder on the fixed socket names)."""
    token = _text(body, "token")
    if fixed and not token:
        return token
    if len(token) != INSTANCE_TOKEN_LEN or any(c not in "0123456789abcdef" for c in token):
        raise ProtocolError("token is not an instance token")
    return token


def answer(installation: str, hello: Hello, *, busy: bool) -> Refuse | None:
    """The holder's decision on a hello: None to hand over, else why not.

    Only the same installation takes over while the holder lives: any other (the
    operator's operand beside this chart, an instance with no installation) waits for
    the holder to exit, as every instance did before hand-overs existed. One successor at
    a time: a third instance waits until the hand-over under way has ended.
    """
    if not installation:
        return Refuse("this instance belongs to no installation")
    if hello.installation != installation:
        return Refuse(f"another installation ({installation!r}) serves this node")
    if busy:
        return Refuse("a hand-over to another successor is under way")
    return None
