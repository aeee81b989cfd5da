"""Every ``OTEL_GPU_*`` setting, in one place (DESIGN §7).

:data:`ENV_VARS` documents otel-gpu's own variables and :class:`Settings` reads them. The
standard ``OTEL_*`` variables (:data:`STANDARD_VARS`) keep their SDK meaning and are read by the
SDK itself; :func:`check_otel_env` only rejects, up front and in one line, the values that the
SDK would otherwise turn into a stack trace, a silent default or a log line that prints an API
key. CLI flags override the environment. An invalid value raises
:class:`~otel_gpu.errors.ConfigError` naming the variable and the accepted values (the CLI
turns it into one line and exit code 2).

Secrets: the OTLP header variables carry API keys. No message of this module contains their
values, only the position of a malformed entry.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from typing import Any

from otel_gpu.errors import ConfigError
from otel_gpu.hal.manager import DeviceFilter
from otel_gpu.hal.registry import ENTRY_POINT_GROUP, parse_selectors
from otel_gpu.health.monitor import HealthThresholds

__all__ = [
    "ENV_VARS",
    "STANDARD_VARS",
    "EnvVar",
    "Settings",
    "check_otel_env",
    "markdown_table",
    "parse_interval",
    "sdk_disabled",
]

_log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.2
DEFAULT_INTERVAL_S = 10.0
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
#: Backend names of DESIGN §3; installed plug-ins may add more.
BACKEND_NAMES = ("auto", "nvml", "nvidia-smi", "amd", "intel", "tpu", "neuron", "simulated")
SCOPES = ("node", "process")


@dataclass(frozen=True, slots=True)
class EnvVar:
    """Documentation of one variable."""

    name: str
    default: str
    accepted: str
    description: str


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(
        "OTEL_GPU_BACKEND",
        "auto",
        "auto, nvml, nvidia-smi, amd, intel, tpu, neuron, "
        "simulated[:<spec>], or a comma-separated list",
        "Which backends to use (`--backend`).",
    ),
    EnvVar(
        "OTEL_GPU_DEVICES",
        "all",
        "all, or node-wide indices and/or device ids separated by ,",
        "Report only these devices (MIG instances follow their parent).",
    ),
    EnvVar(
        "OTEL_GPU_INTERVAL",
        "OTEL_METRIC_EXPORT_INTERVAL, else 10",
        f"seconds >= {MIN_INTERVAL_S}",
        "Collection and export interval (`--interval`).",
    ),
    EnvVar(
        "OTEL_GPU_ATTRIBUTES",
        "full",
        "full, minimal",
        "Per-point attributes: `minimal` keeps hw.id, hw.type, hw.name (descriptors stay on "
        "the resource) for large fleets.",
    ),
    EnvVar(
        "OTEL_GPU_PROCESSES",
        "false (true with OTEL_GPU_SCOPE=process)",
        "true, false",
        "Export per-process GPU memory (`accel.process.memory.usage`, with process.pid).",
    ),
    EnvVar(
        "OTEL_GPU_SCOPE",
        "node",
        "node, process",
        "What the `opentelemetry-instrument` plug-in and the resource detector cover: `node` "
        "every device, as the agent does; `process` only the devices this process can see "
        "(CUDA_VISIBLE_DEVICES, ROCR_/HIP_VISIBLE_DEVICES, ZE_AFFINITY_MASK, TPU_VISIBLE_CHIPS) "
        "and per-process memory of its own pids only (OTEL_GPU_PROCESSES then defaults to "
        "true). `otel-gpu run` always reports the node.",
    ),
    EnvVar(
        "OTEL_GPU_SWEEP_TIMEOUT",
        "5",
        "seconds > 0",
        "Deadline of one sweep: a vendor call stuck longer (a wedged driver) leaves the devices "
        "not yet read as failed and fires `accel.telemetry.degraded`; the rest goes out.",
    ),
    EnvVar(
        "OTEL_GPU_EXPECTED_DEVICES",
        "unset",
        "an integer >= 0",
        "Expected device count for the health check (`--expect-devices`).",
    ),
    EnvVar(
        "OTEL_GPU_PCIE_REPLAY_LIMIT",
        "8",
        "a number >= 0",
        "Health: PCIe replays within a minute above which `accel.pcie.replay_rate` fires "
        "(DCGM's default).",
    ),
    EnvVar(
        "OTEL_GPU_RETIRED_PAGES_LIMIT",
        "60",
        "an integer >= 0 (0: off)",
        "Health: retired memory pages (page retirement, pre-Ampere GPUs) at which "
        "`accel.memory.retirement.limit` fires.",
    ),
    EnvVar(
        "OTEL_GPU_HEALTH_REEMIT",
        "300",
        "seconds > 0",
        "Health: how often a persisting failure is emitted again.",
    ),
    EnvVar(
        "OTEL_GPU_HEALTH_XID_HOLD",
        "600",
        "seconds > 0",
        "Health: how long an Xid keeps the device's `hw.status` out of `ok`.",
    ),
    EnvVar(
        "OTEL_GPU_HEALTH_DEGRADED_AFTER",
        "3",
        "an integer >= 1",
        "Health: failed sweeps of a device in a row before `accel.telemetry.degraded` fires.",
    ),
    EnvVar(
        "OTEL_GPU_ATTRIBUTION",
        "none",
        "none, or kubernetes, slurm, process separated by ,",
        "Workload attribution (opt-in): `kubernetes` puts the pod holding a device "
        "(k8s.namespace.name, k8s.pod.name, k8s.pod.uid, k8s.container.name) on its points, "
        "from the kubelet PodResources API; `slurm` the job (slurm.job.id, slurm.job.user, "
        "slurm.job.partition, slurm.job.name), from the processes' cgroups and environment and "
        "from OTEL_GPU_SLURM_JOB_MAP_DIR; `process` adds per-process series "
        "(`accel.workload.memory.usage`, `accel.workload.utilization`) attributed through "
        "/proc/<pid>/cgroup. Any of them adds `accel.workload.energy` per pod or job.",
    ),
    EnvVar(
        "OTEL_GPU_KUBELET_SOCKET",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "a unix socket path",
        "The kubelet PodResources socket (mount /var/lib/kubelet/pod-resources into the "
        "agent's pod, the directory rather than the socket, so that a kubelet restart is seen).",
    ),
    EnvVar(
        "OTEL_GPU_SLURM_JOB_MAP_DIR",
        "unset",
        "a directory",
        "A prolog-written GPU-to-job mapping directory in dcgm-exporter's "
        "`--hpc-job-mapping-dir` layout: one file per GPU, named by its index (or its "
        "UUID), holding the job ids on that GPU, one per line.",
    ),
    EnvVar(
        "OTEL_GPU_ATTRIBUTION_REFRESH",
        "10",
        "seconds >= 0.2",
        "How often the kubelet, the job mapping directory and the pod log directory are "
        "read again (on a background thread, never during a collection).",
    ),
    EnvVar(
        "OTEL_GPU_ATTRIBUTION_MAX_PROCESSES",
        "64",
        "an integer >= 1",
        "Per device, the most processes that get their own series with "
        "OTEL_GPU_ATTRIBUTION=process (those using the most memory; a warning once when hit).",
    ),
    EnvVar(
        "OTEL_GPU_HOST_ROOT",
        "/",
        "a directory",
        "Where the host's file system is seen: /proc, /sys (PCI devices, cgroups, DRM), /dev "
        "and /var/log/pods are read under it (e.g. `/host` when the agent runs in a container "
        "with the host's / mounted there, and hostPID).",
    ),
    EnvVar(
        "OTEL_GPU_TPU_METRICS_ADDR",
        "localhost:8431",
        "host:port (loopback)",
        "libtpu's runtime metric service, read by the `tpu` backend while a workload runs.",
    ),
    EnvVar(
        "OTEL_GPU_NEURON_MONITOR",
        "neuron-monitor (PATH, then /opt/aws/neuron/bin)",
        "a command name or path",
        "The `neuron-monitor` the `neuron` backend runs; `neuron-ls` is looked for beside it.",
    ),
    EnvVar(
        "OTEL_GPU_LOG_LEVEL",
        "warning",
        "debug, info, warning, error",
        "Verbosity of otel-gpu's own diagnostics on stderr.",
    ),
)


#: The standard variables otel-gpu honours, as the SDK reads them (documentation only; the SDK
#: and its exporters read them, :func:`check_otel_env` checks some of them).
STANDARD_VARS: tuple[EnvVar, ...] = (
    EnvVar(
        "OTEL_SDK_DISABLED",
        "false",
        "true, false",
        "`true`: `otel-gpu run` exits 0 at once and exports nothing; the plug-in and the "
        "resource detector do nothing.",
    ),
    EnvVar(
        "OTEL_METRICS_EXPORTER",
        "otlp",
        "otlp, console, prometheus, none (comma-separated)",
        "Where metrics go (`--exporter`). `prometheus` serves `/metrics`.",
    ),
    EnvVar(
        "OTEL_LOGS_EXPORTER",
        "follows the metrics (none with prometheus alone)",
        "otlp, console, none",
        "Where health events go, as log records.",
    ),
    EnvVar(
        "OTEL_METRIC_EXPORT_INTERVAL",
        "10000 for `otel-gpu run` (SDK: 60000)",
        "milliseconds >= 200",
        "Push interval; also the default of OTEL_GPU_INTERVAL.",
    ),
    EnvVar(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "http://localhost:4317 (grpc), http://localhost:4318 (http/protobuf)",
        "a URL",
        "The Collector or backend. `_METRICS_`/`_LOGS_` variants override per signal.",
    ),
    EnvVar(
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "grpc",
        "grpc, http/protobuf",
        "OTLP transport (also per signal).",
    ),
    EnvVar(
        "OTEL_EXPORTER_OTLP_HEADERS",
        "unset",
        "name=value pairs separated by `,`, URL-encoded",
        "Request headers, e.g. API keys. Never logged, never in an error message.",
    ),
    EnvVar(
        "OTEL_EXPORTER_OTLP_TIMEOUT",
        "10",
        "seconds > 0",
        "Export timeout. The Python SDK reads **seconds** (the specification says "
        "milliseconds): 10, not 10000.",
    ),
    EnvVar(
        "OTEL_EXPORTER_OTLP_COMPRESSION",
        "none",
        "gzip (grpc); gzip, deflate, none (http/protobuf)",
        "Request compression.",
    ),
    EnvVar(
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
        "system roots",
        "a PEM file",
        "CA bundle for a TLS endpoint.",
    ),
    EnvVar(
        "OTEL_EXPORTER_PROMETHEUS_HOST",
        "localhost",
        "a host or address",
        "Where `/metrics` listens with the prometheus exporter.",
    ),
    EnvVar(
        "OTEL_EXPORTER_PROMETHEUS_PORT",
        "9464",
        "0..65535",
        "Port of `/metrics`.",
    ),
    EnvVar(
        "OTEL_SERVICE_NAME",
        "otel-gpu (the agent)",
        "a name",
        "`service.name` on the Resource (with OTEL_RESOURCE_ATTRIBUTES).",
    ),
    EnvVar(
        "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS",
        "unset",
        "detector names, e.g. gpu",
        "In an application: `gpu` adds the node's accelerator topology (`accel.*`) to its "
        "Resource.",
    ),
)


@dataclass(frozen=True, slots=True)
class Settings:
    """Resolved otel-gpu settings."""

    backend: str = "auto"
    devices: DeviceFilter | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    attributes: str = "full"
    processes: bool = False
    scope: str = "node"
    log_level: str = "warning"
    sweep_timeout_s: float = 5.0
    health: HealthThresholds = field(default_factory=HealthThresholds)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, standard: bool = True) -> Settings:
        """Read every ``OTEL_GPU_*`` variable from ``env`` (default ``os.environ``).

        ``standard`` also checks the standard ``OTEL_*`` variables (:func:`check_otel_env`);
        the plug-in and the resource detector pass ``False``, as there the application's SDK
        owns them.
        """
        env = os.environ if env is None else env
        if standard:
            check_otel_env(env)

        def get(name: str, parse: Callable[[str, str], Any], default: Any) -> Any:
            raw = env.get(name)
            return default if raw is None or raw.strip() == "" else parse(name, raw.strip())

        interval_default = DEFAULT_INTERVAL_S
        sdk_interval = env.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
        if sdk_interval:
            try:
                interval_default = _interval("OTEL_METRIC_EXPORT_INTERVAL", sdk_interval, 1000.0)
            except ConfigError:
                if standard:
                    raise
        scope = get("OTEL_GPU_SCOPE", _choice(*SCOPES), "node")
        return cls(
            backend=get("OTEL_GPU_BACKEND", _backend, "auto"),
            devices=DeviceFilter.parse(env.get("OTEL_GPU_DEVICES"), "OTEL_GPU_DEVICES"),
            interval_s=get("OTEL_GPU_INTERVAL", _interval, interval_default),
            attributes=get("OTEL_GPU_ATTRIBUTES", _choice("full", "minimal"), "full"),
            processes=get("OTEL_GPU_PROCESSES", _bool, scope == "process"),
            scope=scope,
            log_level=get(
                "OTEL_GPU_LOG_LEVEL", _choice("debug", "info", "warning", "error"), "warning"
            ),
            sweep_timeout_s=get("OTEL_GPU_SWEEP_TIMEOUT", _positive_float, 5.0),
            health=HealthThresholds(
                expected_devices=get("OTEL_GPU_EXPECTED_DEVICES", _nonneg_int, None),
                pcie_replay_limit=get("OTEL_GPU_PCIE_REPLAY_LIMIT", _nonneg_float, 8.0),
                retired_pages_limit=get("OTEL_GPU_RETIRED_PAGES_LIMIT", _nonneg_int, 60),
                reemit_s=get("OTEL_GPU_HEALTH_REEMIT", _positive_float, 300.0),
                xid_hold_s=get("OTEL_GPU_HEALTH_XID_HOLD", _positive_float, 600.0),
                degraded_after_sweeps=get("OTEL_GPU_HEALTH_DEGRADED_AFTER", _positive_int, 3),
            ),
        )

    def override(self, **changes: Any) -> Settings:
        """A copy with CLI flags applied (``None`` values are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def device_filter(self, env: Mapping[str, str] | None = None) -> DeviceFilter | None:
        """The device selection to build a manager with: ``devices``, narrowed in process
        scope to what the vendors' visibility variables in ``env`` allow
        (see :mod:`otel_gpu.scope`)."""
        if self.scope != "process":
            return self.devices
        from otel_gpu.scope import visible_devices

        return visible_devices(self.devices, env)


def sdk_disabled(env: Mapping[str, str] | None = None) -> bool:
    """``OTEL_SDK_DISABLED`` as the SDK reads it: only ``true`` (any case) disables."""
    env = os.environ if env is None else env
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


_SIGNALS = ("", "METRICS_", "LOGS_")
_PROTOCOLS = ("grpc", "http/protobuf")
_COMPRESSION = {"grpc": ("gzip",), "http/protobuf": ("gzip", "deflate", "none")}
# RFC 7230 token characters, plus % for URL-encoded names (as the SDK accepts them).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_LIKELY_MILLISECONDS_S = 1000.0


def check_otel_env(env: Mapping[str, str] | None = None) -> None:
    """Check the standard variables whose bad values the SDK would not report usefully.

    Raises :class:`ConfigError` for: ``OTEL_SDK_DISABLED`` other than true/false; an OTLP
    protocol, timeout or compression the exporters cannot use (they would raise a bare
    ``ValueError`` or exception class); a malformed OTLP header list (the SDK would log the
    entry, API key included: our message gives only its position); a non-numeric
    ``OTEL_EXPORTER_PROMETHEUS_PORT``. Everything else is left to the SDK, which warns and uses
    its default exactly as it does in any application.
    """
    env = os.environ if env is None else env

    def value(name: str) -> str | None:
        raw = env.get(name)
        return None if raw is None or not raw.strip() else raw.strip()

    disabled = value("OTEL_SDK_DISABLED")
    if disabled is not None:
        _bool_strict("OTEL_SDK_DISABLED", disabled)
    default_protocol = "grpc"
    for signal in _SIGNALS:
        protocol = value(f"OTEL_EXPORTER_OTLP_{signal}PROTOCOL")
        if protocol is not None and protocol not in _PROTOCOLS:
            raise ConfigError(
                f"OTEL_EXPORTER_OTLP_{signal}PROTOCOL",
                f"invalid value {protocol!r}",
                ", ".join(_PROTOCOLS),
            )
        if signal == "" and protocol is not None:
            default_protocol = protocol
    for signal in _SIGNALS:
        timeout_var = f"OTEL_EXPORTER_OTLP_{signal}TIMEOUT"
        timeout = value(timeout_var)
        if timeout is not None:
            seconds = _positive_float(
                timeout_var, timeout, "seconds > 0; the Python SDK reads seconds, not milliseconds"
            )
            if seconds >= _LIKELY_MILLISECONDS_S:
                _log.warning(
                    "%s=%s is read in seconds by the Python SDK (the specification says "
                    "milliseconds): did you mean %g?",
                    timeout_var,
                    timeout,
                    seconds / 1000.0,
                )
        _check_headers(
            f"OTEL_EXPORTER_OTLP_{signal}HEADERS", env.get(f"OTEL_EXPORTER_OTLP_{signal}HEADERS")
        )
        compression_var = f"OTEL_EXPORTER_OTLP_{signal}COMPRESSION"
        compression = value(compression_var)
        if compression is None:
            continue
        if signal:
            protocols = [value(f"OTEL_EXPORTER_OTLP_{signal}PROTOCOL") or default_protocol]
        else:
            protocols = [
                value(f"OTEL_EXPORTER_OTLP_{s}PROTOCOL") or default_protocol for s in _SIGNALS[1:]
            ]
        accepted = [
            c for c in _COMPRESSION["http/protobuf"] if all(c in _COMPRESSION[p] for p in protocols)
        ]
        if compression.lower() not in accepted:
            raise ConfigError(
                compression_var,
                f"invalid value {compression!r} for protocol {', '.join(sorted(set(protocols)))}",
                ", ".join(accepted),
            )
    port = value("OTEL_EXPORTER_PROMETHEUS_PORT")
    if port is not None and not (port.isdecimal() and int(port) <= 65535):
        raise ConfigError("OTEL_EXPORTER_PROMETHEUS_PORT", f"invalid port {port!r}", "0..65535")


def _check_headers(setting: str, raw: str | None) -> None:
    """Raise on a malformed header list, naming the entry's position, never its text."""
    if raw is None or not raw.strip():
        return
    entries = raw.split(",")
    for number, entry in enumerate(entries, 1):
        if not entry.strip():
            continue
        name, sep, _value = entry.partition("=")
        if not sep or not _HEADER_NAME.fullmatch(name.strip()):
            raise ConfigError(
                setting,
                f"malformed entry {number} of {len(entries)} (values are not shown: they may "
                "hold API keys)",
                "name=value pairs separated by ',', URL-encoded (a space is %20)",
            )


def parse_interval(setting: str, raw: str) -> float:
    """Parse an interval in seconds (CLI ``--interval``)."""
    return _interval(setting, raw)


def _interval(setting: str, raw: str, divisor: float = 1.0) -> float:
    try:
        value = float(raw) / divisor
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < MIN_INTERVAL_S:
        unit = "milliseconds" if divisor == 1000.0 else "seconds"
        floor = MIN_INTERVAL_S * divisor
        raise ConfigError(setting, f"invalid interval {raw!r}", f"{unit} >= {floor:g}")
    return value


def _nonneg_int(setting: str, raw: str) -> int:
    if not raw.isdecimal():
        raise ConfigError(setting, f"invalid value {raw!r}", "an integer >= 0")
    return int(raw)


def _positive_int(setting: str, raw: str) -> int:
    if not raw.isdecimal() or int(raw) < 1:
        raise ConfigError(setting, f"invalid value {raw!r}", "an integer >= 1")
    return int(raw)


def _backend(setting: str, raw: str) -> str:
    """Check a backend selector's syntax and names (the options are checked on open)."""
    names = [s.name for s in parse_selectors(raw, setting)]
    known = list(BACKEND_NAMES)
    known += sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} - set(known))
    for name in names:
        if name not in known:
            raise ConfigError(setting, f"unknown backend {name!r}", ", ".join(known))
    if "auto" in names and len(names) > 1:
        raise ConfigError(setting, "'auto' cannot be combined with other backends", "auto alone")
    return raw


def _nonneg_float(setting: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(setting, f"invalid value {raw!r}", "a number >= 0")
    return value


def _positive_float(setting: str, raw: str, accepted: str = "a number > 0") -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(setting, f"invalid value {raw!r}", accepted)
    return value


def _bool_strict(setting: str, raw: str) -> bool:
    low = raw.lower()
    if low not in ("true", "false"):
        raise ConfigError(setting, f"invalid value {raw!r}", "true, false")
    return low == "true"


def _bool(setting: str, raw: str) -> bool:
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigError(setting, f"invalid value {raw!r}", "true, false")


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(setting: str, raw: str) -> str:
        low = raw.lower()
        if low not in choices:
            raise ConfigError(setting, f"invalid value {raw!r}", ", ".join(choices))
        return low

    return parse


def markdown_table(variables: tuple[EnvVar, ...] = ENV_VARS) -> str:
    """The variables as a markdown table (README): otel-gpu's own, or :data:`STANDARD_VARS`."""
    rows = ["| variable | default | accepted | meaning |", "|---|---|---|---|"]
    rows.extend(f"| `{v.name}` | {v.default} | {v.accepted} | {v.description} |" for v in variables)
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())  # noqa: T201
    print()  # noqa: T201
    print(markdown_table(STANDARD_VARS))  # noqa: T201
