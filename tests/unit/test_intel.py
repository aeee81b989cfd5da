"""The Intel backend over the fake ``pyzes`` (the real backend code runs above it)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.backends.intel import IntelBackend, format_uuid, throttle_reasons
from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.errors import BackendUnavailable
from otel_gpu.hal import DeviceManager, HealthEvent, HealthState, Severity, interconnect_domains
from otel_gpu.hal.model import DeviceSample
from otel_gpu.health import HealthMonitor
from otel_gpu.otel import GpuTelemetry
from otel_gpu.testing.fake_pyzes import FakePyzes, builtin_scenarios, install

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
UNAVAILABLE = ("intel-missing-loader", "intel-no-package", "intel-no-driver")
GIB = 1 << 30


@pytest.fixture
def max1550() -> Iterator[tuple[FakePyzes, IntelBackend]]:
    with install("intel-max-1550") as fake:
        backend = IntelBackend()
        backend.open()
        yield fake, backend
        backend.close()


def _numbers(sample: DeviceSample) -> list[float]:
    out: list[float] = []
    for name in sample.__dataclass_fields__:
        value = getattr(sample, name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(float(value))
        elif hasattr(value, "values"):
            out.extend(float(v) for v in value.values())
    return out


# -- probe ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "fragment"),
    [
        ("intel-missing-loader", "libze_loader.so.1) could not be loaded"),
        ("intel-no-package", "pip install 'otel-gpu[intel]'"),
        ("intel-no-driver", "no Level Zero GPU driver answered zesInit"),
    ],
)
def test_unavailable_level_zero_says_what_to_install(scenario: str, fragment: str) -> None:
    with install(scenario):
        probe = IntelBackend().probe()
        assert not probe.available and fragment in probe.reason
        with pytest.raises(BackendUnavailable, match=re.escape(fragment)):
            IntelBackend().open()


@pytest.mark.parametrize("scenario", [s for s in builtin_scenarios() if s not in UNAVAILABLE])
def test_every_scenario_opens_and_sweeps(scenario: str) -> None:
    with install(scenario) as fake:
        backend = IntelBackend()
        assert backend.probe().available
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


def test_helpers() -> None:
    assert format_uuid(bytes(range(16))) == "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert throttle_reasons(0) == frozenset()
    assert throttle_reasons(1 | 2) == frozenset({"power"})
    assert throttle_reasons(1 << 3) == frozenset({"thermal"})
    assert throttle_reasons(1 << 5) == frozenset()  # the user's frequency range: no throttle


# -- inventory ------------------------------------------------------------------------------------


def test_max1550_cards_with_tiles_as_children(max1550: tuple[FakePyzes, IntelBackend]) -> None:
    _, backend = max1550
    inv = backend.inventory()
    cards = [d for d in inv.devices if d.parent_id is None]
    tiles = [d for d in inv.devices if d.parent_id is not None]
    assert len(cards) == 4 and len(tiles) == 8
    assert [d.index for d in inv.devices] == list(range(12))
    assert inv.versions == {"intel.driver": "1.3.29735"}
    assert [c.pci_bus_id for c in cards] == [
        "0000:29:00.0",
        "0000:3a:00.0",
        "0000:9a:00.0",
        "0000:ca:00.0",
    ]
    c0 = cards[0]
    assert c0.vendor == "intel" and c0.model == "Intel(R) Data Center GPU Max 1550"
    assert re.match(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", c0.id)
    assert c0.serial == "LQAC15500000" and c0.board_part_number is None  # "unknown" -> None
    assert c0.memory_total_bytes == 128 * GIB
    assert (c0.power_limit_default_w, c0.power_limit_min_w) == (600.0, 300.0)
    assert (c0.pcie_max_generation, c0.pcie_max_width) == (5, 16)
    assert c0.extra["intel.tiles"] == "2"
    mine = [t for t in tiles if t.parent_id == c0.id]
    assert [t.extra["intel.tile"] for t in mine] == ["0", "1"]
    assert all(t.memory_total_bytes == 64 * GIB and t.pci_bus_id == c0.pci_bus_id for t in mine)
    assert len({d.id for d in inv.devices}) == 12
    assert interconnect_domains(inv.devices) == []  # Xe Link is not reported by Sysman here


def test_numa_and_cpu_list_from_sysfs(tmp_path: Path) -> None:
    dev = tmp_path / "sys/bus/pci/devices/0000:9a:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    (dev / "local_cpulist").write_text("56-111\n")
    with install("intel-max-1550"):
        backend = IntelBackend(sysfs_root=tmp_path)
        inv = backend.inventory()
        assert [d.numa_node for d in inv.devices[:4]] == [None, None, 1, None]
        assert inv.devices[2].cpu_affinity == "56-111"
        tile = next(d for d in inv.devices if d.parent_id == inv.devices[2].id)
        assert tile.numa_node == 1
        backend.close()


# -- sampling -------------------------------------------------------------------------------------


def test_max1550_sample_values_and_units(max1550: tuple[FakePyzes, IntelBackend]) -> None:
    fake, backend = max1550
    inv = backend.inventory()
    fake.advance(10.0)
    first = backend.sample().by_id()
    fake.advance(10.0)
    second = backend.sample().by_id()
    card = inv.devices[0]
    tile0, tile1 = (d for d in inv.devices if d.parent_id == card.id)
    a, b = first[card.id], second[card.id]
    # Utilization: Δactive/Δtime of the compute engine group; the card is its tiles' mean.
    assert second[tile0.id].utilization_ratio == pytest.approx(0.82)
    assert second[tile1.id].utilization_ratio == pytest.approx(0.78)
    assert b.utilization_ratio == pytest.approx(0.80)
    assert dict(b.engines) == pytest.approx({"compute": 0.80, "copy": 0.11})
    # Power from the energy counter's growth (µJ/µs = W); the card-level domain for the card.
    assert b.power_w == pytest.approx(205 + 198 + 47)
    assert second[tile0.id].power_w == pytest.approx(205.0)
    assert a.energy_j is not None and b.energy_j is not None
    assert b.energy_j - a.energy_j == pytest.approx(450 * 10.0)
    assert b.power_limit_w == 600.0
    # Memory: bytes, the card sums its tiles' HBM.
    assert b.memory_used_bytes == 2 * 20 * GIB
    assert second[tile0.id].memory_used_bytes == 20 * GIB
    assert b.memory_total_bytes == 2 * 68_182_605_824
    assert b.memory_bandwidth_utilization_ratio == pytest.approx(0.33)
    # Celsius (the hottest tile), Hz, and the PCIe counters in bytes.
    assert dict(b.temperatures_c) == {"gpu": 61.0, "memory": 51.0}
    assert dict(second[tile0.id].temperatures_c) == {"gpu": 57.0, "memory": 49.0}
    assert b.clocks_hz["graphics"] == 1.6e9 and b.clocks_hz["memory"] == 3.2e9
    assert (b.pcie_generation, b.pcie_width, b.pcie_replay_total) == (5, 16, 0)
    assert a.pcie_tx_bytes is not None and b.pcie_tx_bytes is not None
    assert b.pcie_tx_bytes - a.pcie_tx_bytes == 3_000_000_000 * 10
    assert b.ecc_corrected_total == 0 and b.ecc_uncorrected_total == 0
    assert b.throttle_reasons == frozenset()
    # Card 2's tile 1 is thermally throttled; card 3's tile 0 has corrected memory errors.
    hot = inv.devices[2]
    assert second[hot.id].throttle_reasons == frozenset({"thermal"})
    assert second[hot.id].temperatures_c["gpu"] == 96.0
    assert second[inv.devices[3].id].ecc_corrected_total == 6
    for sample in second.values():
        assert not any(math.isnan(v) for v in _numbers(sample))
        if sample.utilization_ratio is not None:
            assert 0.0 <= sample.utilization_ratio <= 1.0


def test_calls_per_card_per_sweep(max1550: tuple[FakePyzes, IntelBackend]) -> None:
    fake, backend = max1550
    backend.sample()
    fake.reset_calls()
    sweeps = 12
    for _ in range(sweeps):
        fake.advance(10.0)
        backend.sample()
    per_card = sum(fake.calls.values()) / sweeps / 4
    assert fake.calls["zesDevicePciGetStats"] == sweeps * 4
    assert fake.calls["zesEngineGetActivity"] == sweeps * 4 * 4  # compute + copy per tile
    assert per_card <= 23.0, dict(fake.calls)
    print(f"Max 1550: {per_card:.2f} Level Zero calls per card per sweep: {dict(fake.calls)}")


def test_processes_only_when_enabled() -> None:
    with install("intel-max-1550") as fake:
        backend = IntelBackend()
        backend.open()
        assert backend.sample().samples[0].processes is None
        assert fake.calls["zesDeviceProcessesGetState"] == 0
        backend.enable("processes")
        backend._sweep = 0  # next sweep is a slow one
        procs = backend.sample().samples[0].processes
        assert procs is not None and procs[0].pid == 52000
        assert procs[0].memory_used_bytes == 16 * GIB
        backend.close()


def test_unsupported_is_none_and_asked_once() -> None:
    with install("intel-flex-170") as fake:
        backend = IntelBackend(slow_every=1)
        backend.open()
        for _ in range(5):
            fake.advance(10.0)
            s = backend.sample().samples[0]
        assert fake.calls["zesDeviceEnumRasErrorSets"] == 1
        assert fake.calls["zesMemoryGetBandwidth"] == 1
        assert s.ecc_corrected_total is None and s.ecc_uncorrected_total is None
        assert s.memory_bandwidth_utilization_ratio is None
        # A single-tile card: no children; media and render engine groups are reported.
        assert len(backend.inventory().devices) == 1
        assert set(s.engines) == {"compute", "copy", "media", "render"}
        assert s.utilization_ratio == pytest.approx(0.35)
        assert s.throttle_reasons == frozenset({"power"})
        assert s.power_w == pytest.approx(95.0)
        backend.close()


# -- faults ---------------------------------------------------------------------------------------


def test_a_card_that_fails_every_call_is_isolated() -> None:
    with install("intel-max-1550-faulty") as fake:
        manager = DeviceManager([IntelBackend()])
        events: list[HealthEvent] = []
        monitor = HealthMonitor(emit=events.append)
        inv = manager.open()
        broken = inv.devices[2]
        assert broken.id == "intel-gpu-2" and broken.model.startswith("unknown")
        assert len(inv.devices) == 10  # 3 cards x (1 + 2 tiles) + the unreadable card
        for _ in range(3):
            fake.advance(10.0)
            snap = manager.sample()
            monitor.process(inv, snap)
            assert len(snap.samples) == 9
            assert [(f.device_id, f.lost) for f in snap.failures] == [(broken.id, False)]
        assert "ZE_RESULT_ERROR_UNKNOWN" in snap.failures[0].reason
        assert [e.name for e in events if e.device_id == broken.id] == ["accel.telemetry.degraded"]
        manager.close()


def test_a_lost_card_and_its_tiles_are_reported_and_come_back() -> None:
    now = [0.0]
    with install("intel-max-1550-lost") as fake:
        manager = DeviceManager([IntelBackend(clock=lambda: now[0])])
        events: list[HealthEvent] = []
        monitor = HealthMonitor(emit=events.append)
        inv = manager.open()
        card1 = inv.devices[1]
        family = {card1.id} | {d.id for d in inv.devices if d.parent_id == card1.id}
        fake.advance(2.0)
        snap = manager.sample()
        monitor.process(inv, snap)
        assert {f.device_id for f in snap.failures if f.lost} == family
        assert len(snap.samples) == 9
        assert {e.device_id for e in events if e.name == "accel.device.lost"} == family
        fake.reset_calls()
        manager.sample()
        assert fake.card_calls[1] == 0  # backoff: not asked
        fake.recover_card(1)
        now[0] += 400
        fake.advance(10.0)
        snap = manager.sample()
        monitor.process(inv, snap)
        assert family <= set(snap.by_id())
        assert "accel.device.recovered" in {e.name for e in events}
        manager.close()


def test_uncorrectable_ras_errors_fire_the_same_event_as_nvidia() -> None:
    with install("intel-max-1550-ras") as fake:
        backend = IntelBackend()
        inv = backend.inventory()
        events: list[HealthEvent] = []
        monitor = HealthMonitor(emit=events.append)
        fake.advance(10.0)
        monitor.process(inv, backend.sample())
        backend.close()
    card1 = inv.devices[1]
    tile0 = next(d for d in inv.devices if d.parent_id == card1.id)
    ecc = [e for e in events if e.name == "accel.memory.ecc.uncorrectable"]
    assert {e.device_id for e in ecc} == {card1.id, tile0.id}
    # Resets are a RAS category too, but not a hardware error: the count is 1, not 2.
    assert all(e.attributes["error.count"] == 1 for e in ecc)
    assert all(e.state is HealthState.FAILED and e.severity is Severity.ERROR for e in ecc)
    nvidia = SimulatedBackend("count=2,faults=ecc@1:0")
    nv_events: list[HealthEvent] = []
    nvidia.open()
    HealthMonitor(emit=nv_events.append).process(nvidia.inventory(), nvidia.sample())
    nv_ecc = next(e for e in nv_events if e.name == "accel.memory.ecc.uncorrectable")
    assert (nv_ecc.severity, nv_ecc.state) == (ecc[0].severity, ecc[0].state)
    assert set(nv_ecc.attributes) == set(ecc[0].attributes)
    nvidia.close()


# -- through OpenTelemetry -----------------------------------------------------------------------


def _collect(backends: list[Any], sweeps: int = 2) -> dict[str, list[dict[str, Any]]]:
    reader = InMemoryMetricReader()
    tel = GpuTelemetry(
        DeviceManager(backends), MeterProvider(metric_readers=[reader]), interval_s=10.0
    )
    tel.start()
    try:
        data = None
        for _ in range(sweeps):
            tel.cache.invalidate()
            data = reader.get_metrics_data()
    finally:
        tel.shutdown()
    assert data is not None
    return {
        m.name: [dict(p.attributes or {}) for p in m.data.data_points]
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }


# The metrics an NVIDIA node has and the Intel backend cannot supply (see the report).
INTEL_CANNOT = {
    "accel.interconnect.io",
    "accel.interconnect.errors",
    "accel.interconnect.link.status",
    "accel.memory.retired",
}


def test_otel_bridge_same_metric_names_and_attribute_keys_as_nvidia() -> None:
    start = time.monotonic()
    # Utilization and power are rates between two reads: the fake's clock must move.
    with install("intel-max-1550", timer=lambda: time.monotonic() - start):
        intel = _collect([IntelBackend()])
    nvidia = _collect([SimulatedBackend("count=8")])
    shared = set(intel) & set(nvidia)
    assert set(intel) - shared == {"accel.engine.utilization"}
    assert set(nvidia) - set(intel) == INTEL_CANNOT
    for name in shared:
        # Tiles are child devices: like MIG instances they add hw.parent (DESIGN §4).
        mine = {frozenset(p) - {"hw.parent"} for p in intel[name]}
        assert mine <= {frozenset(p) - {"hw.parent"} for p in nvidia[name]}, name
    parents = {p["hw.parent"] for p in intel["hw.gpu.memory.usage"] if "hw.parent" in p}
    assert len(parents) == 4  # each tile's point names its card
    power = {p["hw.name"] for p in intel["hw.power"]}
    assert power == {f"gpu{i}" for i in range(12)}  # 4 cards and 8 tiles
    tiles = [p for p in intel["hw.gpu.memory.usage"] if "hw.parent" in p]
    assert len(tiles) == 8
    assert {p["accel.engine"] for p in intel["accel.engine.utilization"]} == {"compute", "copy"}


def test_intel_and_amd_and_simulated_nvidia_on_one_node() -> None:
    from otel_gpu.backends.amd import AmdBackend
    from otel_gpu.testing import fake_amdsmi

    with install("intel-max-1550"), fake_amdsmi.install("amd-mi300x-8"):
        manager = DeviceManager([IntelBackend(), AmdBackend(), SimulatedBackend("count=2")])
        inv = manager.open()
        assert inv.vendors == ("intel", "amd", "nvidia")
        assert len(inv.devices) == 12 + 8 + 2
        snap = manager.sample()
        assert {s.device_id for s in snap.samples} == {d.id for d in inv.devices}
        assert interconnect_domains(inv.devices) == [list(range(12, 20)), [20, 21]]
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


def test_cli_inventory_json_shows_cards_and_tiles() -> None:
    result = fake_cli("intel-max-1550", "inventory", "--json", "--backend", "intel")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    cards = [d for d in doc["devices"] if d["parent_id"] is None]
    assert len(cards) == 4 and all(len(c["children"]) == 2 for c in cards)
    assert doc["resource"]["accel.vendors"] == ["intel"]
    assert doc["resource"]["accel.device.count"] == 12
    assert doc["resource"]["accel.intel.driver.version"] == "1.3.29735"
    assert all(BDF.match(bus) for bus in doc["resource"]["accel.device.pci_bus_ids"])


def test_cli_run_once_exports_the_intel_metrics() -> None:
    result = fake_cli(
        "intel-max-1550", "run", "--once", "--exporter", "console", "--backend", "intel"
    )
    assert result.returncode == 0, result.stderr
    decoder, docs, i, out = json.JSONDecoder(), [], 0, result.stdout
    while i < len(out):
        if out[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(out, i)
        docs.append(doc)
    metrics_doc = next(d for d in docs if "resource_metrics" in d)
    metrics = {
        m["name"]: m
        for sm in metrics_doc["resource_metrics"][0]["scope_metrics"]
        for m in sm["metrics"]
    }
    for name in (
        "hw.gpu.utilization",
        "hw.gpu.memory.usage",
        "hw.power",
        "hw.energy",
        "hw.temperature",
        "hw.errors",
        "hw.gpu.io",
        "accel.engine.utilization",
        "accel.throttle.active",
        "hw.status",
    ):
        assert name in metrics, name
    thermal = [d for d in docs if d.get("event_name") == "accel.throttle.thermal"]
    assert thermal and thermal[0]["attributes"]["hw.vendor"] == "intel"
