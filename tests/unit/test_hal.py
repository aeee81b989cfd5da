"""HAL: the model, the registry (tolerant entry-point loading) and the manager."""

from __future__ import annotations

import dataclasses
import logging
import textwrap
from pathlib import Path
from typing import ClassVar

import pytest

from otel_gpu.errors import BackendUnavailable, ConfigError, UnknownBackend
from otel_gpu.hal import (
    DeviceFilter,
    DeviceInfo,
    DeviceManager,
    DeviceSample,
    LinkInfo,
    Registry,
    interconnect_domains,
    normalize_pci_bus_id,
    parse_selectors,
    probe_all,
)
from otel_gpu.hal.registry import Selector
from tests.conftest import FakeBackend

# -- model ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:1B:00.0", "0000:1b:00.0"),
        ("0000:1b:00.0", "0000:1b:00.0"),
        ("1b:00.0", "0000:1b:00.0"),
        ("00000001:DB:1F.7", "0001:db:1f.7"),
    ],
)
def test_pci_bus_ids_normalize_to_one_form(raw: str, expected: str) -> None:
    assert normalize_pci_bus_id(raw) == expected


@pytest.mark.parametrize("bad", ["", "GPU-1234", "0000:1b:00", "0000:1b:00.9", "100000000:1b:00.0"])
def test_malformed_pci_bus_id_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="PCI"):
        normalize_pci_bus_id(bad)


def _dev(index: int, links: tuple[LinkInfo, ...] = ()) -> DeviceInfo:
    return DeviceInfo(index=index, id=f"d{index}", vendor="v", model="m", backend="b", links=links)


def test_domains_of_a_switch_fabric_join_every_gpu() -> None:
    devices = tuple(
        _dev(i, (LinkInfo(0, "nvlink", True, "switch", remote_id=f"sw{i % 2}"),)) for i in range(4)
    )
    # Different switch ids: two fabrics.
    assert interconnect_domains(devices) == [[0, 2], [1, 3]]
    anonymous = tuple(_dev(i, (LinkInfo(0, "nvlink", True, "switch"),)) for i in range(4))
    assert interconnect_domains(anonymous) == [[0, 1, 2, 3]]


def test_domains_of_two_meshes_and_a_lone_pcie_gpu() -> None:
    def mesh(i: int, peers: list[int]) -> DeviceInfo:
        return _dev(
            i,
            tuple(
                LinkInfo(k, "xgmi", True, "gpu", remote_device_index=p) for k, p in enumerate(peers)
            ),
        )

    devices = (mesh(0, [1]), mesh(1, [0]), mesh(2, [3]), mesh(3, [2]), _dev(4))
    assert interconnect_domains(devices) == [[0, 1], [2, 3]]


def test_a_down_link_does_not_join_a_domain() -> None:
    devices = (
        _dev(0, (LinkInfo(0, "nvlink", False, "gpu", remote_device_index=1),)),
        _dev(1, (LinkInfo(0, "nvlink", False, "gpu", remote_device_index=0),)),
    )
    assert interconnect_domains(devices) == []


def test_values_are_immutable() -> None:
    sample = DeviceSample("d0", temperatures_c={"gpu": 40.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.power_w = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        sample.temperatures_c["gpu"] = 1.0  # type: ignore[index]


def test_memory_utilization_is_derived_and_none_when_unknown() -> None:
    assert (
        DeviceSample("d", memory_used_bytes=1, memory_total_bytes=4).memory_utilization_ratio
        == 0.25
    )
    assert DeviceSample("d", memory_used_bytes=1).memory_utilization_ratio is None
    assert (
        DeviceSample("d", memory_used_bytes=1, memory_total_bytes=0).memory_utilization_ratio
        is None
    )


# -- selectors and registry ----------------------------------------------------------------------


def test_selectors_parse_lists_and_simulated_specs_with_commas() -> None:
    assert parse_selectors("auto") == [Selector("auto")]
    assert parse_selectors("nvml, amd") == [Selector("nvml"), Selector("amd")]
    assert parse_selectors("amd,simulated:count=2,vendor=amd") == [
        Selector("amd"),
        Selector("simulated", "count=2,vendor=amd"),
    ]
    for bad in ("", " ", "nvml,", ",amd", "nvml,,amd"):
        with pytest.raises(ConfigError):
            parse_selectors(bad)


def _install_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, target: str
) -> None:
    dist = tmp_path / f"{name}_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[otel_gpu.backends]\n{name} = {target}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_broken_plugin_is_skipped_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_backend_mod.py").write_text("raise ImportError('libfoo.so missing')\n")
    _install_plugin(tmp_path, monkeypatch, "broken", "broken_backend_mod:Backend")
    registry = Registry()
    assert "simulated" in registry.names()
    assert "broken" not in registry.names()
    assert "libfoo.so missing" in registry.load_errors()["broken"]
    with pytest.raises(ConfigError, match="failed to load"):
        registry.factory("broken")
    rows = {r.name: r for r in probe_all(registry)}
    assert rows["simulated"].probe.available
    assert not rows["broken"].probe.available
    assert "libfoo.so missing" in rows["broken"].probe.reason


def test_a_third_party_plugin_is_loaded_from_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "acme_backend_mod.py").write_text(
        textwrap.dedent(
            """
            from tests.conftest import FakeBackend
            class AcmeBackend(FakeBackend):
                name = "acme"
            """
        )
    )
    _install_plugin(tmp_path, monkeypatch, "acme", "acme_backend_mod:AcmeBackend")
    manager = DeviceManager.from_selector("acme:3")
    with manager:
        assert [d.id for d in manager.inventory.devices] == ["acme-0", "acme-1", "acme-2"]


def test_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(UnknownBackend) as err:
        DeviceManager.from_selector("cuda")
    assert "cuda" in str(err.value)
    assert "simulated" in str(err.value)


# -- manager -------------------------------------------------------------------------------------


class AcmeBackend(FakeBackend):
    name: ClassVar[str] = "acme"


class ZedBackend(FakeBackend):
    name: ClassVar[str] = "zed"

    def __init__(self, options: str | None = None) -> None:
        super().__init__(options, vendor="zed", devices=1)


class DownBackend(FakeBackend):
    name: ClassVar[str] = "down"

    def __init__(self, options: str | None = None) -> None:
        super().__init__(options, available=False)


class DownFallback(FakeBackend):
    name: ClassVar[str] = "down-cli"
    fallback_for: ClassVar[str | None] = "down"

    def __init__(self, options: str | None = None) -> None:
        super().__init__(options, vendor="downcli", devices=1)


class AcmeFallback(FakeBackend):
    name: ClassVar[str] = "acme-cli"
    fallback_for: ClassVar[str | None] = "acme"


def _registry(*factories: type[FakeBackend]) -> Registry:
    return Registry({f.name: f for f in factories})  # type: ignore[misc]


def test_auto_uses_every_available_vendor_and_renumbers_devices() -> None:
    registry = _registry(AcmeBackend, ZedBackend, DownBackend)
    with DeviceManager.from_selector("auto", registry) as manager:
        devices = manager.inventory.devices
        assert [(d.index, d.id, d.local_index) for d in devices] == [
            (0, "acme-0", 0),
            (1, "acme-1", 1),
            (2, "zed-0", 0),
        ]
        assert manager.inventory.vendors == ("acme", "zed")
        assert dict(manager.inventory.versions) == {"acme.driver": "1.0", "zed.driver": "1.0"}
        assert [s.device_id for s in manager.sample().samples] == ["acme-0", "acme-1", "zed-0"]


def test_auto_falls_back_loudly_only_when_the_primary_is_unavailable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = _registry(AcmeBackend, AcmeFallback, DownBackend, DownFallback)
    with caplog.at_level(logging.WARNING):
        manager = DeviceManager.from_selector("auto", registry)
    assert [b.name for b in manager.backends] == ["acme", "down-cli"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "falling back from down to down-cli" in warnings[0]
    assert "down driver missing" in warnings[0]


def test_an_explicit_unavailable_backend_fails_with_its_reason_and_never_falls_back() -> None:
    registry = _registry(DownBackend, DownFallback)
    with pytest.raises(BackendUnavailable, match="down driver missing"):
        DeviceManager.from_selector("down", registry)


def test_auto_with_nothing_available_says_what_was_tried() -> None:
    with pytest.raises(BackendUnavailable) as err:
        DeviceManager.from_selector("auto", _registry(DownBackend))
    assert "down: down driver missing" in str(err.value)
    assert "--backend simulated" in str(err.value)


def test_auto_cannot_be_combined() -> None:
    with pytest.raises(ConfigError, match="auto"):
        DeviceManager.from_selector("auto,acme", _registry(AcmeBackend))


def test_a_failing_backend_marks_only_its_devices_failed() -> None:
    acme, zed = AcmeBackend(), ZedBackend()
    with DeviceManager([acme, zed]) as manager:
        acme.broken = True
        snap = manager.sample()
        assert [s.device_id for s in snap.samples] == ["zed-0"]
        assert {f.device_id for f in snap.failures} == {"acme-0", "acme-1"}
        assert all("driver wedged" in f.reason and not f.lost for f in snap.failures)
        acme.broken = False
        assert len(manager.sample().samples) == 3


def test_a_lost_device_is_reported_and_the_others_go_on() -> None:
    backend = FakeBackend(devices=3, lost=(1,))
    with DeviceManager([backend]) as manager:
        snap = manager.sample()
    assert [s.device_id for s in snap.samples] == ["acme-0", "acme-2"]
    assert snap.failures[0].device_id == "acme-1" and snap.failures[0].lost


def test_device_filter_by_index_and_id_keeps_mig_children() -> None:
    f = DeviceFilter.parse("0, acme-2")
    assert f is not None
    parent = DeviceInfo(index=0, id="p", vendor="v", model="m", backend="b")
    child = DeviceInfo(index=5, id="c", vendor="v", model="m", backend="b", parent_id="p")
    assert f.keeps(parent, {"p": parent}) and f.keeps(child, {"p": parent})
    assert DeviceFilter.parse("all") is None and DeviceFilter.parse(None) is None
    for bad in ("0,,1", "-1"):
        with pytest.raises(ConfigError, match="OTEL_GPU_DEVICES"):
            DeviceFilter.parse(bad)
    with DeviceManager([FakeBackend(devices=4)], DeviceFilter.parse("1,acme-3")) as manager:
        assert [d.id for d in manager.inventory.devices] == ["acme-1", "acme-3"]
        assert [s.device_id for s in manager.sample().samples] == ["acme-1", "acme-3"]


def test_close_closes_every_backend_once_and_open_failure_closes_the_opened() -> None:
    acme, zed = AcmeBackend(), ZedBackend()
    manager = DeviceManager([acme, zed])
    manager.open()
    manager.close()
    manager.close()
    assert acme.closed and zed.closed

    class Exploding(FakeBackend):
        name: ClassVar[str] = "boom"

        def open(self) -> None:
            raise OSError("permission denied on /dev/nvidiactl")

    first = AcmeBackend()
    with pytest.raises(BackendUnavailable, match="permission denied"):
        DeviceManager([first, Exploding()]).open()
    assert first.closed
