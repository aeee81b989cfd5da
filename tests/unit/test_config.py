"""Configuration: every OTEL_GPU_* variable, the standard OTEL_* checks, process scope, and the
CLI's one-line errors, secrets and OTEL_SDK_DISABLED (through real `otel-gpu` processes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_gpu import config
from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.config import ENV_VARS, STANDARD_VARS, Settings, check_otel_env, markdown_table
from otel_gpu.errors import ConfigError
from otel_gpu.hal.manager import DeviceFilter, DeviceManager
from otel_gpu.scope import VisibleDevices, own_pids, visible_devices

SECRET = "SECRET123"


# -- Settings.from_env ----------------------------------------------------------------------------


def test_defaults() -> None:
    s = Settings.from_env({})
    assert (s.backend, s.devices, s.interval_s, s.attributes) == ("auto", None, 10.0, "full")
    assert (s.processes, s.scope, s.log_level) == (False, "node", "warning")
    assert s.health.expected_devices is None
    assert (s.health.pcie_replay_limit, s.health.reemit_s) == (8.0, 300.0)
    assert s.health.retired_pages_limit == 60
    assert (s.health.xid_hold_s, s.health.degraded_after_sweeps) == (600.0, 3)


def test_every_variable_is_read() -> None:
    s = Settings.from_env(
        {
            "OTEL_GPU_BACKEND": "simulated:count=2",
            "OTEL_GPU_DEVICES": "0,GPU-abc",
            "OTEL_GPU_INTERVAL": "2.5",
            "OTEL_GPU_ATTRIBUTES": "Minimal",
            "OTEL_GPU_PROCESSES": "yes",
            "OTEL_GPU_SCOPE": "process",
            "OTEL_GPU_EXPECTED_DEVICES": "8",
            "OTEL_GPU_PCIE_REPLAY_LIMIT": "0.5",
            "OTEL_GPU_HEALTH_REEMIT": "60",
            "OTEL_GPU_HEALTH_XID_HOLD": "30",
            "OTEL_GPU_HEALTH_DEGRADED_AFTER": "5",
            "OTEL_GPU_LOG_LEVEL": "DEBUG",
        }
    )
    assert s.backend == "simulated:count=2"
    assert s.devices == DeviceFilter(frozenset({0}), frozenset({"GPU-abc"}))
    assert (s.interval_s, s.attributes, s.processes, s.scope) == (2.5, "minimal", True, "process")
    assert s.log_level == "debug"
    h = s.health
    assert (h.expected_devices, h.pcie_replay_limit, h.reemit_s) == (8, 0.5, 60.0)
    assert (h.xid_hold_s, h.degraded_after_sweeps) == (30.0, 5)


def test_documented_variables_are_exactly_those_read() -> None:
    # Every OTEL_GPU_* string literal in the package outside config's table is a read.
    package = Path(config.__file__).parent
    read: set[str] = set()
    for path in package.rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        if path.name == "config.py" and path.parent == package:
            source = source[source.index("class Settings:") :]
        read |= set(re.findall(r'"(OTEL_GPU_[A-Z_]+)"', source))
    assert read == {v.name for v in ENV_VARS}
    table = markdown_table()
    assert all(f"`{v.name}`" in table for v in ENV_VARS)
    assert all(f"`{v.name}`" in markdown_table(STANDARD_VARS) for v in STANDARD_VARS)


def test_interval_follows_the_sdk_variable_in_milliseconds() -> None:
    assert Settings.from_env({"OTEL_METRIC_EXPORT_INTERVAL": "5000"}).interval_s == 5.0
    env = {"OTEL_METRIC_EXPORT_INTERVAL": "5000", "OTEL_GPU_INTERVAL": "1"}
    assert Settings.from_env(env).interval_s == 1.0


def test_application_mode_leaves_the_sdk_variables_to_the_sdk() -> None:
    env = {"OTEL_METRIC_EXPORT_INTERVAL": "soon", "OTEL_EXPORTER_OTLP_TIMEOUT": "x"}
    assert Settings.from_env(env, standard=False).interval_s == 10.0
    with pytest.raises(ConfigError):
        Settings.from_env(env)


def test_process_scope_turns_process_metrics_on_unless_told_otherwise() -> None:
    assert Settings.from_env({"OTEL_GPU_SCOPE": "process"}).processes is True
    env = {"OTEL_GPU_SCOPE": "process", "OTEL_GPU_PROCESSES": "false"}
    assert Settings.from_env(env).processes is False


def test_cli_flags_override_env() -> None:
    s = Settings.from_env({"OTEL_GPU_BACKEND": "simulated", "OTEL_GPU_INTERVAL": "3"})
    o = s.override(backend="nvml", interval_s=None, processes=True)
    assert (o.backend, o.interval_s, o.processes) == ("nvml", 3.0, True)


BAD_GPU_VALUES = [
    ("OTEL_GPU_BACKEND", "bogus", "auto, nvml, nvidia-smi"),
    ("OTEL_GPU_BACKEND", "auto,simulated", "auto alone"),
    ("OTEL_GPU_BACKEND", "nvml,", "names separated by ,"),
    ("OTEL_GPU_DEVICES", "0,,1", "indices or ids"),
    ("OTEL_GPU_DEVICES", "-1", "device indices >= 0"),
    ("OTEL_GPU_INTERVAL", "0.1", "seconds >= 0.2"),
    ("OTEL_GPU_INTERVAL", "fast", "seconds >= 0.2"),
    ("OTEL_GPU_ATTRIBUTES", "all", "full, minimal"),
    ("OTEL_GPU_PROCESSES", "maybe", "true, false"),
    ("OTEL_GPU_SCOPE", "job", "node, process"),
    ("OTEL_GPU_EXPECTED_DEVICES", "-2", "an integer >= 0"),
    ("OTEL_GPU_PCIE_REPLAY_LIMIT", "nan", "a number >= 0"),
    ("OTEL_GPU_RETIRED_PAGES_LIMIT", "-1", "an integer >= 0"),
    ("OTEL_GPU_HEALTH_REEMIT", "0", "a number > 0"),
    ("OTEL_GPU_HEALTH_XID_HOLD", "inf", "a number > 0"),
    ("OTEL_GPU_HEALTH_DEGRADED_AFTER", "0", "an integer >= 1"),
    ("OTEL_GPU_LOG_LEVEL", "trace", "debug, info, warning, error"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "100", "milliseconds >= 200"),
]

BAD_STANDARD_VALUES = [
    ("OTEL_SDK_DISABLED", "yes", "true, false"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "grpc, http/protobuf"),
    ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "udp", "grpc, http/protobuf"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s", "seconds > 0; the Python SDK reads seconds"),
    ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "0", "seconds > 0"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "deflate", "gzip"),
    ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "zstd", "gzip"),
    ("OTEL_EXPORTER_PROMETHEUS_PORT", "http", "0..65535"),
    ("OTEL_EXPORTER_PROMETHEUS_PORT", "70000", "0..65535"),
]


@pytest.mark.parametrize(("name", "value", "accepted"), BAD_GPU_VALUES + BAD_STANDARD_VALUES)
def test_bad_value_names_the_variable_and_what_is_accepted(
    name: str, value: str, accepted: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: value})
    assert info.value.setting == name
    text = str(info.value)
    assert text.startswith(f"{name}: ")
    assert accepted in text
    assert "\n" not in text


def test_compression_accepted_values_follow_the_protocol() -> None:
    http = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    for value in ("gzip", "deflate", "none", "GZIP"):
        check_otel_env({**http, "OTEL_EXPORTER_OTLP_COMPRESSION": value})
    check_otel_env({"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"})
    mixed = {**http, "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "grpc"}
    check_otel_env({**mixed, "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "deflate"})
    with pytest.raises(ConfigError, match=r"accepted: gzip\)"):
        check_otel_env({**mixed, "OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"})


@pytest.mark.parametrize(
    "headers",
    [
        f"x-honeycomb-team:{SECRET}",
        f"x-honeycomb-team={SECRET},{SECRET}",
        f"Authorization Basic {SECRET}",
        f"={SECRET}",
    ],
)
def test_malformed_headers_never_show_their_value(headers: str) -> None:
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_METRICS_HEADERS"):
        with pytest.raises(ConfigError) as info:
            check_otel_env({name: headers})
        assert str(info.value).startswith(f"{name}: malformed entry")
        assert SECRET not in str(info.value)
        assert SECRET not in repr(info.value.args)


@pytest.mark.parametrize(
    "headers",
    [
        f"x-honeycomb-team={SECRET}",
        f"x-honeycomb-team={SECRET},x-honeycomb-dataset=gpu",
        f"Authorization=Basic%20{SECRET}==",
        f"Authorization=Basic {SECRET}",
        "a=1,,b=2",
    ],
)
def test_wellformed_headers_pass(headers: str) -> None:
    check_otel_env({"OTEL_EXPORTER_OTLP_HEADERS": headers})


def test_timeout_in_milliseconds_is_accepted_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check_otel_env({"OTEL_EXPORTER_OTLP_TIMEOUT": "10"})
    assert not caplog.records
    check_otel_env({"OTEL_EXPORTER_OTLP_TIMEOUT": "10000"})
    assert "read in seconds" in caplog.text
    assert "did you mean 10?" in caplog.text


def test_sdk_disabled_reads_true_only() -> None:
    assert config.sdk_disabled({"OTEL_SDK_DISABLED": "TRUE"})
    assert not config.sdk_disabled({"OTEL_SDK_DISABLED": "false"})
    assert not config.sdk_disabled({})


# -- process scope ----------------------------------------------------------------------------


def _names(spec: str, settings_env: dict[str, str], env: dict[str, str]) -> list[str]:
    settings = Settings.from_env({"OTEL_GPU_SCOPE": "process", **settings_env})
    manager = DeviceManager([SimulatedBackend(spec)], settings.device_filter(env))
    with manager:
        return [d.name for d in manager.inventory.devices]


def _ids(spec: str) -> list[str]:
    with DeviceManager([SimulatedBackend(spec)]) as manager:
        return [d.id for d in manager.inventory.devices]


def test_node_scope_ignores_visibility_variables() -> None:
    settings = Settings.from_env({"OTEL_GPU_DEVICES": "1"})
    assert settings.device_filter({"CUDA_VISIBLE_DEVICES": "0"}) == settings.devices


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1,3", ["gpu1", "gpu3"]),
        ("3,1", ["gpu1", "gpu3"]),
        ("0,-1,2", ["gpu0"]),  # CUDA: the list ends at the first invalid entry
        ("1,9,2", ["gpu1"]),
        ("", []),
        (" 2 ", ["gpu2"]),
    ],
)
def test_cuda_visible_devices_indices(value: str, expected: list[str]) -> None:
    assert _names("count=4", {}, {"CUDA_VISIBLE_DEVICES": value}) == expected


def test_cuda_visible_devices_uuids_and_prefixes() -> None:
    ids = _ids("count=4")
    value = f"{ids[2]},{ids[0][:12]}"
    assert _names("count=4", {}, {"CUDA_VISIBLE_DEVICES": value}) == ["gpu0", "gpu2"]


def test_visibility_intersects_otel_gpu_devices() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2"}
    assert _names("count=4", {"OTEL_GPU_DEVICES": "1,3"}, env) == ["gpu1"]


def test_mig_instance_keeps_itself_and_its_parent() -> None:
    spec = "count=2,mig=0:3"
    ids = _ids(spec)
    mig = ids[3]  # the second instance of gpu0
    names = _names(spec, {}, {"CUDA_VISIBLE_DEVICES": mig})
    with DeviceManager([SimulatedBackend(spec)]) as manager:
        by_id = {d.id: d.name for d in manager.inventory.devices}
    assert names == ["gpu0", by_id[mig]]
    whole = _names(spec, {}, {"CUDA_VISIBLE_DEVICES": "0"})
    assert whole == ["gpu0", *[by_id[i] for i in ids[2:5]]]


def test_amd_hip_indexes_into_rocr_selection() -> None:
    env = {"ROCR_VISIBLE_DEVICES": "4,5,6", "HIP_VISIBLE_DEVICES": "1"}
    assert _names("vendor=amd", {}, env) == ["gpu5"]
    assert _names("vendor=amd", {}, {"CUDA_VISIBLE_DEVICES": "0"}) == [
        f"gpu{i}" for i in range(8)
    ]  # another vendor's variable


def test_intel_affinity_mask_uses_the_device_part() -> None:
    env = {"ZE_AFFINITY_MASK": "1.0,1.1,3"}
    assert _names("vendor=intel,count=4", {}, env) == ["gpu1", "gpu3"]


def test_visible_devices_reads_only_variables_that_are_set() -> None:
    f = visible_devices(None, {"CUDA_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "1"})
    assert f == VisibleDevices(visible=(("nvidia", ("0",)), ("amd", ("1",))))


def test_own_pids_follows_children(tmp_path: Path) -> None:
    for pid, tasks in {10: {10: "11 12", 13: "14"}, 11: {11: ""}, 12: {12: "15"}}.items():
        for tid, children in tasks.items():
            task = tmp_path / "proc" / str(pid) / "task" / str(tid)
            task.mkdir(parents=True)
            (task / "children").write_text(children, encoding="ascii")
    assert own_pids(tmp_path, 10) == {10, 11, 12, 14, 15}
    assert own_pids(tmp_path, 99) == {99}


def test_own_pids_of_this_process_includes_a_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        pids = own_pids()
    finally:
        child.kill()
        child.wait()
    assert os.getpid() in pids
    if Path(f"/proc/self/task/{os.getpid()}/children").exists():
        assert child.pid in pids


# -- the CLI: one line and exit 2, secrets, OTEL_SDK_DISABLED ----------------------------------


def _otel_gpu(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-m", "otel_gpu", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [*BAD_GPU_VALUES, *BAD_STANDARD_VALUES],
)
def test_cli_bad_env_value_is_one_line_and_exit_2(name: str, value: str, accepted: str) -> None:
    proc = _otel_gpu(["run", "--once", "--exporter", "none"], {name: value})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"otel-gpu: error: {name}: ")
    assert accepted in lines[0]
    assert proc.stdout == ""


def test_cli_bad_backend_env_value_is_reported_for_every_command() -> None:
    for command in (["inventory"], ["backends"]):
        proc = _otel_gpu(command, {"OTEL_GPU_BACKEND": "nvlm"})
        assert proc.returncode == 2
        assert proc.stderr.startswith("otel-gpu: error: OTEL_GPU_BACKEND: unknown backend 'nvlm'")


def test_cli_malformed_headers_are_one_line_without_the_secret() -> None:
    proc = _otel_gpu(
        ["run", "--backend", "simulated", "--once", "--log-level", "debug"],
        {"OTEL_EXPORTER_OTLP_HEADERS": f"x-honeycomb-team: {SECRET}"},
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "OTEL_EXPORTER_OTLP_HEADERS: malformed entry 1 of 1" in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_headers_never_appear_in_debug_output(protocol: str) -> None:
    """An unreachable endpoint (connection refused, retries, give-up): debug logs all of it."""
    import socket

    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = _otel_gpu(
        ["run", "--backend", "simulated", "--once", "--log-level", "debug"],
        {
            "OTEL_EXPORTER_OTLP_HEADERS": f"x-honeycomb-team={SECRET}",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        },
    )
    output = proc.stdout + proc.stderr
    assert "DEBUG" in output  # debug logging was on
    assert SECRET not in output


def test_headers_reach_the_receiver_but_not_the_logs() -> None:
    receiver = pytest.importorskip("otel_gpu.testing.otlp_receiver")
    with receiver.OtlpReceiver() as rx:
        proc = _otel_gpu(
            ["run", "--backend", "simulated", "--once", "--log-level", "debug"],
            {**rx.exporter_env("grpc"), "OTEL_EXPORTER_OTLP_HEADERS": f"x-api-key={SECRET}"},
        )
        assert proc.returncode == 0, proc.stderr
        assert rx.wait_for(lambda r: r.metrics_requests, timeout=10)
        assert any(r.metadata.get("x-api-key") == SECRET for r in rx.received)
    assert SECRET not in proc.stdout + proc.stderr


def test_sdk_disabled_exits_0_quickly_and_exports_nothing() -> None:
    receiver = pytest.importorskip("otel_gpu.testing.otlp_receiver")
    with receiver.OtlpReceiver() as rx:
        started = time.monotonic()
        proc = _otel_gpu(
            ["run", "--backend", "simulated", "--interval", "0.2"],
            {**rx.exporter_env("grpc"), "OTEL_SDK_DISABLED": "true"},
            timeout=30,
        )
        elapsed = time.monotonic() - started
        assert proc.returncode == 0, proc.stderr
        assert elapsed < 20  # did not wait for a signal: it never started collecting
        assert not rx.wait_for(lambda r: r.received, timeout=1)
    assert "OTEL_SDK_DISABLED" in proc.stderr


# -- examples/env ---------------------------------------------------------------------------------

ENV_FILES = sorted((Path(__file__).resolve().parents[2] / "examples" / "env").glob("*.env"))


def _read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, sep, value = line.partition("=")
            assert sep and name == name.strip() and not value.startswith(("'", '"')), line
            env[name] = value
    return env


def test_there_are_env_examples() -> None:
    assert {p.name for p in ENV_FILES} >= {
        "datadog-agent.env",
        "honeycomb.env",
        "grafana-cloud.env",
        "prometheus.env",
    }


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.name)
def test_env_example_is_valid_for_otel_gpu_and_the_sdk(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _read_env_file(path)
    assert all(name.startswith("OTEL_") for name in env)
    Settings.from_env(env)  # our variables and the standard checks
    if env.get("OTEL_METRICS_EXPORTER") == "prometheus":
        return
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
            OTLPMetricExporter,
        )
    OTLPMetricExporter().shutdown()  # the SDK builds its exporter from these variables
