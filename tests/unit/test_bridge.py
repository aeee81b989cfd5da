"""The OTel bridge through the real SDK: instruments, attributes, one sweep, health logs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    InMemoryMetricReader,
    Sum,
)

from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.hal import DeviceManager
from otel_gpu.otel import METRICS, GpuTelemetry, SnapshotCache, topology_attributes
from otel_gpu.otel.metrics import Instrument


def _points(reader: InMemoryMetricReader) -> dict[str, tuple[Any, list[Any]]]:
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[str, tuple[Any, list[Any]]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = (metric, list(metric.data.data_points))
    return out


@pytest.fixture
def telemetry() -> Iterator[tuple[GpuTelemetry, InMemoryMetricReader, InMemoryLogRecordExporter]]:
    reader = InMemoryMetricReader()
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    manager = DeviceManager([SimulatedBackend("count=8,faults=ecc@2:0")])
    tel = GpuTelemetry(
        manager, MeterProvider(metric_readers=[reader]), logger_provider, interval_s=10.0
    )
    tel.start()
    yield tel, reader, logs
    tel.shutdown()


def test_every_metric_of_the_table_is_exported_with_its_kind_and_unit(telemetry: Any) -> None:
    _, reader, _ = telemetry
    points = _points(reader)
    # NVIDIA has no engine groups (Intel/Neuron do): that metric has no points here.
    skipped = {"accel.engine.utilization"}
    expected = {m.name for m in METRICS if m.opt_in is None} - skipped | {"hw.status"}
    assert set(points) == expected
    for spec in METRICS:
        if spec.opt_in or spec.name in skipped:
            continue
        metric, data = points[spec.name]
        assert metric.unit == spec.unit
        if spec.instrument is Instrument.GAUGE:
            assert isinstance(metric.data, Gauge)
        else:
            assert isinstance(metric.data, Sum)
            assert metric.data.is_monotonic is (spec.instrument is Instrument.COUNTER)
            assert metric.data.aggregation_temporality is AggregationTemporality.CUMULATIVE
        assert data, spec.name


def test_points_carry_the_device_attributes(telemetry: Any) -> None:
    tel, reader, _ = telemetry
    _, util = _points(reader)["hw.gpu.utilization"]
    general = [p for p in util if p.attributes["hw.gpu.task"] == "general"]
    assert sorted(p.attributes["hw.name"] for p in general) == [f"gpu{i}" for i in range(8)]
    ids = {d.id for d in tel.inventory.devices}
    for p in general:
        assert p.attributes["hw.id"] in ids
        assert p.attributes["hw.type"] == "gpu"
        assert p.attributes["hw.vendor"] == "nvidia"
        assert p.attributes["hw.model"] == "NVIDIA H100 80GB HBM3"
        assert 0.0 <= p.value <= 1.0
    _, temps = _points(reader)["hw.temperature"]
    assert {p.attributes["hw.sensor_location"] for p in temps} == {"gpu", "memory"}
    assert all(p.attributes["hw.type"] == "temperature" for p in temps)
    assert {p.attributes["hw.parent"] for p in temps} == ids
    _, limit = _points(reader)["hw.gpu.memory.limit"]
    assert {p.value for p in limit} == {80 * 2**30}


def test_minimal_attributes() -> None:
    reader = InMemoryMetricReader()
    tel = GpuTelemetry(
        DeviceManager([SimulatedBackend("count=2")]),
        MeterProvider(metric_readers=[reader]),
        attributes="minimal",
    )
    tel.start()
    _, power = _points(reader)["hw.power"]
    assert {tuple(sorted(p.attributes)) for p in power} == {("hw.id", "hw.name", "hw.type")}


def test_unsupported_quantities_yield_no_points_never_nan() -> None:
    reader = InMemoryMetricReader()
    tel = GpuTelemetry(
        DeviceManager([SimulatedBackend("tpu")]), MeterProvider(metric_readers=[reader])
    )
    tel.start()
    points = _points(reader)
    assert "hw.power" not in points  # a TPU reports no power: no points, not zeros
    assert "hw.energy" not in points
    _, util = points["hw.gpu.utilization"]
    assert {p.attributes["accel.kind"] for p in util} == {"tpu"}
    for _, data in points.values():
        assert all(p.value == p.value for p in data if hasattr(p, "value"))


def test_one_sweep_per_collection_with_two_readers() -> None:
    first, second = InMemoryMetricReader(), InMemoryMetricReader()
    manager = DeviceManager([SimulatedBackend("count=8")])
    tel = GpuTelemetry(manager, MeterProvider(metric_readers=[first, second]), interval_s=10.0)
    tel.start()
    first.collect()
    second.collect()
    assert manager.sweeps == 1
    assert tel.cache.sweeps == 1
    # Each reader saw the whole node from that single sweep.
    assert len(_points(first)["hw.power"][1]) == 8
    assert len(_points(second)["hw.power"][1]) == 8


def test_snapshot_cache_sweeps_again_after_its_window() -> None:
    now = [0.0]
    sweeps: list[int] = []

    def sweep() -> Any:
        sweeps.append(1)
        return object()

    hooked: list[Any] = []
    cache = SnapshotCache(sweep, max_age_s=5.0, clock=lambda: now[0])
    cache.on_sweep.append(hooked.append)
    a = cache.get()
    now[0] = 4.9
    assert cache.get() is a
    now[0] = 5.0
    assert cache.get() is not a
    assert len(sweeps) == 2 and len(hooked) == 2


def test_health_event_becomes_a_log_record_and_moves_hw_status(telemetry: Any) -> None:
    tel, reader, logs = telemetry
    points = _points(reader)
    gpu2 = tel.inventory.devices[2]
    records = [r.log_record for r in logs.get_finished_logs()]
    ecc = [r for r in records if r.event_name == "accel.memory.ecc.uncorrectable"]
    assert len(ecc) == 1
    assert ecc[0].severity_number.value == 17
    assert ecc[0].attributes["hw.id"] == gpu2.id
    assert ecc[0].attributes["hw.name"] == "gpu2"
    assert ecc[0].attributes["error.count"] == 1
    assert "gpu2" in str(ecc[0].body)
    _, status = points["hw.status"]
    table = {(p.attributes["hw.name"], p.attributes["hw.state"]): p.value for p in status}
    assert table[("gpu2", "failed")] == 1 and table[("gpu2", "ok")] == 0
    assert table[("gpu0", "ok")] == 1 and table[("gpu0", "failed")] == 0
    assert len(status) == 8 * 4


def test_a_failing_metric_reader_does_not_drop_other_devices() -> None:
    reader = InMemoryMetricReader()
    tel = GpuTelemetry(
        DeviceManager([SimulatedBackend("count=3")]), MeterProvider(metric_readers=[reader])
    )
    tel.start()
    bad = tel.inventory.devices[1].id
    spec = next(m for m in METRICS if m.name == "hw.power")
    original = spec.read

    def flaky(dev: Any, sample: Any) -> Any:
        if dev.id == bad:
            raise RuntimeError("boom")
        return original(dev, sample)

    object.__setattr__(spec, "read", flaky)  # the spec is frozen
    try:
        tel.cache.invalidate()
        _, power = _points(reader)["hw.power"]
    finally:
        object.__setattr__(spec, "read", original)
    assert sorted(p.attributes["hw.name"] for p in power) == ["gpu0", "gpu2"]


def test_topology_resource_attributes() -> None:
    manager = DeviceManager([SimulatedBackend("count=4,mig=0:2")])
    attrs = topology_attributes(manager.open())
    assert attrs["accel.device.count"] == 6
    assert attrs["accel.vendors"] == ["nvidia"]
    assert len(attrs["accel.device.ids"]) == 6  # type: ignore[arg-type]
    assert attrs["accel.device.pci_bus_ids"][:4] == [  # type: ignore[index]
        "0000:18:00.0",
        "0000:2a:00.0",
        "0000:3a:00.0",
        "0000:5d:00.0",
    ]
    assert attrs["accel.device.numa_nodes"] == [0, 0, 1, 1, 0, 0]
    assert attrs["accel.interconnect.domains"] == ["0,1,2,3"]
    assert attrs["accel.cuda.version"] == "12.4"
    assert attrs["accel.nvidia.driver.version"] == "550.54.15"


def test_attribute_sources_tag_only_the_devices_they_name() -> None:
    reader = InMemoryMetricReader()
    manager = DeviceManager([SimulatedBackend("count=3")])
    calls: list[int] = []

    def pods(inventory: Any, snapshot: Any) -> dict[str, dict[str, str]]:
        calls.append(1)
        return {inventory.devices[1].id: {"k8s.pod.name": "trainer-0"}, "unknown": {"x": "y"}}

    tel = GpuTelemetry(manager, MeterProvider(metric_readers=[reader]), attribute_sources=[pods])
    tel.start()
    _, power = _points(reader)["hw.power"]
    tagged = {p.attributes["hw.name"]: p.attributes.get("k8s.pod.name") for p in power}
    assert tagged == {"gpu0": None, "gpu1": "trainer-0", "gpu2": None}
    assert len(calls) == 1  # once per sweep, not per instrument


def test_processes_feature_exports_per_process_memory() -> None:
    reader = InMemoryMetricReader()
    tel = GpuTelemetry(
        DeviceManager([SimulatedBackend("count=2")]),
        MeterProvider(metric_readers=[reader]),
        features=frozenset({"processes"}),
    )
    tel.start()
    _, procs = _points(reader)["accel.process.memory.usage"]
    assert {p.attributes["process.pid"] for p in procs} == {4242, 4243}


def test_the_plugin_warns_when_a_node_outgrows_the_sdk_series_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from otel_gpu.instrumentation.instrumentor import _warn_cardinality

    with caplog.at_level("WARNING"):
        _warn_cardinality(DeviceManager([SimulatedBackend("count=8")]).open())
        assert caplog.records == []
        _warn_cardinality(DeviceManager([SimulatedBackend("count=64")]).open())
    assert "aggregation_cardinality_limit" in caplog.records[0].getMessage()
