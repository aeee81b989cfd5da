"""The ``accel.workload.*`` instruments of :mod:`otel_gpu.attribution`, on the same meter scope
as the device metrics (the OpenTelemetry side of attribution lives here, with the rest of the
bridge).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from otel_gpu import __version__
from otel_gpu.otel.bridge import SCOPE

__all__ = ["register"]

Points = Callable[[], Iterable[tuple[float, Mapping[str, str | int]]]]


def _callback(points: Points) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, dict(attrs)) for value, attrs in points()]

    return observe


def register(
    meter_provider: MeterProvider,
    *,
    energy: tuple[str, str, Points],
    processes: tuple[tuple[str, Points], tuple[str, Points]] | None,
) -> list[object]:
    """Register ``accel.workload.energy`` and, with ``processes``, the per-process
    ``accel.workload.memory.usage`` and ``accel.workload.utilization``."""
    meter = meter_provider.get_meter(SCOPE, __version__)
    name, description, points = energy
    instruments: list[object] = [
        meter.create_observable_counter(
            name, callbacks=[_callback(points)], unit="J", description=description
        )
    ]
    if processes is not None:
        (memory_name, memory), (util_name, util) = processes
        instruments.append(
            meter.create_observable_up_down_counter(
                memory_name,
                callbacks=[_callback(memory)],
                unit="By",
                description=(
                    "Device memory used by a process, with the pod and container (through its "
                    "cgroup) or the Slurm job it belongs to; at most "
                    "OTEL_GPU_ATTRIBUTION_MAX_PROCESSES processes per device."
                ),
            )
        )
        instruments.append(
            meter.create_observable_gauge(
                util_name,
                callbacks=[_callback(util)],
                unit="1",
                description=(
                    "Utilization of a device by a process (where the vendor reports it per "
                    "process), with the pod and container or the Slurm job it belongs to."
                ),
            )
        )
    return instruments
