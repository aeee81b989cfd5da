"""Attribution settings: the ``OTEL_GPU_ATTRIBUTION*`` variables, documented and parsed here.

:data:`ENV_VARS` holds their documentation rows (the same :class:`~otel_gpu.config.EnvVar`
shape as :data:`otel_gpu.config.ENV_VARS`); :meth:`AttributionSettings.from_env` reads them and
raises :class:`~otel_gpu.errors.ConfigError` naming the variable and the accepted values.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from otel_gpu.config import ENV_VARS as CONFIG_ENV_VARS
from otel_gpu.config import EnvVar
from otel_gpu.errors import ConfigError

__all__ = [
    "DEFAULT_KUBELET_SOCKET",
    "ENV_VARS",
    "SOURCES",
    "AttributionSettings",
]

#: The attribution sources ``OTEL_GPU_ATTRIBUTION`` accepts.
SOURCES = ("kubernetes", "slurm", "process")
DEFAULT_KUBELET_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_REFRESH_S = 10.0
MIN_REFRESH_S = 0.2
DEFAULT_MAX_PROCESSES = 64
_NAMES = frozenset(
    (
        "OTEL_GPU_ATTRIBUTION",
        "OTEL_GPU_KUBELET_SOCKET",
        "OTEL_GPU_SLURM_JOB_MAP_DIR",
        "OTEL_GPU_ATTRIBUTION_REFRESH",
        "OTEL_GPU_ATTRIBUTION_MAX_PROCESSES",
        "OTEL_GPU_HOST_ROOT",
    )
)

#: The variables read here; their documentation rows live with every other OTEL_GPU_* variable
#: in :data:`otel_gpu.config.ENV_VARS`.
ENV_VARS: tuple[EnvVar, ...] = tuple(v for v in CONFIG_ENV_VARS if v.name in _NAMES)


@dataclass(frozen=True, slots=True)
class AttributionSettings:
    """Resolved attribution settings (see :data:`ENV_VARS`).

    ``sources`` is empty when attribution is off. ``host_root`` is the injectable root under
    which procfs, cgroupfs, sysfs and the kubelet's pod log directory are read.
    ``kubelet_timeout_s`` bounds every call to the kubelet.
    """

    sources: frozenset[str] = frozenset()
    kubelet_socket: Path = DEFAULT_KUBELET_SOCKET
    slurm_job_map_dir: Path | None = None
    refresh_s: float = DEFAULT_REFRESH_S
    max_processes: int = DEFAULT_MAX_PROCESSES
    host_root: Path = Path("/")
    kubelet_timeout_s: float = 2.0

    @property
    def enabled(self) -> bool:
        """Whether any attribution source is on."""
        return bool(self.sources)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AttributionSettings:
        """Read the attribution variables from ``env`` (default ``os.environ``).

        Raises :class:`ConfigError` for an invalid value.
        """
        env = os.environ if env is None else env

        def raw(name: str) -> str | None:
            value = env.get(name)
            return None if value is None or not value.strip() else value.strip()

        map_dir = raw("OTEL_GPU_SLURM_JOB_MAP_DIR")
        socket = raw("OTEL_GPU_KUBELET_SOCKET")
        refresh = raw("OTEL_GPU_ATTRIBUTION_REFRESH")
        max_processes = raw("OTEL_GPU_ATTRIBUTION_MAX_PROCESSES")
        root = raw("OTEL_GPU_HOST_ROOT")
        return cls(
            sources=parse_sources("OTEL_GPU_ATTRIBUTION", raw("OTEL_GPU_ATTRIBUTION")),
            kubelet_socket=Path(socket) if socket else DEFAULT_KUBELET_SOCKET,
            slurm_job_map_dir=Path(map_dir) if map_dir else None,
            refresh_s=(
                _refresh("OTEL_GPU_ATTRIBUTION_REFRESH", refresh) if refresh else DEFAULT_REFRESH_S
            ),
            max_processes=(
                _positive_int("OTEL_GPU_ATTRIBUTION_MAX_PROCESSES", max_processes)
                if max_processes
                else DEFAULT_MAX_PROCESSES
            ),
            host_root=Path(root) if root else Path("/"),
        )


def parse_sources(setting: str, raw: str | None) -> frozenset[str]:
    """Parse ``"kubernetes,slurm"``; ``None``, empty or ``none`` turns attribution off."""
    if raw is None or raw.strip().lower() in ("", "none"):
        return frozenset()
    sources: set[str] = set()
    for part in raw.split(","):
        name = part.strip().lower()
        if not name:
            continue
        if name not in SOURCES:
            raise ConfigError(setting, f"unknown attribution source {name!r}", _accepted())
        sources.add(name)
    return frozenset(sources)


def _accepted() -> str:
    return "none, or " + ", ".join(SOURCES) + " separated by ,"


def _refresh(setting: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < MIN_REFRESH_S:
        raise ConfigError(setting, f"invalid interval {raw!r}", f"seconds >= {MIN_REFRESH_S}")
    return value


def _positive_int(setting: str, raw: str) -> int:
    if not raw.isdecimal() or int(raw) < 1:
        raise ConfigError(setting, f"invalid value {raw!r}", "an integer >= 1")
    return int(raw)
