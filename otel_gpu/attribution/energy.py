"""Energy per workload: each device's energy counter, credited to the workloads that held it.

Every sweep hands :class:`EnergyIntegrator` each device's cumulative energy (J) and the
workloads holding the device at that sweep, with a weight each. The energy a device used
between two sweeps (the counter's difference) goes to the workloads that held it at the
*first* of the two, in proportion to their weights: a workload is credited from the sweep that
first sees it to the sweep that first sees it gone, which is where each end's error (at most
one interval) goes both ways. A counter that goes backwards (driver reload) or a device without
an energy reading credits nothing for that interval.

A workload that holds nothing any more gets its final total once more, at the sweep that found
it gone, and is then forgotten: its series ends (a workload that comes back starts again at 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["DESCRIPTION", "METRIC", "EnergyIntegrator", "WorkloadKey"]

METRIC = "accel.workload.energy"
DESCRIPTION = (
    "Energy used by the devices a workload (Kubernetes pod or Slurm job) held, from each "
    "device's energy counter: the energy between two sweeps goes to the workloads holding the "
    "device at the first of them. A device held by several workloads (time-slicing, MPS, MIG "
    "instances of one GPU) is split by their processes' utilization where the vendor reports "
    "it per process, otherwise evenly."
)

WorkloadKey = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Device:
    energy_j: float | None
    weights: Mapping[WorkloadKey, float]


class EnergyIntegrator:
    """Integrates device energy into per-workload totals (see the module docstring).

    Not thread-safe: the caller serializes :meth:`update` (the snapshot cache does).
    """

    def __init__(self) -> None:
        self._devices: dict[str, _Device] = {}
        self._totals: dict[WorkloadKey, float] = {}
        self._attributes: dict[WorkloadKey, Mapping[str, str]] = {}
        self._points: tuple[tuple[float, Mapping[str, str]], ...] = ()

    def update(
        self,
        devices: Mapping[str, tuple[float | None, Mapping[WorkloadKey, float]]],
        attributes: Mapping[WorkloadKey, Mapping[str, str]],
    ) -> None:
        """One sweep: ``{device id: (energy J or None, {workload: weight})}``.

        ``attributes`` gives each workload's point attributes; the first ones seen for a
        workload stay for as long as it lives, so that its series never splits. A device
        absent from ``devices`` (not read this sweep) keeps its previous reading, and the
        interval up to its next reading goes to its previous holders.
        """
        for device_id, (energy, weights) in devices.items():
            previous = self._devices.get(device_id)
            if previous is not None and previous.energy_j is not None and energy is not None:
                delta = energy - previous.energy_j
                total_weight = sum(w for w in previous.weights.values() if w > 0)
                if delta > 0 and total_weight > 0:
                    for key, weight in previous.weights.items():
                        if weight > 0:
                            self._totals[key] = (
                                self._totals.get(key, 0.0) + delta * weight / total_weight
                            )
            clean = {k: float(w) for k, w in weights.items() if w > 0}
            self._devices[device_id] = _Device(energy, MappingProxyType(clean))
        holding = {key for dev in self._devices.values() for key in dev.weights}
        for key in holding:
            self._totals.setdefault(key, 0.0)
            if key not in self._attributes:
                self._attributes[key] = MappingProxyType(dict(attributes.get(key, {})))
        self._points = tuple(
            (total, self._attributes.get(key, MappingProxyType({})))
            for key, total in sorted(self._totals.items())
        )
        for key in [k for k in self._totals if k not in holding]:
            del self._totals[key]
            self._attributes.pop(key, None)

    def points(self) -> tuple[tuple[float, Mapping[str, str]], ...]:
        """``(total J, attributes)`` of every workload as of the last update, including the
        final point of those that ended at it."""
        return self._points

    def total(self, key: WorkloadKey) -> float | None:
        """The running total of ``key`` (``None`` when it holds nothing)."""
        return self._totals.get(key)
