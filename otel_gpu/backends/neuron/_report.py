"""The shapes the Neuron tools print, read into plain values (no process handling here).

``neuron-monitor`` writes one JSON report per line (AWS Neuron docs, "Neuron Monitor User
Guide", ``tools/neuron-sys-tools/neuron-monitor-user-guide.rst``)::

    {"neuron_runtime_data": [            # one entry per Neuron application (may be null)
        {"pid": 1234, "neuron_runtime_tag": "1234", "error": "",
         "report": {
            "neuroncore_counters": {"neuroncores_in_use": {"0": {"neuroncore_utilization": 42.0}},
                                    "error": ""},
            "memory_used": {"neuron_runtime_used_bytes": {
                "host": ..., "neuron_device": ...,
                "usage_breakdown": {"neuroncore_memory_usage": {"0": {"constants": ..., ...}}}},
                            "error": ""}}}],
     "system_data": {"neuron_hw_counters": {"neuron_devices": [
        {"neuron_device_index": 0, "mem_ecc_corrected": 0, "mem_ecc_uncorrected": 0,
         "sram_ecc_corrected": 0, "sram_ecc_uncorrected": 0}], "error": ""}},
     "neuron_hardware_info": {"neuron_device_type": "trainium", "neuron_device_count": 16,
                              "neuroncore_per_device_count": 2,
                              "neuron_device_memory_size": 34359738368, "error": ""}}

NeuronCore keys are node-wide core indices; utilization is in percent over the report's period.
The ECC figures are the events *of the period* (AWS's own ``neuron-monitor-prometheus.py``
adds each report's figures to a counter), so the backend sums them into totals.

``neuron-ls --json-output`` prints a list of devices (an object with ``neuron_devices`` is
accepted too)::

    [{"neuron_device": 0, "bdf": "0000:00:1e.0", "cpu_affinity": "0-7", "numa_node": "-1",
      "connected_to": null, "nc_count": 2, "memory_size": 34359738368,
      "neuroncore_ids": [0, 1], "neuron_processes": []}]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_gpu.hal.model import normalize_pci_bus_id

__all__ = [
    "CoreMap",
    "DeviceUsage",
    "HardwareInfo",
    "LsDevice",
    "ecc_deltas",
    "hardware_info",
    "model_name",
    "parse_neuron_ls",
    "usage",
]

_MODELS = {
    "inferentia": "Inferentia",
    "inferentia2": "Inferentia2",
    "trainium": "Trainium1",
    "trainium1": "Trainium1",
    "trainium2": "Trainium2",
    "trainium3": "Trainium3",
}


def model_name(device_type: str | None) -> str | None:
    """``"trainium"`` -> ``"Trainium1"`` (the name the driver's sysfs uses)."""
    if not device_type:
        return None
    key = device_type.strip().lower()
    return _MODELS.get(key, device_type.strip().capitalize())


@dataclass(frozen=True, slots=True)
class HardwareInfo:
    """``neuron_hardware_info`` of a report."""

    device_count: int | None = None
    cores_per_device: int | None = None
    memory_bytes: int | None = None
    device_type: str | None = None


def hardware_info(report: Mapping[str, Any]) -> HardwareInfo | None:
    """The report's hardware description, or None when absent or in error."""
    info = report.get("neuron_hardware_info")
    if not isinstance(info, Mapping) or info.get("error"):
        return None
    device_type = info.get("neuron_device_type")
    return HardwareInfo(
        device_count=_int(info.get("neuron_device_count")),
        cores_per_device=_int(info.get("neuroncore_per_device_count")),
        memory_bytes=_int(info.get("neuron_device_memory_size")),
        device_type=device_type if isinstance(device_type, str) else None,
    )


@dataclass(frozen=True, slots=True)
class LsDevice:
    """One device of ``neuron-ls --json-output``."""

    index: int
    bdf: str | None
    numa_node: int | None
    cpu_affinity: str | None
    connected_to: tuple[int, ...]
    core_count: int | None
    memory_bytes: int | None
    core_ids: tuple[int, ...]


def parse_neuron_ls(doc: Any) -> list[LsDevice]:
    """The devices of a ``neuron-ls --json-output`` document, by device index.

    Raises ``ValueError`` when the document has no device list.
    """
    items = doc.get("neuron_devices") if isinstance(doc, Mapping) else doc
    if not isinstance(items, list):
        raise ValueError("neuron-ls JSON has no device list")
    devices: list[LsDevice] = []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        index = _int(item.get("neuron_device"))
        if index is None:
            continue
        bdf = item.get("bdf")
        try:
            bus = normalize_pci_bus_id(bdf) if isinstance(bdf, str) else None
        except ValueError:
            bus = None
        numa = _int(item.get("numa_node"))
        affinity = item.get("cpu_affinity")
        devices.append(
            LsDevice(
                index=index,
                bdf=bus,
                numa_node=numa if numa is not None and numa >= 0 else None,
                cpu_affinity=affinity if isinstance(affinity, str) and affinity else None,
                connected_to=tuple(
                    p for p in (_int(x) for x in item.get("connected_to") or ()) if p is not None
                ),
                core_count=_int(item.get("nc_count")),
                memory_bytes=_int(item.get("memory_size")),
                core_ids=tuple(
                    c for c in (_int(x) for x in item.get("neuroncore_ids") or ()) if c is not None
                ),
            )
        )
    return sorted(devices, key=lambda d: d.index)


@dataclass(frozen=True, slots=True)
class CoreMap:
    """Where each node-wide NeuronCore index lives: ``core -> (device index, local index)``."""

    cores: Mapping[int, tuple[int, int]]
    cores_per_device: Mapping[int, int]

    @classmethod
    def build(cls, layout: Mapping[int, tuple[int, ...]]) -> CoreMap:
        """From each device's node-wide core ids, in local order."""
        cores = {
            core: (device, local)
            for device, ids in layout.items()
            for local, core in enumerate(ids)
        }
        return cls(cores, {device: len(ids) for device, ids in layout.items()})

    def place(self, key: Any) -> tuple[int, int] | None:
        """``(device, local core)`` of a core key of a report (``"0"``), or None."""
        core = _int(key)
        return None if core is None else self.cores.get(core)


@dataclass
class DeviceUsage:
    """Utilization and memory of one device in one report (None: unknown)."""

    cores: dict[int, float] = field(default_factory=dict)
    memory_used_bytes: int | None = None


def usage(report: Mapping[str, Any], cores: CoreMap) -> dict[int, DeviceUsage]:
    """Per-device NeuronCore utilization (0..1, by local core) and device memory in use.

    A core no application uses is idle (0.0) and a device no application uses has 0 bytes in
    use: the report covers every application. When an application's entry (or one of its
    groups) is in error, what it would have said is unknown: the cores it reported stay, the
    rest are left out, and device memory is unknown.
    """
    util: dict[int, dict[int, float]] = {d: {} for d in cores.cores_per_device}
    memory: dict[int, int] = {}
    util_complete = memory_complete = True
    runtimes = report.get("neuron_runtime_data") or []
    if not isinstance(runtimes, list):
        runtimes, util_complete, memory_complete = [], False, False
    for runtime in runtimes:
        if not isinstance(runtime, Mapping) or runtime.get("error"):
            util_complete = memory_complete = False
            continue
        groups = runtime.get("report")
        if not isinstance(groups, Mapping):
            util_complete = memory_complete = False
            continue
        counters = groups.get("neuroncore_counters")
        in_use: Mapping[str, Any] = {}
        if isinstance(counters, Mapping) and not counters.get("error"):
            found = counters.get("neuroncores_in_use")
            in_use = found if isinstance(found, Mapping) else {}
        else:
            util_complete = False
        for key, data in in_use.items():
            place = cores.place(key)
            pct = _float(data.get("neuroncore_utilization")) if isinstance(data, Mapping) else None
            if place is None or pct is None:
                continue
            device, local = place
            ratio = min(1.0, max(0.0, pct / 100.0))
            util[device][local] = max(ratio, util[device].get(local, 0.0))
        if not _add_memory(groups.get("memory_used"), in_use, cores, memory):
            memory_complete = False
    out: dict[int, DeviceUsage] = {}
    for device, count in cores.cores_per_device.items():
        known = util[device]
        per_core = {c: known.get(c, 0.0) for c in range(count)} if util_complete else known
        used = memory.get(device, 0) if memory_complete else None
        out[device] = DeviceUsage(per_core, used)
    return out


def _add_memory(
    group: Any, in_use: Mapping[str, Any], cores: CoreMap, memory: dict[int, int]
) -> bool:
    """Add one application's device memory to ``memory``; False when it cannot be placed."""
    if not isinstance(group, Mapping) or group.get("error"):
        return False
    used = group.get("neuron_runtime_used_bytes")
    if not isinstance(used, Mapping):
        return False
    split = used.get("usage_breakdown")
    breakdown = split.get("neuroncore_memory_usage") if isinstance(split, Mapping) else None
    if isinstance(breakdown, Mapping):
        for key, categories in breakdown.items():
            place = cores.place(key)
            if place is None or not isinstance(categories, Mapping):
                continue
            in_core = sum(v for v in (_int(x) for x in categories.values()) if v is not None)
            memory[place[0]] = memory.get(place[0], 0) + in_core
        return True
    # No per-core breakdown: the total can be placed only when the application uses one device.
    total = _int(used.get("neuron_device"))
    if total is None:
        return False
    devices = {place[0] for place in (cores.place(k) for k in in_use) if place is not None}
    if total == 0:
        return True
    if len(devices) != 1:
        return False
    device = devices.pop()
    memory[device] = memory.get(device, 0) + total
    return True


def ecc_deltas(report: Mapping[str, Any]) -> dict[int, tuple[int, int]] | None:
    """ECC events of the report's period by device index: ``(corrected, uncorrected)``, DRAM
    and SRAM together. None when the report has no (or a failed) ``neuron_hw_counters``."""
    system = report.get("system_data")
    counters = system.get("neuron_hw_counters") if isinstance(system, Mapping) else None
    if not isinstance(counters, Mapping) or counters.get("error"):
        return None
    out: dict[int, tuple[int, int]] = {}
    items = counters.get("neuron_devices")
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, Mapping):
            continue
        index = _int(item.get("neuron_device_index"))
        if index is None:
            continue
        corrected = _sum(item, "mem_ecc_corrected", "sram_ecc_corrected")
        uncorrected = _sum(item, "mem_ecc_uncorrected", "sram_ecc_uncorrected")
        out[index] = (corrected, uncorrected)
    return out


def _sum(item: Mapping[str, Any], *keys: str) -> int:
    return sum(max(0, v) for v in (_int(item.get(k)) for k in keys) if v is not None)


def _int(value: Any) -> int | None:
    """An int from a JSON number or decimal string (``numa_node`` is ``"-1"``); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None
