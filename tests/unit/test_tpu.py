"""The TPU backend over a checked-in sysfs tree and a fake libtpu metric service (real gRPC)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.backends.tpu import (
    DUTY_CYCLE,
    HBM_BANDWIDTH,
    HBM_TOTAL,
    HBM_USAGE,
    TpuBackend,
    _per_chip,
)
from otel_gpu.backends.tpu._grpc import serve_runtime_metrics
from otel_gpu.backends.tpu._sysfs import chip_type, discover
from otel_gpu.errors import BackendUnavailable
from otel_gpu.hal import DeviceManager
from otel_gpu.hal.protocol import Backend
from otel_gpu.otel import GpuTelemetry
from otel_gpu.testing.fake_tpu_neuron import (
    TPU_V5E_8,
    UNREACHABLE_ADDR,
    FakeTpuRuntime,
    install_tpu,
    start_fake_tpu,
    tpu_env,
    tpu_scenarios,
)

GIB = 1 << 30
V5E_HBM_RUNTIME = 17044078592  # what libtpu reports as total HBM of a v5e chip


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def runtime() -> Iterator[FakeTpuRuntime]:
    with FakeTpuRuntime.from_fixture() as fake:
        yield fake


def _backend(addr: str, **kwargs: Any) -> TpuBackend:
    backend = TpuBackend(root=TPU_V5E_8, metrics_addr=addr, **kwargs)
    backend.open()
    return backend


def test_backend_satisfies_the_protocol() -> None:
    assert isinstance(TpuBackend(root=TPU_V5E_8), Backend)
    assert TpuBackend.name == "tpu" and TpuBackend.auto


def test_v5e_host_inventory_from_sysfs() -> None:
    backend = _backend(UNREACHABLE_ADDR)
    inv = backend.inventory()
    assert len(inv.devices) == 8  # the gVNIC (Google vendor id too) and the virtio disk are not
    assert {d.kind for d in inv.devices} == {"tpu"}
    assert {d.vendor for d in inv.devices} == {"google"}
    assert {d.model for d in inv.devices} == {"TPU v5 lite"}
    assert [d.pci_bus_id for d in inv.devices] == [f"0000:00:{4 + i:02x}.0" for i in range(8)]
    assert [d.id for d in inv.devices] == [f"tpu-0000:00:{4 + i:02x}.0" for i in range(8)]
    assert [d.numa_node for d in inv.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inv.devices[4].cpu_affinity == "56-111,168-223"
    assert {d.memory_total_bytes for d in inv.devices} == {16 * GIB}
    assert [d.extra["tpu.device_path"] for d in inv.devices] == [f"/dev/vfio/{i}" for i in range(8)]
    assert {d.extra["tpu.generation"] for d in inv.devices} == {"v5e"}
    assert {(d.pcie_max_generation, d.pcie_max_width) for d in inv.devices} == {(4, 16)}
    assert all(d.links == () for d in inv.devices)
    backend.close()


def test_chip_table_follows_tpu_info() -> None:
    assert chip_type(0x0027, 0x004E).generation == "v2"  # type: ignore[union-attr]
    assert chip_type(0x0027, 0x004F).generation == "v3"  # type: ignore[union-attr]
    assert chip_type(0x0027, None) is None
    assert chip_type(0x005E, None).model == "TPU v4"  # type: ignore[union-attr]
    assert chip_type(0x0062, None).generation == "v5p"  # type: ignore[union-attr]
    assert chip_type(0x006F, None).model == "TPU v6 lite"  # type: ignore[union-attr]
    assert chip_type(0x0076, None).cores_per_chip == 2  # type: ignore[union-attr]
    assert chip_type(0x0042, None) is None  # gVNIC


def _pci(root: Path, bus: str, device: str, **files: str) -> Path:
    entry = root / "sys/bus/pci/devices" / bus
    entry.mkdir(parents=True)
    (entry / "vendor").write_text("0x1ae0\n")
    (entry / "device").write_text(device + "\n")
    for name, text in files.items():
        (entry / name).write_text(text + "\n")
    return entry


def test_device_nodes_from_iommu_group_and_accel_class(tmp_path: Path) -> None:
    v5p = _pci(tmp_path, "0000:af:00.0", "0x0062", current_link_speed="Unknown")
    (tmp_path / "sys/kernel/iommu_groups/37").mkdir(parents=True)
    os.symlink("../../../../kernel/iommu_groups/37", v5p / "iommu_group")
    (tmp_path / "dev/vfio").mkdir(parents=True)
    (tmp_path / "dev/vfio/37").write_text("")
    v4 = _pci(tmp_path, "0000:00:05.0", "0x005e")
    (v4 / "accel/accel3").mkdir(parents=True)
    (tmp_path / "dev/accel3").write_text("")
    chips = discover(tmp_path)
    assert [(c.pci_bus_id, c.type.generation, c.device_path) for c in chips] == [
        ("0000:00:05.0", "v4", "/dev/accel3"),
        ("0000:af:00.0", "v5p", "/dev/vfio/37"),
    ]
    assert chips[1].pcie_max_generation is None and chips[1].numa_node is None


def test_probe_says_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = TpuBackend(root=TPU_V5E_8).probe()
    assert probe.available and probe.device_count == 8 and "TPU v5 lite" in probe.reason
    empty = TpuBackend(root=tmp_path).probe()
    assert not empty.available and "0x1ae0" in empty.reason
    with pytest.raises(BackendUnavailable, match="no Google TPU"):
        TpuBackend(root=tmp_path).open()
    monkeypatch.setitem(sys.modules, "grpc", None)  # grpcio not installed
    probe = TpuBackend(root=TPU_V5E_8).probe()
    assert not probe.available and "pip install 'otel-gpu[tpu]'" in probe.reason
    with pytest.raises(BackendUnavailable, match=r"otel-gpu\[tpu\]"):
        TpuBackend(root=TPU_V5E_8).open()


def test_no_workload_lists_devices_and_leaves_runtime_metrics_absent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _backend(UNREACHABLE_ADDR, retry_s=0.0)
    with caplog.at_level(logging.DEBUG, logger="otel_gpu.backends.tpu"):
        first, second = backend.sample(), backend.sample()
    for snap in (first, second):
        assert snap.failures == ()
        assert len(snap.samples) == 8
        for s in snap.samples:
            assert s.utilization_ratio is None  # absent, not 0
            assert s.memory_used_bytes is None and s.memory_total_bytes is None
            assert s.memory_bandwidth_utilization_ratio is None
            assert (s.pcie_generation, s.pcie_width) == (4, 16)
    unreachable = [r for r in caplog.records if "absent until a workload" in r.getMessage()]
    assert len(unreachable) == 1 and unreachable[0].levelno == logging.DEBUG
    backend.close()


def test_runtime_values_and_units(runtime: FakeTpuRuntime) -> None:
    backend = _backend(runtime.address)
    snap = backend.sample()
    assert snap.failures == ()
    s0, s4, s7 = (snap.samples[i] for i in (0, 4, 7))
    assert s0.utilization_ratio == pytest.approx(0.975)
    assert s0.memory_used_bytes == 8522039296 and s0.memory_total_bytes == V5E_HBM_RUNTIME
    assert s0.memory_utilization_ratio == pytest.approx(0.5)
    assert s0.memory_bandwidth_utilization_ratio == pytest.approx(0.615)
    assert s4.utilization_ratio == pytest.approx(0.5) and s4.memory_used_bytes == 4261019648
    assert s7.utilization_ratio == 0.0 and s7.memory_used_bytes == 0  # idle but measured
    assert all(s.engines == {} for s in snap.samples)  # one TensorCore per v5e chip
    assert sorted(set(runtime.requests)) == sorted(
        [HBM_USAGE, HBM_TOTAL, DUTY_CYCLE, HBM_BANDWIDTH]
    )
    backend.close()


def test_service_dying_mid_run_makes_metrics_absent_and_they_come_back(
    runtime: FakeTpuRuntime,
) -> None:
    clock = Clock()
    backend = _backend(runtime.address, retry_s=5.0, clock=clock)
    assert backend.sample().samples[0].utilization_ratio == pytest.approx(0.975)
    runtime.stop()  # the workload ends
    snap = backend.sample()
    assert snap.failures == () and len(snap.samples) == 8
    assert all(s.utilization_ratio is None and s.memory_used_bytes is None for s in snap.samples)
    runtime.start()  # a new workload, same port
    asked = len(runtime.requests)
    clock.now += 1.0
    assert backend.sample().samples[0].utilization_ratio is None  # not retried before retry_s
    assert len(runtime.requests) == asked
    clock.now += 5.0
    assert backend.sample().samples[0].utilization_ratio == pytest.approx(0.975)
    backend.close()


def test_metric_unknown_to_this_libtpu_is_absent_and_not_asked_again(
    runtime: FakeTpuRuntime,
) -> None:
    runtime.set(HBM_BANDWIDTH, None)  # an older libtpu
    backend = _backend(runtime.address)
    for _ in range(3):
        s = backend.sample().samples[0]
        assert s.memory_bandwidth_utilization_ratio is None
        assert s.utilization_ratio == pytest.approx(0.975)
    assert runtime.requests.count(HBM_BANDWIDTH) == 1
    assert runtime.requests.count(DUTY_CYCLE) == 3
    backend.close()


def test_a_hung_service_costs_at_most_the_deadline() -> None:
    release = threading.Event()

    def hang(_name: str) -> dict[int, float | int] | None:
        release.wait(5.0)
        return {}

    server, port = serve_runtime_metrics(hang)
    try:
        backend = _backend(f"127.0.0.1:{port}", timeout_s=0.2)
        snap = backend.sample()  # returns after the 0.2 s deadline, never hangs
        assert snap.failures == () and snap.samples[0].utilization_ratio is None
        backend.close()
    finally:
        release.set()
        server.stop(None).wait(5.0)


def test_two_core_chips_sum_memory_and_report_each_tensorcore(tmp_path: Path) -> None:
    for i in range(4):  # a v3-8: 4 chips, 2 TensorCores each
        _pci(tmp_path, f"0000:00:{4 + i:02x}.0", "0x0027", subsystem_device="0x004f")
    fake = FakeTpuRuntime(
        {
            HBM_USAGE: [1 * GIB, 2 * GIB, 3 * GIB, 4 * GIB, 0, 0, 5 * GIB, 5 * GIB],  # per core
            HBM_TOTAL: [8 * GIB] * 8,
            DUTY_CYCLE: [100.0, 50.0, 0.0, 20.0],  # per chip
        }
    ).start()
    try:
        backend = TpuBackend(root=tmp_path, metrics_addr=fake.address)
        backend.open()
        assert {d.model for d in backend.inventory().devices} == {"TPU v3"}
        samples = backend.sample().samples
        assert [s.memory_used_bytes for s in samples] == [3 * GIB, 7 * GIB, 0, 10 * GIB]
        assert {s.memory_total_bytes for s in samples} == {16 * GIB}
        assert [s.utilization_ratio for s in samples] == [1.0, 0.5, 0.0, 0.2]
        backend.close()
    finally:
        fake.stop()
    per_chip, cores = _per_chip([(0, 80.0), (1, 40.0), (2, 10.0), (3, 30.0)], 2, DUTY_CYCLE)
    assert per_chip == [60.0, 20.0] and cores == [[80.0, 40.0], [10.0, 30.0]]
    assert _per_chip([(0, 1.0), (5, 2.0), (9, 3.0)], 2, DUTY_CYCLE)[0] == [None, None]


def test_chip_that_leaves_the_bus_is_lost_and_the_others_go_on(
    tmp_path: Path, runtime: FakeTpuRuntime
) -> None:
    root = tmp_path / "host"
    shutil.copytree(TPU_V5E_8, root)
    backend = TpuBackend(root=root, metrics_addr=runtime.address)
    backend.open()
    shutil.rmtree(root / "sys/bus/pci/devices/0000:00:06.0")
    snap = backend.sample()
    assert [(f.device_id, f.lost) for f in snap.failures] == [("tpu-0000:00:06.0", True)]
    assert len(snap.samples) == 7 and snap.samples[2].device_id == "tpu-0000:00:07.0"
    assert snap.samples[2].utilization_ratio == pytest.approx(0.9375)
    backend.close()


def _exported(backend: Any) -> dict[str, list[Any]]:
    reader = InMemoryMetricReader()
    telemetry = GpuTelemetry(DeviceManager([backend]), MeterProvider(metric_readers=[reader]))
    telemetry.start()
    try:
        data = reader.get_metrics_data()
    finally:
        telemetry.shutdown()
    assert data is not None
    return {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }


def test_exported_like_the_simulated_tpu_node(runtime: FakeTpuRuntime) -> None:
    ours = _exported(TpuBackend(root=TPU_V5E_8, metrics_addr=runtime.address))
    simulated = _exported(SimulatedBackend("vendor=tpu,count=8"))
    for name in (
        "hw.gpu.utilization",
        "hw.gpu.memory.usage",
        "hw.gpu.memory.limit",
        "hw.gpu.memory.utilization",
        "accel.memory.bandwidth.utilization",
        "accel.pcie.link.width",
        "accel.pcie.link.generation",
        "hw.status",
    ):
        assert name in ours, name
    for name, points in ours.items():
        assert name in simulated, name
        keys = {frozenset(p.attributes) for p in points}
        assert keys <= {frozenset(p.attributes) for p in simulated[name]}, name
        assert all(p.attributes["accel.kind"] == "tpu" for p in points)
        assert all(p.attributes["hw.vendor"] == "google" for p in points)
    util = {p.attributes["hw.name"]: p.value for p in ours["hw.gpu.utilization"]}
    assert util["gpu0"] == pytest.approx(0.975) and len(util) == 8
    for absent in ("hw.power", "hw.energy", "hw.temperature", "hw.errors"):
        assert absent not in ours


def test_exported_without_a_workload_has_no_runtime_points() -> None:
    ours = _exported(TpuBackend(root=TPU_V5E_8, metrics_addr=UNREACHABLE_ADDR))
    assert "hw.gpu.utilization" not in ours and "hw.gpu.memory.usage" not in ours
    limit = {p.value for p in ours["hw.gpu.memory.limit"]}  # the chip's data-sheet HBM
    assert limit == {16 * GIB}
    assert len(ours["hw.status"]) == 8 * 4


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "otel_gpu", *args],
        capture_output=True,
        text=True,
        env=full,
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


def test_cli_inventory_and_run_once_against_the_fakes() -> None:
    runtime, selector, env = start_fake_tpu()
    try:
        inv = _cli(env, "inventory", "--json", "--backend", selector)
        assert inv.returncode == 0, inv.stderr
        doc = json.loads(inv.stdout)
        assert [d["model"] for d in doc["devices"]] == ["TPU v5 lite"] * 8
        assert doc["resource"]["accel.device.pci_bus_ids"][0] == "0000:00:04.0"
        run = _cli(env, "run", "--once", "--exporter", "console", "--backend", selector)
        assert run.returncode == 0, run.stderr
        metrics_doc = next(d for d in _docs(run.stdout) if "resource_metrics" in d)
        metrics = {
            m["name"]: m
            for sm in metrics_doc["resource_metrics"][0]["scope_metrics"]
            for m in sm["metrics"]
        }
        points = metrics["hw.gpu.utilization"]["data"]["data_points"]
        assert {p["attributes"]["accel.kind"] for p in points} == {"tpu"}
        assert len(points) == 8
    finally:
        runtime.stop()
    # No workload: the devices are still listed, the command succeeds.
    idle = _cli(tpu_env(None), "inventory", "--json")
    assert idle.returncode == 0, idle.stderr
    assert len(json.loads(idle.stdout)["devices"]) == 8


def test_installer_points_the_default_backend_at_the_fake() -> None:
    assert tpu_scenarios() == ["tpu-v5e-8"]
    with install_tpu("tpu-v5e-8") as runtime:
        backend = TpuBackend()  # reads OTEL_GPU_HOST_ROOT / OTEL_GPU_TPU_METRICS_ADDR
        assert backend.metrics_addr == runtime.address
        backend.open()
        assert backend.sample().samples[1].utilization_ratio == pytest.approx(0.9625)
        backend.close()
    assert os.environ.get("OTEL_GPU_TPU_METRICS_ADDR") != runtime.address
    with pytest.raises(ValueError, match="unknown scenario"):
        install_tpu("tpu-v9").__enter__()
