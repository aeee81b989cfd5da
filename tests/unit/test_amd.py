"""The AMD backend over the fake ``amdsmi`` (the real backend code runs above it)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.backends.amd import AmdBackend, pcie_generation
from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.errors import BackendUnavailable
from otel_gpu.hal import DeviceManager, HealthEvent, HealthState, Severity, interconnect_domains
from otel_gpu.hal.model import DeviceSample, Snapshot
from otel_gpu.health import HealthMonitor
from otel_gpu.otel import GpuTelemetry
from otel_gpu.testing.fake_amdsmi import FakeAmdSmi, builtin_scenarios, install, load_scenario

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
UNAVAILABLE = ("amd-missing-library", "amd-no-package", "amd-driver-not-loaded")


@pytest.fixture
def mi300x() -> Iterator[tuple[FakeAmdSmi, AmdBackend]]:
    with install("amd-mi300x-8") as fake:
        backend = AmdBackend()
        backend.open()
        yield fake, backend
        backend.close()


def _numbers(sample: DeviceSample) -> list[float]:
    """Every number a sample carries (to check that none is NaN)."""
    out: list[float] = []
    for name in sample.__dataclass_fields__:
        value = getattr(sample, name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(float(value))
        elif hasattr(value, "values"):
            out.extend(float(v) for v in value.values())
    for link in sample.links:
        out.extend(float(v) for v in (link.tx_bytes, link.rx_bytes) if v is not None)
    return out


# -- probe ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "fragment"),
    [
        ("amd-missing-library", "libamd_smi.so not found: install ROCm's amd-smi-lib"),
        ("amd-no-package", "pip install 'otel-gpu[amd]'"),
        ("amd-driver-not-loaded", "amdgpu kernel driver is not loaded"),
    ],
)
def test_unavailable_amdsmi_says_what_to_install(scenario: str, fragment: str) -> None:
    with install(scenario):
        probe = AmdBackend().probe()  # never raises
        assert not probe.available and fragment in probe.reason
        with pytest.raises(BackendUnavailable, match=re.escape(fragment)):
            AmdBackend().open()


def test_missing_library_fails_the_import_with_keyerror_like_the_real_package() -> None:
    with install("amd-missing-library"), pytest.raises(KeyError, match=r"libamd_smi\.so"):
        import amdsmi  # noqa: F401


@pytest.mark.parametrize("scenario", [s for s in builtin_scenarios() if s not in UNAVAILABLE])
def test_every_scenario_opens_sweeps_and_shuts_down(scenario: str) -> None:
    with install(scenario) as fake:
        backend = AmdBackend()
        assert backend.probe().available
        assert fake.init_count == 0  # the probe's amdsmi_init was balanced
        backend.open()
        inv = backend.inventory()
        fake.advance(10.0)
        snap = backend.sample()
        assert {s.device_id for s in snap.samples} | {f.device_id for f in snap.failures} == {
            d.id for d in inv.devices
        }
        for sample in snap.samples:
            assert not any(math.isnan(v) for v in _numbers(sample)), sample
        backend.close()
        assert fake.init_count == 0


# -- inventory ------------------------------------------------------------------------------------


def test_mi300x_inventory_ids_bus_ids_numa_and_one_xgmi_domain(
    mi300x: tuple[FakeAmdSmi, AmdBackend],
) -> None:
    _, backend = mi300x
    inv = backend.inventory()
    spec = load_scenario("amd-mi300x-8")
    assert len(inv.devices) == 8
    assert inv.versions == {"amd.driver": "6.8.5", "rocm": "6.4.1"}
    assert [d.id for d in inv.devices] == [g.uuid for g in spec.gpus]
    assert all(BDF.match(d.pci_bus_id or "") for d in inv.devices)
    assert inv.devices[0].pci_bus_id == "0000:05:00.0"
    assert [d.numa_node for d in inv.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    d0 = inv.devices[0]
    assert d0.vendor == "amd" and d0.model == "AMD Instinct MI300X" and d0.kind == "gpu"
    assert d0.compute_capability == "gfx942"
    assert d0.firmware_version == "022.040.003.043.000001"
    assert d0.memory_total_bytes == 206_141_652_992
    assert d0.power_limit_default_w == 750.0 and d0.power_limit_max_w == 750.0
    assert (d0.pcie_max_generation, d0.pcie_max_width) == (5, 16)
    assert d0.extra["amd.compute_partition"] == "SPX"
    assert len(d0.links) == 7
    assert {link.link_type for link in d0.links} == {"xgmi"}
    assert {link.remote_kind for link in d0.links} == {"gpu"}
    assert sorted(link.remote_device_index or -1 for link in d0.links) == [1, 2, 3, 4, 5, 6, 7]
    assert interconnect_domains(inv.devices) == [list(range(8))]


def test_numa_and_cpu_list_come_from_sysfs_first(tmp_path: Path) -> None:
    dev = tmp_path / "sys/bus/pci/devices/0000:05:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("3\n")
    (dev / "local_cpulist").write_text("0-47,96-143\n")
    with install("amd-mi300x-8"):
        backend = AmdBackend(sysfs_root=tmp_path)
        backend.open()
        d0, d1 = backend.inventory().devices[:2]
        assert (d0.numa_node, d0.cpu_affinity) == (3, "0-47,96-143")
        assert (d1.numa_node, d1.cpu_affinity) == (0, None)  # amdsmi's answer, no sysfs file
        backend.close()


def test_pcie_generation_from_tenths_of_gts() -> None:
    assert [pcie_generation(s) for s in (25, 50, 80, 160, 320, 640)] == [1, 2, 3, 4, 5, 6]
    assert pcie_generation(7) is None


# -- sampling -------------------------------------------------------------------------------------


def test_mi300x_sample_values_and_units(mi300x: tuple[FakeAmdSmi, AmdBackend]) -> None:
    fake, backend = mi300x
    first = backend.sample().by_id()
    fake.advance(10.0)
    second = backend.sample().by_id()
    ids = [d.id for d in backend.inventory().devices]
    a, b = first[ids[0]], second[ids[0]]
    assert b.utilization_ratio is not None and 0.0 <= b.utilization_ratio <= 1.0
    assert b.memory_bandwidth_utilization_ratio == pytest.approx(0.38)
    assert b.power_w is not None and 380 <= b.power_w <= 460  # W, not mW or µW
    assert a.energy_j is not None and b.energy_j is not None
    assert b.energy_j - a.energy_j == pytest.approx(420 * 10.0, rel=0.01)  # J over 10 s
    assert b.memory_used_bytes == 60_129_542_144 and b.memory_total_bytes == 206_141_652_992
    assert set(b.temperatures_c) == {"hotspot", "memory"}  # MI300X: no edge sensor
    assert 40 < b.temperatures_c["hotspot"] < 110
    assert b.clocks_hz["graphics"] > 2.0e9 and b.clocks_hz["memory"] == 1.3e9
    assert (b.pcie_generation, b.pcie_width, b.pcie_replay_total) == (5, 16, 0)
    assert b.pcie_tx_bytes is None and b.pcie_rx_bytes is None  # no directional PCIe bytes
    assert b.ecc_corrected_total == 0 and b.ecc_uncorrected_total == 0
    assert b.power_limit_w == 750.0
    assert b.throttle_reasons == frozenset()
    assert set(b.engines) == {"gfx", "mm"}
    assert len(b.links) == 7 and all(link.up for link in b.links)
    assert all(
        lb.tx_bytes and la.tx_bytes and lb.tx_bytes > la.tx_bytes
        for la, lb in zip(a.links, b.links, strict=True)
    )
    assert all(lb.rx_bytes and lb.rx_bytes % 1024 == 0 for lb in b.links)  # KB -> bytes
    # GPU 2: corrected ECC and one retired page; GPU 6: held by its power cap (PPT).
    assert second[ids[2]].ecc_corrected_total == 14
    assert dict(second[ids[2]].retired_rows) == {"remapped": 1, "pending": 0, "failed": 0}
    assert second[ids[6]].throttle_reasons == frozenset({"power"})
    for sample in second.values():
        assert not any(math.isnan(v) for v in _numbers(sample))


def test_one_batched_metrics_call_per_device_per_sweep(
    mi300x: tuple[FakeAmdSmi, AmdBackend],
) -> None:
    fake, backend = mi300x
    backend.sample()  # the first sweep reads the slow path too
    fake.reset_calls()
    sweeps = 12
    for _ in range(sweeps):
        fake.advance(10.0)
        backend.sample()
    per_device = sum(fake.calls.values()) / sweeps / 8
    assert fake.calls["amdsmi_get_gpu_metrics_info"] == sweeps * 8
    assert per_device <= 3.5, dict(fake.calls)
    print(f"MI300X: {per_device:.2f} amdsmi calls per device per sweep: {dict(fake.calls)}")


def test_processes_are_read_only_when_enabled(mi300x: tuple[FakeAmdSmi, AmdBackend]) -> None:
    fake, backend = mi300x
    assert backend.sample().samples[0].processes is None
    assert fake.calls["amdsmi_get_gpu_process_list"] == 0
    fresh = AmdBackend(slow_every=1)
    fresh.enable("processes")
    fresh.open()
    proc = fresh.sample().samples[0].processes
    assert proc is not None and proc[0].pid == 41000 and proc[0].name == "python3"
    assert proc[0].memory_used_bytes == 58_000_000_000
    fresh.close()


def test_unsupported_is_none_and_asked_once() -> None:
    with install("amd-radeon-w7900") as fake:
        backend = AmdBackend(slow_every=1)  # the slow path every sweep: still asked once
        backend.open()
        for _ in range(5):
            fake.advance(10.0)
            s = backend.sample().samples[0]
        for function in (
            "amdsmi_get_gpu_metrics_info",
            "amdsmi_get_gpu_total_ecc_count",
            "amdsmi_get_gpu_bad_page_info",
        ):
            assert fake.calls[function] == 1, function
        assert "amdsmi_get_link_metrics" not in fake.calls  # not in this amdsmi: never called
        # Not supported is None (never 0); the one-value calls stand in for gpu_metrics.
        assert s.ecc_uncorrected_total is None and s.ecc_corrected_total is None
        assert s.energy_j is None and s.throttle_reasons is None and s.pcie_width is None
        assert dict(s.retired_rows) == {}
        assert s.power_w == pytest.approx(61.0, abs=16.0)  # W, with the fake's jitter
        assert s.temperatures_c["gpu"] == 41.0  # Radeon parts have an edge sensor
        assert s.utilization_ratio is not None and 0 <= s.utilization_ratio <= 1
        assert backend.inventory().devices[0].numa_node is None  # amdsmi's -1
        assert interconnect_domains(backend.inventory().devices) == []
        backend.close()


# -- faults ---------------------------------------------------------------------------------------


def test_a_device_that_fails_every_call_is_isolated() -> None:
    with install("amd-mi300x-faulty") as fake:
        backend = AmdBackend()
        manager = DeviceManager([backend])
        events: list[HealthEvent] = []
        monitor = HealthMonitor(emit=events.append)
        inv = manager.open()
        assert len(inv.devices) == 8
        broken = inv.devices[5]
        assert broken.model.startswith("unknown") and broken.id == "amd-gpu-5"
        for _ in range(3):
            fake.advance(10.0)
            snap = manager.sample()
            monitor.process(inv, snap)
            assert len(snap.samples) == 7
            assert [(f.device_id, f.lost) for f in snap.failures] == [(broken.id, False)]
        assert "AMDSMI_STATUS_IO" in snap.failures[0].reason
        # GPU 6 is held by its power cap (an INFO event); GPU 5 is unreadable for 3 sweeps.
        assert [e.name for e in events if e.device_id != inv.devices[6].id] == [
            "accel.telemetry.degraded"
        ]
        assert monitor.state(inv.devices[0].id) is HealthState.OK
        # The seven healthy GPUs still form one xGMI domain (the broken one has no known links).
        assert interconnect_domains(inv.devices) == [[0, 1, 2, 3, 4, 6, 7]]
        manager.close()
        assert fake.init_count == 0


def test_a_lost_gpu_is_reported_retried_with_backoff_and_comes_back() -> None:
    now = [0.0]
    with install("amd-mi300x-lost") as fake:
        backend = AmdBackend(clock=lambda: now[0])
        manager = DeviceManager([backend])
        events: list[HealthEvent] = []
        monitor = HealthMonitor(emit=events.append)
        inv = manager.open()
        gpu1 = inv.devices[1].id
        fake.advance(2.0)
        snap = manager.sample()
        monitor.process(inv, snap)
        assert [(f.device_id, f.lost) for f in snap.failures] == [(gpu1, True)]
        assert len(snap.samples) == 7
        assert [e.name for e in events if e.device_id != inv.devices[6].id] == ["accel.device.lost"]
        assert monitor.state(gpu1) is HealthState.FAILED
        fake.reset_calls()
        manager.sample()  # within the backoff: not asked
        assert fake.gpu_calls[1] == 0
        fake.recover_gpu(1)
        now[0] += 400
        snap = manager.sample()
        monitor.process(inv, snap)
        assert gpu1 in snap.by_id()
        assert events[-1].name == "accel.device.recovered"
        manager.close()


def test_amd_uncorrectable_ecc_fires_the_same_event_as_nvidia() -> None:
    with install("amd-mi300x-ecc") as fake:
        backend = AmdBackend()
        inv = backend.inventory()
        amd_events: list[HealthEvent] = []
        monitor = HealthMonitor(emit=amd_events.append)
        fake.advance(10.0)
        monitor.process(inv, backend.sample())
        backend.close()
    gpu3 = inv.devices[3].id
    by_name = {e.name: e for e in amd_events if e.device_id == gpu3}
    ecc = by_name["accel.memory.ecc.uncorrectable"]
    assert ecc.state is HealthState.FAILED and ecc.severity is Severity.ERROR
    assert ecc.attributes["error.count"] == 2
    assert "accel.memory.retirement.pending" in by_name  # the PENDING bad page
    assert monitor.state(gpu3) is HealthState.FAILED
    assert monitor.state(inv.devices[0].id) is HealthState.OK

    nvidia = SimulatedBackend("count=2,faults=ecc@1:0")
    nv_events: list[HealthEvent] = []
    nv_monitor = HealthMonitor(emit=nv_events.append)
    nvidia.open()
    nv_monitor.process(nvidia.inventory(), nvidia.sample())
    nv_ecc = next(e for e in nv_events if e.name == "accel.memory.ecc.uncorrectable")
    assert (nv_ecc.severity, nv_ecc.state) == (ecc.severity, ecc.state)
    assert set(nv_ecc.attributes) == set(ecc.attributes)
    nvidia.close()


# -- partitions -----------------------------------------------------------------------------------


def test_cpx_partitions_are_children_of_their_gpu() -> None:
    with install("amd-mi300x-cpx") as fake:
        backend = AmdBackend()
        backend.open()
        inv = backend.inventory()
        parents = [d for d in inv.devices if d.parent_id is None]
        children = [d for d in inv.devices if d.parent_id is not None]
        assert len(parents) == 2 and len(children) == 16
        assert [d.index for d in inv.devices] == list(range(18))
        for parent in parents:
            mine = [c for c in children if c.parent_id == parent.id]
            assert [c.extra["amd.partition_id"] for c in mine] == [str(p) for p in range(8)]
            assert len({c.id for c in mine} | {parent.id}) == 9  # unique ids
            assert all(c.pci_bus_id == parent.pci_bus_id == parent.pci_bus_id for c in mine)
            assert all(c.memory_total_bytes == 206_141_652_992 // 8 for c in mine)
            assert parent.memory_total_bytes == 8 * (206_141_652_992 // 8)
            assert parent.extra["amd.compute_partition"] == "CPX"
            assert all(c.links == () for c in mine)
        assert interconnect_domains(inv.devices) == [[0, 1]]
        fake.advance(10.0)
        by_id = backend.sample().by_id()
        child = by_id[children[0].id]
        assert child.utilization_ratio is not None and 0 < child.utilization_ratio <= 1
        assert child.memory_used_bytes == 60_129_542_144 // 8
        assert by_id[parents[0].id].memory_used_bytes == 8 * (60_129_542_144 // 8)
        assert by_id[parents[0].id].power_w is not None  # socket-wide readings on the parent
        backend.close()


# -- events ---------------------------------------------------------------------------------------


def test_driver_events_arrive_from_the_event_thread() -> None:
    start = time.monotonic()
    with install("amd-mi300x-events", timer=lambda: time.monotonic() - start) as fake:
        got: list[HealthEvent] = []
        arrived = threading.Event()
        monitor = HealthMonitor()

        def sink(event: HealthEvent) -> None:
            got.append(event)
            if len(got) >= 4:
                arrived.set()

        monitor.set_emitter(sink)
        manager = DeviceManager([AmdBackend()])
        inv = manager.open()
        manager.start_events(monitor.record_event)
        assert arrived.wait(10), got
        by_name: dict[str, list[HealthEvent]] = {}
        for event in got:
            by_name.setdefault(event.name, []).append(event)
        vm = by_name["amd.vm_fault"][0]
        assert vm.device_id == inv.devices[0].id and vm.severity is Severity.INFO
        assert "0x7f2a00000000" in vm.message
        thermal = by_name["accel.throttle.thermal"][0]
        assert thermal.device_id == inv.devices[4].id
        assert thermal.attributes["accel.throttle.reason"] == "thermal"
        resets = by_name["amd.gpu.reset"]
        assert [e.state for e in resets] == [HealthState.DEGRADED, HealthState.OK]
        assert {e.device_id for e in resets} == {inv.devices[7].id}
        assert monitor.state(inv.devices[4].id) is HealthState.DEGRADED
        manager.close()
        assert fake.calls["amdsmi_stop_gpu_event_notification"] == 8


# -- through OpenTelemetry -----------------------------------------------------------------------


def _collect(backends: list[Any], sweeps: int = 1) -> dict[str, list[dict[str, Any]]]:
    """Metric name -> the attributes of each point, through the real SDK."""
    reader = InMemoryMetricReader()
    manager = DeviceManager(backends)
    tel = GpuTelemetry(manager, MeterProvider(metric_readers=[reader]), interval_s=10.0)
    tel.start()
    try:
        data = None
        for _ in range(sweeps):
            tel.cache.invalidate()
            data = reader.get_metrics_data()
    finally:
        tel.shutdown()
    assert data is not None
    out: dict[str, list[dict[str, Any]]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = [dict(p.attributes or {}) for p in metric.data.data_points]
    return out


def _keys(points: list[dict[str, Any]]) -> set[frozenset[str]]:
    return {frozenset(p) for p in points}


# The metrics an NVIDIA node has and the AMD backend cannot supply (see the report).
AMD_CANNOT = {"hw.gpu.io", "accel.interconnect.errors"}


def test_otel_bridge_same_metric_names_and_attribute_keys_as_nvidia() -> None:
    with install("amd-mi300x-8"):
        amd = _collect([AmdBackend()], sweeps=2)
    nvidia = _collect([SimulatedBackend("count=8")], sweeps=2)
    assert amd["hw.power"] and len(amd["hw.power"]) == 8
    shared = set(amd) & set(nvidia)
    assert set(amd) - shared == {"accel.engine.utilization"}  # NVIDIA has no engine groups
    assert set(nvidia) - set(amd) == AMD_CANNOT
    for name in shared:
        assert _keys(amd[name]) <= _keys(nvidia[name]), name
    assert {p["hw.vendor"] for p in amd["hw.power"]} == {"amd"}
    links = {(p["hw.name"], p["accel.link.index"]) for p in amd["accel.interconnect.io"]}
    assert len(links) == 8 * 7
    assert {p["accel.link.type"] for p in amd["accel.interconnect.io"]} == {"xgmi"}
    tasks = {p["hw.gpu.task"] for p in amd["hw.gpu.utilization"]}
    assert tasks == {"general"}  # VCN is shared by encode and decode: engine "mm" instead
    assert {p["accel.engine"] for p in amd["accel.engine.utilization"]} == {"gfx", "mm"}


def test_a_node_with_two_vendors_reports_both() -> None:
    with install("amd-mi300x-8"):
        manager = DeviceManager([AmdBackend(), SimulatedBackend("count=4")])
        inv = manager.open()
        assert inv.vendors == ("amd", "nvidia")
        assert len(inv.devices) == 12
        assert interconnect_domains(inv.devices) == [list(range(8)), list(range(8, 12))]
        snap: Snapshot = manager.sample()
        assert {s.device_id for s in snap.samples} == {d.id for d in inv.devices}
        assert inv.versions["amd.driver"] == "6.8.5" and "cuda" in inv.versions
        manager.close()


def test_amd_and_nvml_fakes_together() -> None:
    from otel_gpu.backends.nvml import NvmlBackend
    from otel_gpu.testing import fake_nvml

    with install("amd-mi300x-8"), fake_nvml.install("l40s-4-pcie"):
        manager = DeviceManager([NvmlBackend(), AmdBackend()])
        inv = manager.open()
        assert inv.vendors == ("nvidia", "amd")
        assert [d.index for d in inv.devices if d.vendor == "amd"] == list(range(4, 12))
        assert interconnect_domains(inv.devices) == [list(range(4, 12))]
        snap = manager.sample()
        assert len(snap.samples) == 12 and not snap.failures
        manager.close()


# -- through the command line ---------------------------------------------------------------------


def fake_cli(scenario: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-m", "otel_gpu.testing.fake_vendor_cli", scenario, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _docs(stdout: str) -> list[dict[str, Any]]:
    decoder, docs, i = json.JSONDecoder(), [], 0
    while i < len(stdout):
        if stdout[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(stdout, i)
        docs.append(doc)
    return docs


def test_cli_inventory_json_shows_the_xgmi_domain() -> None:
    result = fake_cli("amd-mi300x-8", "inventory", "--json", "--backend", "amd")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["interconnect_domains"] == [list(range(8))]
    assert doc["resource"]["accel.interconnect.domains"] == ["0,1,2,3,4,5,6,7"]
    assert doc["resource"]["accel.device.numa_nodes"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert doc["resource"]["accel.rocm.version"] == "6.4.1"
    assert all(BDF.match(bus) for bus in doc["resource"]["accel.device.pci_bus_ids"])
    assert {link["type"] for link in doc["devices"][0]["links"]} == {"xgmi"}


def test_cli_run_once_exports_the_amd_metrics() -> None:
    result = fake_cli("amd-mi300x-8", "run", "--once", "--exporter", "console", "--backend", "amd")
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
        "accel.throttle.active",
        "hw.status",
    ):
        assert name in metrics, name
    power = {p["attributes"]["hw.name"] for p in metrics["hw.power"]["data"]["data_points"]}
    assert power == {f"gpu{i}" for i in range(8)}
    assert rm["resource"]["attributes"]["accel.vendors"] == ["amd"]


def test_cli_mixed_vendor_node() -> None:
    result = fake_cli(
        "amd-mi300x-8+h100-sxm-8-nvswitch", "inventory", "--json", "--backend", "nvml,amd"
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["resource"]["accel.vendors"] == ["nvidia", "amd"]
    assert doc["interconnect_domains"] == [list(range(8)), list(range(8, 16))]


def test_fake_vendor_cli_resolves_scenarios_by_name_or_vendor() -> None:
    from otel_gpu.testing.fake_vendor_cli import FAKES, resolve

    assert set(FAKES) >= {"amd", "intel", "nvml"}
    assert resolve("amd-mi300x-8") == ("amd", "amd-mi300x-8")
    assert resolve("intel-max-1550") == ("intel", "intel-max-1550")
    assert resolve("h100-sxm-8-nvswitch") == ("nvml", "h100-sxm-8-nvswitch")
    assert resolve("amd:/tmp/node.json") == ("amd", "/tmp/node.json")
    with pytest.raises(ValueError, match="unknown scenario"):
        resolve("no-such-node")
    result = fake_cli("no-such-node", "inventory")
    assert result.returncode == 2 and "unknown scenario" in result.stderr
