"""The nvidia-smi fallback backend: ``nvidia-smi --query-gpu=... --format=csv``.

Used by ``--backend auto`` only when NVML cannot be initialised (the manager logs that
downgrade at WARNING with NVML's error), or when named explicitly. It has no topology (no
NVLink peers), no events, and costs one process start per sweep: fix NVML to get everything.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import ClassVar

from otel_gpu.errors import BackendUnavailable
from otel_gpu.hal.model import (
    DeviceFailure,
    DeviceInfo,
    DeviceSample,
    Inventory,
    Snapshot,
    normalize_pci_bus_id,
)
from otel_gpu.hal.protocol import Probe

__all__ = ["NvidiaSmiBackend", "parse_csv"]

_MIB = 1 << 20
STATIC_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "serial",
    "vbios_version",
    "driver_version",
    "memory.total",
    "power.default_limit",
    "pcie.link.gen.max",
    "pcie.link.width.max",
)
SAMPLE_FIELDS = (
    "uuid",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "power.draw",
    "enforced.power.limit",
    "temperature.gpu",
    "temperature.memory",
    "clocks.gr",
    "clocks.sm",
    "clocks.mem",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "pcie.link.gen.current",
    "pcie.link.width.current",
    "clocks_event_reasons.sw_power_cap",
    "clocks_event_reasons.hw_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown",
    "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown",
)
_REASONS = {
    "clocks_event_reasons.sw_power_cap": "power",
    "clocks_event_reasons.hw_slowdown": "hw_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown": "sw_thermal",
    "clocks_event_reasons.hw_thermal_slowdown": "hw_thermal",
    "clocks_event_reasons.hw_power_brake_slowdown": "hw_power_brake",
}
_MISSING = {
    "",
    "[n/a]",
    "n/a",
    "[not supported]",
    "not supported",
    "[unknown error]",
    "[gpu is lost]",
}


def parse_csv(text: str, fields: Sequence[str]) -> list[dict[str, str | None]]:
    """Rows of ``--format=csv,noheader,nounits`` output; N/A-like values become None."""
    rows = []
    for record in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not record or not any(x.strip() for x in record):
            continue
        if len(record) != len(fields):
            raise ValueError(f"expected {len(fields)} columns, got {len(record)}: {record!r}")
        rows.append(
            {
                k: (None if v.strip().lower() in _MISSING else v.strip())
                for k, v in zip(fields, record, strict=True)
            }
        )
    return rows


def _float(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    number = _float(value)
    return None if number is None else int(number)


class NvidiaSmiBackend:
    """NVIDIA GPUs through the ``nvidia-smi`` command (fallback for ``nvml``)."""

    name: ClassVar[str] = "nvidia-smi"
    auto: ClassVar[bool] = True
    fallback_for: ClassVar[str | None] = "nvml"

    def __init__(
        self, options: str | None = None, *, command: str | None = None, timeout_s: float = 10.0
    ) -> None:
        self.command = command or options or "nvidia-smi"
        self.timeout_s = timeout_s
        self._inventory: Inventory | None = None

    def _run(self, fields: Sequence[str]) -> list[dict[str, str | None]]:
        exe = shutil.which(self.command)
        if exe is None:
            raise BackendUnavailable(
                self.name, f"{self.command} not found on PATH: install the NVIDIA driver utilities"
            )
        try:
            out = subprocess.run(
                [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise BackendUnavailable(
                self.name, f"{self.command} did not answer in {self.timeout_s:g}s"
            ) from err
        if out.returncode != 0:
            message = (out.stdout + out.stderr).strip().splitlines()
            raise BackendUnavailable(
                self.name, f"{self.command} failed: {message[0] if message else out.returncode}"
            )
        try:
            return parse_csv(out.stdout, fields)
        except ValueError as err:
            raise BackendUnavailable(self.name, f"unexpected {self.command} output: {err}") from err

    def probe(self) -> Probe:
        """Run nvidia-smi once. Never raises."""
        try:
            rows = self._run(("uuid",))
        except BackendUnavailable as err:
            return Probe(False, err.reason)
        except OSError as err:
            return Probe(False, f"cannot run {self.command}: {err}")
        if not rows:
            return Probe(False, f"{self.command} lists no GPU", 0)
        return Probe(
            True, f"{self.command}: {len(rows)} GPU(s) (no topology, no events)", len(rows)
        )

    def open(self) -> None:
        """Read the static inventory."""
        rows = self._run(STATIC_FIELDS)
        devices = []
        driver = ""
        for i, row in enumerate(rows):
            driver = row["driver_version"] or driver
            bus = row["pci.bus_id"]
            limit = _float(row["power.default_limit"])
            total = _float(row["memory.total"])
            devices.append(
                DeviceInfo(
                    index=i,
                    id=row["uuid"] or f"nvidia-smi-{i}",
                    vendor="nvidia",
                    model=row["name"] or "NVIDIA GPU",
                    backend=self.name,
                    local_index=_int(row["index"]),
                    serial=row["serial"],
                    firmware_version=row["vbios_version"],
                    pci_bus_id=normalize_pci_bus_id(bus) if bus else None,
                    memory_total_bytes=int(total * _MIB) if total is not None else None,
                    power_limit_default_w=limit,
                    pcie_max_generation=_int(row["pcie.link.gen.max"]),
                    pcie_max_width=_int(row["pcie.link.width.max"]),
                )
            )
        self._inventory = Inventory(tuple(devices), {"nvidia.driver": driver} if driver else {})

    def inventory(self) -> Inventory:
        """The static inventory read at open."""
        if self._inventory is None:
            self.open()
        assert self._inventory is not None
        return self._inventory

    def sample(self) -> Snapshot:
        """One nvidia-smi run for every GPU."""
        inv = self.inventory()
        try:
            rows = {row["uuid"]: row for row in self._run(SAMPLE_FIELDS)}
        except BackendUnavailable as err:
            return Snapshot(
                time.time_ns(), (), tuple(DeviceFailure(d.id, err.reason) for d in inv.devices)
            )
        samples, failures = [], []
        for dev in inv.devices:
            row = rows.get(dev.id)
            if row is None:
                failures.append(DeviceFailure(dev.id, "missing from nvidia-smi output", lost=True))
                continue
            samples.append(_sample(dev.id, row))
        return Snapshot(time.time_ns(), tuple(samples), tuple(failures))

    def close(self) -> None:
        """Nothing to release."""


def _sample(device_id: str, row: dict[str, str | None]) -> DeviceSample:
    util, mem_util = _float(row["utilization.gpu"]), _float(row["utilization.memory"])
    used, total = _float(row["memory.used"]), _float(row["memory.total"])
    temps = {
        k: v
        for k, v in (
            ("gpu", _float(row["temperature.gpu"])),
            ("memory", _float(row["temperature.memory"])),
        )
        if v is not None
    }
    clocks = {
        k: v * 1e6
        for k, v in (
            ("graphics", _float(row["clocks.gr"])),
            ("sm", _float(row["clocks.sm"])),
            ("memory", _float(row["clocks.mem"])),
        )
        if v is not None
    }
    flags = {reason: row[field] for field, reason in _REASONS.items()}
    throttle = None
    if any(v is not None for v in flags.values()):
        throttle = frozenset(r for r, v in flags.items() if v is not None and v.lower() == "active")
    return DeviceSample(
        device_id=device_id,
        utilization_ratio=util / 100 if util is not None else None,
        memory_bandwidth_utilization_ratio=mem_util / 100 if mem_util is not None else None,
        memory_used_bytes=int(used * _MIB) if used is not None else None,
        memory_total_bytes=int(total * _MIB) if total is not None else None,
        power_w=_float(row["power.draw"]),
        power_limit_w=_float(row["enforced.power.limit"]),
        temperatures_c=temps,
        clocks_hz=clocks,
        throttle_reasons=throttle,
        ecc_corrected_total=_int(row["ecc.errors.corrected.volatile.total"]),
        ecc_uncorrected_total=_int(row["ecc.errors.uncorrected.volatile.total"]),
        pcie_generation=_int(row["pcie.link.gen.current"]),
        pcie_width=_int(row["pcie.link.width.current"]),
    )
