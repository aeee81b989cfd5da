"""The metric table: every metric otel-gpu exports, as data (DESIGN §4).

Each :class:`MetricSpec` names an instrument and says how to read its points from one device's
sample. The bridge registers them in one loop; the README's metric reference is generated from
this table (``python -m otel_gpu.otel.metrics``). Names follow the OTel hardware semantic
conventions (``hw.*``); vendor-neutral extensions live under ``accel.*``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from otel_gpu.hal.model import DeviceInfo, DeviceSample, Inventory

__all__ = ["METRICS", "Instrument", "MetricSpec", "Point", "cardinality_limit", "markdown_table"]

SDK_DEFAULT_CARDINALITY = 2000

Attrs = dict[str, str | int]
Point = tuple[float, Attrs]


class Instrument(str, enum.Enum):
    """Observable instrument kinds."""

    GAUGE = "Gauge"
    COUNTER = "Counter"
    UPDOWNCOUNTER = "UpDownCounter"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric: its name, instrument, unit, description and point reader.

    ``read`` yields ``(value, extra attributes)`` for one device; it yields nothing when the
    sample lacks the quantity (not supported is data: no point, never NaN or 0).
    ``opt_in`` metrics are only registered when their feature is enabled (e.g. processes).
    """

    name: str
    instrument: Instrument
    unit: str
    description: str
    read: Callable[[DeviceInfo, DeviceSample], Iterator[Point]]
    attributes: str = ""
    opt_in: str | None = None


def _one(value: float | None, attrs: Attrs | None = None) -> Iterator[Point]:
    if value is not None:
        yield float(value), attrs or {}


def _utilization(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    yield from _one(s.utilization_ratio, {"hw.gpu.task": "general"})
    yield from _one(s.encoder_utilization_ratio, {"hw.gpu.task": "encoder"})
    yield from _one(s.decoder_utilization_ratio, {"hw.gpu.task": "decoder"})


def _memory_limit(d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    yield from _one(
        s.memory_total_bytes if s.memory_total_bytes is not None else d.memory_total_bytes
    )


def _io(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    yield from _one(s.pcie_tx_bytes, {"network.io.direction": "transmit"})
    yield from _one(s.pcie_rx_bytes, {"network.io.direction": "receive"})


def _temperature(d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    for location, value in s.temperatures_c.items():
        yield (
            value,
            {
                "hw.type": "temperature",
                "hw.id": f"{d.id}:{location}",
                "hw.parent": d.id,
                "hw.sensor_location": location,
            },
        )


def _errors(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    yield from _one(s.ecc_corrected_total, {"error.type": "corrected"})
    yield from _one(s.ecc_uncorrected_total, {"error.type": "uncorrected"})
    yield from _one(s.pcie_replay_total, {"error.type": "pcie_replay"})


def _clocks(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    for domain, hz in s.clocks_hz.items():
        yield hz, {"accel.clock.domain": domain}


def _throttle(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    if s.throttle_reasons is None:
        return
    for reason in sorted(s.throttle_reasons):
        yield 1.0, {"accel.throttle.reason": reason}
    if not s.throttle_reasons:
        yield 0.0, {"accel.throttle.reason": "none"}


def _retired(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    for state, count in s.retired_rows.items():
        yield float(count), {"accel.retirement.state": state}


def _link_io(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    for link in s.links:
        base: Attrs = {"accel.link.type": link.link_type, "accel.link.index": link.index}
        yield from _one(link.tx_bytes, {**base, "network.io.direction": "transmit"})
        yield from _one(link.rx_bytes, {**base, "network.io.direction": "receive"})


def _link_errors(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    for link in s.links:
        for kind, count in link.errors.items():
            yield (
                float(count),
                {
                    "accel.link.type": link.link_type,
                    "accel.link.index": link.index,
                    "error.type": kind,
                },
            )


def _link_status(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    for link in s.links:
        if link.up is not None:
            yield (
                (1.0 if link.up else 0.0),
                {
                    "accel.link.type": link.link_type,
                    "accel.link.index": link.index,
                },
            )


def _engines(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    for engine, ratio in s.engines.items():
        yield ratio, {"accel.engine": engine}


def _processes(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    for proc in s.processes or ():
        yield from _one(proc.memory_used_bytes, {"process.pid": proc.pid})


def _pcie_width(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    yield from _one(s.pcie_width)


def _pcie_generation(_d: DeviceInfo, s: DeviceSample) -> Iterator[Point]:
    yield from _one(s.pcie_generation)


G, C, U = Instrument.GAUGE, Instrument.COUNTER, Instrument.UPDOWNCOUNTER

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "hw.gpu.utilization",
        G,
        "1",
        "Fraction of time the GPU was busy, by task.",
        _utilization,
        "hw.gpu.task",
    ),
    MetricSpec(
        "hw.gpu.memory.usage",
        U,
        "By",
        "GPU memory in use.",
        lambda _d, s: _one(s.memory_used_bytes),
    ),
    MetricSpec("hw.gpu.memory.limit", U, "By", "Total GPU memory.", _memory_limit),
    MetricSpec(
        "hw.gpu.memory.utilization",
        G,
        "1",
        "Fraction of GPU memory in use (usage/limit).",
        lambda _d, s: _one(s.memory_utilization_ratio),
    ),
    MetricSpec(
        "hw.gpu.io",
        C,
        "By",
        "Bytes moved over the host link (PCIe), by direction.",
        _io,
        "network.io.direction",
    ),
    MetricSpec("hw.power", G, "W", "Power drawn by the device.", lambda _d, s: _one(s.power_w)),
    MetricSpec(
        "hw.energy",
        C,
        "J",
        "Energy consumed by the device since the driver loaded.",
        lambda _d, s: _one(s.energy_j),
    ),
    MetricSpec(
        "hw.temperature",
        G,
        "Cel",
        "Temperature by sensor location.",
        _temperature,
        "hw.type=temperature, hw.parent, hw.sensor_location",
    ),
    MetricSpec(
        "hw.errors",
        C,
        "{error}",
        "Memory ECC errors (volatile) and PCIe replays.",
        _errors,
        "error.type",
    ),
    MetricSpec(
        "accel.memory.bandwidth.utilization",
        G,
        "1",
        "Fraction of time device memory was being read or written.",
        lambda _d, s: _one(s.memory_bandwidth_utilization_ratio),
    ),
    MetricSpec(
        "accel.clock.frequency",
        G,
        "Hz",
        "Current clock frequency by domain.",
        _clocks,
        "accel.clock.domain",
    ),
    MetricSpec(
        "accel.power.limit", G, "W", "Enforced power limit.", lambda _d, s: _one(s.power_limit_w)
    ),
    MetricSpec(
        "accel.throttle.active",
        G,
        "1",
        "1 for each active clock throttle reason; reason=none with 0 when not throttled.",
        _throttle,
        "accel.throttle.reason",
    ),
    MetricSpec(
        "accel.memory.retired",
        U,
        "{row}",
        "Memory rows remapped, pending or failed; pages retired (page retirement).",
        _retired,
        "accel.retirement.state",
    ),
    MetricSpec("accel.pcie.link.width", G, "{lane}", "Current PCIe link width.", _pcie_width),
    MetricSpec(
        "accel.pcie.link.generation", G, "1", "Current PCIe link generation.", _pcie_generation
    ),
    MetricSpec(
        "accel.interconnect.io",
        C,
        "By",
        "Bytes moved over each interconnect link.",
        _link_io,
        "accel.link.type, accel.link.index, network.io.direction",
    ),
    MetricSpec(
        "accel.interconnect.errors",
        C,
        "{error}",
        "Interconnect link errors by type.",
        _link_errors,
        "accel.link.type, accel.link.index, error.type",
    ),
    MetricSpec(
        "accel.interconnect.link.status",
        G,
        "1",
        "1 when the link is up, 0 when down.",
        _link_status,
        "accel.link.type, accel.link.index",
    ),
    MetricSpec(
        "accel.engine.utilization",
        G,
        "1",
        "Utilization of an engine (Intel engine group, NeuronCore...).",
        _engines,
        "accel.engine",
    ),
    MetricSpec(
        "accel.process.memory.usage",
        U,
        "By",
        "Device memory used by a process.",
        _processes,
        "process.pid",
        opt_in="processes",
    ),
)


def cardinality_limit(inventory: Inventory, processes_per_device: int = 64) -> int:
    """A per-metric series limit large enough for this node.

    The SDK keeps at most 2000 series per metric by default and folds the rest into one
    ``otel.metric.overflow`` point. A 64-GPU node with 18 NVLinks each has 3,456 series of
    ``accel.interconnect.errors`` (links x error types): the limit follows the node instead.
    """
    links = max((len(d.links) for d in inventory.devices), default=0)
    per_device = max(8, 3 * links + 3) + processes_per_device
    return max(SDK_DEFAULT_CARDINALITY, 2 * len(inventory.devices) * per_device)


def markdown_table() -> str:
    """The metric reference as a markdown table (README)."""
    rows = [
        "| name | instrument | unit | extra attributes | description |",
        "|---|---|---|---|---|",
    ]
    rows.extend(
        f"| `{m.name}` | {m.instrument.value} | `{m.unit}` | {m.attributes} | "
        f"{m.description}{' (opt-in: ' + m.opt_in + ')' if m.opt_in else ''} |"
        for m in METRICS
    )
    rows.append(
        "| `hw.status` | UpDownCounter | `1` | hw.state | 1 for the device's current health state, "
        "0 for the others (ok, degraded, failed, predicted_failure). |"
    )
    rows.extend(
        [
            "| `accel.workload.energy` | Counter | `J` | k8s.pod.*, k8s.namespace.name or "
            "slurm.job.* | Energy spent by a pod or job on the devices it held (opt-in: "
            "OTEL_GPU_ATTRIBUTION). |",
            "| `accel.workload.memory.usage` | UpDownCounter | `By` | process.pid, k8s.*/slurm.* | "
            "Device memory of a process, attributed to its pod or job (opt-in: "
            "OTEL_GPU_ATTRIBUTION=process). |",
            "| `accel.workload.utilization` | Gauge | `1` | process.pid, k8s.*/slurm.* | "
            "Device utilization of a process where the vendor gives it (opt-in: "
            "OTEL_GPU_ATTRIBUTION=process). |",
        ]
    )
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())  # noqa: T201
