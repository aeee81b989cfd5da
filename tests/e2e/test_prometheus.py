"""Prometheus pull: one sweep per window with OTLP push and Prometheus pull together (in-process),
and a real Prometheus server (Debian package ``prometheus``) scraping ``otel-gpu run
--exporter prometheus``, checked through Prometheus's HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from otel_gpu.hal.manager import DeviceManager
from otel_gpu.otel.bridge import GpuTelemetry
from tests.conftest import missing_part

GIB = 1 << 30


# -- one sweep per collection window ----------------------------------------------------------


def test_push_and_pull_together_sweep_once_per_window() -> None:
    registry = CollectorRegistry()
    push = InMemoryMetricReader()  # stands for the OTLP periodic reader
    pull = PrometheusMetricReader(registry=registry)
    provider = MeterProvider(metric_readers=[push, pull], shutdown_on_exit=False)
    manager = DeviceManager.from_selector("simulated")
    telemetry = GpuTelemetry(manager, provider, interval_s=0.4)
    telemetry.start()
    try:
        data = push.get_metrics_data()
        scrape = generate_latest(registry).decode()
        assert manager.sweeps == 1
        assert telemetry.cache.sweeps == 1
        assert data is not None
        assert scrape.count("hw_gpu_memory_limit_bytes{") == 8

        time.sleep(0.25)  # the next window (max age = interval / 2)
        push.get_metrics_data()
        generate_latest(registry)
        generate_latest(registry)
        assert manager.sweeps == telemetry.cache.sweeps == 2
    finally:
        telemetry.shutdown()
        provider.shutdown()


# -- a real Prometheus server -----------------------------------------------------------------


@pytest.fixture
def prometheus_bin() -> str:
    """The Prometheus server binary (skips, or fails in CI, when it is not installed)."""
    found = shutil.which(os.environ.get("OTEL_GPU_PROMETHEUS_BIN") or "prometheus")
    if found:
        return found
    missing_part(
        "the Prometheus server is not installed (apt-get install prometheus, "
        "or set OTEL_GPU_PROMETHEUS_BIN)"
    )
    raise AssertionError("unreachable")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except OSError as err:
        return 0, str(err)


def _wait(what: str, check: Any, proc: subprocess.Popen[str], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        if proc.poll() is not None:
            pytest.fail(f"{what}: process exited with {proc.returncode}: {proc.stderr}")
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err or ""


@pytest.fixture
def agent() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """``otel-gpu run --exporter prometheus`` on a free loopback port."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTEL_EXPORTER_PROMETHEUS_PORT=str(port),
        OTEL_SERVICE_NAME="gpu-node-agent",
    )
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "otel_gpu", "run", "--backend", "simulated"),
            *("--exporter", "prometheus", "--interval", "1"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(
            "the /metrics endpoint",
            lambda: "hw_power_watts" in _get(f"http://127.0.0.1:{port}/metrics")[1],
            proc,
        )
        yield port, proc
    finally:
        code, err = _stop(proc)
        assert code == 0, err  # SIGTERM: flush, close, exit 0


@pytest.fixture
def prometheus(
    prometheus_bin: str, agent: tuple[int, subprocess.Popen[str]], tmp_path: Path
) -> Iterator[str]:
    """A Prometheus server scraping the agent every second; yields its base URL."""
    target_port, _ = agent
    web_port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: otel-gpu\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{target_port}']\n",
        encoding="utf-8",
    )
    proc = subprocess.Popen(
        [
            prometheus_bin,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{web_port}",
            "--log.level=warn",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{web_port}"
    try:
        _wait("Prometheus readiness", lambda: _get(f"{base}/-/ready")[0] == 200, proc, 60)
        yield base
    finally:
        _stop(proc)


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    status, body = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    if status != 200:
        return []
    doc = json.loads(body)
    assert doc["status"] == "success", doc
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


@pytest.mark.e2e
def test_prometheus_scrapes_the_gpu_series(
    prometheus_bin: str, prometheus: str, agent: tuple[int, subprocess.Popen[str]]
) -> None:
    _, proc = agent
    limits = _wait(
        "8 hw_gpu_memory_limit_bytes series in Prometheus",
        lambda: (r := _query(prometheus, "hw_gpu_memory_limit_bytes")) and len(r) == 8 and r,
        proc,
        timeout=60,
    )
    assert {s["metric"]["hw_name"] for s in limits} == {f"gpu{i}" for i in range(8)}
    for series in limits:
        labels = series["metric"]
        assert labels["job"] == "otel-gpu"
        assert labels["hw_vendor"] == "nvidia"
        assert labels["hw_model"] == "NVIDIA H100 80GB HBM3"
        assert labels["hw_type"] == "gpu"
        assert labels["hw_id"].startswith("GPU-")
        assert float(series["value"][1]) == 80 * GIB

    power = _query(prometheus, "hw_power_watts")
    assert len(power) == 8
    assert all(0 < float(s["value"][1]) <= 700 for s in power)
    limit = _query(prometheus, "accel_power_limit_watts")
    assert {float(s["value"][1]) for s in limit} == {700.0}

    status = _query(prometheus, "sum by (hw_name) (hw_status)")
    assert len(status) == 8
    assert {float(s["value"][1]) for s in status} == {1.0}  # one state per device
    ok = _query(prometheus, 'hw_status{hw_state="ok"} == 1')
    assert len(ok) == 8

    counters = _query(prometheus, "hw_energy_joules_total")
    assert len(counters) == 8
    assert _query(prometheus, 'up{job="otel-gpu"} == 1')

    info = _query(prometheus, "target_info")  # the Resource, topology included
    assert len(info) == 1
    labels = info[0]["metric"]
    assert labels["service_name"] == "gpu-node-agent"
    assert labels["accel_device_count"] == "8"
