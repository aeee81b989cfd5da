"""An Xid reaches the exporter as a log record at once, independent of the metric interval.

The driver event is injected beneath pynvml (fake NVML); the agent is wired as `otel-gpu run`
wires it (providers from the standard variables, OTLP gRPC); the record is read back from an
OTLP receiver. The latency is printed (the closing note reports it), never asserted.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import pytest

from otel_gpu.backends.nvml import NvmlBackend
from otel_gpu.hal import DeviceManager
from otel_gpu.health import HealthMonitor
from otel_gpu.otel import GpuTelemetry, build_providers, build_resource
from otel_gpu.testing.fake_nvml import install
from otel_gpu.testing.otlp_receiver import OtlpReceiver


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


def test_injected_xid_is_exported_before_the_next_metric_collection(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in receiver.exporter_env("grpc").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("OTEL_BLRP_SCHEDULE_DELAY", raising=False)
    with install("h100-sxm-8-nvswitch") as fake:
        manager = DeviceManager([NvmlBackend()])
        inventory = manager.open()
        # A 60 s metric interval: only the event path can deliver within the test.
        providers = build_providers(build_resource(inventory), 60.0, exporter="otlp")
        telemetry = GpuTelemetry(
            manager,
            providers.meter_provider,
            providers.logger_provider,
            interval_s=60.0,
            monitor=HealthMonitor(),
        )
        telemetry.start()
        latencies = []
        try:
            for n, code in enumerate((79, 48, 13, 79, 94)):
                gpu = n % 8
                sent = time.monotonic()
                fake.inject_xid(gpu, code)

                def arrived(rx: OtlpReceiver, gpu: int = gpu, code: int = code) -> bool:
                    return any(
                        r.event_name == "nvidia.xid"
                        and r.attributes.get("hw.name") == f"gpu{gpu}"
                        and r.attributes.get("nvidia.xid.code") == code
                        for r in rx.log_records()
                    )

                assert receiver.wait_for(arrived, timeout=10.0), f"Xid {code} never arrived"
                latencies.append(time.monotonic() - sent)
            # No metric collection has run yet (60 s interval): the events did not wait for one.
            assert receiver.metrics_requests == []
        finally:
            telemetry.shutdown()
            providers.shutdown()
        records = receiver.log_records("nvidia.xid")
        fatal = [r for r in records if r.attributes.get("nvidia.xid.code") == 79]
        assert fatal and all(r.severity_number == 21 for r in fatal)
        assert all(r.attributes.get("nvidia.xid.class") == "fatal" for r in fatal)
        info = [r for r in records if r.attributes.get("nvidia.xid.code") == 13]
        assert info and info[0].severity_number == 9
        print(
            f"Xid injection -> OTLP log record: median {statistics.median(latencies) * 1000:.0f} ms, "
            f"max {max(latencies) * 1000:.0f} ms over {len(latencies)} events"
        )
