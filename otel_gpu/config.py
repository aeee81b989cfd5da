"""Every ``OTEL_GPU_*`` setting, in one place (DESIGN §7).

The standard ``OTEL_*`` variables keep their SDK meaning and are read by the SDK itself; this
module reads only otel-gpu's own. CLI flags override the environment. An invalid value raises
:class:`~otel_gpu.errors.ConfigError` naming the variable and the accepted values (the CLI
turns it into one line and exit code 2).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from otel_gpu.errors import ConfigError
from otel_gpu.hal.manager import DeviceFilter
from otel_gpu.health.monitor import HealthThresholds

__all__ = ["ENV_VARS", "EnvVar", "Settings", "markdown_table"]

MIN_INTERVAL_S = 0.2
DEFAULT_INTERVAL_S = 10.0
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


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
        "false",
        "true, false",
        "Export per-process GPU memory (`accel.process.memory.usage`, with process.pid).",
    ),
    EnvVar(
        "OTEL_GPU_EXPECTED_DEVICES",
        "unset",
        "an integer >= 0",
        "Expected device count for the health check (`--expect-devices`).",
    ),
    EnvVar(
        "OTEL_GPU_PCIE_REPLAY_RATE",
        "1.0",
        "replays per second >= 0",
        "Health: PCIe replay rate above which `accel.pcie.replay_rate` fires.",
    ),
    EnvVar(
        "OTEL_GPU_HEALTH_REEMIT",
        "300",
        "seconds > 0",
        "Health: how often a persisting failure is emitted again.",
    ),
    EnvVar(
        "OTEL_GPU_LOG_LEVEL",
        "warning",
        "debug, info, warning, error",
        "Verbosity of otel-gpu's own diagnostics on stderr.",
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
    log_level: str = "warning"
    health: HealthThresholds = field(default_factory=HealthThresholds)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every ``OTEL_GPU_*`` variable from ``env`` (default ``os.environ``)."""
        env = os.environ if env is None else env

        def get(name: str, parse: Callable[[str, str], Any], default: Any) -> Any:
            raw = env.get(name)
            return default if raw is None or raw.strip() == "" else parse(name, raw.strip())

        interval_default = DEFAULT_INTERVAL_S
        sdk_interval = env.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
        if sdk_interval:
            interval_default = _interval("OTEL_METRIC_EXPORT_INTERVAL", sdk_interval, 1000.0)
        expected = get("OTEL_GPU_EXPECTED_DEVICES", _nonneg_int, None)
        return cls(
            backend=get("OTEL_GPU_BACKEND", lambda _n, v: v, "auto"),
            devices=DeviceFilter.parse(env.get("OTEL_GPU_DEVICES"), "OTEL_GPU_DEVICES"),
            interval_s=get("OTEL_GPU_INTERVAL", _interval, interval_default),
            attributes=get("OTEL_GPU_ATTRIBUTES", _choice("full", "minimal"), "full"),
            processes=get("OTEL_GPU_PROCESSES", _bool, False),
            log_level=get(
                "OTEL_GPU_LOG_LEVEL", _choice("debug", "info", "warning", "error"), "warning"
            ),
            health=HealthThresholds(
                expected_devices=expected,
                pcie_replay_rate=get("OTEL_GPU_PCIE_REPLAY_RATE", _nonneg_float, 1.0),
                reemit_s=get("OTEL_GPU_HEALTH_REEMIT", _positive_float, 300.0),
            ),
        )

    def override(self, **changes: Any) -> Settings:
        """A copy with CLI flags applied (``None`` values are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


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
    if not raw.isdigit():
        raise ConfigError(setting, f"invalid value {raw!r}", "an integer >= 0")
    return int(raw)


def _nonneg_float(setting: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(setting, f"invalid value {raw!r}", "a number >= 0")
    return value


def _positive_float(setting: str, raw: str) -> float:
    value = _nonneg_float(setting, raw)
    if value == 0:
        raise ConfigError(setting, f"invalid value {raw!r}", "a number > 0")
    return value


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


def markdown_table() -> str:
    """The variables as a markdown table (README)."""
    rows = ["| variable | default | accepted | meaning |", "|---|---|---|---|"]
    rows.extend(f"| `{v.name}` | {v.default} | {v.accepted} | {v.description} |" for v in ENV_VARS)
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())  # noqa: T201
