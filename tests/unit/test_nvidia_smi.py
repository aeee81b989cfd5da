"""The nvidia-smi fallback backend, against a fake nvidia-smi executable, and the loud fallback."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_gpu.backends.nvidia_smi import NvidiaSmiBackend, parse_csv
from otel_gpu.backends.nvml import NvmlBackend
from otel_gpu.errors import BackendUnavailable
from otel_gpu.hal import DeviceManager, Registry
from otel_gpu.testing.fake_nvidia_smi import DEFAULT_GPUS, write_fake


def test_parse_csv_maps_not_available_to_none() -> None:
    rows = parse_csv("1, [N/A], [Not Supported], 3.5\n\n", ("a", "b", "c", "d"))
    assert rows == [{"a": "1", "b": None, "c": None, "d": "3.5"}]
    with pytest.raises(ValueError, match="expected 2 columns"):
        parse_csv("1, 2, 3\n", ("a", "b"))


def test_inventory_and_sample_from_the_fake(tmp_path: Path) -> None:
    exe = write_fake(tmp_path)
    backend = NvidiaSmiBackend(command=str(exe))
    assert backend.probe().available
    backend.open()
    inv = backend.inventory()
    assert [d.id for d in inv.devices] == [g["uuid"] for g in DEFAULT_GPUS]
    assert inv.devices[1].pci_bus_id == "0000:0f:00.0"
    assert inv.devices[0].memory_total_bytes == 40960 * 2**20
    assert inv.versions["nvidia.driver"] == "535.161.08"
    assert inv.devices[0].links == ()  # no topology through nvidia-smi
    by_id = backend.sample().by_id()
    s0, s1 = (by_id[d.id] for d in inv.devices)
    assert s0.utilization_ratio == 0.1 and s1.utilization_ratio == 0.2
    assert s0.power_w == 60.5 and s0.power_limit_w == 400.0
    assert s0.temperatures_c == {"gpu": 30.0, "memory": 40.0}
    assert s1.temperatures_c == {"gpu": 31.0}  # [N/A] is absent, not 0
    assert s1.ecc_uncorrected_total is None  # [Not Supported]
    assert s0.clocks_hz["graphics"] == 1410e6
    assert s1.throttle_reasons == frozenset({"power"}) and s0.throttle_reasons == frozenset()
    assert s0.memory_used_bytes == 1000 * 2**20


def test_unavailable_reasons(tmp_path: Path) -> None:
    missing = NvidiaSmiBackend(command=str(tmp_path / "nowhere" / "nvidia-smi"))
    assert "not found" in missing.probe().reason
    broken = NvidiaSmiBackend(command=str(write_fake(tmp_path / "b", mode="fail")))
    probe = broken.probe()
    assert not probe.available and "couldn't communicate with the NVIDIA driver" in probe.reason
    slow = NvidiaSmiBackend(command=str(write_fake(tmp_path / "h", mode="hang")), timeout_s=0.5)
    assert "did not answer" in slow.probe().reason


def test_a_failing_nvidia_smi_marks_the_devices_failed(tmp_path: Path) -> None:
    exe = write_fake(tmp_path)
    backend = NvidiaSmiBackend(command=str(exe))
    backend.open()
    write_fake(tmp_path, mode="fail")  # the driver breaks after start
    snap = backend.sample()
    assert snap.samples == () and len(snap.failures) == 2
    assert all(not f.lost for f in snap.failures)


class _Fallback(NvidiaSmiBackend):
    """nvidia-smi pointed at the fake (the registry instantiates backends with no options)."""

    command_path = ""

    def __init__(self, options: str | None = None) -> None:
        super().__init__(command=self.command_path)


def test_auto_falls_back_loudly_and_an_explicit_nvml_never_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _Fallback.command_path = str(write_fake(tmp_path))
    registry = Registry({"nvml": NvmlBackend, "nvidia-smi": _Fallback})  # type: ignore[dict-item]
    with caplog.at_level(logging.WARNING):
        manager = DeviceManager.from_selector("auto", registry)
    assert [b.name for b in manager.backends] == ["nvidia-smi"]
    warning = next(r.getMessage() for r in caplog.records if "falling back" in r.getMessage())
    assert "from nvml to nvidia-smi" in warning
    assert "libnvidia-ml.so.1 not found" in warning  # NVML's own reason is kept
    with pytest.raises(BackendUnavailable, match=r"libnvidia-ml\.so\.1"):
        DeviceManager.from_selector("nvml", registry)


def test_cli_auto_on_a_node_with_only_nvidia_smi(tmp_path: Path) -> None:
    write_fake(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PATH"] = f"{tmp_path}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        [sys.executable, "-m", "otel_gpu", "run", "--once", "--exporter", "console"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "falling back from nvml to nvidia-smi" in warnings[0]
    assert '"name": "hw.power"' in result.stdout
