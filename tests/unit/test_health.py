"""Health checks over simulated snapshots: each fires on its fault and stays quiet otherwise."""

from __future__ import annotations

import dataclasses

import pytest

from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.hal import DeviceManager, HealthEvent, HealthState, Severity
from otel_gpu.health import CATALOG, HealthMonitor, HealthThresholds, classify
from otel_gpu.health.xid import XID_CLASSES


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _run(
    spec: str, sweeps: int = 1, **thresholds: object
) -> tuple[HealthMonitor, list[HealthEvent], DeviceManager]:
    events: list[HealthEvent] = []
    clock = Clock()
    monitor = HealthMonitor(HealthThresholds(**thresholds), events.append, clock)  # type: ignore[arg-type]
    manager = DeviceManager([SimulatedBackend(spec, timer=clock)])
    manager.open()
    manager.start_events(monitor.record_event)
    for _ in range(sweeps):
        monitor.process(manager.inventory, manager.sample())
        clock.t += 10.0
    return monitor, events, manager


def test_a_healthy_node_is_quiet() -> None:
    monitor, events, manager = _run("count=8", sweeps=5, expected_devices=8)
    assert events == []
    assert monitor.findings() == []
    assert {monitor.state(d.id) for d in manager.inventory.devices} == {HealthState.OK}


@pytest.mark.parametrize(
    ("fault", "event", "state"),
    [
        ("ecc@1:0", "accel.memory.ecc.uncorrectable", HealthState.FAILED),
        ("lost@1:0", "accel.device.lost", HealthState.FAILED),
        ("row-remap-failure@1:0", "accel.memory.row_remap.failure", HealthState.FAILED),
        (
            "retirement-pending@1:0",
            "accel.memory.retirement.pending",
            HealthState.PREDICTED_FAILURE,
        ),
        ("pcie-degraded@1:0", "accel.pcie.link.degraded", HealthState.DEGRADED),
        ("link-down@1:0", "accel.interconnect.link.down", HealthState.DEGRADED),
        ("throttle-thermal@1:0", "accel.throttle.thermal", HealthState.DEGRADED),
        ("hot@1:0", "accel.throttle.thermal", HealthState.DEGRADED),
        ("throttle-power@1:0", "accel.throttle.power", HealthState.OK),
    ],
)
def test_each_check_fires_on_its_fault_for_that_device_only(
    fault: str, event: str, state: HealthState
) -> None:
    monitor, events, manager = _run(f"count=4,faults={fault}", sweeps=2)
    gpu1 = manager.inventory.devices[1]
    assert [(e.name, e.device_id) for e in events] == [(event, gpu1.id)]
    assert events[0].state is state
    assert events[0].severity is next(c.severity for c in CATALOG if c.name == event)
    assert gpu1.name in events[0].message
    assert monitor.state(gpu1.id) is state
    others = [d for d in manager.inventory.devices if d.id != gpu1.id]
    assert {monitor.state(d.id) for d in others} == {HealthState.OK}


def test_count_mismatch_is_a_node_finding_that_fails_every_device() -> None:
    monitor, events, manager = _run("count=7", expected_devices=8)
    assert [e.name for e in events] == ["accel.device.count_mismatch"]
    assert events[0].attributes["accel.device.count"] == 7
    assert events[0].device_id is None
    assert monitor.state(manager.inventory.devices[0].id) is HealthState.FAILED


def test_a_lost_device_counts_as_missing_for_the_expected_count() -> None:
    _, events, _ = _run("count=8,faults=lost@3:0", expected_devices=8)
    assert sorted(e.name for e in events) == ["accel.device.count_mismatch", "accel.device.lost"]


def test_edge_triggered_enter_persist_and_leave() -> None:
    monitor, events, manager = _run("count=2,faults=lost@0:1;recover@0:4", sweeps=6)
    gpu0 = manager.inventory.devices[0].id
    names = [e.name for e in events]
    # Lost at sweep 1, still lost at 2 and 3 (no repeat), back at 4.
    assert names == ["accel.device.lost", "accel.device.recovered"]
    assert events[1].state is HealthState.OK and events[1].device_id == gpu0
    assert events[1].attributes["accel.health.check"] == "accel.device.lost"
    assert monitor.state(gpu0) is HealthState.OK


def test_a_persisting_failure_is_re_emitted_at_the_low_rate() -> None:
    # Sweeps are 10 s apart; re-emit every 25 s: sweeps 0, 3 and 6 emit (at 0, 30, 60 s).
    _, events, _ = _run("count=1,faults=lost@0:0", sweeps=7, reemit_s=25.0)
    assert [e.name for e in events] == ["accel.device.lost"] * 3


def test_new_ecc_errors_re_emit_at_once() -> None:
    events: list[HealthEvent] = []
    monitor = HealthMonitor(emit=events.append)
    manager = DeviceManager([SimulatedBackend("count=1,faults=ecc@0:0;ecc@0:2")])
    manager.open()
    for _ in range(4):
        monitor.process(manager.inventory, manager.sample())
    assert [e.attributes["error.count"] for e in events] == [1, 2]
    assert events[1].attributes["error.delta"] == 1


def test_telemetry_degraded_after_repeated_unreadable_sweeps() -> None:
    monitor = HealthMonitor(HealthThresholds(degraded_after_sweeps=3))
    backend = SimulatedBackend("count=2")
    manager = DeviceManager([backend])
    manager.open()
    from otel_gpu.hal import DeviceFailure

    for i in range(4):
        snap = manager.sample()
        dev = manager.inventory.devices[0].id
        broken = dataclasses.replace(
            snap,
            samples=tuple(s for s in snap.samples if s.device_id != dev),
            failures=(DeviceFailure(dev, "NVML Timeout"),),
        )
        events = monitor.process(manager.inventory, broken)
        assert [e.name for e in events] == (["accel.telemetry.degraded"] if i == 2 else [])


@pytest.mark.parametrize(
    ("code", "klass", "severity", "state"),
    [
        (79, "fatal", Severity.FATAL, HealthState.FAILED),
        (48, "fatal", Severity.FATAL, HealthState.FAILED),
        (94, "warn", Severity.WARN, HealthState.DEGRADED),
        (13, "application", Severity.INFO, HealthState.OK),
        (31, "application", Severity.INFO, HealthState.OK),
        (9999, "warn", Severity.WARN, HealthState.DEGRADED),
    ],
)
def test_xid_classes(code: int, klass: str, severity: Severity, state: HealthState) -> None:
    xid = classify(code)
    assert (xid.klass, xid.severity, xid.state) == (klass, severity, state)
    assert xid.action


def test_dcgm_fatal_and_application_lists_are_in_the_table() -> None:
    assert {c for c, x in XID_CLASSES.items() if x.klass == "fatal"} >= {
        48,
        74,
        79,
        95,
        119,
        120,
        140,
    }
    assert {c for c, x in XID_CLASSES.items() if x.klass == "application"} == {
        13,
        31,
        43,
        45,
        68,
        109,
    }


def test_xid_events_are_classified_and_hold_the_device_state() -> None:
    monitor, events, manager = _run("count=2,faults=xid79@0:0;xid13@1:0")
    by_dev = {e.device_id: e for e in events}
    gpu0, gpu1 = (d.id for d in manager.inventory.devices)
    assert by_dev[gpu0].severity is Severity.FATAL
    assert by_dev[gpu0].attributes["nvidia.xid.class"] == "fatal"
    assert "fallen off the bus" in by_dev[gpu0].message
    assert by_dev[gpu1].severity is Severity.INFO
    assert monitor.state(gpu0) is HealthState.FAILED
    assert monitor.state(gpu1) is HealthState.OK


def test_xid_state_expires_after_the_hold_time() -> None:
    clock = Clock()
    monitor = HealthMonitor(HealthThresholds(xid_hold_s=60.0), clock=clock)
    manager = DeviceManager([SimulatedBackend("count=1,faults=xid48@0:0")])
    manager.open()
    manager.start_events(monitor.record_event)
    monitor.process(manager.inventory, manager.sample())
    gpu0 = manager.inventory.devices[0].id
    assert monitor.state(gpu0) is HealthState.FAILED
    clock.t = 59.0
    monitor.process(manager.inventory, manager.sample())
    assert monitor.state(gpu0) is HealthState.FAILED
    clock.t = 61.0
    monitor.process(manager.inventory, manager.sample())
    assert monitor.state(gpu0) is HealthState.OK


def test_the_catalog_names_are_unique_and_namespaced() -> None:
    names = [c.name for c in CATALOG]
    assert len(names) == len(set(names))
    assert all(
        n.startswith(("accel.", "nvidia.", "amd.", "intel.", "tpu.", "neuron.")) for n in names
    )


def test_busy_check_fires_on_a_loaded_node_and_not_on_an_idle_one() -> None:
    _, events, _ = _run("count=2", check_busy=True)
    assert [e.name for e in events] == ["accel.device.busy"] * 2
    assert events[0].attributes["accel.process.count"] == 1
    _, idle_events, _ = _run("count=2,idle=true", check_busy=True)
    assert idle_events == []
    _, off, _ = _run("count=2")  # off unless asked for (prolog/epilog use)
    assert off == []


def test_firmware_mismatch_across_devices_of_one_model() -> None:
    from otel_gpu.hal import DeviceInfo, Inventory, Snapshot

    def dev(i: int, fw: str, model: str = "H100") -> DeviceInfo:
        return DeviceInfo(
            index=i, id=f"d{i}", vendor="nvidia", model=model, backend="b", firmware_version=fw
        )

    monitor = HealthMonitor()
    same = Inventory((dev(0, "96.00.99"), dev(1, "96.00.99"), dev(2, "90.1", "A100")))
    assert monitor.process(same, Snapshot(1)) == []
    mixed = Inventory((dev(0, "96.00.99"), dev(1, "96.00.74"), dev(2, "90.1", "A100")))
    events = HealthMonitor().process(mixed, Snapshot(1))
    assert [e.name for e in events] == ["accel.firmware.mismatch"]
    assert events[0].attributes["accel.firmware.versions"] == "96.00.74, 96.00.99"
    assert events[0].severity is Severity.WARN


def test_pcie_replays_over_the_trailing_minute() -> None:
    from otel_gpu.hal import DeviceInfo, DeviceSample, Inventory, Snapshot

    dev = DeviceInfo(index=0, id="d0", vendor="nvidia", model="m", backend="b")
    inv = Inventory((dev,))
    clock = Clock()
    monitor = HealthMonitor(HealthThresholds(pcie_replay_limit=8), clock=clock)

    def sweep(t: float, replays: int) -> list[str]:
        clock.t = t
        snap = Snapshot(1, (DeviceSample("d0", pcie_replay_total=replays),))
        return [e.name for e in monitor.process(inv, snap)]

    assert sweep(0, 100) == []  # a high count since boot is history, not a rate
    assert sweep(10, 104) == []
    assert sweep(20, 109) == ["accel.pcie.replay_rate"]  # 9 within the minute
    assert sweep(90, 110) == ["accel.device.recovered"]  # 1 in the last minute
    assert sweep(100, 111) == []


def test_retired_pages_over_the_limit() -> None:
    from otel_gpu.hal import DeviceInfo, DeviceSample, Inventory, Snapshot

    inv = Inventory((DeviceInfo(index=0, id="d0", vendor="nvidia", model="V100", backend="b"),))
    monitor = HealthMonitor(HealthThresholds(retired_pages_limit=60))
    quiet = Snapshot(1, (DeviceSample("d0", retired_rows={"retired": 59, "pending": 0}),))
    assert monitor.process(inv, quiet) == []
    full = Snapshot(2, (DeviceSample("d0", retired_rows={"retired": 60, "pending": 0}),))
    events = monitor.process(inv, full)
    assert [e.name for e in events] == ["accel.memory.retirement.limit"]
    assert events[0].state is HealthState.PREDICTED_FAILURE
