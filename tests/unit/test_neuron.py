"""The Neuron backend over fake neuron-monitor / neuron-ls executables replaying recorded output."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.backends.neuron import NeuronBackend
from otel_gpu.backends.neuron._report import (
    CoreMap,
    ecc_deltas,
    hardware_info,
    parse_neuron_ls,
    usage,
)
from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.errors import BackendUnavailable
from otel_gpu.hal import DeviceManager, HealthState, interconnect_domains
from otel_gpu.hal.model import Snapshot
from otel_gpu.hal.protocol import Backend
from otel_gpu.health import HealthMonitor
from otel_gpu.otel import GpuTelemetry
from otel_gpu.testing.fake_tpu_neuron import (
    TRN1_32XLARGE,
    FakeNeuronTools,
    install_neuron,
    neuron_scenarios,
)

GIB = 1 << 30
MIB = 1 << 20
TRAIN_CORE_BYTES = GIB + 128 * MIB + 256 * MIB + 64 * MIB + 2 * GIB  # + r * 64 MiB in report r


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def _backend(tools: FakeNeuronTools, **kwargs: Any) -> NeuronBackend:
    kwargs.setdefault("period_s", 0.05)
    return NeuronBackend(monitor=str(tools.monitor), root=TRN1_32XLARGE, **kwargs)


@pytest.fixture
def trn1(tmp_path: Path) -> Iterator[tuple[FakeNeuronTools, NeuronBackend]]:
    tools = FakeNeuronTools(tmp_path)
    backend = _backend(tools)
    backend.open()
    yield tools, backend
    backend.close()


def _reports_seen(backend: NeuronBackend) -> int:
    assert backend.monitor is not None
    return backend.monitor.state().sequence


def test_backend_satisfies_the_protocol(tmp_path: Path) -> None:
    tools = FakeNeuronTools(tmp_path)
    assert isinstance(_backend(tools), Backend)
    assert NeuronBackend.name == "neuron" and NeuronBackend.auto


def test_probe_names_the_package_and_the_driver(tmp_path: Path) -> None:
    tools = FakeNeuronTools(tmp_path / "tools")
    probe = _backend(tools).probe()
    assert probe.available and probe.device_count == 16
    missing = NeuronBackend(monitor=str(tmp_path / "nope"), root=TRN1_32XLARGE).probe()
    assert not missing.available and "aws-neuronx-tools" in missing.reason
    no_driver = NeuronBackend(monitor=str(tools.monitor), root=tmp_path).probe()
    assert not no_driver.available and "/dev" in no_driver.reason
    with pytest.raises(BackendUnavailable, match="aws-neuronx-tools"):
        NeuronBackend(monitor=str(tmp_path / "nope"), root=TRN1_32XLARGE).open()


def test_trn1_inventory_and_neuronlink_topology(
    trn1: tuple[FakeNeuronTools, NeuronBackend],
) -> None:
    _, backend = trn1
    inv = backend.inventory()
    assert len(inv.devices) == 16
    d0 = inv.devices[0]
    assert (d0.kind, d0.vendor, d0.model) == ("neuron", "aws", "Trainium1")
    assert d0.id == "neuron-9ff5434815c8bd80" and d0.serial == "9ff5434815c8bd80"
    assert [d.pci_bus_id for d in inv.devices][:2] == ["0000:00:04.0", "0000:00:05.0"]
    assert [d.numa_node for d in inv.devices] == [0] * 8 + [1] * 8
    assert d0.cpu_affinity == "0-31,64-95"
    assert {d.memory_total_bytes for d in inv.devices} == {32 * GIB}
    assert d0.extra["neuron.core_ids"] == "0,1"
    assert inv.devices[15].extra["neuron.core_ids"] == "30,31"
    assert [link.remote_device_index for link in d0.links] == [12, 3, 4, 1]
    assert {link.link_type for d in inv.devices for link in d.links} == {"neuronlink"}
    assert d0.links[0].remote_pci_bus_id == "0000:00:10.0"
    assert interconnect_domains(inv.devices) == [list(range(16))]
    assert inv.versions == {"neuron.driver": "2.19.64.0"}


def test_values_and_units(trn1: tuple[FakeNeuronTools, NeuronBackend]) -> None:
    _, backend = trn1
    wait_for(lambda: _reports_seen(backend) >= 4)  # the last recorded report now repeats
    snap = backend.sample()
    assert snap.failures == () and len(snap.samples) == 16
    s = {i: snap.samples[i] for i in range(16)}
    # report 3: core c is 60 + c + 3 % busy
    assert dict(s[0].engines) == pytest.approx({"core0": 0.63, "core1": 0.64})
    assert s[0].utilization_ratio == pytest.approx(0.635)
    assert dict(s[7].engines) == pytest.approx({"core0": 0.77, "core1": 0.78})
    assert s[0].memory_used_bytes == 2 * (TRAIN_CORE_BYTES + 3 * 64 * MIB)
    assert s[0].memory_total_bytes == 32 * GIB
    assert s[8].utilization_ratio == pytest.approx(0.15)  # the small application, cores 16-17
    assert s[8].memory_used_bytes == 2 * (512 + 256) * MIB
    for idle in (9, 15):  # no application: idle and empty, measured (not absent)
        assert s[idle].utilization_ratio == 0.0
        assert dict(s[idle].engines) == {"core0": 0.0, "core1": 0.0}
        assert s[idle].memory_used_bytes == 0
    for sample in snap.samples:
        assert sample.power_w is None and sample.temperatures_c == {}
        assert sample.memory_bandwidth_utilization_ratio is None


def test_ecc_events_of_each_period_add_up(trn1: tuple[FakeNeuronTools, NeuronBackend]) -> None:
    _, backend = trn1
    wait_for(lambda: _reports_seen(backend) >= 6)
    by_index = {i: s for i, s in enumerate(backend.sample().samples)}
    assert (by_index[5].ecc_corrected_total, by_index[5].ecc_uncorrected_total) == (2, 1)
    assert (by_index[7].ecc_corrected_total, by_index[7].ecc_uncorrected_total) == (1, 0)
    assert (by_index[0].ecc_corrected_total, by_index[0].ecc_uncorrected_total) == (0, 0)


def test_malformed_line_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tools = FakeNeuronTools(tmp_path, malformed_after=1)
    backend = _backend(tools)
    with caplog.at_level(logging.DEBUG, logger="otel_gpu.backends.neuron"):
        backend.open()
        wait_for(lambda: _reports_seen(backend) >= 3)
    assert backend.monitor is not None and backend.monitor.malformed == 1
    assert backend.monitor.restarts == 0
    assert any("malformed line" in r.getMessage() for r in caplog.records)
    assert backend.sample().failures == ()
    backend.close()


def test_crash_fails_the_devices_until_the_restart_with_backoff(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    # run 0: two reports then exit 1; run 1: exits at once; run 2 keeps going.
    tools = FakeNeuronTools(tmp_path, crash_after=[2, 0])
    backend = _backend(tools, clock=clock, backoff_initial_s=1.0, backoff_max_s=8.0)
    backend.open()
    monitor = backend.monitor
    assert monitor is not None
    health = HealthMonitor()
    inv = backend.inventory()
    with caplog.at_level(logging.WARNING, logger="otel_gpu.backends.neuron"):
        wait_for(lambda: monitor.restarts == 1)
        snap = backend.sample()
        assert snap.samples == ()
        assert len(snap.failures) == 16 and not any(f.lost for f in snap.failures)
        assert "exited with code 1; restarting it in 1.0 s" in snap.failures[0].reason
        for _ in range(3):  # failed, not lost: telemetry degraded, never accel.device.lost
            events = health.process(inv, backend.sample())
        assert {e.name for e in events} == {"accel.telemetry.degraded"}
        assert health.state(inv.devices[0].id) is HealthState.DEGRADED
        time.sleep(0.2)
        assert tools.runs == 1  # the backoff runs on the injected clock
        clock.now += 1.0
        wait_for(lambda: monitor.restarts == 2)  # run 1 died at once: the delay doubles
        assert monitor.delays == [1.0, 2.0]
        clock.now += 1.0
        time.sleep(0.2)
        assert tools.runs == 2
        clock.now += 1.0
        wait_for(lambda: monitor.state().report is not None)
        assert tools.runs == 3
    snap = backend.sample()
    assert snap.failures == () and len(snap.samples) == 16
    events = health.process(inv, snap)
    recovered = [e for e in events if e.name == "accel.device.recovered"]
    assert len(recovered) == 16  # run 2 resumes at report 2, whose ECC error is also reported
    assert {e.name for e in events} == {"accel.device.recovered", "accel.memory.ecc.uncorrectable"}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("restarting it in" in r.getMessage() for r in warnings)
    backend.close()


def test_stale_report_fails_the_sweep(tmp_path: Path) -> None:
    clock = Clock()
    tools = FakeNeuronTools(tmp_path)
    backend = _backend(tools, clock=clock, period_s=60.0, stale_after_s=5.0)
    backend.open()
    assert backend.sample().failures == ()
    clock.now += 6.0
    snap = backend.sample()
    assert len(snap.failures) == 16 and "no report from neuron-monitor for 6 s" in (
        snap.failures[0].reason
    )
    backend.close()


def test_without_neuron_ls_devices_come_from_the_hardware_info(tmp_path: Path) -> None:
    tools = FakeNeuronTools(tmp_path, with_neuron_ls=False)
    backend = _backend(tools, neuron_ls=str(tmp_path / "missing" / "neuron-ls"))
    backend.open()
    inv = backend.inventory()
    assert len(inv.devices) == 16
    assert inv.devices[3].extra["neuron.core_ids"] == "6,7"
    assert all(d.pci_bus_id is None and d.links == () for d in inv.devices)
    assert {d.memory_total_bytes for d in inv.devices} == {32 * GIB}
    wait_for(lambda: _reports_seen(backend) >= 1)
    assert backend.sample().samples[3].utilization_ratio is not None
    backend.close()


def test_same_ecc_health_event_as_nvidia(trn1: tuple[FakeNeuronTools, NeuronBackend]) -> None:
    _, backend = trn1
    wait_for(lambda: _reports_seen(backend) >= 3)  # report 2 carries the uncorrectable error
    neuron_events = HealthMonitor().process(backend.inventory(), backend.sample())
    nvidia = SimulatedBackend("count=2,faults=ecc@1:0")
    nvidia.open()
    nvidia_events = HealthMonitor().process(nvidia.inventory(), nvidia.sample())
    (ours,) = [e for e in neuron_events if e.name == "accel.memory.ecc.uncorrectable"]
    (theirs,) = [e for e in nvidia_events if e.name == "accel.memory.ecc.uncorrectable"]
    assert ours.device_id == backend.inventory().devices[5].id
    assert (ours.severity, ours.state) == (theirs.severity, theirs.state)
    assert set(ours.attributes) == set(theirs.attributes)
    assert ours.attributes["error.count"] == 1


def test_report_parsing_edge_cases() -> None:
    cores = CoreMap.build({0: (0, 1), 1: (2, 3)})
    failed_runtime = {"neuron_runtime_data": [{"pid": 1, "error": "connection refused"}]}
    result = usage(failed_runtime, cores)
    assert result[0].cores == {} and result[0].memory_used_bytes is None
    no_breakdown = {
        "neuron_runtime_data": [
            {
                "error": "",
                "report": {
                    "neuroncore_counters": {
                        "neuroncores_in_use": {"2": {"neuroncore_utilization": 150.0}},
                        "error": "",
                    },
                    "memory_used": {
                        "neuron_runtime_used_bytes": {"host": 1, "neuron_device": 4096},
                        "error": "",
                    },
                },
            }
        ],
    }
    result = usage(no_breakdown, cores)
    assert result[1].cores == {0: 1.0, 1: 0.0}  # clamped to 1
    assert (result[0].memory_used_bytes, result[1].memory_used_bytes) == (0, 4096)
    assert usage({"neuron_runtime_data": None}, cores)[1].cores == {0: 0.0, 1: 0.0}
    assert ecc_deltas({"system_data": {"neuron_hw_counters": {"error": "no driver"}}}) is None
    assert ecc_deltas({}) is None
    listed = parse_neuron_ls(
        {"neuron_devices": [{"neuron_device": 0, "bdf": "cc:00.0", "numa_node": "-1"}]}
    )
    assert listed[0].bdf == "0000:cc:00.0" and listed[0].numa_node is None
    with pytest.raises(ValueError):
        parse_neuron_ls({"devices": 3})


def _exported(backend: Any) -> dict[str, list[Any]]:
    reader = InMemoryMetricReader()
    telemetry = GpuTelemetry(DeviceManager([backend]), MeterProvider(metric_readers=[reader]))
    telemetry.start()
    try:
        if isinstance(backend, NeuronBackend):
            wait_for(lambda: _reports_seen(backend) >= 4)
        data = reader.get_metrics_data()
    finally:
        telemetry.shutdown()
    assert data is not None
    return {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }


def test_exported_like_the_simulated_neuron_node(tmp_path: Path) -> None:
    ours = _exported(_backend(FakeNeuronTools(tmp_path)))
    simulated = _exported(SimulatedBackend("vendor=neuron,count=16"))
    for name in (
        "hw.gpu.utilization",
        "hw.gpu.memory.usage",
        "hw.gpu.memory.limit",
        "hw.gpu.memory.utilization",
        "hw.errors",
        "accel.engine.utilization",
        "hw.status",
    ):
        assert name in ours, name
    for name, points in ours.items():
        assert name in simulated, name
        keys = {frozenset(p.attributes) for p in points}
        assert keys <= {frozenset(p.attributes) for p in simulated[name]}, name
        assert all(p.attributes["accel.kind"] == "neuron" for p in points)
        assert all(p.attributes["hw.vendor"] == "aws" for p in points)
    engines = {
        (p.attributes["hw.name"], p.attributes["accel.engine"]): p.value
        for p in ours["accel.engine.utilization"]
    }
    assert len(engines) == 32 and engines["gpu0", "core1"] == pytest.approx(0.64)
    errors = {
        (p.attributes["hw.name"], p.attributes["error.type"]): p.value for p in ours["hw.errors"]
    }
    assert errors["gpu5", "uncorrected"] == 1 and errors["gpu5", "corrected"] == 2


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "otel_gpu", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=60,
        check=False,
    )


def test_cli_inventory_and_run_once_against_the_fakes(tmp_path: Path) -> None:
    tools = FakeNeuronTools(tmp_path)
    inv = _cli(tools.env, "inventory", "--json", "--backend", tools.selector)
    assert inv.returncode == 0, inv.stderr
    doc = json.loads(inv.stdout)
    assert len(doc["devices"]) == 16 and doc["interconnect_domains"] == [list(range(16))]
    assert doc["resource"]["accel.interconnect.domains"] == [",".join(map(str, range(16)))]
    assert doc["devices"][0]["links"][0]["type"] == "neuronlink"
    run = _cli(tools.env, "run", "--once", "--exporter", "console", "--backend", tools.selector)
    assert run.returncode == 0, run.stderr
    decoder, text, docs, i = json.JSONDecoder(), run.stdout, [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        item, i = decoder.raw_decode(text, i)
        docs.append(item)
    metrics_doc = next(d for d in docs if "resource_metrics" in d)
    metrics = {
        m["name"]: m
        for sm in metrics_doc["resource_metrics"][0]["scope_metrics"]
        for m in sm["metrics"]
    }
    points = metrics["accel.engine.utilization"]["data"]["data_points"]
    assert {p["attributes"]["accel.kind"] for p in points} == {"neuron"}
    assert len(points) == 32
    assert "hw.gpu.memory.usage" in metrics and "hw.errors" in metrics


def test_sample_never_waits_for_the_monitor(trn1: tuple[FakeNeuronTools, NeuronBackend]) -> None:
    _, backend = trn1
    snaps: list[Snapshot] = [backend.sample() for _ in range(50)]  # no I/O, no wait per sweep
    assert all(len(s.samples) == 16 for s in snaps)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)
_keys = st.sampled_from(
    [
        "neuron_runtime_data",
        "report",
        "error",
        "neuroncore_counters",
        "neuroncores_in_use",
        "neuroncore_utilization",
        "memory_used",
        "neuron_runtime_used_bytes",
        "usage_breakdown",
        "neuroncore_memory_usage",
        "neuron_device",
        "system_data",
        "neuron_hw_counters",
        "neuron_devices",
        "neuron_device_index",
        "mem_ecc_uncorrected",
        "neuron_hardware_info",
        "0",
        "1",
    ]
)
_report = st.recursive(
    st.none() | st.integers() | st.floats() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_keys, _report | _json, max_size=5))
def test_report_parsing_never_raises_on_odd_shapes(report: dict[str, Any]) -> None:
    cores = CoreMap.build({0: (0, 1), 1: (2, 3)})
    result = usage(report, cores)
    assert set(result) == {0, 1}
    for device in result.values():
        assert all(0.0 <= r <= 1.0 for r in device.cores.values())
    ecc_deltas(report)
    hardware_info(report)


def test_installer_points_the_default_backend_at_the_fakes() -> None:
    assert neuron_scenarios() == ["neuron-trn1-32xlarge"]
    with install_neuron("neuron-trn1-32xlarge") as tools:
        backend = NeuronBackend(period_s=0.05)  # reads OTEL_GPU_NEURON_MONITOR / ..._SYSFS_ROOT
        assert backend.monitor_command == str(tools.monitor)
        assert backend.probe().available
        backend.open()
        assert len(backend.sample().samples) == 16
        backend.close()
    assert os.environ.get("OTEL_GPU_NEURON_MONITOR") != str(tools.monitor)
