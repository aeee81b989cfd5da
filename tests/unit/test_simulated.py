"""The simulated backend: specs, determinism, topology, counters and scripted faults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_gpu.backends.simulated import SimulatedBackend, parse_spec
from otel_gpu.errors import ConfigError
from otel_gpu.hal import HealthEvent, interconnect_domains


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_default_node_looks_like_an_8_gpu_nvswitch_box() -> None:
    backend = SimulatedBackend()
    assert backend.probe().available
    backend.open()
    inv = backend.inventory()
    assert len(inv.devices) == 8
    assert {d.model for d in inv.devices} == {"NVIDIA H100 80GB HBM3"}
    assert len({d.id for d in inv.devices}) == 8
    assert all(d.id.startswith("GPU-") for d in inv.devices)
    assert [d.numa_node for d in inv.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inv.devices[0].pci_bus_id == "0000:18:00.0"
    assert all(len(d.links) == 18 and d.links[0].remote_kind == "switch" for d in inv.devices)
    assert interconnect_domains(inv.devices) == [list(range(8))]
    assert inv.versions["cuda"] == "12.4"


@pytest.mark.parametrize(
    ("spec", "domains", "link_type"),
    [
        ("count=4,topology=pcie", [], None),
        ("vendor=amd,count=4", [[0, 1, 2, 3]], "xgmi"),
        ("count=2,topology=mesh", [[0, 1]], "nvlink"),
    ],
)
def test_topologies(spec: str, domains: list[list[int]], link_type: str | None) -> None:
    backend = SimulatedBackend(spec)
    backend.open()
    devices = backend.inventory().devices
    assert interconnect_domains(devices) == domains
    if link_type:
        assert {link.link_type for d in devices for link in d.links} == {link_type}


def test_same_seed_same_values_and_other_seed_other_values() -> None:
    def run(seed: int) -> list[float | None]:
        b = SimulatedBackend(f"seed={seed}", timer=Clock())
        b.open()
        return [s.utilization_ratio for _ in range(3) for s in b.sample().samples]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_counters_grow_with_time_and_values_are_in_range() -> None:
    clock = Clock()
    backend = SimulatedBackend(timer=clock)
    backend.open()
    first = backend.sample().by_id()
    clock.t += 10.0
    second = backend.sample().by_id()
    for dev_id, s in second.items():
        before = first[dev_id]
        assert s.energy_j is not None and before.energy_j is not None
        assert s.power_w is not None
        # Energy integrates power over the 10 simulated seconds.
        assert s.energy_j - before.energy_j == pytest.approx(s.power_w * 10.0)
        assert s.pcie_tx_bytes is not None and before.pcie_tx_bytes is not None
        assert s.pcie_tx_bytes > before.pcie_tx_bytes
        assert s.utilization_ratio is not None and 0.0 <= s.utilization_ratio <= 1.0
        assert s.memory_used_bytes is not None and s.memory_total_bytes is not None
        assert 0 < s.memory_used_bytes <= s.memory_total_bytes


def test_mig_children_have_parents_and_their_own_memory() -> None:
    backend = SimulatedBackend("count=2,mig=0:3")
    backend.open()
    devices = backend.inventory().devices
    assert len(devices) == 5
    children = [d for d in devices if d.parent_id]
    assert [c.parent_id for c in children] == [devices[0].id] * 3
    assert all(c.id.startswith("MIG-") for c in children)
    assert devices[0].mig_mode is True and devices[1].mig_mode is False
    by_id = backend.sample().by_id()
    assert all(by_id[c.id].memory_total_bytes == c.memory_total_bytes for c in children)


def test_lost_device_at_cycle_then_recovers() -> None:
    backend = SimulatedBackend("count=3,mig=1:2,faults=lost@1:1;recover@1:3")
    backend.open()
    inv = backend.inventory()
    gpu1 = inv.devices[1].id
    children = {d.id for d in inv.devices if d.parent_id == gpu1}
    assert not backend.sample().failures
    lost = backend.sample()
    assert {f.device_id for f in lost.failures} == {gpu1, *children}
    assert all(f.lost for f in lost.failures)
    assert gpu1 not in lost.by_id()
    assert backend.sample().failures
    assert not backend.sample().failures


def test_scripted_xid_is_delivered_to_the_event_sink_on_its_cycle() -> None:
    backend = SimulatedBackend("count=2,faults=xid79@1:1")
    backend.open()
    events: list[HealthEvent] = []
    backend.start_events(events.append)
    backend.sample()
    assert events == []
    backend.sample()
    assert len(events) == 1
    assert events[0].name == "nvidia.xid"
    assert events[0].attributes["nvidia.xid.code"] == 79
    assert events[0].device_id == backend.inventory().devices[1].id


def test_faults_change_the_samples() -> None:
    spec = (
        "count=2,faults=ecc@0:0;throttle-thermal@1:0;throttle-power@1:0;link-down@0:0;"
        "pcie-degraded@1:0;retirement-pending@0:0;row-remap-failure@1:0;hot@0:0"
    )
    backend = SimulatedBackend(spec)
    backend.open()
    inv = backend.inventory()
    by_id = backend.sample().by_id()
    s0, s1 = by_id[inv.devices[0].id], by_id[inv.devices[1].id]
    assert s0.ecc_uncorrected_total == 1 and s1.ecc_uncorrected_total == 0
    assert s1.throttle_reasons == frozenset({"thermal", "power"})
    assert s0.throttle_reasons == frozenset()
    assert s0.links[0].up is False and s0.links[1].up is True
    assert s1.pcie_width == 8 and s0.pcie_width == 16
    assert s0.retired_rows["pending"] == 1 and s1.retired_rows["failed"] == 1
    assert s0.temperatures_c["gpu"] > (inv.devices[0].temperature_slowdown_c or 0)


@pytest.mark.parametrize("vendor", ["nvidia", "amd", "intel", "tpu", "neuron"])
def test_every_vendor_preset_samples(vendor: str) -> None:
    backend = SimulatedBackend(vendor)
    backend.open()
    inv = backend.inventory()
    snap = backend.sample()
    assert len(snap.samples) == len(inv.devices) == 8
    assert {d.vendor for d in inv.devices} == {vendor}
    if vendor in ("tpu", "neuron"):
        assert {d.kind for d in inv.devices} == {vendor}
        assert snap.samples[0].power_w is None  # not supplied, not zero
    if vendor == "neuron":
        assert set(snap.samples[0].engines) == {"core0", "core1"}


def test_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"count": 3, "vendor": "amd", "faults": ["lost@2:0"]}))
    spec = parse_spec(str(path))
    assert spec.count == 3 and spec.vendor == "amd" and spec.faults[0].kind == "lost"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("count=0", "out of range"),
        ("count=abc", "not an integer"),
        ("count=5000", "out of range"),
        ("vendor=cuda", "unknown vendor"),
        ("topology=ring", "unknown topology"),
        ("colour=red", "unknown key"),
        ("count", "malformed item"),
        ("faults=explode@0", "unknown fault kind"),
        ("faults=lost@9", "names device 9"),
        ("faults=lost", "malformed fault"),
        ("mig=0", "malformed mig"),
        ("mig=0:9", "out of range"),
        ("memory_gib=-1", "positive"),
        ("memory_gib=nan", "positive"),
        ("/nonexistent/spec.json", "does not exist"),
    ],
)
def test_bad_specs_raise_one_config_error(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_spec(text)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_corrupt_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_spec(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        parse_spec(str(path))
