"""NVIDIA Xid classification, as data, following DCGM's classes.

``fatal`` Xids mean the GPU must be reset or drained; ``warn`` ones need attention;
``application`` ones are caused by the workload (illegal address, kernel fault) and are
informational for the node.
"""

from __future__ import annotations

from dataclasses import dataclass

from otel_gpu.hal.model import HealthState, Severity

__all__ = ["XID_CLASSES", "XidClass", "classify"]


@dataclass(frozen=True, slots=True)
class XidClass:
    """How one Xid code is treated."""

    code: int
    klass: str
    severity: Severity
    state: HealthState
    action: str
    description: str


_FATAL = ("fatal", Severity.FATAL, HealthState.FAILED)
_WARN = ("warn", Severity.WARN, HealthState.DEGRADED)
_APP = ("application", Severity.INFO, HealthState.OK)

_TABLE: tuple[tuple[int, tuple[str, Severity, HealthState], str, str], ...] = (
    (
        13,
        _APP,
        "none: check the application (graphics engine exception)",
        "Graphics Engine Exception",
    ),
    (31, _APP, "none: check the application (GPU memory page fault)", "GPU memory page fault"),
    (43, _APP, "none: the application was stopped by the driver", "GPU stopped processing"),
    (45, _APP, "none: preemptive cleanup after an earlier error", "Preemptive cleanup"),
    (
        48,
        _FATAL,
        "drain the node and reset the GPU; replace it if it repeats",
        "Double Bit ECC Error",
    ),
    (
        63,
        _WARN,
        "reset the GPU when idle to apply the pending row remap",
        "ECC page retirement or row remapping recording event",
    ),
    (
        64,
        _WARN,
        "reset the GPU; replace it if the remap keeps failing",
        "ECC page retirement or row remapper recording failure",
    ),
    (68, _APP, "none: check the application (video processor exception)", "NVDEC0 Exception"),
    (74, _FATAL, "drain the node; check NVLink cables/bridges and reset", "NVLink Error"),
    (
        79,
        _FATAL,
        "drain the node; the GPU has fallen off the bus: reboot, check power and seating",
        "GPU has fallen off the bus",
    ),
    (
        92,
        _WARN,
        "watch the corrected error rate; reset if it keeps rising",
        "High single-bit ECC error rate",
    ),
    (94, _WARN, "restart the affected application; the error was contained", "Contained ECC error"),
    (
        95,
        _FATAL,
        "drain the node and reset the GPU (uncontained ECC error)",
        "Uncontained ECC error",
    ),
    (
        109,
        _APP,
        "none: check the application (context switch timeout)",
        "Context Switch Timeout Error",
    ),
    (119, _FATAL, "drain the node and reset the GPU (GSP RPC timeout)", "GSP RPC Timeout"),
    (120, _FATAL, "drain the node and reset the GPU (GSP error)", "GSP Error"),
    (
        140,
        _FATAL,
        "drain the node and reset the GPU (unrecovered ECC error)",
        "Unrecovered ECC Error",
    ),
)

XID_CLASSES: dict[int, XidClass] = {
    code: XidClass(code, klass[0], klass[1], klass[2], action, description)
    for code, klass, action, description in _TABLE
}


def classify(code: int) -> XidClass:
    """The class of Xid ``code``; unknown codes are ``warn`` (look them up in NVIDIA's list)."""
    known = XID_CLASSES.get(code)
    if known is not None:
        return known
    return XidClass(
        code,
        "warn",
        Severity.WARN,
        HealthState.DEGRADED,
        "look the code up in NVIDIA's Xid catalog",
        f"Xid {code}",
    )
