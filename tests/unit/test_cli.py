"""The command line, run as a user runs it: a subprocess, its output and its exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest


def otel_gpu(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "otel_gpu", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )


def _console_metrics(stdout: str) -> list[dict[str, Any]]:
    """Split the console exporters' concatenated JSON documents."""
    decoder = json.JSONDecoder()
    docs, i = [], 0
    while i < len(stdout):
        if stdout[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(stdout, i)
        docs.append(doc)
    return docs


def test_run_once_console_prints_the_node() -> None:
    result = otel_gpu(
        "run", "--backend", "simulated", "--once", env={"OTEL_METRICS_EXPORTER": "console"}
    )
    assert result.returncode == 0, result.stderr
    docs = _console_metrics(result.stdout)
    metrics_docs = [d for d in docs if "resource_metrics" in d]
    assert len(metrics_docs) == 1
    rm = metrics_docs[0]["resource_metrics"][0]
    assert rm["resource"]["attributes"]["accel.device.count"] == 8
    assert rm["resource"]["attributes"]["accel.interconnect.domains"] == ["0,1,2,3,4,5,6,7"]
    metrics = {m["name"]: m for sm in rm["scope_metrics"] for m in sm["metrics"]}
    for name in (
        "hw.gpu.utilization",
        "hw.gpu.memory.usage",
        "hw.power",
        "hw.energy",
        "hw.temperature",
    ):
        names = {p["attributes"]["hw.name"] for p in metrics[name]["data"]["data_points"]}
        assert names == {f"gpu{i}" for i in range(8)}, name
    assert "Traceback" not in result.stderr


def test_console_logs_follow_console_metrics() -> None:
    result = otel_gpu(
        "run", "--backend", "simulated:count=2,faults=ecc@1:0", "--once", "--exporter", "console"
    )
    assert result.returncode == 0, result.stderr
    logs = [d for d in _console_metrics(result.stdout) if "event_name" in d]
    assert [d["event_name"] for d in logs] == ["accel.memory.ecc.uncorrectable"]
    assert logs[0]["attributes"]["hw.name"] == "gpu1"
    assert result.stderr == ""  # no OTLP connection attempt, nothing to complain about


@pytest.mark.parametrize(
    ("args", "env", "code", "fragment"),
    [
        (["run", "--backend", "cuda"], {}, 2, "unknown backend 'cuda'"),
        (["run"], {"OTEL_GPU_BACKEND": "cuda"}, 2, "unknown backend 'cuda'"),
        (["run", "--interval", "0.01"], {}, 2, "--interval"),
        (["run", "--backend", "simulated"], {"OTEL_GPU_INTERVAL": "fast"}, 2, "OTEL_GPU_INTERVAL"),
        (
            ["run", "--backend", "simulated"],
            {"OTEL_GPU_ATTRIBUTES": "some"},
            2,
            "OTEL_GPU_ATTRIBUTES",
        ),
        (["run", "--backend", "simulated"], {"OTEL_GPU_DEVICES": "0,,1"}, 2, "OTEL_GPU_DEVICES"),
        (["run", "--backend", "simulated:count=x"], {}, 2, "count='x' is not an integer"),
        (
            ["run", "--backend", "simulated", "--once"],
            {"OTEL_METRICS_EXPORTER": "zipkin"},
            2,
            "OTEL_METRICS_EXPORTER",
        ),
        (
            ["run", "--backend", "simulated", "--once"],
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"},
            2,
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (["inventory", "--backend", ""], {}, 2, "empty backend"),
        (["frobnicate"], {}, 2, "invalid choice"),
        (["run", "--exporter", "kafka"], {}, 2, "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_a_documented_exit_code(
    args: list[str], env: dict[str, str], code: int, fragment: str
) -> None:
    result = otel_gpu(*args, env=env)
    assert result.returncode == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def test_run_with_a_missing_driver_fails_in_one_line_naming_the_library() -> None:
    result = otel_gpu("run", "--backend", "nvml")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "libnvidia-ml.so.1" in lines[0]


def test_inventory_json() -> None:
    result = otel_gpu("inventory", "--json", "--backend", "simulated:count=4,mig=1:3")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert len(doc["devices"]) == 7
    parent = doc["devices"][1]
    assert len(parent["children"]) == 3
    assert doc["interconnect_domains"] == [[0, 1, 2, 3]]
    assert doc["resource"]["accel.device.count"] == 7
    assert doc["versions"]["nvidia.driver"]


def test_inventory_text_and_device_filter() -> None:
    result = otel_gpu("inventory", "--backend", "simulated", "--devices", "0,7")
    assert result.returncode == 0, result.stderr
    assert "2 devices" in result.stdout
    assert "gpu0" in result.stdout and "gpu7" in result.stdout and "gpu3" not in result.stdout


def test_backends_lists_the_simulated_backend() -> None:
    result = otel_gpu("backends", "--json")
    assert result.returncode == 0
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["simulated"]["available"] is True
    assert rows["simulated"]["auto"] is False


def test_health_ok_on_a_healthy_node() -> None:
    result = otel_gpu("health", "--backend", "simulated", "--expect-devices", "8")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK")


def test_health_critical_on_uncorrectable_ecc_names_the_device() -> None:
    result = otel_gpu("health", "--backend", "simulated:faults=ecc@3:0")
    assert result.returncode == 2
    critical = [
        line for line in result.stdout.splitlines() if "CRITICAL" in line and "gpu3" in line
    ]
    assert critical and "accel.memory.ecc.uncorrectable" in critical[0]


@pytest.mark.parametrize(
    ("spec", "extra", "code", "status"),
    [
        ("simulated", ["--expect-devices", "7"], 2, "CRITICAL"),
        ("simulated:faults=throttle-thermal@0:0", [], 1, "WARNING"),
        ("simulated:faults=throttle-power@0:0", [], 0, "OK"),
        ("simulated:faults=xid79@0:0", [], 2, "CRITICAL"),
        ("simulated:faults=xid13@0:0", [], 0, "OK"),
    ],
)
def test_health_nagios_codes(spec: str, extra: list[str], code: int, status: str) -> None:
    result = otel_gpu("health", "--backend", spec, "--format", "nagios", *extra)
    assert result.returncode == code, result.stdout + result.stderr
    assert result.stdout.startswith(f"GPU {status} - ")
    assert len(result.stdout.strip().splitlines()) == 1


def test_health_json_and_unknown_when_no_backend() -> None:
    result = otel_gpu("health", "--backend", "simulated:faults=lost@1:0", "--format", "json")
    assert result.returncode == 2
    doc = json.loads(result.stdout)
    assert doc["status"] == "CRITICAL"
    assert doc["findings"][0]["check"] == "accel.device.lost"
    assert doc["findings"][0]["device"] == "gpu1"
    unknown = otel_gpu("health", "--backend", "nvml")
    assert unknown.returncode == 3
    assert unknown.stderr.startswith("UNKNOWN")


def test_health_sends_events_as_logs_when_asked() -> None:
    result = otel_gpu("health", "--backend", "simulated:faults=ecc@3:0", "--exporter", "console")
    assert result.returncode == 2
    assert '"event_name": "accel.memory.ecc.uncorrectable"' in result.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_daemon_stops_cleanly_on_signal(sig: signal.Signals) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_METRICS_EXPORTER": "console", "OTEL_GPU_INTERVAL": "0.5"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_gpu", "run", "--backend", "simulated:count=2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 20
        # Wait for two periodic exports, so the daemon is really running.
        while sum('"resource_metrics"' in line for line in lines) < 2:
            assert time.monotonic() < deadline, "no periodic export"
            lines.append(proc.stdout.readline())
        proc.send_signal(sig)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=10)
        elapsed = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    # The final flush on shutdown exported once more.
    assert out.count('"resource_metrics"') >= 1
    print(f"stopped {elapsed:.2f}s after {sig.name}")


def test_sdk_disabled_exports_nothing() -> None:
    result = otel_gpu(
        "run",
        "--backend",
        "simulated",
        "--once",
        env={"OTEL_SDK_DISABLED": "true", "OTEL_METRICS_EXPORTER": "console"},
    )
    assert result.returncode == 0
    assert result.stdout == ""
    assert "OTEL_SDK_DISABLED" in result.stderr


def test_health_check_busy_for_a_slurm_prolog() -> None:
    idle = otel_gpu(
        "health", "--backend", "simulated:idle=true", "--check-busy", "--format", "nagios"
    )
    assert idle.returncode == 0, idle.stdout + idle.stderr
    busy = otel_gpu("health", "--backend", "simulated", "--check-busy", "--format", "nagios")
    assert busy.returncode == 2
    assert "process(es) running" in busy.stdout


def test_a_large_node_keeps_every_series() -> None:
    # 64 GPUs x 18 NVLinks x 3 error types = 3,456 series of one metric: above the SDK's
    # default limit of 2000, which would fold the rest into an overflow point.
    result = otel_gpu("run", "--backend", "simulated:count=64", "--once", "--exporter", "console")
    assert result.returncode == 0, result.stderr
    assert "otel.metric.overflow" not in result.stdout
    doc = next(d for d in _console_metrics(result.stdout) if "resource_metrics" in d)
    metrics = {
        m["name"]: m for sm in doc["resource_metrics"][0]["scope_metrics"] for m in sm["metrics"]
    }
    assert len(metrics["accel.interconnect.errors"]["data"]["data_points"]) == 64 * 18 * 3
