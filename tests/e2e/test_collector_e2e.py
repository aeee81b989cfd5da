"""otel-gpu into the real Collector: ``otel-gpu run`` (simulated backend) -> otelcol-gpu
(``collector/configs/test-file.yaml``) over OTLP/gRPC and OTLP/HTTP (protobuf) -> the file
exporter's OTLP/JSON lines.

Checked on what the Collector wrote, i.e. after its receiver decoded and its exporter re-encoded
everything: metric names, units and kinds, the ``hw.*`` attributes on every point, the topology
on the Resource, the ECC health event as a log record, and, with the agent running as a daemon,
a Collector restart on the same ports (the agent stays up, its memory stays bounded, data flows
again, counters do not reset, SIGTERM still exits 0).

Skips without the Collector binary (``scripts/build-collector``), fails instead with
``OTEL_GPU_REQUIRE_E2E=1``. Loopback only; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otel_gpu.otel.metrics import METRICS, Instrument
from tests.e2e.collector_util import (
    TEST_FILE_CONFIG,
    Collector,
    attributes,
    free_endpoint,
    log_records,
    require_collector,
    start_collector,
)
from tests.e2e.test_otlp import COUNTERS, GAUGES, H100, UNITS, UPDOWNCOUNTERS, agent_env

pytestmark = pytest.mark.e2e

PROTOCOLS = ("grpc", "http/protobuf")
ECC_BACKEND = "simulated:faults=ecc@0:0"
ECC_EVENT = "accel.memory.ecc.uncorrectable"
DEVICE_KEYS = {"hw.id", "hw.type", "hw.name", "hw.vendor", "hw.model"}
GIB = 1 << 30
#: OTLP AggregationTemporality CUMULATIVE, as the Collector's JSON encoder writes it.
CUMULATIVE = 2

CLI_TIMEOUT_S = 30.0
DAEMON_INTERVAL_S = 0.5
#: How long the Collector stays away in the restart test (8 collection intervals).
OUTAGE_S = 4.0
#: Bounded waits, not timing assertions.
DATA_TIMEOUT_S = 15.0
RECOVERY_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 10.0
#: How much the agent's resident memory may grow across the outage.
RSS_GROWTH_LIMIT_KIB = 30 * 1024


# -- OTLP/JSON as the file exporter writes it ---------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One data point of metrics.json, with its metric and resource."""

    name: str
    unit: str
    kind: str  # "gauge", "sum", ...
    monotonic: bool
    temporality: int | None
    resource: dict[str, Any]
    attributes: dict[str, Any]
    value: float
    start_ns: int
    time_ns: int


def points(requests: list[dict[str, Any]], name: str | None = None) -> list[Point]:
    """Every data point (of metric ``name``) in ``{"resourceMetrics": [...]}`` requests."""
    out: list[Point] = []
    for req in requests:
        for rm in req.get("resourceMetrics", []):
            resource = attributes(rm.get("resource", {}).get("attributes"))
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    if name is not None and metric["name"] != name:
                        continue
                    kind = next(k for k in ("gauge", "sum", "histogram", "summary") if k in metric)
                    data = metric[kind]
                    for dp in data.get("dataPoints", []):
                        raw = dp.get("asDouble", dp.get("asInt", 0))
                        out.append(
                            Point(
                                name=metric["name"],
                                unit=metric.get("unit", ""),
                                kind=kind,
                                monotonic=bool(data.get("isMonotonic", False)),
                                temporality=data.get("aggregationTemporality"),
                                resource=resource,
                                attributes=attributes(dp.get("attributes")),
                                value=float(raw),  # asInt is a JSON string (int64)
                                start_ns=int(dp.get("startTimeUnixNano", 0)),
                                time_ns=int(dp.get("timeUnixNano", 0)),
                            )
                        )
    return out


def log_resources(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The resource attributes of every ResourceLogs in logs.json requests."""
    return [
        attributes(rl.get("resource", {}).get("attributes"))
        for req in requests
        for rl in req.get("resourceLogs", [])
    ]


def events(requests: list[dict[str, Any]], event_name: str) -> list[dict[str, Any]]:
    """Log records whose ``eventName`` (LogRecord.event_name in OTLP/JSON) is ``event_name``."""
    return [r for r in log_records(requests) if r.get("eventName") == event_name]


def status_of(pts: list[Point], hw_name: str) -> dict[str, float]:
    """``hw.state -> value`` of the latest ``hw.status`` points of device ``hw_name``."""
    latest: dict[str, Point] = {}
    for p in pts:
        if p.name == "hw.status" and p.attributes.get("hw.name") == hw_name:
            state = str(p.attributes["hw.state"])
            if state not in latest or p.time_ns >= latest[state].time_ns:
                latest[state] = p
    return {state: p.value for state, p in latest.items()}


# -- processes ----------------------------------------------------------------------------------


def url_of(col: Collector, protocol: str) -> str:
    """OTEL_EXPORTER_OTLP_ENDPOINT for ``col`` and ``protocol``."""
    return col.grpc_url if protocol == "grpc" else col.http_url


def run_once(col: Collector, protocol: str) -> subprocess.CompletedProcess[str]:
    """``otel-gpu run --once`` against ``col`` (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "otel_gpu", "run", "--backend", ECC_BACKEND, "--once"],
        env=agent_env(url_of(col, protocol), protocol),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def start_file_collector(
    workdir: Path, name: str, ports: dict[str, str] | None = None
) -> Collector:
    """test-file.yaml writing to ``<workdir>/<name>-out``, on ``ports`` (``OTLP_GRPC_ENDPOINT``,
    ``OTLP_HTTP_ENDPOINT``, ``HEALTH_ENDPOINT``) or on free ones (retried on a port race)."""
    attempts = 1 if ports else 3
    last: BaseException | None = None
    for attempt in range(attempts):
        chosen = ports or {
            "OTLP_GRPC_ENDPOINT": free_endpoint(),
            "OTLP_HTTP_ENDPOINT": free_endpoint(),
            "HEALTH_ENDPOINT": free_endpoint(),
        }
        env = {
            "OTLP_GRPC_ENDPOINT": chosen["OTLP_GRPC_ENDPOINT"],
            "OTLP_HTTP_ENDPOINT": chosen["OTLP_HTTP_ENDPOINT"],
            "OUTPUT_DIR": str(workdir / f"{name}-out"),
        }
        try:
            return start_collector(
                TEST_FILE_CONFIG,
                env,
                health_endpoint=chosen["HEALTH_ENDPOINT"],
                log_path=workdir / f"{name}-{attempt}.log",
            )
        except RuntimeError as e:  # exited before healthy: most likely a port taken meanwhile
            last = e
    raise RuntimeError(f"could not start the Collector {name}") from last


def ports_of(col: Collector) -> dict[str, str]:
    """The listen addresses of ``col``, to start another Collector on the same ports."""
    assert col.grpc_endpoint
    assert col.http_endpoint
    return {
        "OTLP_GRPC_ENDPOINT": col.grpc_endpoint,
        "OTLP_HTTP_ENDPOINT": col.http_endpoint,
        "HEALTH_ENDPOINT": col.health_endpoint,
    }


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (``VmRSS`` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, wait (bounded), SIGKILL if it hangs; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=EXIT_TIMEOUT_S)
    return proc.returncode


# -- one export per protocol ---------------------------------------------------------------------


@dataclass
class Received:
    """What the Collector wrote for one ``otel-gpu run --once``."""

    protocol: str
    metrics: list[dict[str, Any]]
    logs: list[dict[str, Any]]
    stderr: str


@pytest.fixture(scope="module", params=PROTOCOLS)
def once(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Received:
    """The default simulated node (8x H100, NVSwitch) with an ECC error on gpu0, exported once."""
    protocol: str = request.param
    require_collector()
    workdir = tmp_path_factory.mktemp("collector-once")
    col = start_file_collector(workdir, "once")
    try:
        proc = run_once(col, protocol)
        assert proc.returncode == 0, proc.stderr
        # --once flushes before it exits; the file exporter flushes every 100 ms.
        metrics = col.wait_for_metrics(lambda reqs: bool(points(reqs, "hw.power")))
        logs = col.wait_for_logs(lambda reqs: bool(events(reqs, ECC_EVENT)))
    finally:
        col.stop()
    assert metrics, f"no metrics reached the Collector:\n{col.log()}\n{proc.stderr}"
    return Received(protocol, metrics, logs, proc.stderr)


def once_device_ids(once: Received) -> list[str]:
    """``accel.device.ids`` of the metrics' Resource."""
    ids = points(once.metrics)[0].resource["accel.device.ids"]
    assert isinstance(ids, list)
    return [str(i) for i in ids]


def test_no_error_on_the_way(once: Received) -> None:
    assert "Traceback" not in once.stderr, once.stderr
    assert "WARNING" not in once.stderr, once.stderr  # no retry, no refused export


def test_metric_names_units_and_kinds(once: Received) -> None:
    pts = points(once.metrics)
    names = {p.name for p in pts}
    expected = GAUGES | COUNTERS | UPDOWNCOUNTERS
    assert names >= expected, sorted(expected - names)
    table = {m.name: m for m in METRICS}
    assert names <= set(table) | {"hw.status"}, sorted(names - set(table))
    units = {p.name: p.unit for p in pts}
    for name, unit in UNITS.items():
        assert units[name] == unit, name
    for name in names & set(table):
        assert units[name] == table[name].unit, name
    for p in pts:
        instrument = table[p.name].instrument if p.name in table else Instrument.UPDOWNCOUNTER
        if instrument is Instrument.GAUGE:
            assert p.kind == "gauge", p.name
        else:
            assert p.kind == "sum", p.name
            assert p.temporality == CUMULATIVE, p.name
            assert p.monotonic is (instrument is Instrument.COUNTER), p.name


def test_every_point_carries_the_device_attributes(once: Received) -> None:
    pts = points(once.metrics)
    ids = once_device_ids(once)
    for p in pts:
        assert p.attributes.keys() >= DEVICE_KEYS, (p.name, p.attributes)
        assert p.attributes["hw.vendor"] == "nvidia", p.name
        assert p.attributes["hw.model"] == H100, p.name
        if p.name == "hw.temperature":
            assert p.attributes["hw.type"] == "temperature"
            assert p.attributes["hw.parent"] in ids
            assert p.attributes["hw.sensor_location"] in ("gpu", "memory", "hotspot")
        else:
            assert p.attributes["hw.type"] == "gpu", p.name
            assert p.attributes["hw.id"] in ids, p.name
    power = {(p.attributes["hw.name"], p.attributes["hw.id"]) for p in pts if p.name == "hw.power"}
    assert power == {(f"gpu{i}", ids[i]) for i in range(8)}


def test_resource_topology(once: Received) -> None:
    resources = [p.resource for p in points(once.metrics)] + log_resources(once.logs)
    res = resources[0]
    assert all(r == res for r in resources), "metrics and logs share one Resource"
    assert res["service.name"] == "otel-gpu"
    assert res["host.name"] == socket.gethostname()
    assert res["accel.device.count"] == 8
    assert res["accel.vendors"] == ["nvidia"]
    assert res["accel.interconnect.domains"] == ["0,1,2,3,4,5,6,7"]
    ids = res["accel.device.ids"]
    assert len(ids) == 8
    assert len(set(ids)) == 8
    assert all(str(i).startswith("GPU-") for i in ids)
    assert res["accel.device.models"] == [H100] * 8
    assert len(res["accel.device.pci_bus_ids"]) == 8
    assert res["accel.device.numa_nodes"] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_values_arrive_intact(once: Received) -> None:
    pts = points(once.metrics)
    limits = {p.attributes["hw.name"]: p.value for p in pts if p.name == "hw.gpu.memory.limit"}
    assert limits == {f"gpu{i}": 80 * GIB for i in range(8)}
    assert {p.value for p in pts if p.name == "accel.power.limit"} == {700.0}
    assert all(0.0 <= p.value <= 1.0 for p in pts if p.name == "hw.gpu.utilization")
    uncorrected = {
        p.attributes["hw.name"]: p.value
        for p in pts
        if p.name == "hw.errors" and p.attributes.get("error.type") == "uncorrected"
    }
    assert uncorrected == {"gpu0": 1, **{f"gpu{i}": 0 for i in range(1, 8)}}
    assert status_of(pts, "gpu0")["failed"] == 1
    assert status_of(pts, "gpu0")["ok"] == 0
    for i in range(1, 8):
        assert status_of(pts, f"gpu{i}")["ok"] == 1, i


def test_ecc_health_event_is_a_log_record(once: Received) -> None:
    records = events(once.logs, ECC_EVENT)
    assert records, [r.get("eventName") for r in log_records(once.logs)]
    gpu0 = once_device_ids(once)[0]
    for record in records:
        attrs = attributes(record.get("attributes"))
        assert record["severityNumber"] == 17  # SEVERITY_NUMBER_ERROR
        assert record["severityText"] == "ERROR"
        assert attrs["hw.id"] == gpu0
        assert attrs["hw.name"] == "gpu0"
        assert attrs["hw.state"] == "failed"
        assert "uncorrectable ECC" in record["body"]["stringValue"]
        assert int(record["timeUnixNano"]) > 0


# -- a daemon across a Collector restart ---------------------------------------------------------


@dataclass
class Figures:
    """What the restart test measured (printed with ``pytest -s``)."""

    rss_before_kib: int = 0
    rss_outage_max_kib: int = 0
    rss_after_kib: int = 0
    metrics_again_s: float = 0.0
    logs_again_s: float = 0.0


@contextlib.contextmanager
def daemon(col: Collector, protocol: str, workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``otel-gpu run`` every 0.5 s into ``col``; killed after the block if still running."""
    env = agent_env(
        url_of(col, protocol),
        protocol,
        OTEL_GPU_INTERVAL=str(DAEMON_INTERVAL_S),
        OTEL_GPU_HEALTH_REEMIT="1",  # re-emit the ECC failure every second: logs flow too
    )
    with (workdir / "agent.stderr").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "otel_gpu", "run", "--backend", ECC_BACKEND],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=EXIT_TIMEOUT_S)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_collector_restart_while_the_agent_runs(protocol: str, tmp_path: Path) -> None:
    require_collector()
    figures = Figures()
    first = start_file_collector(tmp_path, "first")
    second: Collector | None = None
    try:
        with daemon(first, protocol, tmp_path) as agent:

            def stderr() -> str:
                return (tmp_path / "agent.stderr").read_text(errors="replace")

            # Steady state: several exports of metrics, and logs.
            before = first.wait_for_metrics(lambda reqs: len(reqs) >= 4)
            assert len(before) >= 4, f"{len(before)} exports in {DATA_TIMEOUT_S} s\n{stderr()}"
            assert first.wait_for_logs(lambda reqs: bool(events(reqs, ECC_EVENT))), stderr()
            times = sorted({p.time_ns for p in points(before, "hw.power")})
            assert len(times) >= 4, "every export is a new collection"
            figures.rss_before_kib = rss_kib(agent.pid)

            # The Collector goes away; the agent keeps collecting and retrying.
            assert first.stop() == 0, first.log()
            energy_before = points(first.metrics(), "hw.energy")
            deadline = time.monotonic() + OUTAGE_S
            while time.monotonic() < deadline:
                assert agent.poll() is None, f"agent exited during the outage:\n{stderr()}"
                figures.rss_outage_max_kib = max(figures.rss_outage_max_kib, rss_kib(agent.pid))
                time.sleep(0.25)

            # A new Collector on the same ports: data flows again.
            second = start_file_collector(tmp_path, "second", ports_of(first))
            started = time.monotonic()
            after = second.wait_for_metrics(lambda reqs: bool(reqs), RECOVERY_TIMEOUT_S)
            figures.metrics_again_s = time.monotonic() - started
            assert after, f"no metrics {RECOVERY_TIMEOUT_S} s after the restart:\n{stderr()}"
            logs_after = second.wait_for_logs(
                lambda reqs: bool(events(reqs, ECC_EVENT)), RECOVERY_TIMEOUT_S
            )
            figures.logs_again_s = time.monotonic() - started
            assert logs_after, f"no health logs after the restart:\n{stderr()}"
            assert agent.poll() is None, stderr()

            # A few more exports, then memory: bounded across the outage.
            after = second.wait_for_metrics(lambda reqs: len(reqs) >= 3)
            figures.rss_after_kib = rss_kib(agent.pid)
            print(f"\n{protocol}: {figures}")  # the figures, for `pytest -s`
            growth = figures.rss_after_kib - figures.rss_before_kib
            assert growth <= RSS_GROWTH_LIMIT_KIB, figures
            assert figures.rss_outage_max_kib - figures.rss_before_kib <= RSS_GROWTH_LIMIT_KIB

            # Same process, same cumulative series: no counter reset seen by the backend.
            energy_after = points(after, "hw.energy")
            assert energy_after
            for p in energy_after:
                same = [q for q in energy_before if q.attributes["hw.id"] == p.attributes["hw.id"]]
                assert same, p.attributes
                assert {q.start_ns for q in same} == {p.start_ns}
                assert p.value >= max(q.value for q in same)
            assert {p.resource["service.instance.id"] for p in energy_after} == {
                energy_before[0].resource["service.instance.id"]
            }

            # SIGTERM: flush, close, exit 0.
            code = stop(agent)
            assert code == 0, stderr()
            assert "Traceback" not in stderr(), stderr()
    finally:
        first.stop()
        if second is not None:
            second.stop()
