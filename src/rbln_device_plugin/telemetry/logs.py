"""One structured log stream on stdout.

The logger is installed before command-line flags are parsed, so its settings come only
from two environment variables. Every record carries ``ts``, ``level``, ``msg`` and the
event's own keys; errors go under ``err``. Records from gRPC's and OpenTelemetry's Python
loggers are bridged into the same stream with ``component=grpc`` / ``component=otel``.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Final, TextIO

import structlog

from rbln_device_plugin.telemetry import logfmt
from rbln_device_plugin.telemetry.logsink import QueuedSink

LEVEL_ENV: Final = "RBLN_DEVICE_PLUGIN_LOG_LEVEL"
FORMAT_ENV: Final = "RBLN_DEVICE_PLUGIN_LOG_FORMAT"
DEFAULT_LEVEL: Final = "info"
DEFAULT_FORMAT: Final = "json"

# Accepted spellings -> stdlib numeric level.
_LEVELS: Final[Mapping[str, int]] = {
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}
FORMATS: Final = ("json", "text")

# structlog method name -> the level word printed in records.
_LEVEL_WORDS: Final[Mapping[str, str]] = {
    "critical": "error",
    "exception": "error",
    "error": "error",
    "warning": "warn",
    "warn": "warn",
    "info": "info",
    "debug": "debug",
}

# gRPC's asyncio layer logs this at debug for nearly every call and server start: it
# says nothing about the daemon and drowned two of every three debug records.
_GRPC_NOISE: Final = ("[_cygrpc] Loaded running loop",)
# A client's undecodable request (garbage instead of protobuf) is the client's fault, but
# grpc.aio logs it as an error with a traceback. It is shown at debug, and as one warn per
# method at most once per window, with the number of repeats in between.
UNDECODABLE_MSG: Final = "Undecodable request from a client; gRPC answered it with an error"
CLIENT_ERROR_WINDOW_S: Final = 60.0
_DECODE_ERROR: Final = re.compile(
    r"Unexpected \[DecodeError\] raised by servicer method \[(?P<method>[^\]]*)\]"
)

# Repeated OpenTelemetry SDK complaints (an unreachable collector retries forever) are
# folded: the same message is emitted at most once per window, with a suppressed count.
OTEL_REPEAT_WINDOW_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class LogSettings:
    level: int
    level_name: str
    format: str
    # (variable, rejected value, fallback) for each invalid setting, logged after install.
    fallbacks: tuple[tuple[str, str, str], ...]


def describe_levels() -> str:
    """The accepted level spellings for help text: "error, warning (or warn), info, debug"."""
    spellings: dict[int, list[str]] = {}
    for name, number in _LEVELS.items():
        spellings.setdefault(number, []).append(name)
    return ", ".join(
        names[0] + "".join(f" (or {alias})" for alias in names[1:]) for names in spellings.values()
    )


def resolve_settings(environ: Mapping[str, str]) -> LogSettings:
    """Read the two logging variables; invalid values fall back to the defaults."""
    fallbacks: list[tuple[str, str, str]] = []
    raw_level = environ.get(LEVEL_ENV, "").strip()
    level_name = raw_level.lower() or DEFAULT_LEVEL
    if level_name not in _LEVELS:
        fallbacks.append((LEVEL_ENV, raw_level, DEFAULT_LEVEL))
        level_name = DEFAULT_LEVEL
    raw_format = environ.get(FORMAT_ENV, "").strip()
    fmt = raw_format.lower() or DEFAULT_FORMAT
    if fmt not in FORMATS:
        fallbacks.append((FORMAT_ENV, raw_format, DEFAULT_FORMAT))
        fmt = DEFAULT_FORMAT
    return LogSettings(_LEVELS[level_name], _LEVEL_WORDS[level_name], fmt, tuple(fallbacks))


def _level_word(_: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
    event_dict["level"] = _LEVEL_WORDS.get(method_name, method_name)
    return event_dict


def _stringify_err(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    err = event_dict.get("err")
    if isinstance(err, BaseException):
        event_dict["err"] = str(err) or type(err).__name__
    return event_dict


def _renderer(fmt: str) -> structlog.typing.Processor:
    if fmt == "text":
        return logfmt.render
    # Compact, like the README's sample records: {"ts":"...","level":"warn",...}.
    return structlog.processors.JSONRenderer(sort_keys=False, default=str, separators=(",", ":"))


DROPPED_MSG: Final = "Log records dropped while stdout was blocked"
FLUSH_TIMEOUT_S: Final = 2.0

# The process-wide sink; replaced by each install() (tests install repeatedly).
_sink: QueuedSink | None = None


class _SinkLogger:
    """structlog's output object: every level goes to the queued sink."""

    def __init__(self, sink: QueuedSink) -> None:
        self._sink = sink

    def msg(self, message: str) -> None:
        self._sink.write(message)

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def _notice_renderer(render: structlog.typing.Processor) -> Callable[[int], str]:
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts")

    def notice(count: int) -> str:
        event = stamp(None, "warning", {})
        event.update(level="warn", msg=DROPPED_MSG, droppedRecords=count)
        return str(render(None, "warning", event))

    return notice


def _stdout_descriptor() -> int:
    """A duplicate of fd 1; /dev/null when the process was started without a stdout."""
    try:
        return os.dup(sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)


def flush(timeout: float = FLUSH_TIMEOUT_S) -> bool:
    """Write out queued records (bounded wait); False when stdout stayed blocked."""
    return _sink.flush(timeout) if _sink is not None else True


def dropped_total() -> int:
    """Records the installed sink has dropped because stdout was blocked."""
    return _sink.dropped_total if _sink is not None else 0


def last_words(message: str, timeout: float, **fields: Any) -> None:
    """One warn record and a bounded flush, from a signal handler just before ``os._exit``.

    The handler may have interrupted this very thread inside the log queue, holding its
    lock: every wait here is bounded, so the exit comes whatever state the queue is in
    (the record may then be lost).
    """
    if _sink is not None:
        _sink.wait_limit = min(timeout, 0.1)
    get_logger().warning(message, **fields)
    flush(timeout)


def install(environ: Mapping[str, str], stream: TextIO | None = None) -> LogSettings:
    """Install the process-wide logger and bridge the stdlib loggers into it."""
    global _sink
    settings = resolve_settings(environ)
    renderer = _renderer(settings.format)
    # The real stdout is written through its own descriptor (see logsink).
    output: TextIO | int = stream if stream is not None else _stdout_descriptor()
    previous, _sink = _sink, QueuedSink(output, _notice_renderer(renderer))
    if previous is not None:
        previous.close(FLUSH_TIMEOUT_S)
    else:
        # Whatever the exit path, queued records get their bounded chance to be written.
        atexit.register(flush)
    out = _SinkLogger(_sink)
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        _level_word,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
    ]
    if settings.level <= logging.DEBUG:
        processors.append(
            structlog.processors.CallsiteParameterAdder(
                [
                    structlog.processors.CallsiteParameter.MODULE,
                    structlog.processors.CallsiteParameter.LINENO,
                ],
                additional_ignores=["rbln_device_plugin.telemetry.logs"],
            )
        )
        processors.append(_caller_field)
    processors += [
        # exc_info=True becomes an "exception" field holding the formatted traceback.
        structlog.processors.format_exc_info,
        _stringify_err,
        structlog.processors.EventRenamer("msg"),
        _order_keys,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(settings.level),
        logger_factory=lambda *_: out,
        cache_logger_on_first_use=False,
    )
    _install_stdlib_bridge(settings.level)
    log = get_logger()
    for variable, rejected, fallback in settings.fallbacks:
        log.warning(
            f"Invalid {variable}, using default",
            variable=variable,
            value=rejected,
            fallback=fallback,
        )
    return settings


def _caller_field(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    module = event_dict.pop("module", None)
    lineno = event_dict.pop("lineno", None)
    if "caller" not in event_dict and module is not None:
        event_dict["caller"] = f"{module}.py:{lineno}"
    return event_dict


def _order_keys(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """ts, level, msg first: a reader scanning raw JSON finds them in the same place.

    The event's own keys follow in the order the call site gave them, which is the order
    the logging catalogue lists them in; added keys (caller, exception) come last.
    """
    ordered: dict[str, Any] = {}
    for key in ("ts", "level", "msg"):
        if key in event_dict:
            ordered[key] = event_dict.pop(key)
    ordered.update(event_dict)
    return ordered


def get_logger(**initial: Any) -> Any:
    """The project's logger. Keys given here are bound to every record it emits."""
    return structlog.get_logger().bind(**initial) if initial else structlog.get_logger()


class _BridgeHandler(logging.Handler):
    """Forwards stdlib records from third-party libraries into the structlog stream."""

    def __init__(self, component: str, *, demote_info: bool, cap_at_warn: bool) -> None:
        super().__init__()
        self._component = component
        self._demote_info = demote_info
        self._cap_at_warn = cap_at_warn
        # (kind, text) -> (start of its window, repeats dropped in it)
        self._last_seen: dict[tuple[str, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a library's malformed format string must not break logging
            message = str(record.msg)
        if self._component == "grpc" and message.startswith(_GRPC_NOISE):
            return
        level = record.levelno
        if self._demote_info and level == logging.INFO:
            level = logging.DEBUG
        if self._cap_at_warn and level > logging.WARNING:
            level = logging.WARNING
        fields: dict[str, Any] = {"component": self._component, "logger": record.name}
        if record.exc_info and record.exc_info[1] is not None:
            fields["err"] = str(record.exc_info[1]) or type(record.exc_info[1]).__name__
        undecodable = _DECODE_ERROR.match(message) if self._component == "grpc" else None
        if undecodable is not None:
            self._client_garbage(message, undecodable.group("method"), fields)
            return
        if self._cap_at_warn and level >= logging.WARNING:
            # The OpenTelemetry SDK's complaints are one kind of event for an operator;
            # its own wording goes under err, and repeats are folded.
            suppressed = self._fold_repeat(("otel", message), OTEL_REPEAT_WINDOW_S)
            if suppressed is None:
                return
            if suppressed:
                fields["suppressedRepeats"] = suppressed
            fields.setdefault("err", message)
            message = "OpenTelemetry SDK error"
        log = get_logger()
        if level >= logging.ERROR:
            log.error(message, **fields)
        elif level >= logging.WARNING:
            log.warning(message, **fields)
        elif level >= logging.INFO:
            log.info(message, **fields)
        else:
            log.debug(message, **fields)

    def _client_garbage(self, message: str, method: str, fields: dict[str, Any]) -> None:
        log = get_logger()
        log.debug(message, **fields, method=method)
        suppressed = self._fold_repeat(("client", method), CLIENT_ERROR_WINDOW_S)
        if suppressed is None:
            return
        repeats = {"suppressedRepeats": suppressed} if suppressed else {}
        log.warning(UNDECODABLE_MSG, **fields, method=method, **repeats)

    def _fold_repeat(self, key: tuple[str, str], window: float) -> int | None:
        """None: drop this repeat. Otherwise how many repeats were dropped before it."""
        now = time.monotonic()
        with self._lock:
            seen = self._last_seen.get(key)
            if seen is not None and now - seen[0] < window:
                self._last_seen[key] = (seen[0], seen[1] + 1)
                return None
            self._last_seen[key] = (now, 0)
            if len(self._last_seen) > 256:  # bounded: messages can embed changing details
                self._last_seen.pop(next(iter(self._last_seen)))
            return seen[1] if seen is not None else 0


def _install_stdlib_bridge(level: int) -> None:
    for name, component, demote, cap in (
        ("grpc", "grpc", True, False),
        ("opentelemetry", "otel", True, True),
    ):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if isinstance(handler, _BridgeHandler):
                logger.removeHandler(handler)
        # Demoted info records need the stdlib gate one notch lower than ours.
        logger.setLevel(logging.DEBUG if level <= logging.DEBUG else logging.WARNING)
        logger.propagate = False
        logger.addHandler(_BridgeHandler(component, demote_info=demote, cap_at_warn=cap))
