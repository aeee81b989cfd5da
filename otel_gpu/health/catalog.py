"""The health event catalog, as data (DESIGN §6).

Every event otel-gpu emits is listed here with its severity, the device state it implies, what
triggers it and the attributes it carries. The README's health reference is generated from this
table (``python -m otel_gpu.health.catalog``).
"""

from __future__ import annotations

from dataclasses import dataclass

from otel_gpu.hal.model import HealthState, Severity

__all__ = ["CATALOG", "EventSpec", "markdown_table", "spec"]


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One kind of health event."""

    name: str
    severity: Severity
    state: HealthState
    trigger: str
    attributes: tuple[str, ...] = ()


_S, _H = Severity, HealthState

CATALOG: tuple[EventSpec, ...] = (
    EventSpec(
        "accel.device.lost",
        _S.FATAL,
        _H.FAILED,
        "the device stopped answering (fell off the bus, GPU is lost)",
        ("error.message",),
    ),
    EventSpec(
        "accel.device.count_mismatch",
        _S.ERROR,
        _H.FAILED,
        "fewer (or more) devices than expected (--expect-devices, OTEL_GPU_EXPECTED_DEVICES)",
        ("accel.device.expected", "accel.device.count"),
    ),
    EventSpec(
        "accel.memory.ecc.uncorrectable",
        _S.ERROR,
        _H.FAILED,
        "volatile uncorrectable ECC count is non-zero or grew",
        ("error.count", "error.delta"),
    ),
    EventSpec(
        "accel.memory.row_remap.failure",
        _S.ERROR,
        _H.FAILED,
        "a memory row remap failed: the device needs service",
        ("accel.retirement.failed",),
    ),
    EventSpec(
        "accel.memory.retirement.pending",
        _S.WARN,
        _H.PREDICTED_FAILURE,
        "a row remap or page retirement waits for a GPU reset",
        ("accel.retirement.pending",),
    ),
    EventSpec(
        "accel.memory.retirement.limit",
        _S.ERROR,
        _H.PREDICTED_FAILURE,
        "retired memory pages reached OTEL_GPU_RETIRED_PAGES_LIMIT: plan to replace the device",
        ("accel.retirement.retired",),
    ),
    EventSpec(
        "accel.pcie.link.degraded",
        _S.WARN,
        _H.DEGRADED,
        "PCIe link trained below its maximum width or generation",
        (
            "accel.pcie.width",
            "accel.pcie.width.max",
            "accel.pcie.generation",
            "accel.pcie.generation.max",
        ),
    ),
    EventSpec(
        "accel.pcie.replay_rate",
        _S.WARN,
        _H.DEGRADED,
        "more PCIe replays in the last minute than OTEL_GPU_PCIE_REPLAY_LIMIT (DCGM's default: 8)",
        ("error.count",),
    ),
    EventSpec(
        "accel.interconnect.link.down",
        _S.ERROR,
        _H.DEGRADED,
        "an interconnect link that was up at start is down",
        ("accel.link.type", "accel.link.index"),
    ),
    EventSpec(
        "accel.interconnect.errors",
        _S.WARN,
        _H.DEGRADED,
        "interconnect link error counters grew",
        ("accel.link.index", "error.delta"),
    ),
    EventSpec(
        "accel.throttle.thermal",
        _S.WARN,
        _H.DEGRADED,
        "clocks throttled for temperature, or temperature above the slowdown threshold",
        ("accel.throttle.reason", "hw.temperature"),
    ),
    EventSpec(
        "accel.throttle.power",
        _S.INFO,
        _H.OK,
        "clocks throttled by the power limit or a power brake",
        ("accel.throttle.reason",),
    ),
    EventSpec(
        "accel.device.busy",
        _S.ERROR,
        _H.DEGRADED,
        "processes hold the device, or its memory is in use, when it should be free "
        "(health --check-busy: Slurm prolog/epilog)",
        ("accel.process.count", "hw.gpu.memory.utilization"),
    ),
    EventSpec(
        "accel.firmware.mismatch",
        _S.WARN,
        _H.OK,
        "devices of the same model run different firmware (VBIOS) versions",
        ("hw.model", "accel.firmware.versions"),
    ),
    EventSpec(
        "accel.telemetry.degraded",
        _S.WARN,
        _H.DEGRADED,
        "a device could not be read (backend error) for several sweeps, or a vendor call "
        "hung past the sweep deadline",
        ("error.message",),
    ),
    EventSpec(
        "nvidia.xid",
        _S.ERROR,
        _H.DEGRADED,
        "the NVIDIA driver reported an Xid error; severity and state follow the Xid class",
        ("nvidia.xid.code", "nvidia.xid.class", "nvidia.xid.action"),
    ),
    EventSpec(
        "amd.gpu.reset",
        _S.ERROR,
        _H.DEGRADED,
        "the AMD driver reset the GPU (an OK event with the same name follows when it is done)",
        ("amd.event.message",),
    ),
    EventSpec(
        "amd.vm_fault",
        _S.INFO,
        _H.OK,
        "a GPU virtual memory fault: a workload touched memory it does not own",
        ("amd.event.message",),
    ),
    EventSpec(
        "accel.device.recovered",
        _S.INFO,
        _H.OK,
        "a device left a bad state (the event that closes an earlier one)",
        ("accel.health.check",),
    ),
)

_BY_NAME = {e.name: e for e in CATALOG}


def spec(name: str) -> EventSpec:
    """The catalog entry for ``name`` (KeyError for a name not in the catalog)."""
    return _BY_NAME[name]


def markdown_table() -> str:
    """The catalog as a markdown table (README)."""
    rows = ["| event | severity | hw.state | trigger | attributes |", "|---|---|---|---|---|"]
    rows.extend(
        f"| `{e.name}` | {e.severity.name} | {e.state.value} | {e.trigger} | "
        f"{', '.join(e.attributes)} |"
        for e in CATALOG
    )
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())  # noqa: T201
