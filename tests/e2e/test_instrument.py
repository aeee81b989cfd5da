"""The opentelemetry-instrument plug-in: a real ``opentelemetry-instrument python <script>`` run
exporting to an OTLP receiver, the instrumentor in-process, and the rule that the three ways in
(CLI agent, opentelemetry-instrument, library call) report the same metrics for the same node."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import _logs, metrics
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData

from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.config import Settings
from otel_gpu.hal.manager import DeviceManager
from otel_gpu.hal.model import Inventory
from otel_gpu.instrumentation import GpuInstrumentor
from otel_gpu.instrumentation import instrumentor as instrumentor_module
from otel_gpu.otel.bridge import GpuTelemetry
from otel_gpu.testing.otlp_receiver import OtlpReceiver
from tests.conftest import missing_part

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "instrument" / "train.py"
GIB = 1 << 30
Point = tuple[str, frozenset[tuple[str, Any]]]


def _instrument_command() -> Path:
    """``opentelemetry-instrument`` next to this interpreter, with a configurator installed."""
    command = Path(sys.executable).parent / "opentelemetry-instrument"
    missing = []
    if not command.exists():
        missing.append("opentelemetry-instrument (pip install opentelemetry-instrumentation)")
    if not list(entry_points(group="opentelemetry_configurator")):
        missing.append("an SDK configurator (pip install opentelemetry-distro)")
    if missing:
        missing_part("missing " + " and ".join(missing))
    return command


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CUDA_"))}
    env.update(extra)
    return env


def _points(data: MetricsData | None, scope: str = "otel_gpu") -> set[Point]:
    out: set[Point] = set()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            if sm.scope.name != scope:
                continue
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    out.add((metric.name, frozenset(dict(point.attributes or {}).items())))
    return out


def _receiver_points(rx: OtlpReceiver, scope: str = "otel_gpu") -> set[Point]:
    return {(p.name, frozenset(p.attributes.items())) for p in rx.points() if p.scope.name == scope}


@pytest.fixture
def instrumentor() -> Iterator[GpuInstrumentor]:
    inst = GpuInstrumentor()
    yield inst
    if inst.is_instrumented_by_opentelemetry:
        inst.uninstrument()


def _providers() -> tuple[MeterProvider, InMemoryMetricReader, LoggerProvider, Any]:
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    exporter = InMemoryLogRecordExporter()  # type: ignore[no-untyped-call]
    logger_provider = LoggerProvider(shutdown_on_exit=False)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    return meter_provider, reader, logger_provider, exporter


# -- opentelemetry-instrument, for real -----------------------------------------------------------


@pytest.mark.e2e
def test_opentelemetry_instrument_adds_gpu_metrics_and_logs_to_the_app() -> None:
    command = _instrument_command()
    with OtlpReceiver() as rx:
        env = _child_env(
            **rx.exporter_env("grpc"),
            OTEL_SERVICE_NAME="train-job",
            OTEL_RESOURCE_ATTRIBUTES="deployment.environment.name=ci",
            OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="gpu",
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="otlp",
            OTEL_LOGS_EXPORTER="otlp",
            OTEL_METRIC_EXPORT_INTERVAL="500",
            OTEL_BLRP_SCHEDULE_DELAY="100",
            OTEL_GPU_BACKEND="simulated:faults=xid79@1:1",
        )
        proc = subprocess.run(
            [str(command), sys.executable, str(TRAIN), "--steps", "15", "--step-seconds", "0.1"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert "done" in proc.stdout
        assert rx.wait_for(lambda r: r.log_records("nvidia.xid"), timeout=10), proc.stderr
        rows = rx.metrics()
        logs = rx.log_records("nvidia.xid")
        gpu_points = _receiver_points(rx)
    assert proc.stderr == "", proc.stderr

    # The script's own metric and the GPU metrics travel in the same resource-metrics, i.e.
    # the same MeterProvider: the app's Resource, the app's exporter.
    by_resource: dict[str, set[str]] = {}
    for row in rows:
        key = repr(sorted(row.resource.items()))
        by_resource.setdefault(key, set()).add(row.metric.name)
    assert len(by_resource) == 1, by_resource.keys()
    resource = rows[0].resource
    names = next(iter(by_resource.values()))
    assert {"train.steps", "train.step.duration", "train.loss"} <= names
    assert {"hw.gpu.utilization", "hw.gpu.memory.limit", "hw.power", "hw.status"} <= names
    assert resource["service.name"] == "train-job"
    assert resource["deployment.environment.name"] == "ci"
    assert resource["accel.device.count"] == 8  # the gpu resource detector
    assert resource["telemetry.auto.version"]  # configured by opentelemetry-instrument

    limits = [p for p in rx.points("hw.gpu.memory.limit")]
    assert {p.attributes["hw.name"] for p in limits} == {f"gpu{i}" for i in range(8)}
    assert {p.value for p in limits} == {80 * GIB}

    xid = logs[0]
    assert xid.attributes["hw.name"] == "gpu1"
    assert xid.attributes["nvidia.xid.code"] == 79
    assert xid.resource["service.name"] == "train-job"

    # the same metric names and attributes as the library call on the same simulated node
    assert gpu_points == _library_points("simulated")


@pytest.mark.e2e
def test_plugin_can_be_disabled_like_any_instrumentation() -> None:
    command = _instrument_command()
    with OtlpReceiver() as rx:
        env = _child_env(
            **rx.exporter_env("grpc"),
            OTEL_TRACES_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_METRIC_EXPORT_INTERVAL="300",
            OTEL_GPU_BACKEND="simulated",
            OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="gpu",
        )
        proc = subprocess.run(
            [str(command), sys.executable, str(TRAIN), "--steps", "3", "--step-seconds", "0.1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert rx.wait_for(lambda r: "train.steps" in r.metric_names(), timeout=10)
        assert not any(n.startswith("hw.") for n in rx.metric_names())


@pytest.mark.e2e
def test_a_broken_configuration_never_breaks_the_app() -> None:
    command = _instrument_command()
    with OtlpReceiver() as rx:
        env = _child_env(
            **rx.exporter_env("grpc"),
            OTEL_TRACES_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_METRIC_EXPORT_INTERVAL="300",
            OTEL_GPU_BACKEND="simulated:count=zero",
        )
        proc = subprocess.run(
            [str(command), sys.executable, str(TRAIN), "--steps", "3", "--step-seconds", "0.1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert "done" in proc.stdout
        assert rx.wait_for(lambda r: "train.steps" in r.metric_names(), timeout=10)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "otel-gpu: GPU telemetry is off: simulated spec: count='zero'" in lines[0]


# -- the instrumentor in-process ------------------------------------------------------------------


def _library_points(backend: str) -> set[Point]:
    meter_provider, reader, _, _ = _providers()
    telemetry = GpuTelemetry(DeviceManager.from_selector(backend), meter_provider)
    telemetry.start()
    try:
        return _points(reader.get_metrics_data())
    finally:
        telemetry.shutdown()
        meter_provider.shutdown()


def test_instrument_registers_on_the_given_providers(instrumentor: GpuInstrumentor) -> None:
    meter_provider, reader, logger_provider, logs = _providers()
    before = metrics.get_meter_provider()
    backend = SimulatedBackend("faults=xid79@2:0")
    manager = DeviceManager([backend])
    instrumentor.instrument(
        meter_provider=meter_provider, logger_provider=logger_provider, manager=manager
    )
    assert metrics.get_meter_provider() is before  # never sets a global provider
    points = _points(reader.get_metrics_data())
    assert ("hw.power", frozenset()) not in points
    assert {name for name, _ in points} >= {"hw.gpu.utilization", "hw.power", "hw.status"}
    assert [r.log_record.event_name for r in logs.get_finished_logs()] == ["nvidia.xid"]
    instrumentor.uninstrument()
    assert backend.closed
    assert instrumentor.telemetry is None


def test_instrument_defaults_to_the_global_providers(
    instrumentor: GpuInstrumentor, monkeypatch: pytest.MonkeyPatch
) -> None:
    meter_provider, reader, logger_provider, _ = _providers()
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: meter_provider)
    monkeypatch.setattr(_logs, "get_logger_provider", lambda: logger_provider)
    monkeypatch.setenv("OTEL_GPU_BACKEND", "simulated:count=2")
    instrumentor.instrument()
    names = {attrs_name for attrs_name, _ in _points(reader.get_metrics_data())}
    assert "hw.gpu.memory.limit" in names
    telemetry = instrumentor.telemetry
    assert telemetry is not None
    assert len(telemetry.inventory.devices) == 2


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_GPU_BACKEND": "bogus"}, "OTEL_GPU_BACKEND: unknown backend 'bogus'"),
        ({"OTEL_GPU_INTERVAL": "0"}, "OTEL_GPU_INTERVAL: invalid interval '0'"),
        ({"OTEL_GPU_BACKEND": "simulated:count=0"}, "count=0 out of range"),
    ],
)
def test_a_failure_is_one_warning(
    instrumentor: GpuInstrumentor,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    env: dict[str, str],
    message: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    meter_provider, reader, _, _ = _providers()
    instrumentor.instrument(meter_provider=meter_provider)  # does not raise
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert message in warnings[0].getMessage()
    assert instrumentor.telemetry is None
    assert not _points(reader.get_metrics_data())


def test_a_backend_that_raises_on_open_is_closed_and_reported(
    instrumentor: GpuInstrumentor, caplog: pytest.LogCaptureFixture
) -> None:
    class Exploding(SimulatedBackend):
        def inventory(self) -> Inventory:
            raise RuntimeError("driver fell over")

    backend = Exploding()
    meter_provider, _, _, _ = _providers()
    instrumentor.instrument(meter_provider=meter_provider, manager=DeviceManager([backend]))
    assert "GPU telemetry is off" in caplog.text
    assert "driver fell over" in caplog.text
    assert instrumentor.telemetry is None


def test_a_hanging_driver_delays_the_app_by_the_start_timeout_only(
    instrumentor: GpuInstrumentor, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()

    class Hanging(SimulatedBackend):
        def open(self) -> None:
            release.wait(10)
            super().open()

    meter_provider, reader, _, _ = _providers()
    manager = DeviceManager([Hanging()])
    instrumentor.instrument(meter_provider=meter_provider, manager=manager, start_timeout_s=0.2)
    assert "still starting" in caplog.text
    release.set()
    for _ in range(100):
        telemetry = instrumentor.telemetry
        if (
            telemetry is not None
            and telemetry.manager.backends
            and _points(reader.get_metrics_data())
        ):
            break
        threading.Event().wait(0.05)
    assert {name for name, _ in _points(reader.get_metrics_data())} >= {"hw.power"}


def test_sdk_disabled_means_nothing_happens(
    instrumentor: GpuInstrumentor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    backend = SimulatedBackend()
    meter_provider, reader, _, _ = _providers()
    instrumentor.instrument(meter_provider=meter_provider, manager=DeviceManager([backend]))
    assert instrumentor.telemetry is None
    assert not backend.opened
    assert not _points(reader.get_metrics_data())


def test_process_scope_reports_visible_devices_and_own_pids(
    instrumentor: GpuInstrumentor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    monkeypatch.setattr(instrumentor_module, "own_pids", lambda: frozenset({4243}))
    settings = Settings.from_env(
        {"OTEL_GPU_BACKEND": "simulated", "OTEL_GPU_SCOPE": "process"}, standard=False
    )
    meter_provider, reader, _, _ = _providers()
    instrumentor.instrument(meter_provider=meter_provider, settings=settings)
    points = _points(reader.get_metrics_data())
    assert {dict(a)["hw.name"] for n, a in points if n == "hw.power"} == {"gpu1", "gpu3"}
    gpu1 = next(dict(a) for n, a in points if n == "hw.power" and dict(a)["hw.name"] == "gpu1")
    procs = [dict(a) for n, a in points if n == "accel.process.memory.usage"]
    assert procs == [{**gpu1, "process.pid": 4243}]  # gpu1's process is 4243, gpu3's is not ours


# -- three ways in, same metrics ------------------------------------------------------------------


def test_cli_instrumentor_and_library_report_the_same_metrics(
    instrumentor: GpuInstrumentor,
) -> None:
    backend = "simulated:count=4,mig=0:2"
    library = _library_points(backend)

    meter_provider, reader, _, _ = _providers()
    settings = Settings(backend=backend)
    instrumentor.instrument(meter_provider=meter_provider, settings=settings)
    plugin = _points(reader.get_metrics_data())

    with OtlpReceiver() as rx:
        proc = subprocess.run(
            [sys.executable, "-m", "otel_gpu", "run", "--backend", backend, "--once"],
            env=_child_env(**rx.exporter_env("http/protobuf"), OTEL_LOGS_EXPORTER="none"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert rx.wait_for(lambda r: r.metrics_requests, timeout=10)
        cli = _receiver_points(rx)

    assert library
    assert {name for name, _ in library} >= {"hw.gpu.memory.usage", "hw.status"}
    assert plugin == library
    assert cli == library
