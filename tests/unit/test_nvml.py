"""The NVML backend over the fake NVML beneath pynvml: pynvml's own ctypes code runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_gpu.backends.nvml import NvmlBackend, cpu_list, cuda_version
from otel_gpu.errors import BackendUnavailable
from otel_gpu.hal import DeviceManager, HealthEvent, HealthState, Severity, interconnect_domains
from otel_gpu.health import HealthMonitor
from otel_gpu.testing.fake_nvml import FakeNvml, builtin_scenarios, install, load_scenario


@pytest.fixture
def h100() -> Iterator[tuple[FakeNvml, NvmlBackend]]:
    with install("h100-sxm-8-nvswitch") as fake:
        backend = NvmlBackend()
        backend.open()
        yield fake, backend
        backend.close()


def test_helpers() -> None:
    assert cuda_version(12040) == "12.4"
    assert cuda_version(11080) == "11.8"
    assert cpu_list([0xFF]) == "0-7"
    assert cpu_list([0b1011]) == "0-1,3"
    assert cpu_list([0, 1]) == "64"
    assert cpu_list([0]) == ""


@pytest.mark.parametrize("scenario", builtin_scenarios())
def test_every_scenario_opens_and_sweeps(scenario: str) -> None:
    with install(scenario) as fake:
        backend = NvmlBackend()
        assert backend.probe().available
        backend.open()
        inv = backend.inventory()
        spec = load_scenario(scenario)
        physical = [d for d in inv.devices if d.parent_id is None]
        assert len(physical) == len(spec.gpus)
        snap = backend.sample()
        assert {s.device_id for s in snap.samples} | {f.device_id for f in snap.failures} == {
            d.id for d in inv.devices
        }
        backend.close()
        assert fake.init_count == 0  # nvmlShutdown balanced every nvmlInit


def test_h100_inventory_and_nvswitch_domain(h100: tuple[FakeNvml, NvmlBackend]) -> None:
    _, backend = h100
    inv = backend.inventory()
    assert len(inv.devices) == 8
    assert inv.versions["cuda"] == "12.4"
    assert inv.versions["nvidia.driver"] == "550.90.07"
    d0 = inv.devices[0]
    assert d0.model == "NVIDIA H100 80GB HBM3"
    assert d0.id.startswith("GPU-")
    assert d0.pci_bus_id == "0000:18:00.0"
    assert d0.compute_capability == "9.0"
    assert d0.memory_total_bytes and d0.memory_total_bytes > 79 * 2**30
    assert d0.power_limit_max_w == 700.0
    assert len(d0.links) == 18
    assert {link.remote_kind for link in d0.links} == {"switch"}
    assert len({link.remote_id for link in d0.links}) == 4  # four NVSwitches
    assert interconnect_domains(inv.devices) == [list(range(8))]
    assert [d.numa_node for d in inv.devices] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_h100_sweep_values_and_units(h100: tuple[FakeNvml, NvmlBackend]) -> None:
    fake, backend = h100
    first = backend.sample().by_id()
    fake.advance(10.0)
    second = backend.sample().by_id()
    gpu0 = backend.inventory().devices[0].id
    a, b = first[gpu0], second[gpu0]
    assert b.power_w is not None and 50 < b.power_w <= 700
    assert a.energy_j is not None and b.energy_j is not None and b.energy_j > a.energy_j
    assert b.utilization_ratio is not None and 0 <= b.utilization_ratio <= 1
    assert b.memory_used_bytes is not None and b.memory_total_bytes is not None
    assert b.memory_used_bytes < b.memory_total_bytes
    assert b.temperatures_c["gpu"] > 0 and "memory" in b.temperatures_c
    assert b.clocks_hz["graphics"] > 1e9
    assert b.power_limit_w == 700.0
    assert len(b.links) == 18 and all(link.up for link in b.links)
    assert b.links[0].tx_bytes is not None and a.links[0].tx_bytes is not None
    assert b.links[0].tx_bytes > a.links[0].tx_bytes
    assert b.pcie_tx_bytes is not None and a.pcie_tx_bytes is not None
    assert b.pcie_tx_bytes > a.pcie_tx_bytes
    assert b.throttle_reasons == frozenset()
    # GPU 5 of the scenario carries ECC and NVLink CRC errors.
    gpu5 = second[backend.inventory().devices[5].id]
    assert gpu5.ecc_corrected_total and gpu5.ecc_corrected_total > 0
    assert any(link.errors.get("crc", 0) > 0 for link in gpu5.links)


def test_h100_calls_per_device_per_sweep(h100: tuple[FakeNvml, NvmlBackend]) -> None:
    fake, backend = h100
    backend.sample()  # first sweep reads the slow path too
    fake.reset_calls()
    sweeps = 12
    for _ in range(sweeps):
        fake.advance(10.0)
        backend.sample()
    per_device = sum(fake.calls.values()) / sweeps / 8
    # One batched field-value call per device per sweep carries every field and link counter.
    assert fake.calls["nvmlDeviceGetFieldValues"] == sweeps * 8
    assert per_device <= 6.0, dict(fake.calls)
    print(f"H100 scenario: {per_device:.2f} NVML calls per device per sweep: {dict(fake.calls)}")


def test_a100_mesh_has_two_domains() -> None:
    with install("a100-8-nvlink-mesh"):
        backend = NvmlBackend()
        backend.open()
        inv = backend.inventory()
        assert interconnect_domains(inv.devices) == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert {link.remote_kind for d in inv.devices for link in d.links} == {"gpu"}
        backend.close()


def test_l40s_has_no_nvlink_and_gpu2_throttles_thermally() -> None:
    with install("l40s-4-pcie") as fake:
        backend = NvmlBackend()
        backend.open()
        inv = backend.inventory()
        assert all(d.links == () for d in inv.devices)
        assert interconnect_domains(inv.devices) == []
        backend.sample()
        fake.advance(10.0)
        by_id = backend.sample().by_id()
        reasons = [by_id[d.id].throttle_reasons for d in inv.devices]
        assert reasons[2] and "sw_thermal" in reasons[2]
        assert reasons[0] == frozenset()
        assert "memory" not in by_id[inv.devices[0].id].temperatures_c
        backend.close()


def test_mig_children() -> None:
    with install("a100-mig"):
        backend = NvmlBackend()
        backend.open()
        inv = backend.inventory()
        parent, *children = inv.devices
        assert parent.mig_mode is True
        assert len(children) == 3
        assert all(c.parent_id == parent.id and c.id.startswith("MIG-") for c in children)
        assert [c.extra["mig.gpu_instance_id"] for c in children] == ["2", "3", "9"]
        migs = load_scenario("a100-mig").gpus[0].mig_devices
        assert [c.memory_total_bytes for c in children] == [
            m.memory_total_mib * 2**20 for m in migs
        ]
        assert [c.model.rsplit(" ", 1)[-1] for c in children] == [m.profile for m in migs]
        by_id = backend.sample().by_id()
        assert all(by_id[c.id].memory_used_bytes is not None for c in children)
        backend.close()


def test_old_driver_missing_functions_are_asked_once() -> None:
    with install("old-driver") as fake:
        backend = NvmlBackend()
        backend.open()
        for _ in range(4):
            fake.advance(10.0)
            snap = backend.sample()
        missing = set(load_scenario("old-driver").missing_functions)
        asked = {name: fake.lookups[name] for name in missing if fake.lookups[name]}
        # pynvml caches a function pointer; our layer caches FunctionNotFound per device.
        assert all(count <= len(backend.inventory().devices) for count in asked.values()), asked
        s = snap.samples[0]
        assert s.power_w is not None  # from nvmlDeviceGetPowerUsage, the field is missing
        assert s.memory_total_bytes is not None  # v1 memory info
        backend.close()


def test_mixed_bus_id_formats_are_one_form_and_peers_match() -> None:
    with install("mixed-busid"):
        backend = NvmlBackend()
        backend.open()
        inv = backend.inventory()
        assert [d.pci_bus_id for d in inv.devices] == [
            "0000:1b:00.0",
            "0000:3b:00.0",
            "0000:86:00.0",
            "0001:af:00.0",
        ]
        assert interconnect_domains(inv.devices) == [[0, 1], [2, 3]]
        backend.close()


def test_lost_gpu_is_reported_others_go_on_and_it_comes_back() -> None:
    now = [0.0]
    with install("gpu-lost") as fake:
        backend = NvmlBackend(clock=lambda: now[0])
        manager = DeviceManager([backend])
        events: list[HealthEvent] = []
        monitor = HealthMonitor(emit=events.append)
        manager.open()
        gpu0, gpu1 = (d.id for d in manager.inventory.devices)
        seen_lost = False
        for _ in range(10):
            snap = manager.sample()
            monitor.process(manager.inventory, snap)
            assert gpu0 in snap.by_id()  # the healthy GPU always reports
            if any(f.device_id == gpu1 and f.lost for f in snap.failures):
                seen_lost = True
                break
            now[0] += 10
        assert seen_lost
        assert [e.name for e in events] == ["accel.device.lost"]
        assert monitor.state(gpu1) is HealthState.FAILED
        # While lost, the GPU is not asked every sweep: it is retried with backoff.
        fake.reset_calls()
        manager.sample()
        assert fake.calls["nvmlDeviceGetHandleByUUID"] == 0
        fake.recover_gpu(1)
        now[0] += 400
        snap = manager.sample()
        monitor.process(manager.inventory, snap)
        assert gpu1 in snap.by_id()
        assert events[-1].name == "accel.device.recovered"
        manager.close()


@pytest.mark.parametrize(
    ("error", "fragment"),
    [
        ("LIBRARY_NOT_FOUND", "libnvidia-ml.so.1 not found"),
        ("DRIVER_NOT_LOADED", "kernel driver is not loaded"),
        ("NO_PERMISSION", "no permission"),
    ],
)
def test_init_errors_name_what_to_install(error: str, fragment: str) -> None:
    scenario = json.loads(
        (Path(__file__).parents[2] / "otel_gpu/testing/scenarios/nvml/l40s-4-pcie.json").read_text()
    )
    scenario["init_error"] = error
    with install(scenario):
        probe = NvmlBackend().probe()
        assert not probe.available and fragment in probe.reason
        with pytest.raises(BackendUnavailable, match=fragment):
            NvmlBackend().open()


def test_xid_events_arrive_classified_from_the_event_thread() -> None:
    start = time.monotonic()
    with install("xid-events", timer=lambda: time.monotonic() - start) as fake:
        got: list[HealthEvent] = []
        arrived = threading.Event()
        monitor = HealthMonitor()

        def sink(event: HealthEvent) -> None:
            got.append(event)
            if sum(e.name == "nvidia.xid" for e in got) == 3:
                arrived.set()

        monitor.set_emitter(sink)
        backend = NvmlBackend()
        manager = DeviceManager([backend])
        manager.open()
        manager.start_events(monitor.record_event)
        assert arrived.wait(10), got
        xids = {int(e.attributes["nvidia.xid.code"]): e for e in got if e.name == "nvidia.xid"}
        assert set(xids) == {13, 48, 79}
        assert xids[79].severity is Severity.FATAL and xids[79].state is HealthState.FAILED
        assert xids[48].severity is Severity.FATAL
        assert xids[13].severity is Severity.INFO and xids[13].state is HealthState.OK
        gpu1 = manager.inventory.devices[1].id
        assert xids[79].device_id == gpu1
        assert any(e.name == "accel.memory.ecc.uncorrectable" for e in got)  # the DBE event
        assert monitor.state(gpu1) is HealthState.FAILED
        manager.close()
        assert fake.calls["nvmlEventSetFree"] == 1


# -- through the command line ------------------------------------------------------------------


def fake_cli(
    scenario: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "otel_gpu.testing.fake_cli", scenario, *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
        check=False,
    )


def test_cli_inventory_json_shows_the_nvswitch_domain() -> None:
    result = fake_cli("h100-sxm-8-nvswitch", "inventory", "--json", "--backend", "nvml")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["interconnect_domains"] == [list(range(8))]
    assert doc["resource"]["accel.interconnect.domains"] == ["0,1,2,3,4,5,6,7"]
    assert {link["remote_kind"] for link in doc["devices"][0]["links"]} == {"switch"}


def test_cli_inventory_json_shows_mig_children() -> None:
    result = fake_cli("a100-mig", "inventory", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    parent = doc["devices"][0]
    assert len(parent["children"]) == 3
    assert [d["parent_id"] for d in doc["devices"][1:]] == [parent["id"]] * 3


def _docs(stdout: str) -> list[dict[str, Any]]:
    decoder, docs, i = json.JSONDecoder(), [], 0
    while i < len(stdout):
        if stdout[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(stdout, i)
        docs.append(doc)
    return docs


def test_cli_run_once_exports_the_nvml_metrics() -> None:
    result = fake_cli("h100-sxm-8-nvswitch", "run", "--once", "--exporter", "console")
    assert result.returncode == 0, result.stderr
    metrics_doc = next(d for d in _docs(result.stdout) if "resource_metrics" in d)
    rm = metrics_doc["resource_metrics"][0]
    metrics = {m["name"]: m for sm in rm["scope_metrics"] for m in sm["metrics"]}
    for name in (
        "hw.gpu.utilization",
        "hw.gpu.memory.usage",
        "hw.power",
        "hw.energy",
        "hw.temperature",
        "hw.errors",
        "accel.interconnect.io",
        "hw.status",
    ):
        assert name in metrics, name
    links = {
        (p["attributes"]["hw.name"], p["attributes"]["accel.link.index"])
        for p in metrics["accel.interconnect.io"]["data"]["data_points"]
    }
    assert len(links) == 8 * 18
    assert rm["resource"]["attributes"]["accel.cuda.version"] == "12.4"


def test_cli_lost_gpu_yields_the_event_and_the_others_report() -> None:
    result = fake_cli("gpu-lost", "run", "--once", "--exporter", "console")
    assert result.returncode == 0, result.stderr
    docs = _docs(result.stdout)
    # 20 calls into GPU 1 are spent by the inventory: it is lost at the first sweep.
    lost = [d for d in docs if d.get("event_name") == "accel.device.lost"]
    assert len(lost) == 1 and lost[0]["attributes"]["hw.name"] == "gpu1"
    metrics_doc = next(d for d in docs if "resource_metrics" in d)
    metrics = {
        m["name"]: m
        for sm in metrics_doc["resource_metrics"][0]["scope_metrics"]
        for m in sm["metrics"]
    }
    power = {p["attributes"]["hw.name"] for p in metrics["hw.power"]["data"]["data_points"]}
    assert power == {"gpu0"}


@pytest.mark.parametrize(("code", "expected_rc"), [(79, 2), (13, 0)])
def test_cli_health_xid_classes(tmp_path: Path, code: int, expected_rc: int) -> None:
    scenario = json.loads(
        (Path(__file__).parents[2] / "otel_gpu/testing/scenarios/nvml/l40s-4-pcie.json").read_text()
    )
    scenario["events"] = [{"after_s": 0.0, "gpu": 0, "type": "xid", "code": code}]
    scenario["gpus"] = [{"clock_event_reasons": 0}] * 4  # no thermal throttling here
    scenario.pop("overrides", None)
    path = tmp_path / "xid.json"
    path.write_text(json.dumps(scenario))
    # health waits for nothing: the event is delivered when the event thread starts.
    result = fake_cli(str(path), "health", "--format", "json")
    doc = json.loads(result.stdout)
    xids = [f for f in doc["findings"] if f["check"] == "nvidia.xid"]
    assert result.returncode == expected_rc, result.stdout + result.stderr
    if code == 79:
        assert xids and xids[0]["severity"] == "FATAL"
    else:
        assert doc["status"] == "OK"


def test_retired_pages_come_from_the_field_batch_and_reach_the_check() -> None:
    scenario = json.loads(
        (Path(__file__).parents[2] / "otel_gpu/testing/scenarios/nvml/old-driver.json").read_text()
    )
    scenario.setdefault("overrides", {})["0"] = {
        "retired_pages_dbe": list(range(4096, 4096 + 61)),
        "retired_pages_pending": True,
    }
    with install(scenario) as fake:
        backend = NvmlBackend()
        manager = DeviceManager([backend])
        manager.open()
        fake.reset_calls()
        snap = manager.sample()
        gpu0 = manager.inventory.devices[0].id
        s = snap.by_id()[gpu0]
        assert s.retired_rows["retired"] == 61 and s.retired_rows["pending"] == 1
        assert "nvmlDeviceGetRetiredPages" not in fake.calls  # read in the one batch
        events = HealthMonitor().process(manager.inventory, snap)
        assert {e.name for e in events if e.device_id == gpu0} >= {
            "accel.memory.retirement.limit",
            "accel.memory.retirement.pending",
        }
        manager.close()
