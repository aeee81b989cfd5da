"""A vendor call that hangs: the sweep has a deadline, the rest still goes out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from otel_gpu.backends.nvml import NvmlBackend
from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.hal import DeviceManager, HealthEvent
from otel_gpu.health import HealthMonitor
from otel_gpu.testing.fake_nvml import install


def test_a_hung_nvml_call_holds_only_its_device_and_those_after_it() -> None:
    with install("h100-sxm-8-nvswitch") as fake:
        manager = DeviceManager([NvmlBackend()], sweep_timeout_s=0.5)
        manager.open()
        ids = [d.id for d in manager.inventory.devices]
        release = fake.hang("nvmlDeviceGetUtilizationRates", gpu=3, seconds=20)
        events: list[HealthEvent] = []
        monitor = HealthMonitor(emit=events.append)
        snap = manager.sample()
        monitor.process(manager.inventory, snap)
        # GPUs 0-2 were read before the hung call: their data goes out.
        assert [s.device_id for s in snap.samples] == ids[:3]
        assert {f.device_id for f in snap.failures} == set(ids[3:])
        assert all(f.stuck and not f.lost and "stuck" in f.reason for f in snap.failures)
        degraded = [e for e in events if e.name == "accel.telemetry.degraded"]
        assert {e.device_id for e in degraded} == set(ids[3:])
        # Still stuck: the next sweep does not wait for it again and does not pile up calls.
        fake.reset_calls()
        started = time.monotonic()
        again = manager.sample()
        waited = time.monotonic() - started
        assert again.samples == () and len(again.failures) == 8
        assert sum(fake.calls.values()) == 0
        print(f"second sweep returned after {waited * 1000:.1f} ms while the call was stuck")
        # The call returns: the backend sweeps again.
        release.set()
        for _ in range(50):
            snap = manager.sample()
            if len(snap.samples) == 8:
                break
            time.sleep(0.05)
        assert [s.device_id for s in snap.samples] == ids
        manager.close()


def test_a_hung_backend_does_not_hold_another_vendor() -> None:
    hung = SimulatedBackend("count=2,faults=hang@0:0")
    other = SimulatedBackend("count=3,vendor=amd,seed=1")
    manager = DeviceManager([hung, other], sweep_timeout_s=0.3)
    manager.open()
    snap = manager.sample()
    amd = [d.id for d in manager.inventory.devices if d.vendor == "amd"]
    assert sorted(s.device_id for s in snap.samples) == sorted(amd)
    assert len(snap.failures) == 2
    manager.close()  # releases the simulated hang


def test_cli_run_once_with_a_hung_device_exports_the_others_and_the_event() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_gpu",
            "run",
            "--backend",
            "simulated:count=4,faults=hang@2:0",
            "--once",
            "--exporter",
            "console",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    decoder, docs, i, out = json.JSONDecoder(), [], 0, result.stdout
    while i < len(out):
        if out[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(out, i)
        docs.append(doc)
    degraded = [d for d in docs if d.get("event_name") == "accel.telemetry.degraded"]
    assert {d["attributes"]["hw.name"] for d in degraded} == {"gpu2", "gpu3"}
    metrics = next(d for d in docs if "resource_metrics" in d)
    power = [
        p["attributes"]["hw.name"]
        for sm in metrics["resource_metrics"][0]["scope_metrics"]
        for m in sm["metrics"]
        if m["name"] == "hw.power"
        for p in m["data"]["data_points"]
    ]
    assert sorted(power) == ["gpu0", "gpu1"]
