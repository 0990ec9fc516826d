"""The resolved configuration: one frozen object, validated apart from the daemon.

Every option is a flag with an environment variable and a default; a flag beats its
variable, which beats the default. Nothing outside this module and ``telemetry.logs``
reads the environment (``options`` turns a command line into the flag values).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

from rbln_device_plugin.durations import format_duration, parse_duration
from rbln_device_plugin.goints import GO_FALSE, GO_TRUE, parse_go_bool, parse_go_int
from rbln_device_plugin.model import resources

# Set by the RBLN NPU operator for older plugins; resource names are fixed here.
IGNORED_ENV: Final = "USE_GENERIC_RESOURCE_NAME"
# The same setting as a flag, as the Go plugin's older public release has it (a urfave/cli
# BoolFlag over IGNORED_ENV): accepted so a Go command line runs unchanged; it changes
# nothing either. Its parsed value is ``LEGACY_NAMES_FIELD`` among the flag values.
LEGACY_NAMES_FLAG: Final = "--use-generic-resource-name"
LEGACY_NAMES_FIELD: Final = "use_generic_resource_name"
LEGACY_NAMES_HELP: Final = (
    "accepted for compatibility with the Go plugin's older release, and ignored: resource "
    f"names are fixed ({', '.join(resources.RESOURCE_NAMES)}); a false value logs a warning"
)


def legacy_names_requested(
    environ: Mapping[str, str], flag: str | None = None
) -> tuple[str, str] | None:
    """(setting, value) when the flag, or else IGNORED_ENV, asks for the old per-product
    resource names (gone); the setting is the flag or the variable, as given.

    The flag beats the variable, as in Go. An empty variable is false, as the Go plugin's
    BoolFlag reads it (urfave/cli v2); the flag's value is a Go boolean (``config_from_settings``
    refuses any other)."""
    if flag is not None:
        return (LEGACY_NAMES_FLAG, flag) if flag in GO_FALSE else None
    raw = environ.get(IGNORED_ENV)
    return (IGNORED_ENV, raw) if raw is not None and (raw in GO_FALSE or raw == "") else None


def ignored_env_problem(environ: Mapping[str, str], flag: str | None = None) -> str | None:
    """Why IGNORED_ENV's value is not a boolean (the chart refuses it), or None.

    The variable changes nothing, so a bad value is worth a warning, not a refusal. With
    the flag given the variable is not read (the flag beats it).
    """
    raw = environ.get(IGNORED_ENV)
    # strconv.ParseBool's spellings, exactly; empty is false (see legacy_names_requested).
    if flag is not None or raw is None or raw == "" or raw in GO_TRUE | GO_FALSE:
        return None
    return f"{IGNORED_ENV} (environment): {raw!r} is not a boolean (true or false); ignored"


class ConfigError(ValueError):
    """A setting that cannot be used. The message names the flag or variable that gave it."""


class IgnoredSetting(ValueError):
    """A value that is ignored (with a warning) rather than refused: the default is used."""


# The urfave/cli v2 flag type a setting has (or would have, for one the Go plugin lacks):
# it decides what a variable that is set but empty means (see EMPTY_VARIABLE).
STRING: Final = "string"
INT: Final = "int"
DURATION: Final = "duration"
BOOL: Final = "bool"
# urfave/cli v2.25.3 (the Go plugin's version) reads a variable with syscall.Getenv, so an
# empty one is found; IntFlag.Apply and DurationFlag.Apply then skip it (`if val != ""`),
# keeping the default without a word; BoolFlag.Apply sets false; StringFlag.Apply
# applies the empty text, which the setting's own checks then judge. None: the default.
EMPTY_VARIABLE: Final[Mapping[str, str | None]] = {
    INT: None,
    DURATION: None,
    BOOL: "false",
    STRING: "",
}


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: its flag, environment variable, default text and help."""

    field: str
    flag: str
    env: str
    default: str
    help: str
    metavar: str
    # STRING, INT, DURATION or BOOL: what an empty variable means, and (BOOL) that the
    # flag alone means true and takes no separate value, as in Go's flag package.
    kind: str
    # Turns the raw text (flag, variable or default) into the value; ConfigError if unusable.
    convert: Callable[[str], Any]
    # How --help names the default when the literal default means something else.
    shown_default: str = ""

    @property
    def help_default(self) -> str:
        return self.shown_default or self.default or "(empty)"


DEFAULT_SCAN_INTERVAL_S: Final = 5.0
MAX_SCAN_INTERVAL_S: Final = 24 * 3600.0
DEFAULT_METRICS_EXPORT_INTERVAL_S: Final = 60.0
# Every step of a scan has its own bound (rbln-smi 5 s, each host read 1 s, and a file
# that blocked once fails at once afterwards), so even a node whose every status file
# hangs at the same moment finishes a scan of 100 devices well within this.
DEFAULT_SCAN_STALL_LIMIT_S: Final = 120.0
TRACES_EXPORTERS: Final = ("otlp", "none")
# Floors of the two limits the Go plugin does not have (see stall_limit_floor).
MIN_METRICS_EXPORT_INTERVAL_S: Final = 1.0
MIN_SCAN_STALL_LIMIT_S: Final = 1.0
# How Allocate names the CDI device: the annotation (as the Go plugin), the device plugin
# API's cdi_devices field (kubelet 1.29+, or 1.28 with the DevicePluginCDIDevices gate), or both.
CDI_MODES: Final = ("annotation", "field", "both")
# Which kubelet API the daemon serves: one node runs one (the kubelet refuses an extended
# resource offered both through a device plugin and through a DRA DeviceClass).
MODE_DEVICE_PLUGIN: Final = "device-plugin"
MODE_DRA: Final = "dra"
MODES: Final = (MODE_DEVICE_PLUGIN, MODE_DRA)


def _path(raw: str) -> Path:
    if not raw.strip():
        # Where the Go plugin is given an empty directory it fails at start too
        # (os.MkdirAll("") in its Run).
        raise ConfigError("a path is required")
    if "\x00" in raw:
        raise ConfigError("path contains a NUL byte")
    return Path(raw)


def _host_dir(raw: str) -> Path:
    """A directory the chart mounts from the host: absolute, no ".." (as its schema says)."""
    path = _path(raw)
    if not raw.startswith("/"):
        raise ConfigError(f"{raw!r} is not an absolute path")
    if ".." in raw.split("/"):
        raise ConfigError(f"{raw!r} contains '..'; give the directory itself")
    return path


def _lock_file(raw: str) -> Path:
    """A lock file on the host, in a directory below the root: the daemon creates it (and the
    instance lock beside it, see ``runtime.instancelock``), so ``/`` itself, a top-level
    name such as ``/var`` (whose directory is the root) and a path ending in ``/`` (a
    directory) are refused. What the path holds on disk is looked at when the daemon
    starts (``cli``)."""
    path = _host_dir(raw)
    named = [part for part in raw.split("/") if part not in ("", ".")]
    if len(named) < 2:
        where = "is the root directory" if not named else "lies directly in the root directory"
        raise ConfigError(
            f"{raw!r} {where}: the lock file and the instance lock beside it would be made "
            "in /; give a file in a directory below it, such as /run/rbln/rsd-group.lock"
        )
    if raw.endswith(("/", "/.")):
        raise ConfigError(
            f"{raw!r} names a directory; give the lock file's path, such as "
            "/run/rbln/rsd-group.lock"
        )
    return path


# What Kubernetes injects for a Service named "metrics" or "healthcheck" in the pod's
# namespace (service links): METRICS_PORT=tcp://10.0.0.1:9464. Not a port the operator
# chose, so it is not worth a crash loop.
_SERVICE_LINK: Final = re.compile(r"tcp://[^\s/]+:[0-9]+", re.ASCII)


def _port(raw: str) -> int:
    """An integer as Go's strconv.ParseInt(s, 0, 64) reads it; negative disables."""
    if _SERVICE_LINK.fullmatch(raw):
        raise IgnoredSetting(
            f"{raw!r} is a Kubernetes service link (a Service named after the variable "
            "exists in the namespace), not a port; using the default (set "
            "enableServiceLinks: false on the pod, as the chart does)"
        )
    try:
        port = parse_go_int(raw)
    except ValueError:
        raise ConfigError(f"{raw!r} is not an integer port") from None
    if port > 65535:
        raise ConfigError(f"port {port} is out of range (0-65535, <0 disables)")
    return port


# How a too small and a too long duration are worded, per kind of setting.
_INTERVAL_WORDING: Final = (
    "interval must be positive, got {raw!r}",
    "interval {raw!r} is longer than {most}",
)
_LIMIT_WORDING: Final = (
    "{raw!r} must be positive and at most {most}",
    "{raw!r} must be positive and at most {most}",
)


def _positive_duration(wording: tuple[str, str], least: float = 0.0) -> Callable[[str], float]:
    """A converter for a Go duration that is positive (at least ``least``) and at most a day."""

    def convert(raw: str) -> float:
        try:
            seconds = parse_duration(raw)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        most = format_duration(MAX_SCAN_INTERVAL_S)
        if seconds <= 0:
            raise ConfigError(wording[0].format(raw=raw, most=most))
        if seconds > MAX_SCAN_INTERVAL_S:
            raise ConfigError(wording[1].format(raw=raw, most=most))
        if seconds < least:
            raise ConfigError(f"{raw!r} is shorter than the floor of {format_duration(least)}")
        return seconds

    return convert


_interval = _positive_duration(_INTERVAL_WORDING)
_export_interval = _positive_duration(_INTERVAL_WORDING, MIN_METRICS_EXPORT_INTERVAL_S)
_limit = _positive_duration(_LIMIT_WORDING)


def stall_limit_floor(scan_interval: float) -> float:
    """The shortest --scan-stall-limit for ``scan_interval``: three intervals (a scan that
    outlasts them has missed three scans), at least 1 s, never above the 2 min default (an
    interval can be a day; what is wedged is one scan's age, not the schedule)."""
    return min(max(3 * scan_interval, MIN_SCAN_STALL_LIMIT_S), DEFAULT_SCAN_STALL_LIMIT_S)


def _text(raw: str) -> str:
    return raw.strip()


_INSTALLATION_MAX: Final = 253


def _installation(raw: str) -> str:
    name = raw.strip()
    if len(name) > _INSTALLATION_MAX or not all(c.isascii() and c.isprintable() for c in name):
        raise ConfigError(
            f"{raw!r} is not an installation name (printable ASCII, at most "
            f"{_INSTALLATION_MAX} characters)"
        )
    return name


def _bool(raw: str) -> bool:
    # Exactly as Go's strconv.ParseBool: no space around the word (" true" is refused).
    try:
        return parse_go_bool(raw)
    except ValueError:
        raise ConfigError(f"{raw!r} is not a boolean (true or false)") from None


def _choice(raw: str, choices: tuple[str, ...], refusal: ValueError) -> str:
    """One of ``choices``, read without surrounding spaces and ignoring case."""
    text = raw.strip().lower()
    if text not in choices:
        raise refusal
    return text


def _traces_exporter(raw: str) -> str:
    # OpenTelemetry's variable, read as its specification says: enum values ignore case,
    # and an unsupported value is a warning, then ignored as if unset (tracing is
    # best-effort). Of its exporters only OTLP is built in; a list ("otlp,console")
    # would promise more than the daemon sends.
    return _choice(raw, TRACES_EXPORTERS, IgnoredSetting(
        f"{raw!r} is not supported (otlp: traces to the OTLP endpoint, none: no traces); "
        "ignored as if unset"
    ))  # fmt: skip


def _cdi_mode(raw: str) -> str:
    return _choice(raw, CDI_MODES, ConfigError(
        f"{raw!r} is not a CDI mode: annotation (the cdi.k8s.io annotation), field "
        "(the kubelet's cdi_devices field) or both"
    ))  # fmt: skip


def _optional_path(raw: str) -> Path | None:
    return _path(raw) if raw.strip() else None


def _socket_or_off(raw: str) -> Path | None:
    """A host socket the daemon connects to, or empty: do not connect (off)."""
    return _host_dir(raw) if raw.strip() else None


def _mode(raw: str) -> str:
    return _choice(raw, MODES, ConfigError(
        f"{raw!r} is not a mode: device-plugin (the kubelet's device-plugin API) or dra "
        "(a DRA kubelet plugin with ResourceSlices)"
    ))  # fmt: skip


def _beside(below: str) -> str:
    """How --help names a default that follows --kubelet-device-plugin-path's parent."""
    return f"{below} beside --kubelet-device-plugin-path: /var/lib/kubelet/{below}"


OPTIONS: Final[tuple[Option, ...]] = (
    Option("mode", "--mode", "RBLN_MODE", MODE_DEVICE_PLUGIN,
           "which kubelet API serves the NPUs: device-plugin (extended resources through the "
           "device-plugin API) or dra (a DRA kubelet plugin: ResourceSlices and claims); one "
           "node runs one of them", "device-plugin|dra", kind=STRING, convert=_mode),
    Option("cdi_root", "--cdi-root", "CDI_ROOT", "/var/run/cdi",
           "directory of CDI spec files; stale transient specs are removed from it", "DIR",
           kind=STRING, convert=_host_dir),
    Option("cdi_static_dir", "--cdi-static-dir", "CDI_STATIC_DIR", "/etc/cdi",
           "the other CDI spec directory the container runtimes read (read only); the daemon "
           "warns when neither holds a spec defining rebellions.ai/npu=runtime", "DIR",
           kind=STRING, convert=_host_dir),
    Option("cdi_mode", "--cdi-mode", "CDI_MODE", "annotation",
           "how each container's CDI device reaches the runtime: annotation (as the Go "
           "plugin), field (the kubelet's cdi_devices: Kubernetes 1.29+, or 1.28 with the "
           "DevicePluginCDIDevices feature gate on) or both",
           "annotation|field|both", kind=STRING, convert=_cdi_mode),
    Option("kubelet_dir", "--kubelet-device-plugin-path", "KUBELET_DEVICE_PLUGIN_PATH",
           "/var/lib/kubelet/device-plugins", "kubelet device-plugin socket directory", "DIR",
           kind=STRING, convert=_host_dir),
    Option("kubelet_plugins_registry_path", "--kubelet-plugins-registry-path",
           "KUBELET_PLUGINS_REGISTRY_PATH", "/var/lib/kubelet/plugins_registry",
           "dra mode: the kubelet's plugin-watcher directory (the registration socket goes "
           "here)", "DIR", shown_default=_beside("plugins_registry"), kind=STRING,
           convert=_host_dir),
    Option("kubelet_plugins_path", "--kubelet-plugins-path", "KUBELET_PLUGINS_PATH",
           "/var/lib/kubelet/plugins",
           "the kubelet's plugin directory: in dra mode the driver's own directory below it "
           "holds the service socket, the checkpoint and the instance lock; the "
           "device-plugin mode reads that checkpoint (a node switched between the modes)",
           "DIR",
           shown_default=_beside("plugins"), kind=STRING, convert=_host_dir),
    Option("kubelet_pod_resources_socket", "--kubelet-pod-resources-socket",
           "KUBELET_POD_RESOURCES_SOCKET", "/var/lib/kubelet/pod-resources/kubelet.sock",
           "the kubelet's PodResources API socket: devices that running pods hold through the "
           "other mode (a node switched between device-plugin and dra) are not offered until "
           "released; empty: never read it (for nodes that only ever run one mode)", "PATH",
           shown_default=_beside("pod-resources/kubelet.sock"), kind=STRING,
           convert=_socket_or_off),
    Option("kubeconfig", "--kubeconfig", "KUBECONFIG", "",
           "dra mode: a kubeconfig file for the API server; empty: the pod's service account "
           "(in-cluster)", "PATH", shown_default="in-cluster", kind=STRING,
           convert=_optional_path),
    Option("dra_taint_no_execute", "--dra-taint-no-execute", "RBLN_DRA_TAINT_NO_EXECUTE",
           "false",
           "dra mode: taint Unhealthy devices NoExecute instead of NoSchedule, so that pods "
           "holding a faulted device are evicted (unless they tolerate the taint); off, "
           "they keep running and only new claims avoid the device", "BOOL", kind=BOOL,
           convert=_bool),
    Option("healthcheck_port", "--healthcheck-port", "HEALTHCHECK_PORT", "51515",
           "TCP port of the gRPC health service, an integer as Go reads it; negative "
           "disables it, 0 picks a free port; a Kubernetes service link value "
           "(tcp://host:port) is a warning and the default", "PORT", kind=INT, convert=_port),
    Option("scan_interval", "--device-scan-interval", "DEVICE_SCAN_INTERVAL",
           format_duration(DEFAULT_SCAN_INTERVAL_S),
           "interval between device inventory scans, a Go duration such as 500ms, 5s, 1m30s "
           f"or 1h30m0s; positive and at most {format_duration(MAX_SCAN_INTERVAL_S)}", "DURATION",
           kind=DURATION, convert=_interval),
    Option("otlp_endpoint", "--otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", "",
           "OTLP gRPC endpoint for allocation traces (host:port = insecure, https://... = TLS); "
           "empty disables tracing", "ENDPOINT", kind=STRING, convert=_text),
    Option("traces_exporter", "--otel-traces-exporter", "OTEL_TRACES_EXPORTER", "otlp",
           "otlp sends allocation traces to the OTLP endpoint when one is set; none keeps "
           "them off, for an endpoint that should get metrics only; empty means unset, any "
           "other value is a warning and ignored", "otlp|none",
           kind=STRING, convert=_traces_exporter),
    Option("metrics_port", "--metrics-port", "METRICS_PORT", "-1",
           "TCP port of the Prometheus metrics endpoint (GET /metrics); negative disables it, "
           "0 picks a free port; a Kubernetes service link value (tcp://host:port) is a "
           "warning and the default", "PORT", shown_default="-1 (off)", kind=INT,
           convert=_port),
    Option("metrics_otlp", "--metrics-otlp", "METRICS_OTLP", "false",
           "push metrics over OTLP to --otlp-endpoint / OTEL_EXPORTER_OTLP_ENDPOINT, apart "
           "from tracing", "BOOL", kind=BOOL, convert=_bool),
    Option("metrics_export_interval", "--metrics-export-interval", "METRICS_EXPORT_INTERVAL",
           format_duration(DEFAULT_METRICS_EXPORT_INTERVAL_S),
           "time between OTLP metric pushes, a Go duration; at least "
           f"{format_duration(MIN_METRICS_EXPORT_INTERVAL_S)} and at most "
           f"{format_duration(MAX_SCAN_INTERVAL_S)}", "DURATION", kind=DURATION,
           convert=_export_interval),
    Option("node_name", "--node-name", "NODE_NAME", "",
           "Kubernetes node name, recorded on traces as k8s.node.name; dra mode needs it (the "
           "pool and the ResourceSlices are the node's)", "NAME", kind=STRING, convert=_text),
    Option("sysfs_root", "--sysfs-root", "SYSFS_ROOT", "/sys",
           "sysfs mount point (device status, PCI hierarchy, SR-IOV files)", "DIR", kind=STRING,
           convert=_path),
    Option("dev_root", "--dev-root", "DEV_ROOT", "/dev",
           "directory of NPU and RSD device nodes on the host (absolute)", "DIR",
           kind=STRING, convert=_host_dir),
    Option("rbln_smi", "--rbln-smi", "RBLN_SMI_PATH", "",
           "rbln-smi executable; when unset, the first executable rbln-smi in /usr/bin, "
           "/run/rbln/driver/usr/bin, /host/usr/bin, /host/driver/usr/bin, then PATH", "PATH",
           shown_default="search", kind=STRING, convert=_optional_path),
    Option("rsd_lock_path", "--rsd-lock-path", "RSD_LOCK_PATH", "/var/run/rbln-rsd-group.lock",
           "lock file serialising RSD group changes between processes (absolute, in a "
           "directory below /; not a directory or a symlink); the instance lock a second "
           "instance waits on lies beside it", "PATH", kind=STRING, convert=_lock_file),
    Option("installation", "--installation", "RBLN_INSTALLATION", "",
           "the identity of the installation this instance belongs to (the chart: namespace/"
           "DaemonSet name); a successor of the same installation takes over from a running "
           "instance while both are registered (a surge upgrade) instead of waiting for it "
           "to exit; empty: never hand over or take over", "NAME", kind=STRING,
           convert=_installation),
    Option("scan_stall_limit", "--scan-stall-limit", "SCAN_STALL_LIMIT",
           format_duration(DEFAULT_SCAN_STALL_LIMIT_S),
           "a device scan still running after this long turns the liveness health service "
           "NOT_SERVING until it finishes (the chart's probe then restarts the pod); a Go "
           "duration, at least three scan intervals (at least 1s; a floor of at most "
           f"{format_duration(DEFAULT_SCAN_STALL_LIMIT_S)}) and at most "
           f"{format_duration(MAX_SCAN_INTERVAL_S)}", "DURATION", kind=DURATION, convert=_limit),
    Option("test_file_device_nodes", "--test-file-device-nodes", "RBLN_TEST_FILE_DEVICE_NODES",
           "false", "TEST ONLY (the simulated node): accept regular files where device nodes "
           "belong; never set it on a real node", "BOOL", kind=BOOL, convert=_bool),
)  # fmt: skip

_UNIX_SOCKET_PATH_MAX: Final = 107
_NODE_NAME_RE: Final = re.compile(
    r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII
)
# Beside the RSD lock and the instance lock's anchor (see runtime.handover).
HANDOVER_SOCKET_NAME: Final = "rbln-device-plugin.handover.sock"
_OTEL_PREFIX: Final = "OTEL_"


@dataclass(frozen=True, slots=True)
class Config:
    cdi_root: Path
    kubelet_dir: Path
    healthcheck_port: int
    scan_interval: float
    otlp_endpoint: str
    traces_exporter: str
    metrics_port: int
    metrics_otlp: bool
    metrics_export_interval: float
    node_name: str
    sysfs_root: Path
    dev_root: Path
    rbln_smi: Path | None
    rsd_lock_path: Path
    # Test only: a regular file counts as a device node (the simulated node has no
    # character devices). Off in production, and the chart never sets it.
    test_file_device_nodes: bool = False
    scan_stall_limit: float = DEFAULT_SCAN_STALL_LIMIT_S
    cdi_static_dir: Path = Path("/etc/cdi")
    cdi_mode: str = "annotation"
    # The installation this instance belongs to (empty: none); see runtime.handover.
    installation: str = ""
    mode: str = MODE_DEVICE_PLUGIN
    kubelet_plugins_registry_path: Path = Path("/var/lib/kubelet/plugins_registry")
    kubelet_plugins_path: Path = Path("/var/lib/kubelet/plugins")
    kubeconfig: Path | None = None
    # None: off (see the option's help).
    kubelet_pod_resources_socket: Path | None = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    dra_taint_no_execute: bool = False
    # Where each setting came from ("flag", "env" or "default"), so that a later message
    # about a value can name what supplied it. Not part of the configuration itself.
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    # Values ignored in favour of the default, each (setting as its source spells it,
    # value, why): logged once at start.
    ignored: tuple[tuple[str, str, str], ...] = field(default=(), compare=False, repr=False)
    # LEGACY_NAMES_FLAG as given (a Go boolean), None when not given: it changes nothing
    # but the warning ``legacy_names_requested`` asks for.
    legacy_names_flag: str | None = field(default=None, compare=False, repr=False)

    @property
    def cdi_spec_dirs(self) -> tuple[Path, ...]:
        """The CDI spec directories in the runtimes' order: a later one's specs win."""
        return tuple(dict.fromkeys((self.cdi_static_dir, self.cdi_root)))

    @property
    def healthcheck_enabled(self) -> bool:
        return self.healthcheck_port >= 0

    @property
    def tracing_enabled(self) -> bool:
        return bool(self.otlp_endpoint) and self.traces_exporter != "none"

    @property
    def metrics_endpoint_enabled(self) -> bool:
        return self.metrics_port >= 0

    @property
    def metrics_enabled(self) -> bool:
        return self.metrics_endpoint_enabled or self.metrics_otlp

    def origin(self, name: str) -> str:
        """What supplied setting ``name``: its flag, its variable, or the default."""
        return _origin(_option(name), self.sources.get(name, "default"))

    def describe(self) -> dict[str, Any]:
        """The resolved configuration as log fields."""
        out: dict[str, Any] = {}
        for item in fields(self):
            if item.name in ("sources", "ignored", "legacy_names_flag"):
                continue
            value = getattr(self, item.name)
            if item.name in ("scan_interval", "metrics_export_interval", "scan_stall_limit"):
                value = format_duration(value)
            elif isinstance(value, Path):
                value = str(value)
            elif value is None:
                value = "(off)" if item.name == "kubelet_pod_resources_socket" else "(search)"
            out[_camel(item.name)] = value
        return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _option(field: str) -> Option:
    return next(o for o in OPTIONS if o.field == field)


def _origin(option: Option, source: str) -> str:
    """The setting as its source spells it, so the reader knows which one to fix."""
    if source == "flag":
        return f"{option.flag} (command line)"
    if source == "env":
        return f"{option.env} (environment; the flag is {option.flag})"
    return f"{option.flag} (default)"


def _from_environment(option: Option, environ: Mapping[str, str]) -> str | None:
    """The variable's text as the setting reads it; None: take the default."""
    raw = environ.get(option.env)
    if raw is None:
        return None
    # OpenTelemetry's rule for its own variables: an empty one (or only spaces) is unset.
    if option.env.startswith(_OTEL_PREFIX) and not raw.strip():
        return None
    return EMPTY_VARIABLE[option.kind] if raw == "" else raw


_UNDER_KUBELET_ROOT: Final = (
    ("kubelet_plugins_registry_path", "plugins_registry"),
    ("kubelet_plugins_path", "plugins"),
    ("kubelet_pod_resources_socket", "pod-resources/kubelet.sock"),
)


def config_from_settings(flags: Mapping[str, str | None], environ: Mapping[str, str]) -> Config:
    """Build the Config from parsed flag values (None = not given) and the environment."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    ignored: list[tuple[str, str, str]] = []
    for option in OPTIONS:
        raw, source = flags.get(option.field), "flag"
        if raw is None:
            raw, source = _from_environment(option, environ), "env"
        if raw is None:
            raw, source = option.default, "default"
        sources[option.field] = source
        try:
            values[option.field] = option.convert(raw)
        except IgnoredSetting as exc:
            ignored.append((_origin(option, source), raw, str(exc)))
            values[option.field] = option.convert(option.default)
            sources[option.field] = "default"
        except ConfigError as exc:
            hint = ""
            if source == "env" and not raw:
                hint = "; the variable is set but empty: unset it for the default"
            raise ConfigError(f"{_origin(option, source)}: {exc}{hint}") from None
    legacy = flags.get(LEGACY_NAMES_FIELD)
    if legacy is not None:
        try:
            _bool(legacy)  # Go's flag package refuses a value that is not a boolean
        except ConfigError as exc:
            raise ConfigError(f"{LEGACY_NAMES_FLAG} (command line): {exc}") from None
    # The kubelet keeps all its sockets under its --root-dir: a directory not given
    # follows the device-plugin directory's parent, so one setting moves them together
    # (and a simulated node's kubelet directory holds them all).
    for name, below in _UNDER_KUBELET_ROOT:
        if sources[name] == "default":
            values[name] = values["kubelet_dir"].parent / below
    config = Config(**values, sources=sources, ignored=tuple(ignored), legacy_names_flag=legacy)
    floor = stall_limit_floor(config.scan_interval)
    if config.scan_stall_limit < floor:
        raise ConfigError(
            f"{config.origin('scan_stall_limit')}: {format_duration(config.scan_stall_limit)} "
            f"is shorter than its floor of {format_duration(floor)} (three scan intervals "
            f"of {format_duration(config.scan_interval)}, at least "
            f"{format_duration(MIN_SCAN_STALL_LIMIT_S)}, at most "
            f"{format_duration(DEFAULT_SCAN_STALL_LIMIT_S)}): every scan would turn "
            "liveness NOT_SERVING"
        )
    if config.metrics_otlp and not config.otlp_endpoint:
        endpoint = _option("otlp_endpoint")
        raise ConfigError(
            f"{config.origin('metrics_otlp')}: OTLP metrics need a collector; set "
            f"{endpoint.flag} or {endpoint.env}"
        )
    if config.mode == MODE_DRA:
        _dra_fits(config)
    pod_resources = config.kubelet_pod_resources_socket
    if pod_resources is not None and len(str(pod_resources).encode()) > _UNIX_SOCKET_PATH_MAX:
        raise ConfigError(
            f"{config.origin('kubelet_pod_resources_socket')}: {pod_resources} is too long "
            f"for a unix socket (socket paths are limited to {_UNIX_SOCKET_PATH_MAX} bytes)"
        )
    socket_path = config.kubelet_dir / resources.LONGEST_SOCKET_NAME
    if len(str(socket_path)) > _UNIX_SOCKET_PATH_MAX:
        raise ConfigError(
            f"{config.origin('kubelet_dir')}: {config.kubelet_dir} is too long for unix "
            f"sockets (socket paths are limited to {_UNIX_SOCKET_PATH_MAX} bytes)"
        )
    return _installation_fits(config)


def _dra_fits(config: Config) -> None:
    """What dra mode needs that the device-plugin mode does not."""
    if not config.node_name:
        node = _option("node_name")
        raise ConfigError(
            f"{config.origin('mode')}: dra mode needs the node's name ({node.flag} or "
            f"{node.env}; the chart sets it from the pod's spec.nodeName)"
        )
    if not _NODE_NAME_RE.fullmatch(config.node_name):
        raise ConfigError(
            f"{config.origin('node_name')}: {config.node_name[:80]!r} is not a Kubernetes "
            "node name (a DNS subdomain: lowercase letters, digits, '-' and '.', at most "
            "253 characters)"
        )
    # The longer of the two sockets (see dra.names): a bind would fail on a longer path.
    for name, socket in (
        ("kubelet_plugins_registry_path", "npu.rebellions.ai-reg.sock"),
        ("kubelet_plugins_path", "npu.rebellions.ai/dra.sock"),
    ):
        path = getattr(config, name) / socket
        if len(str(path).encode()) > _UNIX_SOCKET_PATH_MAX:
            raise ConfigError(
                f"{config.origin(name)}: {getattr(config, name)} is too long for unix "
                f"sockets (socket paths are limited to {_UNIX_SOCKET_PATH_MAX} bytes)"
            )


def _installation_fits(config: Config) -> Config:
    """An installation whose sockets cannot be named: a warning, and none (the instance
    then waits for a running one as without an installation, and is waited for)."""
    if not config.installation:
        return config
    tokened = resources.socket_name(resources.NPU_VF4.name, "0" * resources.INSTANCE_TOKEN_LEN)
    for path in (
        config.kubelet_dir / tokened,
        config.rsd_lock_path.parent / HANDOVER_SOCKET_NAME,
    ):
        if len(str(path)) > _UNIX_SOCKET_PATH_MAX:
            why = (
                f"{path} would be longer than a unix socket allows ({_UNIX_SOCKET_PATH_MAX} "
                "bytes): no hand-over; a successor waits for this instance to exit"
            )
            ignored = (*config.ignored, (config.origin("installation"), config.installation, why))
            return replace(config, installation="", ignored=ignored)
    return config
