"""The faults that kill other agents: a flapping Collector, a failing driver, signals during
export, and malformed input of every kind (fuzzed). Loopback only, bounded loops."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from otel_gpu.backends.nvml import NvmlBackend
from otel_gpu.backends.simulated.spec import parse_spec
from otel_gpu.config import ENV_VARS, Settings
from otel_gpu.errors import ConfigError
from otel_gpu.hal import DeviceManager, HealthEvent
from otel_gpu.health import HealthMonitor
from otel_gpu.testing.fake_nvml import Scenario, ScenarioError, install
from otel_gpu.testing.otlp_receiver import OtlpReceiver

# Derandomized so that CI sees the same examples every run; a bigger random search is one
# environment variable away: HYPOTHESIS_FUZZ_EXAMPLES=5000 (and it is how "~0" was found).
FUZZ = settings(
    max_examples=int(os.environ.get("HYPOTHESIS_FUZZ_EXAMPLES", "150")),
    derandomize="HYPOTHESIS_FUZZ_EXAMPLES" not in os.environ,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra)
    return env


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# -- the Collector down at start, down mid-run, flapping -----------------------------------------


def test_collector_flapping_agent_stays_up_memory_bounded_data_resumes() -> None:
    with OtlpReceiver() as rx:
        rx.fail_with("UNAVAILABLE")  # down at start
        env = _clean_env(
            **rx.exporter_env("grpc"),
            OTEL_GPU_INTERVAL="0.3",
            OTEL_EXPORTER_OTLP_TIMEOUT="1",
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "otel_gpu", "run", "--backend", "simulated:count=8"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            time.sleep(2.0)
            assert proc.poll() is None, "agent died while the Collector was down"
            rss_start = _rss_kib(proc.pid)
            for _ in range(4):  # flapping: up 1 s, down 1 s
                rx.succeed()
                assert rx.wait_for(lambda r: r.metrics_requests, timeout=10.0)
                time.sleep(1.0)
                rx.fail_with("UNAVAILABLE")
                time.sleep(1.0)
                assert proc.poll() is None
            rss_end = _rss_kib(proc.pid)
            rx.succeed()
            rx.clear()
            assert rx.wait_for(lambda r: r.metrics_requests, timeout=10.0), "no recovery"
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=15)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    growth_mib = (rss_end - rss_start) / 1024
    print(f"RSS {rss_start / 1024:.1f} MiB -> {rss_end / 1024:.1f} MiB over the flapping")
    assert growth_mib < 30, "memory grew while the Collector flapped"


# -- the driver answering errors repeatedly ------------------------------------------------------


def test_nvml_unknown_and_timeout_repeatedly_degrade_one_gpu_and_spare_the_rest() -> None:
    with install("h100-sxm-8-nvswitch") as fake:
        manager = DeviceManager([NvmlBackend()])
        manager.open()
        ids = [d.id for d in manager.inventory.devices]
        events: list[HealthEvent] = []
        monitor = HealthMonitor(emit=events.append)
        fake.fail("nvmlDeviceGetUtilizationRates", "UNKNOWN", gpu=2)
        fake.fail("nvmlDeviceGetTemperature", "TIMEOUT", gpu=5)
        for _ in range(4):
            snap = manager.sample()
            monitor.process(manager.inventory, snap)
            assert {s.device_id for s in snap.samples} == set(ids) - {ids[2], ids[5]}
        degraded = {e.device_id for e in events if e.name == "accel.telemetry.degraded"}
        assert degraded == {ids[2], ids[5]}
        fake.clear_faults()
        snap = manager.sample()
        monitor.process(manager.inventory, snap)
        assert len(snap.samples) == 8
        assert {e.device_id for e in events if e.name == "accel.device.recovered"} == {
            ids[2],
            ids[5],
        }
        manager.close()


# -- signals during export -------------------------------------------------------------------------


def test_sigterm_while_the_exporter_retries_exits_0_promptly() -> None:
    with OtlpReceiver() as rx:
        rx.fail_with("UNAVAILABLE")  # every export is retried with backoff
        env = _clean_env(**rx.exporter_env("grpc"), OTEL_GPU_INTERVAL="0.5")
        for sig in (signal.SIGTERM, signal.SIGINT):
            before = rx.refused
            proc = subprocess.Popen(
                [sys.executable, "-m", "otel_gpu", "run", "--backend", "simulated:count=2"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            try:
                # This agent is exporting (and being refused) now.
                assert rx.wait_for(lambda r, n=before: r.refused >= n + 2, timeout=20.0)
                sent = time.monotonic()
                proc.send_signal(sig)
                _, err = proc.communicate(timeout=20)
                elapsed = time.monotonic() - sent
            finally:
                proc.kill()
            assert proc.returncode == 0, err
            assert "Traceback" not in err
            print(f"{sig.name} during a retried export: exit 0 after {elapsed:.2f}s")
            # The 5 s budget is a functional limit (DESIGN §10), checked generously here.
            assert elapsed < 10


# -- malformed input, fuzzed ----------------------------------------------------------------------


@FUZZ
@given(st.text(max_size=80))
@example("~0")  # a home directory of no user: found by this test
@example("./missing.json")
def test_fuzz_simulated_specs(text: str) -> None:
    try:
        parse_spec(text)
    except ConfigError as err:
        assert "\n" not in str(err)


@FUZZ
@given(
    st.sampled_from([v.name for v in ENV_VARS]),
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        max_size=40,
    ),
)
def test_fuzz_every_otel_gpu_variable(name: str, value: str) -> None:
    try:
        Settings.from_env({name: value}, standard=False)
    except ConfigError as err:
        assert name in str(err)
        assert "\n" not in str(err)


@FUZZ
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-5, 10**6)
        | st.floats(allow_nan=True)
        | st.text(max_size=12),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "count",
                        "template",
                        "gpus",
                        "name",
                        "uuid",
                        "pci_bus_id",
                        "memory_total_mib",
                        "events",
                        "faults",
                        "nvlink_remote",
                        "mig_devices",
                        "driver_version",
                        "missing_functions",
                    ]
                ),
                children,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_fuzz_fake_nvml_scenarios(data: object) -> None:
    # A malformed scenario is a ScenarioError (one line), never another exception.
    with contextlib.suppress(ScenarioError):
        Scenario.from_dict(data)  # type: ignore[arg-type]


@settings(
    max_examples=int(os.environ.get("HYPOTHESIS_CLI_EXAMPLES", "25")),
    deadline=None,
    derandomize="HYPOTHESIS_CLI_EXAMPLES" not in os.environ,
)
@given(
    st.sampled_from(["inventory", "health", "backends", "run"]),
    st.lists(
        st.sampled_from(
            [
                "--backend",
                "--devices",
                "--interval",
                "--format",
                "--expect-devices",
                "--json",
                "--once",
                "--exporter",
                "simulated",
                "simulated:count=2",
                "nvml",
                "0,1",
                "-1",
                "x",
                "",
                "nagios",
                "0.1",
                "none",
                "--bogus",
            ]
        ),
        max_size=5,
    ),
)
def test_fuzz_cli_arguments(command: str, args: list[str]) -> None:
    argv = [command, *args]
    if command == "run":
        argv += ["--once", "--exporter", "none"]  # never a daemon in a fuzz loop
    result = subprocess.run(
        [sys.executable, "-m", "otel_gpu", *argv],
        capture_output=True,
        text=True,
        env=_clean_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode in (0, 1, 2, 3), (argv, result.stderr)
    assert "Traceback" not in result.stderr, argv
    if result.returncode not in (0,) and command != "health":
        assert len(result.stderr.strip().splitlines()) == 1, (argv, result.stderr)


def test_corrupt_spec_and_scenario_files_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "node.json"
    bad.write_bytes(b"\xff\xfe{not json")
    result = subprocess.run(
        [sys.executable, "-m", "otel_gpu", "inventory", "--backend", f"simulated:{bad}"],
        capture_output=True,
        text=True,
        env=_clean_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and str(bad) in result.stderr
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"count": "many"}))
    result = subprocess.run(
        [sys.executable, "-m", "otel_gpu.testing.fake_cli", str(scenario), "inventory"],
        capture_output=True,
        text=True,
        env=_clean_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
