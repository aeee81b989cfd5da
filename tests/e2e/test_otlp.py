"""The real ``otel-gpu run`` command, exporting over OTLP (gRPC and HTTP/protobuf) to an
in-process receiver: metric names, units, instrument kinds, per-point attributes, the topology
resource and health events, as a Collector would receive them.

Each test runs ``python -m otel_gpu run --backend simulated:... --once`` in a subprocess with a
clean ``OTEL_*`` environment, then reads what :class:`OtlpReceiver` decoded.
"""

from __future__ import annotations

import gzip
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from otel_gpu.otel.metrics import METRICS, Instrument
from otel_gpu.testing.otlp_receiver import ExportMetricsServiceRequest, OtlpReceiver, PointRow

PROTOCOLS = ("grpc", "http/protobuf")
TRANSPORT = {"grpc": "grpc", "http/protobuf": "http"}
CLI_TIMEOUT_S = 30.0
#: A hang detector, not a timing measurement: exporters get a 4 s shutdown budget
#: (cli/commands.py); 10 s leaves room for start-up on a loaded CI machine.
UNREACHABLE_EXIT_S = 10.0
ECC_BACKEND = "simulated:faults=ecc@0:0"
H100 = "NVIDIA H100 80GB HBM3"
PCI_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DEVICE_KEYS = {"hw.id", "hw.type", "hw.name", "hw.vendor", "hw.model"}
MINIMAL_KEYS = {"hw.id", "hw.type", "hw.name"}

GAUGES = {
    "hw.gpu.utilization",
    "hw.gpu.memory.utilization",
    "hw.power",
    "hw.temperature",
    "accel.clock.frequency",
    "accel.power.limit",
    "accel.throttle.active",
    "accel.memory.bandwidth.utilization",
}
COUNTERS = {"hw.energy", "hw.errors", "hw.gpu.io", "accel.interconnect.io"}
UPDOWNCOUNTERS = {"hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.status"}
UNITS = {
    "hw.power": "W",
    "accel.power.limit": "W",
    "hw.energy": "J",
    "hw.gpu.memory.usage": "By",
    "hw.gpu.memory.limit": "By",
    "hw.gpu.io": "By",
    "hw.temperature": "Cel",
    "hw.gpu.utilization": "1",
    "hw.gpu.memory.utilization": "1",
    "hw.status": "1",
    "accel.clock.frequency": "Hz",
    "hw.errors": "{error}",
}
EXPECTED_NAMES = GAUGES | COUNTERS | UPDOWNCOUNTERS


# -- running the agent ---------------------------------------------------------------------


def agent_env(endpoint: str, protocol: str, **extra: str) -> dict[str, str]:
    """The parent environment without any OTEL_*/proxy setting, pointed at ``endpoint``."""
    proxies = {"http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "no_proxy"}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_") and k.lower() not in proxies
    }
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    if protocol == "grpc":
        env["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
    env.update(extra)
    return env


def run_agent(env: dict[str, str], backend: str = ECC_BACKEND) -> subprocess.CompletedProcess[str]:
    """``otel-gpu run --backend <backend> --once`` in a subprocess (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "otel_gpu", "run", "--backend", backend, "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def export_to(
    rx: OtlpReceiver, protocol: str, backend: str = ECC_BACKEND, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run the agent once against ``rx``; assert it exited 0 and that metrics arrived."""
    proc = run_agent(agent_env(rx.endpoint(protocol), protocol, **extra), backend)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    # --once flushes before exiting, so this only guards against a slow server thread.
    assert rx.wait_for(lambda r: r.metrics_requests, timeout=5.0), proc.stderr
    return proc


def device_ids(rx: OtlpReceiver) -> list[str]:
    """``accel.device.ids`` of the (single) resource."""
    ids = rx.resources()[0]["accel.device.ids"]
    assert isinstance(ids, list)
    return [str(i) for i in ids]


def by_name(points: list[PointRow]) -> dict[str, list[PointRow]]:
    """Points grouped by ``hw.name``."""
    out: dict[str, list[PointRow]] = {}
    for p in points:
        out.setdefault(str(p.attributes.get("hw.name")), []).append(p)
    return out


def status_of(rx: OtlpReceiver, name: str) -> dict[str, float | int | None]:
    """``hw.state -> value`` of the ``hw.status`` points of device ``name``."""
    return {
        str(p.attributes["hw.state"]): p.value
        for p in rx.points("hw.status")
        if p.attributes.get("hw.name") == name
    }


def attribute_keys(rx: OtlpReceiver) -> dict[str, set[str]]:
    """Metric name -> every attribute key seen on its points."""
    keys: dict[str, set[str]] = {}
    for p in rx.points():
        keys.setdefault(p.name, set()).update(p.attributes)
    return keys


def extra_keys(metric: str) -> set[str]:
    """The metric-specific attribute keys of ``metric``, from the metric table."""
    if metric == "hw.status":
        return {"hw.state"}
    spec = next(m for m in METRICS if m.name == metric)
    return {a.split("=", 1)[0].strip() for a in spec.attributes.split(",") if a.strip()}


# -- one export of the default node (8x H100, NVSwitch, ECC error on gpu0), per protocol ------


@dataclass
class Export:
    """What one ``otel-gpu run --once`` sent."""

    protocol: str
    proc: subprocess.CompletedProcess[str]
    rx: OtlpReceiver


@pytest.fixture(scope="module", params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    """``OTEL_EXPORTER_OTLP_PROTOCOL``."""
    value: str = request.param
    return value


@pytest.fixture(scope="module")
def nvidia(protocol: str) -> Iterator[Export]:
    """The default simulated node with ``faults=ecc@0:0``, exported once (receiver stopped)."""
    with OtlpReceiver() as rx:
        proc = export_to(rx, protocol)
        rx.wait_for(lambda r: r.log_records(), timeout=5.0)
    yield Export(protocol, proc, rx)


def test_exports_over_the_chosen_protocol(nvidia: Export) -> None:
    transports = {r.transport for r in nvidia.rx.received}
    assert transports == {TRANSPORT[nvidia.protocol]}
    assert {r.signal for r in nvidia.rx.received} == {"metrics", "logs"}
    assert nvidia.rx.refused == 0


def test_metric_names(nvidia: Export) -> None:
    names = nvidia.rx.metric_names()
    assert names >= EXPECTED_NAMES, sorted(EXPECTED_NAMES - names)
    table = {m.name for m in METRICS} | {"hw.status"}
    assert names <= table, sorted(names - table)
    assert all(n.startswith(("hw.", "accel.")) for n in names)


def test_units(nvidia: Export) -> None:
    units = {row.metric.name: row.metric.unit for row in nvidia.rx.metrics()}
    for name, unit in UNITS.items():
        assert units[name] == unit, name
    for spec in METRICS:
        if spec.name in units:
            assert units[spec.name] == spec.unit, spec.name


def test_instrument_kinds(nvidia: Export) -> None:
    rows = {row.metric.name: row for row in nvidia.rx.metrics()}
    kinds = {
        **{n: Instrument.GAUGE for n in GAUGES},
        **{n: Instrument.COUNTER for n in COUNTERS},
        **{n: Instrument.UPDOWNCOUNTER for n in UPDOWNCOUNTERS},
        **{m.name: m.instrument for m in METRICS if m.name in rows},
    }
    for name, instrument in kinds.items():
        metric = rows[name].metric
        if instrument is Instrument.GAUGE:
            assert rows[name].kind == "gauge", name
            continue
        assert rows[name].kind == "sum", name
        assert metric.sum.aggregation_temporality == CUMULATIVE, name
        assert metric.sum.is_monotonic is (instrument is Instrument.COUNTER), name


def test_every_device_point_carries_the_device_attributes(nvidia: Export) -> None:
    points = nvidia.rx.points()
    ids = device_ids(nvidia.rx)
    gpu_points = [p for p in points if p.name != "hw.temperature"]
    assert gpu_points
    for p in gpu_points:
        assert p.attributes.keys() >= DEVICE_KEYS, (p.name, p.attributes)
        assert p.attributes["hw.type"] == "gpu", p.name
        assert p.attributes["hw.vendor"] == "nvidia"
        assert p.attributes["hw.model"] == H100
    names = {(p.attributes["hw.id"], p.attributes["hw.name"]) for p in gpu_points}
    assert len({i for i, _ in names}) == 8
    assert sorted(names, key=lambda n: int(str(n[1])[3:])) == [
        (ids[i], f"gpu{i}") for i in range(8)
    ]
    for name in ("hw.power", "hw.energy", "hw.gpu.memory.usage", "hw.gpu.memory.limit"):
        assert {p.attributes["hw.name"] for p in nvidia.rx.points(name)} == {
            f"gpu{i}" for i in range(8)
        }, name


def test_temperature_points(nvidia: Export) -> None:
    ids = device_ids(nvidia.rx)
    points = nvidia.rx.points("hw.temperature")
    assert points
    for p in points:
        assert p.attributes["hw.type"] == "temperature"
        assert p.attributes["hw.parent"] in ids
        assert p.attributes["hw.sensor_location"] in ("gpu", "memory", "hotspot")
        assert isinstance(p.value, float)
        assert 0.0 < p.value < 150.0
    per_gpu = {(p.attributes["hw.parent"], p.attributes["hw.sensor_location"]) for p in points}
    assert {parent for parent, _ in per_gpu} == set(ids)
    assert {loc for _, loc in per_gpu} >= {"gpu", "memory"}


def test_resource(nvidia: Export) -> None:
    resources = nvidia.rx.resources()
    assert len(resources) >= 2  # metrics and logs
    assert all(r == resources[0] for r in resources), "metrics and logs share one Resource"
    res = resources[0]
    assert res["service.name"] == "otel-gpu"
    assert res["host.name"] == socket.gethostname()
    assert res["accel.device.count"] == 8
    ids = device_ids(nvidia.rx)
    assert len(ids) == 8
    assert len(set(ids)) == 8
    point_ids = {p.attributes["hw.id"] for p in nvidia.rx.points("hw.power")}
    assert set(ids) == point_ids
    pci = res["accel.device.pci_bus_ids"]
    assert isinstance(pci, list)
    assert len(pci) == 8
    assert all(PCI_BUS_ID.match(str(b)) for b in pci), pci
    assert res["accel.interconnect.domains"] == ["0,1,2,3,4,5,6,7"]


def test_ecc_event_and_status(nvidia: Export) -> None:
    ids = device_ids(nvidia.rx)
    records = nvidia.rx.log_records("accel.memory.ecc.uncorrectable")
    assert records, [r.event_name for r in nvidia.rx.log_records()]
    for record in records:
        assert record.severity_number == 17
        assert record.record.severity_text == "ERROR"
        assert record.attributes["hw.id"] == ids[0]
        assert record.attributes["hw.name"] == "gpu0"
        assert record.body
    assert status_of(nvidia.rx, "gpu0")["failed"] == 1
    assert status_of(nvidia.rx, "gpu0")["ok"] == 0
    for i in range(1, 8):
        status = status_of(nvidia.rx, f"gpu{i}")
        assert status["ok"] == 1, (i, status)
        assert status["failed"] == 0, (i, status)
    for i in range(8):
        assert sum(v or 0 for v in status_of(nvidia.rx, f"gpu{i}").values()) == 1
    uncorrected = {
        p.attributes["hw.name"]: p.value
        for p in nvidia.rx.points("hw.errors")
        if p.attributes.get("error.type") == "uncorrected"
    }
    assert uncorrected["gpu0"] == 1
    assert all(uncorrected[f"gpu{i}"] == 0 for i in range(1, 8))


# -- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_resource_and_service_name_from_environment(receiver: OtlpReceiver, protocol: str) -> None:
    export_to(
        receiver,
        protocol,
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test",
        OTEL_SERVICE_NAME="gpu-agent",
    )
    receiver.wait_for(lambda r: r.log_records(), timeout=5.0)
    resources = receiver.resources()
    assert len(resources) >= 2
    for res in resources:
        assert res["service.name"] == "gpu-agent"
        assert res["deployment.environment"] == "test"
        assert res["accel.device.count"] == 8


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_minimal_attributes(receiver: OtlpReceiver, protocol: str) -> None:
    export_to(receiver, protocol, OTEL_GPU_ATTRIBUTES="minimal")
    points = receiver.points()
    assert points
    for p in points:
        assert p.attributes.keys() >= MINIMAL_KEYS, (p.name, p.attributes)
        allowed = MINIMAL_KEYS | extra_keys(p.name)
        assert p.attributes.keys() <= allowed, (p.name, sorted(p.attributes.keys() - allowed))
    res = receiver.resources()[0]
    assert res["accel.device.models"] == [H100] * 8  # descriptors stay on the resource


@pytest.mark.parametrize("compression", ["gzip"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_compressed_export(receiver: OtlpReceiver, protocol: str, compression: str) -> None:
    export_to(receiver, protocol, OTEL_EXPORTER_OTLP_COMPRESSION=compression)
    assert "hw.power" in receiver.metric_names()
    if protocol == "http/protobuf":
        assert {r.compression for r in receiver.received} == {compression}


# -- faults --------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_device_lost(receiver: OtlpReceiver, protocol: str) -> None:
    export_to(receiver, protocol, backend="simulated:faults=lost@3:0")
    assert receiver.wait_for(lambda r: r.log_records("accel.device.lost"), timeout=5.0)
    ids = device_ids(receiver)
    lost = receiver.log_records("accel.device.lost")
    assert {r.attributes["hw.id"] for r in lost} == {ids[3]}
    assert all(r.severity_number == 21 for r in lost)
    gpu3 = [
        p
        for p in receiver.points()
        if ids[3] in (p.attributes.get("hw.id"), p.attributes.get("hw.parent"))
    ]
    assert {p.name for p in gpu3} == {"hw.status"}
    assert status_of(receiver, "gpu3")["failed"] == 1
    assert sum(v or 0 for v in status_of(receiver, "gpu3").values()) == 1
    others = {p.attributes["hw.name"] for p in receiver.points("hw.power")}
    assert others == {f"gpu{i}" for i in range(8) if i != 3}
    for i in (0, 1, 2, 4, 5, 6, 7):
        assert status_of(receiver, f"gpu{i}")["ok"] == 1


def test_amd_node_exports_the_same_schema(receiver: OtlpReceiver, nvidia: Export) -> None:
    export_to(receiver, nvidia.protocol, backend="simulated:vendor=amd")
    assert receiver.metric_names() == nvidia.rx.metric_names()
    assert attribute_keys(receiver) == attribute_keys(nvidia.rx)
    links = receiver.points("accel.interconnect.io")
    assert links
    assert {p.attributes["accel.link.type"] for p in links} == {"xgmi"}
    assert {p.attributes["accel.link.type"] for p in nvidia.rx.points("accel.interconnect.io")} == {
        "nvlink"
    }
    assert {p.attributes["hw.vendor"] for p in receiver.points("hw.power")} == {"amd"}


# -- an unhealthy Collector ----------------------------------------------------------------


def closed_port() -> int:
    """A loopback port with nothing listening (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unreachable_collector(protocol: str) -> None:
    env = agent_env(f"http://127.0.0.1:{closed_port()}", protocol)
    started = time.monotonic()
    proc = run_agent(env)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert elapsed < UNREACHABLE_EXIT_S, (elapsed, proc.stderr)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_collector_unavailable_once_then_recovers(receiver: OtlpReceiver, protocol: str) -> None:
    receiver.fail_with("UNAVAILABLE", times=1, signals=("metrics",))
    proc = export_to(receiver, protocol)
    assert "Traceback" not in proc.stderr
    refused = [r for r in receiver.received if not r.accepted]
    assert [(r.signal, r.status.name) for r in refused] == [("metrics", "UNAVAILABLE")]
    assert len(receiver.metrics_requests) == 1
    assert "hw.power" in receiver.metric_names()


# -- the receiver itself -------------------------------------------------------------------


def _post(
    url: str, body: bytes, content_type: str = "application/x-protobuf", **headers: str
) -> int:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type, **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=5.0) as response:
            status: int = response.status
    except urllib.error.HTTPError as err:
        status = err.code
    return status


def test_receiver_http_answers(receiver: OtlpReceiver) -> None:
    request = ExportMetricsServiceRequest()
    request.resource_metrics.add().resource.attributes.add(key="k").value.string_value = "v"
    body = request.SerializeToString()
    metrics = f"{receiver.http_endpoint}/v1/metrics"
    assert _post(metrics, body) == 200
    assert _post(metrics, gzip.compress(body), **{"Content-Encoding": "gzip"}) == 200
    assert _post(f"{receiver.http_endpoint}/v1/traces", body) == 404
    assert _post(metrics, b"{}", "application/json") == 415
    assert _post(metrics, b"\xff\xff\xff") == 400
    receiver.fail_with("UNAVAILABLE", times=1)
    assert _post(metrics, body) == 503
    assert _post(f"{receiver.http_endpoint}/v1/logs", b"") == 200
    assert [r.compression for r in receiver.received if r.accepted] == ["", "gzip", ""]
    assert receiver.refused == 2
    assert receiver.resources() == [{"k": "v"}, {"k": "v"}]
    assert receiver.wait_for(lambda r: len(r.log_requests) == 1, timeout=1.0)
    assert not receiver.wait_for(lambda r: len(r.log_requests) == 2, timeout=0.1)
