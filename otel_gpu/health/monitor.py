"""Health checks over HAL snapshots, edge-triggered (DESIGN §6).

The :class:`HealthMonitor` runs every check on each snapshot (once per sweep), keeps the set of
active findings per device, and emits a :class:`HealthEvent` when a finding appears, a
``accel.device.recovered`` event when it clears, and re-emits a persisting failure at a low
rate. Driver events (Xid) enter through :meth:`HealthMonitor.record_event` the moment the
backend reports them. The worst active finding of a device is its ``hw.status`` state.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from otel_gpu.hal.model import (
    DeviceInfo,
    DeviceSample,
    HealthEvent,
    HealthState,
    Inventory,
    Severity,
    Snapshot,
)
from otel_gpu.health import catalog
from otel_gpu.health.xid import classify

__all__ = ["Finding", "HealthMonitor", "HealthThresholds", "worst_state"]

_STATE_RANK = {
    HealthState.OK: 0,
    HealthState.DEGRADED: 1,
    HealthState.PREDICTED_FAILURE: 2,
    HealthState.FAILED: 3,
}
THERMAL_REASONS = frozenset({"thermal", "sw_thermal", "hw_thermal", "hw_slowdown"})
POWER_REASONS = frozenset({"power", "sw_power", "hw_power_brake", "current_limit"})


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """Tunable limits of the checks (``OTEL_GPU_HEALTH_*`` variables)."""

    expected_devices: int | None = None
    pcie_replay_limit: float = 8.0
    pcie_replay_window_s: float = 60.0
    retired_pages_limit: int = 60
    reemit_s: float = 300.0
    xid_hold_s: float = 600.0
    degraded_after_sweeps: int = 3
    check_busy: bool = False
    busy_memory_ratio: float = 0.05


@dataclass(frozen=True, slots=True)
class Finding:
    """An active bad condition: a catalog event on one device (or the node, device_id None)."""

    check: str
    device_id: str | None
    severity: Severity
    state: HealthState
    message: str
    attributes: dict[str, str | int | float | bool] = dataclasses.field(default_factory=dict)
    expires_at: float | None = None


def worst_state(states: list[HealthState]) -> HealthState:
    """The most severe of ``states`` (OK when empty)."""
    return max(states, key=_STATE_RANK.__getitem__, default=HealthState.OK)


AttrValue = str | int | float | bool


def _finding(
    name: str, dev: DeviceInfo | None, message: str, attributes: dict[str, AttrValue] | None = None
) -> Finding:
    entry = catalog.spec(name)
    return Finding(
        name, dev.id if dev else None, entry.severity, entry.state, message, attributes or {}
    )


class HealthMonitor:
    """Runs the checks and tracks active findings. Thread-safe.

    ``emit`` receives every event (the OTel bridge turns them into log records); ``clock``
    returns monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        thresholds: HealthThresholds | None = None,
        emit: Callable[[HealthEvent], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.thresholds = thresholds or HealthThresholds()
        self._emit = emit
        self._clock = clock
        self._lock = threading.Lock()
        self._active: dict[tuple[str, str | None], Finding] = {}
        self._last_emit: dict[tuple[str, str | None], float] = {}
        self._prev: dict[str, tuple[float, DeviceSample]] = {}
        self._replays: dict[str, deque[tuple[float, int]]] = {}
        self._failing: dict[str, int] = {}
        self._inventory: Inventory | None = None
        self.events_emitted = 0

    def set_emitter(self, emit: Callable[[HealthEvent], None] | None) -> None:
        """Attach (or detach) the event consumer."""
        self._emit = emit

    # -- inputs ------------------------------------------------------------------------------

    def process(self, inventory: Inventory, snapshot: Snapshot) -> list[HealthEvent]:
        """Run every check on ``snapshot``; emit and return the events it causes."""
        now = self._clock()
        with self._lock:
            self._inventory = inventory
            current = list(self._check(inventory, snapshot, now))
            events = self._transition(current, now, snapshot.timestamp_ns)
        self._deliver(events)
        return events

    def record_event(self, event: HealthEvent) -> None:
        """Take a driver event (e.g. ``nvidia.xid``), classify it, emit it at once.

        The event's state holds for ``xid_hold_s`` in ``hw.status``.
        """
        if event.name == "nvidia.xid":
            code = int(event.attributes.get("nvidia.xid.code", 0))
            xid = classify(code)
            event = dataclasses.replace(
                event,
                severity=xid.severity,
                state=xid.state,
                message=f"{event.message}: {xid.description} ({xid.klass}); action: {xid.action}",
                attributes={
                    **event.attributes,
                    "nvidia.xid.class": xid.klass,
                    "nvidia.xid.action": xid.action,
                },
            )
        if not event.timestamp_ns:
            event = dataclasses.replace(event, timestamp_ns=time.time_ns())
        with self._lock:
            if event.state is HealthState.OK:
                # The driver said the condition is over (a GPU reset completed): clear it.
                self._active.pop((event.name, event.device_id), None)
            else:
                key = (event.name, event.device_id)
                previous = self._active.get(key)
                if previous is None or _STATE_RANK[event.state] >= _STATE_RANK[previous.state]:
                    self._active[key] = Finding(
                        event.name,
                        event.device_id,
                        event.severity,
                        event.state,
                        event.message,
                        dict(event.attributes),
                        self._clock() + self.thresholds.xid_hold_s,
                    )
        self._deliver([event])

    # -- outputs -----------------------------------------------------------------------------

    def state(self, device_id: str) -> HealthState:
        """The device's ``hw.status`` state: its worst active finding (node findings count)."""
        with self._lock:
            return worst_state(
                [f.state for f in self._active.values() if f.device_id in (device_id, None)]
            )

    def findings(self) -> list[Finding]:
        """The active findings, most severe first."""
        with self._lock:
            return sorted(
                self._active.values(), key=lambda f: (-f.severity, f.device_id or "", f.check)
            )

    # -- internals ---------------------------------------------------------------------------

    def _deliver(self, events: list[HealthEvent]) -> None:
        emit = self._emit
        for event in events:
            self.events_emitted += 1
            if emit is not None:
                emit(event)

    def _transition(self, current: list[Finding], now: float, ts: int) -> list[HealthEvent]:
        events: list[HealthEvent] = []
        seen = {(f.check, f.device_id): f for f in current}
        for key, finding in seen.items():
            old = self._active.get(key)
            fresh = old is None or old.expires_at is not None
            grew = old is not None and finding.attributes.get("error.delta", 0) not in (0, None)
            stale = (
                finding.state is HealthState.FAILED
                and now - self._last_emit.get(key, now) >= self.thresholds.reemit_s
            )
            self._active[key] = finding
            if fresh or grew or stale:
                self._last_emit[key] = now
                events.append(self._event(finding, ts))
        for key, old in list(self._active.items()):
            if key in seen:
                continue
            if old.expires_at is not None:
                if now < old.expires_at:
                    continue
            elif key[0] in _SNAPSHOT_CHECKS:
                events.append(self._recovered(old, ts))
            else:
                continue
            del self._active[key]
            self._last_emit.pop(key, None)
        return events

    def _event(self, f: Finding, ts: int) -> HealthEvent:
        return HealthEvent(
            f.check, f.severity, f.state, f.message, f.device_id, ts, dict(f.attributes)
        )

    def _recovered(self, f: Finding, ts: int) -> HealthEvent:
        entry = catalog.spec("accel.device.recovered")
        return HealthEvent(
            entry.name,
            entry.severity,
            HealthState.OK,
            f"recovered: {f.check} cleared",
            f.device_id,
            ts,
            {"accel.health.check": f.check},
        )

    def _check(self, inv: Inventory, snap: Snapshot, now: float) -> Iterator[Finding]:
        th = self.thresholds
        devices = inv.by_id()
        lost = {f.device_id for f in snap.failures if f.lost}
        for failure in snap.failures:
            dev = devices.get(failure.device_id)
            if failure.lost:
                yield _finding(
                    "accel.device.lost",
                    dev,
                    f"{_label(dev, failure.device_id)} lost: {failure.reason}",
                    {"error.message": failure.reason},
                )
                continue
            count = self._failing.get(failure.device_id, 0) + 1
            self._failing[failure.device_id] = count
            # A hung vendor call is reported at once; other read errors once they repeat.
            if failure.stuck or count >= th.degraded_after_sweeps:
                yield _finding(
                    "accel.telemetry.degraded",
                    dev,
                    f"{_label(dev, failure.device_id)} unreadable for {count} sweeps: "
                    f"{failure.reason}",
                    {"error.message": failure.reason},
                )
        failing_now = {f.device_id for f in snap.failures if not f.lost}
        for device_id in list(self._failing):
            if device_id not in failing_now:
                del self._failing[device_id]
        if th.expected_devices is not None:
            present = [d for d in inv.physical() if d.id not in lost]
            if len(present) != th.expected_devices:
                yield _finding(
                    "accel.device.count_mismatch",
                    None,
                    f"{len(present)} devices present, {th.expected_devices} expected",
                    {
                        "accel.device.expected": th.expected_devices,
                        "accel.device.count": len(present),
                    },
                )
        yield from _firmware_mismatch(inv)
        for sample in snap.samples:
            dev = devices.get(sample.device_id)
            if dev is None:
                continue
            prev = self._prev.get(sample.device_id)
            replays = self._replays.setdefault(sample.device_id, deque())
            yield from _device_checks(dev, sample, prev, replays, now=now, th=th)
            self._prev[sample.device_id] = (now, sample)


_SNAPSHOT_CHECKS = frozenset(e.name for e in catalog.CATALOG) - {"nvidia.xid"}


def _firmware_mismatch(inv: Inventory) -> Iterator[Finding]:
    """Devices of one model on one node should run one firmware (VBIOS) version."""
    by_model: dict[str, set[str]] = {}
    for dev in inv.physical():
        if dev.firmware_version:
            by_model.setdefault(dev.model, set()).add(dev.firmware_version)
    for model, versions in sorted(by_model.items()):
        if len(versions) > 1:
            listed = ", ".join(sorted(versions))
            yield _finding(
                "accel.firmware.mismatch",
                None,
                f"{model}: devices run different firmware versions ({listed})",
                {"hw.model": model, "accel.firmware.versions": listed},
            )


def _label(dev: DeviceInfo | None, fallback: str) -> str:
    return f"{dev.name} ({dev.id})" if dev else fallback


def _device_checks(
    dev: DeviceInfo,
    s: DeviceSample,
    prev: tuple[float, DeviceSample] | None,
    replays: deque[tuple[float, int]],
    *,
    now: float,
    th: HealthThresholds,
) -> Iterator[Finding]:
    label = _label(dev, dev.id)
    p = prev[1] if prev else None
    if th.check_busy and dev.parent_id is None:
        procs = len(s.processes or ())
        used = s.memory_utilization_ratio
        if procs or (used is not None and used > th.busy_memory_ratio):
            yield _finding(
                "accel.device.busy",
                dev,
                f"{label}: {procs} process(es) running, "
                f"{(used or 0.0) * 100:.1f}% of memory in use",
                {"accel.process.count": procs, "hw.gpu.memory.utilization": round(used or 0.0, 4)},
            )
    if s.ecc_uncorrected_total:
        # First sight of a non-zero count: all of it is new to us.
        delta = s.ecc_uncorrected_total - (p.ecc_uncorrected_total or 0 if p else 0)
        yield _finding(
            "accel.memory.ecc.uncorrectable",
            dev,
            f"{label}: {s.ecc_uncorrected_total} uncorrectable ECC errors since driver load",
            {"error.count": s.ecc_uncorrected_total, "error.delta": max(0, delta)},
        )
    failed = s.retired_rows.get("failed", 0)
    if failed:
        yield _finding(
            "accel.memory.row_remap.failure",
            dev,
            f"{label}: row remapping failed",
            {"accel.retirement.failed": failed},
        )
    pending = s.retired_rows.get("pending", 0)
    if pending:
        yield _finding(
            "accel.memory.retirement.pending",
            dev,
            f"{label}: {pending} memory rows/pages wait for a GPU reset",
            {"accel.retirement.pending": pending},
        )
    width_low = (
        s.pcie_width is not None and dev.pcie_max_width and s.pcie_width < dev.pcie_max_width
    )
    # An idle GPU lowers its PCIe generation to save power: judge the generation only when busy.
    busy = (s.utilization_ratio or 0.0) > 0.0
    gen_low = (
        busy
        and s.pcie_generation is not None
        and dev.pcie_max_generation
        and s.pcie_generation < dev.pcie_max_generation
    )
    if width_low or gen_low:
        yield _finding(
            "accel.pcie.link.degraded",
            dev,
            f"{label}: PCIe link x{s.pcie_width} gen{s.pcie_generation}, "
            f"capable of x{dev.pcie_max_width} gen{dev.pcie_max_generation}",
            {
                "accel.pcie.width": s.pcie_width or 0,
                "accel.pcie.width.max": dev.pcie_max_width or 0,
                "accel.pcie.generation": s.pcie_generation or 0,
                "accel.pcie.generation.max": dev.pcie_max_generation or 0,
            },
        )
    if s.pcie_replay_total is not None:
        # Replays within the trailing window (DCGM's rule: more than 8 in a minute).
        replays.append((now, s.pcie_replay_total))
        while len(replays) > 1 and replays[1][0] <= now - th.pcie_replay_window_s:
            replays.popleft()
        recent = s.pcie_replay_total - replays[0][1]
        if recent > th.pcie_replay_limit:
            yield _finding(
                "accel.pcie.replay_rate",
                dev,
                f"{label}: {recent} PCIe replays in the last {now - replays[0][0]:.0f}s "
                f"(limit {th.pcie_replay_limit:g} per {th.pcie_replay_window_s:g}s)",
                {"error.count": recent, "error.delta": 0},
            )
    retired = s.retired_rows.get("retired", 0)
    if th.retired_pages_limit and retired >= th.retired_pages_limit:
        yield _finding(
            "accel.memory.retirement.limit",
            dev,
            f"{label}: {retired} memory pages retired (limit {th.retired_pages_limit})",
            {"accel.retirement.retired": retired},
        )
    was_up = {link.index for link in dev.links if link.up}
    for link in s.links:
        if link.up is False and link.index in was_up:
            yield _finding(
                "accel.interconnect.link.down",
                dev,
                f"{label}: {link.link_type} link {link.index} is down",
                {"accel.link.type": link.link_type, "accel.link.index": link.index},
            )
    if p:
        before = {link.index: link for link in p.links}
        for link in s.links:
            old = before.get(link.index)
            if old is None:
                continue
            delta = sum(link.errors.values()) - sum(old.errors.values())
            if delta > 0:
                yield _finding(
                    "accel.interconnect.errors",
                    dev,
                    f"{label}: {delta} new errors on {link.link_type} link {link.index}",
                    {"accel.link.index": link.index, "error.delta": delta},
                )
    reasons = s.throttle_reasons or frozenset()
    # MI300 has no edge ("gpu") sensor: judge its hotspot against the threshold instead.
    gpu_temp = s.temperatures_c.get("gpu", s.temperatures_c.get("hotspot"))
    hot = (
        gpu_temp is not None
        and dev.temperature_slowdown_c is not None
        and gpu_temp >= dev.temperature_slowdown_c
    )
    if reasons & THERMAL_REASONS or hot:
        yield _finding(
            "accel.throttle.thermal",
            dev,
            f"{label}: thermal throttling ({', '.join(sorted(reasons & THERMAL_REASONS)) or 'hot'}"
            f", {gpu_temp} C)",
            {
                "accel.throttle.reason": ",".join(sorted(reasons & THERMAL_REASONS))
                or "temperature",
                "hw.temperature": gpu_temp if gpu_temp is not None else -1.0,
            },
        )
    if reasons & POWER_REASONS:
        yield _finding(
            "accel.throttle.power",
            dev,
            f"{label}: clocks held by the power limit",
            {"accel.throttle.reason": ",".join(sorted(reasons & POWER_REASONS))},
        )
