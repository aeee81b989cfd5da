"""The NVIDIA backend, on NVML through pynvml (``nvidia-ml-py``).

Static facts are read once at :meth:`NvmlBackend.open`: identity, PCI address, NUMA node, CPU
affinity, limits, MIG instances and the NVLink topology (second pass: a link's peer may be
enumerated after it). Each sweep then reads every device with few calls (DESIGN §9):

====================================  =========================================================
hot path, every sweep                 ``nvmlDeviceGetFieldValues`` (one batch: energy, power,
                                      enforced limit, memory temperature, volatile ECC, PCIe
                                      bytes and replays, remapped rows, throttle-time counters,
                                      per-link NVLink state/bytes/errors), utilization rates,
                                      memory info v2, GPU temperature, graphics clock
slow path, every ``slow_every`` sweeps encoder/decoder utilization, SM and memory clocks, PCIe
                                      generation and width, running processes (when enabled)
====================================  =========================================================

Throttle reasons come from the growth of the driver's throttle-time counters between sweeps
(so a short throttle between two sweeps is not missed); where the driver lacks them, from the
instantaneous clocks-event-reasons bitmask. A device whose calls return ``GpuIsLost`` is
reported lost (its MIG instances with it) while the others go on; it is probed again with
exponential backoff and comes back when it answers. Xid and ECC events are read by a thread
waiting on ``nvmlEventSetWait_v2`` and delivered at once.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from otel_gpu.backends._common import LibraryBackend, LostState
from otel_gpu.backends.nvml._lib import Nvml, NvmlCallError
from otel_gpu.errors import DeviceLost, OtelGpuError
from otel_gpu.hal.model import (
    DeviceFailure,
    DeviceInfo,
    DeviceSample,
    HealthEvent,
    HealthState,
    Inventory,
    LinkInfo,
    LinkSample,
    ProcessSample,
    Severity,
    normalize_pci_bus_id,
)
from otel_gpu.hal.protocol import EventSink, Probe

__all__ = ["NvmlBackend", "cpu_list", "cuda_version"]

_log = logging.getLogger(__name__)
_MIB = 1 << 20

# Device-scoped fields read in the one nvmlDeviceGetFieldValues batch: name -> our key.
_DEVICE_FIELDS = (
    ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_mj"),
    ("NVML_FI_DEV_POWER_INSTANT", "power_mw"),
    ("NVML_FI_DEV_POWER_CURRENT_LIMIT", "power_limit_mw"),
    ("NVML_FI_DEV_MEMORY_TEMP", "memory_temp_c"),
    ("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_corrected"),
    ("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_uncorrected"),
    ("NVML_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replay"),
    ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "pcie_tx"),
    ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", "pcie_rx"),
    ("NVML_FI_DEV_REMAPPED_COR", "remapped_cor"),
    ("NVML_FI_DEV_REMAPPED_UNC", "remapped_unc"),
    ("NVML_FI_DEV_REMAPPED_PENDING", "remapped_pending"),
    ("NVML_FI_DEV_REMAPPED_FAILURE", "remapped_failure"),
    ("NVML_FI_DEV_RETIRED_SBE", "retired_sbe"),
    ("NVML_FI_DEV_RETIRED_DBE", "retired_dbe"),
    ("NVML_FI_DEV_RETIRED_PENDING", "retired_pending"),
    ("NVML_FI_DEV_PERF_POLICY_POWER", "throttle_ns:power"),
    ("NVML_FI_DEV_PERF_POLICY_THERMAL", "throttle_ns:thermal"),
    ("NVML_FI_DEV_PERF_POLICY_SYNC_BOOST", "throttle_ns:sync_boost"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN", "throttle_ns:sw_thermal"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", "throttle_ns:hw_thermal"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN", "throttle_ns:hw_power_brake"),
)
# Link-scoped fields (scopeId = link index).
_LINK_FIELDS = (
    ("NVML_FI_DEV_NVLINK_GET_STATE", "state"),
    ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "tx_kib"),
    ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", "rx_kib"),
    ("NVML_FI_DEV_NVLINK_ERROR_DL_CRC", "err:crc"),
    ("NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY", "err:replay"),
    ("NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY", "err:recovery"),
)
# clocks-event-reasons bitmask (fallback when the throttle-time counters are missing).
_REASON_BITS = (
    ("nvmlClocksEventReasonGpuIdle", "idle"),
    ("nvmlClocksEventReasonApplicationsClocksSetting", "apps_clocks"),
    ("nvmlClocksEventReasonSwPowerCap", "power"),
    ("nvmlClocksEventReasonHwSlowdown", "hw_slowdown"),
    ("nvmlClocksEventReasonSyncBoost", "sync_boost"),
    ("nvmlClocksEventReasonSwThermalSlowdown", "sw_thermal"),
    ("nvmlClocksEventReasonHwThermalSlowdown", "hw_thermal"),
    ("nvmlClocksEventReasonHwPowerBrakeSlowdown", "hw_power_brake"),
)


def cuda_version(raw: int) -> str:
    """NVML's CUDA driver version integer as text: ``12040`` -> ``"12.4"``."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def cpu_list(masks: list[int]) -> str:
    """64-bit CPU masks (NVML's cpuSet) as a Linux cpu list: ``[0xff]`` -> ``"0-7"``."""
    cpus = [w * 64 + b for w, mask in enumerate(masks) for b in range(64) if mask >> b & 1]
    ranges: list[str] = []
    start = prev = None
    for cpu in [*cpus, None]:
        if start is not None and (cpu is None or cpu != (prev or 0) + 1):
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if cpu is not None and start is None:
            start = cpu
        prev = cpu
    return ",".join(ranges)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Device:
    """Per-device state kept between sweeps."""

    info: DeviceInfo
    handle: Any
    children: list[tuple[DeviceInfo, Any]] = field(default_factory=list)
    links: tuple[int, ...] = ()
    fields: list[Any] = field(default_factory=list)
    field_keys: list[tuple[str, int | None]] = field(default_factory=list)
    throttle_ns: dict[str, float] = field(default_factory=dict)
    slow: dict[str, Any] = field(default_factory=dict)
    lost: LostState = field(default_factory=LostState)


class NvmlBackend(LibraryBackend):
    """NVIDIA GPUs through NVML. ``sysfs_root`` is where ``sys/bus/pci`` is read (tests);
    ``slow_every`` sets how many sweeps pass between slow-path reads; ``clock`` is monotonic
    seconds (backoff)."""

    name: ClassVar[str] = "nvml"
    call_error: ClassVar[type[Exception]] = NvmlCallError
    auto: ClassVar[bool] = True
    fallback_for: ClassVar[str | None] = None

    @property
    def library(self) -> Nvml:
        """The vendor library handle."""
        return self.nvml

    def __init__(
        self,
        options: str | None = None,
        *,
        sysfs_root: Path = Path("/"),
        slow_every: int = 6,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(options, sysfs_root=sysfs_root, slow_every=slow_every, clock=clock)
        self.nvml = Nvml()
        self._devices: list[_Device] = []
        self._events: _EventThread | None = None
        self._value_members: dict[int, str] | None = None
        self._gpu_is_lost = 15

    # -- lifecycle ---------------------------------------------------------------------------

    def probe(self) -> Probe:
        """Initialise NVML and count devices. Never raises."""
        nvml = Nvml()
        try:
            nvml.start()
            count = int(nvml.call("nvmlDeviceGetCount"))
        except OtelGpuError as err:
            return Probe(False, getattr(err, "reason", str(err)))
        except Exception as err:
            return Probe(False, f"NVML probe failed: {type(err).__name__}: {err}")
        finally:
            nvml.stop()
        if count == 0:
            return Probe(False, "NVML found no NVIDIA GPU", 0)
        return Probe(True, f"NVML: {count} GPU(s)", count)

    # -- inventory ---------------------------------------------------------------------------

    def _read_inventory(self) -> Inventory:
        n = self.nvml
        count = int(n.call("nvmlDeviceGetCount"))
        versions = {"nvidia.driver": _text(n.call("nvmlSystemGetDriverVersion"))}
        cuda = n.try_call("nvmlSystemGetCudaDriverVersion")
        if cuda:
            versions["cuda"] = cuda_version(int(cuda))
        self._devices = []
        children: list[DeviceInfo] = []
        for i in range(count):
            handle = n.call("nvmlDeviceGetHandleByIndex", i)
            try:
                dev = _Device(self._static(i, handle), handle)
            except DeviceLost as err:  # lost before we could read it: keep its place, say so
                try:
                    uuid = _opt_text(n.call("nvmlDeviceGetUUID", handle))
                except OtelGpuError:
                    uuid = None
                info = DeviceInfo(
                    index=i,
                    id=uuid or f"nvml-gpu-{i}",
                    vendor="nvidia",
                    model="unknown (GPU lost)",
                    backend=self.name,
                    local_index=i,
                )
                dev = _Device(info, handle)
                self._mark_lost(dev, err.reason, self._clock())
            self._devices.append(dev)
        by_bus = {d.info.pci_bus_id: d.info.index for d in self._devices}
        for dev in self._devices:
            links = self._links(dev, by_bus)
            dev.info = _replace(dev.info, links=links)
            dev.links = tuple(link.index for link in links)
            self._prepare_fields(dev)
        index = count
        for dev in self._devices:
            for child_info, child_handle in self._mig_children(dev, index):
                dev.children.append((child_info, child_handle))
                children.append(child_info)
                index += 1
        return Inventory(tuple([d.info for d in self._devices] + children), versions)

    def _static(self, i: int, h: Any) -> DeviceInfo:
        n = self.nvml
        uuid = _text(n.call("nvmlDeviceGetUUID", h))
        q = {"device": uuid}
        pci = n.try_call("nvmlDeviceGetPciInfo", h, **q)
        bus = None
        if pci is not None:
            try:
                bus = normalize_pci_bus_id(_text(pci.busId))
            except ValueError:
                _log.warning("GPU %d: unparsable PCI bus id %r", i, pci.busId)
        memory = self._memory(h, uuid)
        limits = n.try_call("nvmlDeviceGetPowerManagementLimitConstraints", h, **q)
        default_limit = n.try_call("nvmlDeviceGetPowerManagementDefaultLimit", h, **q)
        cc = n.try_call("nvmlDeviceGetCudaComputeCapability", h, **q)
        mig = n.try_call("nvmlDeviceGetMigMode", h, **q)
        affinity = n.try_call(
            "nvmlDeviceGetCpuAffinity", h, max(1, math.ceil((os.cpu_count() or 1) / 64)), **q
        )
        slowdown = n.try_call(
            "nvmlDeviceGetTemperatureThreshold",
            h,
            n.const("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1),
            device=uuid,
            quantity="temp_threshold_slowdown",
        )
        shutdown = n.try_call(
            "nvmlDeviceGetTemperatureThreshold",
            h,
            n.const("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0),
            device=uuid,
            quantity="temp_threshold_shutdown",
        )
        return DeviceInfo(
            index=i,
            id=uuid,
            vendor="nvidia",
            model=_text(n.call("nvmlDeviceGetName", h)),
            backend=self.name,
            local_index=i,
            serial=_opt_text(n.try_call("nvmlDeviceGetSerial", h, **q)),
            firmware_version=_opt_text(n.try_call("nvmlDeviceGetVbiosVersion", h, **q)),
            board_part_number=_opt_text(n.try_call("nvmlDeviceGetBoardPartNumber", h, **q)),
            pci_bus_id=bus,
            numa_node=self._numa(h, uuid, bus),
            cpu_affinity=(cpu_list(list(affinity)) or None) if affinity is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            power_limit_default_w=default_limit / 1000 if default_limit else None,
            power_limit_min_w=limits[0] / 1000 if limits else None,
            power_limit_max_w=limits[1] / 1000 if limits else None,
            compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
            mig_mode=bool(mig[0]) if mig else None,
            pcie_max_generation=n.try_call("nvmlDeviceGetMaxPcieLinkGeneration", h, **q),
            pcie_max_width=n.try_call("nvmlDeviceGetMaxPcieLinkWidth", h, **q),
            temperature_slowdown_c=float(slowdown) if slowdown is not None else None,
            temperature_shutdown_c=float(shutdown) if shutdown is not None else None,
        )

    def _memory(self, handle: Any, device: str) -> Any:
        """Memory info v2 (used excludes driver-reserved memory), v1 on older drivers."""
        n = self.nvml
        v2 = n.const("nvmlMemory_v2")
        if v2 is not None and n.supported(device, "memory_v2"):
            info = n.call(
                "nvmlDeviceGetMemoryInfo", handle, v2, device=device, quantity="memory_v2"
            )
            if info is not None:
                return info
        return n.call("nvmlDeviceGetMemoryInfo", handle, device=device, quantity="memory")

    def _numa(self, handle: Any, device: str, bus: str | None) -> int | None:
        """Host NUMA node: sysfs ``numa_node`` of the PCI device, else NVML (C2C systems)."""
        if bus is not None:
            path = self._root / "sys/bus/pci/devices" / bus / "numa_node"
            try:
                node = int(path.read_text().strip())
                return node if node >= 0 else None
            except (OSError, ValueError):
                pass
        node = self.nvml.try_call("nvmlDeviceGetNumaNodeId", handle, device=device)
        return int(node) if node is not None and node >= 0 else None

    def _links(self, dev: _Device, by_bus: dict[str | None, int]) -> tuple[LinkInfo, ...]:
        n, h, uuid = self.nvml, dev.handle, dev.info.id
        links: list[LinkInfo] = []
        switch_type = n.const("NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        gpu_type = n.const("NVML_NVLINK_DEVICE_TYPE_GPU", 0)
        for link in range(int(n.const("NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = n.call("nvmlDeviceGetNvLinkState", h, link, device=uuid, quantity="nvlink")
            except NvmlCallError as err:
                if err.code == n.const("NVML_ERROR_INVALID_ARGUMENT"):
                    break  # past the last link
                raise
            if state is None:
                break  # no NVLink on this GPU
            remote_bus = None
            pci = n.try_call(
                "nvmlDeviceGetNvLinkRemotePciInfo",
                h,
                link,
                device=uuid,
                quantity="nvlink_remote_pci",
            )
            if pci is not None:
                try:
                    remote_bus = normalize_pci_bus_id(_text(pci.busId))
                except ValueError:
                    remote_bus = None
            rtype = n.try_call(
                "nvmlDeviceGetNvLinkRemoteDeviceType",
                h,
                link,
                device=uuid,
                quantity="nvlink_remote_type",
            )
            peer = by_bus.get(remote_bus)
            if rtype is None:  # older drivers: a bus id that is not one of our GPUs is a switch
                kind = "gpu" if peer is not None else ("switch" if remote_bus else "unknown")
            else:
                kind = (
                    "switch" if rtype == switch_type else "gpu" if rtype == gpu_type else "unknown"
                )
            links.append(
                LinkInfo(
                    index=link,
                    link_type="nvlink",
                    up=bool(state),
                    remote_kind=kind,
                    remote_pci_bus_id=remote_bus,
                    remote_device_index=peer if kind == "gpu" else None,
                    remote_id=remote_bus if kind == "switch" else None,
                )
            )
        return tuple(links)

    def _mig_children(self, dev: _Device, first_index: int) -> list[tuple[DeviceInfo, Any]]:
        if not dev.info.mig_mode:
            return []
        n, parent = self.nvml, dev.info
        out: list[tuple[DeviceInfo, Any]] = []
        count = n.try_call("nvmlDeviceGetMaxMigDeviceCount", dev.handle, device=parent.id) or 0
        for j in range(int(count)):
            try:
                h = n.call(
                    "nvmlDeviceGetMigDeviceHandleByIndex",
                    dev.handle,
                    j,
                    device=parent.id,
                    quantity="mig_handle",
                )
            except NvmlCallError as err:
                if err.code == n.const("NVML_ERROR_NOT_FOUND"):
                    continue  # an empty MIG slot
                raise
            if h is None:
                break
            uuid = _text(n.call("nvmlDeviceGetUUID", h))
            mem = n.try_call("nvmlDeviceGetMemoryInfo", h, device=uuid)
            gi = n.try_call("nvmlDeviceGetGpuInstanceId", h, device=uuid)
            ci = n.try_call("nvmlDeviceGetComputeInstanceId", h, device=uuid)
            total = int(mem.total) if mem is not None else None
            name = _opt_text(n.try_call("nvmlDeviceGetName", h, device=uuid)) or parent.model
            out.append(
                (
                    DeviceInfo(
                        index=first_index + len(out),
                        id=uuid,
                        vendor="nvidia",
                        model=name,
                        backend=self.name,
                        local_index=first_index + len(out),
                        parent_id=parent.id,
                        pci_bus_id=parent.pci_bus_id,
                        numa_node=parent.numa_node,
                        cpu_affinity=parent.cpu_affinity,
                        memory_total_bytes=total,
                        extra={"mig.gpu_instance_id": str(gi), "mig.compute_instance_id": str(ci)},
                    ),
                    h,
                )
            )
        return out

    def _prepare_fields(self, dev: _Device) -> None:
        """The field-id batch of a device, built once (fields this pynvml lacks are skipped)."""
        n = self.nvml
        dev.fields, dev.field_keys = [], []
        for const, key in _DEVICE_FIELDS:
            fid = n.const(const)
            if fid is not None:
                dev.fields.append(fid)
                dev.field_keys.append((key, None))
        for link in dev.links:
            for const, key in _LINK_FIELDS:
                fid = n.const(const)
                if fid is not None:
                    dev.fields.append((fid, link))
                    dev.field_keys.append((key, link))

    # -- sampling ----------------------------------------------------------------------------

    def _units(self) -> list[_Device]:
        return self._devices

    def _read_unit(self, unit: _Device, slow: bool) -> list[DeviceSample]:
        sample = self._sample_device(unit, slow)
        return [sample] + [self._sample_mig(child, handle) for child, handle in unit.children]

    def _unit_failures(self, dev: _Device, reason: str, lost: bool) -> list[DeviceFailure]:
        prefix = "parent GPU lost: " if lost else "parent GPU unreadable: "
        return [DeviceFailure(dev.info.id, reason, lost=lost)] + [
            DeviceFailure(child.id, prefix + reason, lost=lost) for child, _ in dev.children
        ]

    def _retry_lost(self, dev: _Device, now: float) -> bool:
        """Probe a lost GPU again when its backoff has passed; True when it answers."""
        if not dev.lost.due(now):
            return False
        try:
            handle = self.nvml.call(
                "nvmlDeviceGetHandleByUUID",
                dev.info.id,
                device=dev.info.id,
                quantity="handle_by_uuid",
            )
            if handle is None:
                handle = dev.handle
            self.nvml.call("nvmlDeviceGetUUID", handle, device=dev.info.id, quantity="uuid")
        except (DeviceLost, NvmlCallError) as err:
            self._mark_lost(dev, str(err), now)
            return False
        dev.lost.recovered(f"{dev.info.name} ({dev.info.id})")
        dev.handle = handle
        dev.throttle_ns.clear()
        return True

    def _field_values(self, dev: _Device) -> dict[tuple[str, int | None], float]:
        n = self.nvml
        if not dev.fields:
            return {}
        values = n.call(
            "nvmlDeviceGetFieldValues",
            dev.handle,
            dev.fields,
            device=dev.info.id,
            quantity="field_values",
        )
        if values is None:
            return {}
        out: dict[tuple[str, int | None], float] = {}
        union_member = self._union_members()
        for key, value in zip(dev.field_keys, values, strict=False):
            ret = value.nvmlReturn
            if ret == 0:  # NVML_SUCCESS
                out[key] = float(getattr(value.value, union_member[value.valueType]))
            elif ret == self._gpu_is_lost:
                raise DeviceLost(dev.info.id, "GPU is lost (field values)")
        return out

    def _union_members(self) -> dict[int, str]:
        """nvmlValue_t union member by NVML_VALUE_TYPE_* (looked up once)."""
        if self._value_members is None:
            n = self.nvml
            self._gpu_is_lost = n.const("NVML_ERROR_GPU_IS_LOST", 15)
            members = {}
            for const, default, member in _VALUE_TYPES:
                members[int(n.const(const, default))] = member
            self._value_members = members
        return self._value_members

    def _sample_device(self, dev: _Device, slow: bool) -> DeviceSample:
        n, h, uuid = self.nvml, dev.handle, dev.info.id
        f = self._field_values(dev)
        util = n.call("nvmlDeviceGetUtilizationRates", h, device=uuid, quantity="utilization")
        memory = self._memory(h, uuid)
        gpu_temp = n.call(
            "nvmlDeviceGetTemperature",
            h,
            n.const("NVML_TEMPERATURE_GPU", 0),
            device=uuid,
            quantity="temperature",
        )
        graphics = n.call(
            "nvmlDeviceGetClockInfo",
            h,
            n.const("NVML_CLOCK_GRAPHICS", 0),
            device=uuid,
            quantity="clock_graphics",
        )
        power_mw = f.get(("power_mw", None))
        energy = f.get(("energy_mj", None))
        limit = f.get(("power_limit_mw", None))
        # Drivers without a field (or without nvmlDeviceGetFieldValues): the one-value calls,
        # asked only while they are supported.
        if power_mw is None:
            power_mw = n.call("nvmlDeviceGetPowerUsage", h, device=uuid, quantity="power_usage")
        if energy is None:
            energy = n.call(
                "nvmlDeviceGetTotalEnergyConsumption", h, device=uuid, quantity="energy"
            )
        if limit is None:
            limit = n.call(
                "nvmlDeviceGetEnforcedPowerLimit", h, device=uuid, quantity="enforced_limit"
            )
        if slow:
            dev.slow = self._slow_reads(dev)
        temps: dict[str, float] = {}
        if gpu_temp is not None:
            temps["gpu"] = float(gpu_temp)
        if ("memory_temp_c", None) in f and f["memory_temp_c", None] > 0:
            temps["memory"] = f["memory_temp_c", None]
        clocks: dict[str, float] = {}
        if graphics is not None:
            clocks["graphics"] = graphics * 1e6
        for domain in ("sm", "memory"):
            if dev.slow.get(domain) is not None:
                clocks[domain] = dev.slow[domain] * 1e6
        retired: dict[str, int] = {}
        if ("remapped_cor", None) in f or ("remapped_unc", None) in f:
            retired["remapped"] = int(
                f.get(("remapped_cor", None), 0) + f.get(("remapped_unc", None), 0)
            )
            retired["pending"] = int(f.get(("remapped_pending", None), 0))
            retired["failed"] = int(f.get(("remapped_failure", None), 0))
        if ("retired_sbe", None) in f or ("retired_dbe", None) in f:  # page retirement (pre-A100)
            retired["retired"] = int(
                f.get(("retired_sbe", None), 0) + f.get(("retired_dbe", None), 0)
            )
            pending = int(f.get(("retired_pending", None), 0))
            retired["pending"] = max(retired.get("pending", 0), pending)
        return DeviceSample(
            device_id=uuid,
            utilization_ratio=util.gpu / 100 if util is not None else None,
            encoder_utilization_ratio=dev.slow.get("encoder"),
            decoder_utilization_ratio=dev.slow.get("decoder"),
            memory_bandwidth_utilization_ratio=util.memory / 100 if util is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            power_w=power_mw / 1000 if power_mw is not None else None,
            power_limit_w=limit / 1000 if limit is not None else None,
            energy_j=energy / 1000 if energy is not None else None,
            temperatures_c=temps,
            clocks_hz=clocks,
            throttle_reasons=self._throttle(dev, f),
            ecc_corrected_total=_opt_int(f.get(("ecc_corrected", None))),
            ecc_uncorrected_total=_opt_int(f.get(("ecc_uncorrected", None))),
            pcie_replay_total=_opt_int(f.get(("pcie_replay", None))),
            pcie_tx_bytes=_opt_int(f.get(("pcie_tx", None))),
            pcie_rx_bytes=_opt_int(f.get(("pcie_rx", None))),
            pcie_generation=dev.slow.get("pcie_gen"),
            pcie_width=dev.slow.get("pcie_width"),
            retired_rows=retired,
            links=tuple(_link_sample(link, f) for link in dev.links),
            processes=dev.slow.get("processes"),
        )

    def _slow_reads(self, dev: _Device) -> dict[str, Any]:
        n, h, uuid = self.nvml, dev.handle, dev.info.id
        out: dict[str, Any] = {}
        enc = n.try_call("nvmlDeviceGetEncoderUtilization", h, device=uuid)
        dec = n.try_call("nvmlDeviceGetDecoderUtilization", h, device=uuid)
        out["encoder"] = enc[0] / 100 if enc is not None else None
        out["decoder"] = dec[0] / 100 if dec is not None else None
        out["sm"] = n.try_call(
            "nvmlDeviceGetClockInfo",
            h,
            n.const("NVML_CLOCK_SM", 1),
            device=uuid,
            quantity="clock_sm",
        )
        out["memory"] = n.try_call(
            "nvmlDeviceGetClockInfo",
            h,
            n.const("NVML_CLOCK_MEM", 2),
            device=uuid,
            quantity="clock_mem",
        )
        out["pcie_gen"] = n.try_call("nvmlDeviceGetCurrPcieLinkGeneration", h, device=uuid)
        out["pcie_width"] = n.try_call("nvmlDeviceGetCurrPcieLinkWidth", h, device=uuid)
        if self.collect_processes:
            procs = n.try_call(
                "nvmlDeviceGetComputeRunningProcesses_v3", h, device=uuid, quantity="processes"
            )
            if procs is None and not n.supported(uuid, "processes"):
                procs = n.try_call(
                    "nvmlDeviceGetComputeRunningProcesses_v2",
                    h,
                    device=uuid,
                    quantity="processes_v2",
                )
            out["processes"] = tuple(
                ProcessSample(
                    pid=int(p.pid),
                    memory_used_bytes=int(p.usedGpuMemory) if p.usedGpuMemory is not None else None,
                )
                for p in procs or ()
            )
        return out

    def _throttle(
        self, dev: _Device, f: dict[tuple[str, int | None], float]
    ) -> frozenset[str] | None:
        """Reasons whose throttle-time counter grew since the last sweep (bitmask fallback)."""
        counters = {
            k[0].split(":", 1)[1]: v for k, v in f.items() if k[0].startswith("throttle_ns:")
        }
        if counters and dev.throttle_ns:
            active = {
                reason for reason, ns in counters.items() if ns > dev.throttle_ns.get(reason, ns)
            }
            dev.throttle_ns = counters
            return frozenset(active)
        dev.throttle_ns = counters
        mask = self.nvml.try_call(
            "nvmlDeviceGetCurrentClocksEventReasons",
            dev.handle,
            device=dev.info.id,
            quantity="clocks_event_reasons",
        )
        if mask is None:
            return None
        reasons = set()
        for const, reason in _REASON_BITS:
            bit = self.nvml.const(const)
            if bit and int(mask) & bit and reason not in ("idle", "apps_clocks"):
                reasons.add(reason)
        return frozenset(reasons)

    def _sample_mig(self, info: DeviceInfo, handle: Any) -> DeviceSample:
        mem = self.nvml.try_call("nvmlDeviceGetMemoryInfo", handle, device=info.id)
        return DeviceSample(
            device_id=info.id,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
        )

    # -- events ------------------------------------------------------------------------------

    def start_events(self, sink: EventSink) -> None:
        """Start the thread that waits on NVML events (Xid, double-bit ECC, row remap)."""
        if self._events is not None:
            return
        self.inventory()
        thread = _EventThread(self.nvml, {d.info.id: d.handle for d in self._devices}, sink)
        if thread.register():
            self._events = thread
            thread.start()

    def stop_events(self) -> None:
        """Stop and join the event thread."""
        if self._events is not None:
            self._events.stop()
            self._events = None


class _EventThread(threading.Thread):
    """Waits on ``nvmlEventSetWait_v2``; a Timeout is the normal idle answer."""

    WAIT_MS = 250  # also bounds how long stopping takes

    def __init__(self, nvml: Nvml, handles: dict[str, Any], sink: EventSink) -> None:
        super().__init__(name="otel-gpu-nvml-events", daemon=True)
        self.nvml = nvml
        self.handles = handles
        self.sink = sink
        self._stop_flag = threading.Event()
        self._set: Any = None
        self._by_address = {_address(h): uuid for uuid, h in handles.items()}

    def register(self) -> bool:
        n = self.nvml
        wanted = 0
        for const in (
            "nvmlEventTypeXidCriticalError",
            "nvmlEventTypeDoubleBitEccError",
            "nvmlEventTypeDramRetirementFailure",
        ):
            wanted |= int(n.const(const, 0))
        self._set = n.try_call("nvmlEventSetCreate", quantity="events")
        if self._set is None:
            return False
        registered = 0
        for uuid, handle in self.handles.items():
            try:
                supported = n.call(
                    "nvmlDeviceGetSupportedEventTypes", handle, device=uuid, quantity="event_types"
                )
                mask = wanted & int(supported or 0)
                if mask:
                    n.call(
                        "nvmlDeviceRegisterEvents",
                        handle,
                        mask,
                        self._set,
                        device=uuid,
                        quantity="register_events",
                    )
                    registered += 1
            except OtelGpuError as err:  # a lost GPU has no events to give
                _log.info("%s: no NVML events: %s", uuid, err)
        if not registered:
            n.try_call("nvmlEventSetFree", self._set)
            return False
        return True

    def run(self) -> None:
        n = self.nvml
        timeout = n.const("NVML_ERROR_TIMEOUT", 10)
        while not self._stop_flag.is_set():
            try:
                data = n.mod.nvmlEventSetWait_v2(self._set, self.WAIT_MS)
            except n.mod.NVMLError as err:
                if err.value == timeout:
                    continue
                _log.debug("nvmlEventSetWait_v2: %s", err)
                self._stop_flag.wait(1.0)
                continue
            except Exception:
                _log.warning("NVML event thread error", exc_info=True)
                self._stop_flag.wait(1.0)
                continue
            try:
                self._deliver(data)
            except Exception:
                _log.warning("could not handle an NVML event", exc_info=True)
        n.try_call("nvmlEventSetFree", self._set)

    def _deliver(self, data: Any) -> None:
        n = self.nvml
        # Map the handle by address: asking NVML for the UUID fails once the GPU is lost (Xid 79).
        uuid = self._by_address.get(_address(data.device))
        kind = int(data.eventType)
        now = time.time_ns()
        if kind & int(n.const("nvmlEventTypeXidCriticalError", 0)):
            code = int(data.eventData)
            self.sink(
                HealthEvent(
                    "nvidia.xid",
                    Severity.ERROR,
                    HealthState.DEGRADED,
                    f"Xid {code}",
                    uuid,
                    now,
                    {"nvidia.xid.code": code},
                )
            )
        elif kind & int(n.const("nvmlEventTypeDoubleBitEccError", 0)):
            self.sink(
                HealthEvent(
                    "accel.memory.ecc.uncorrectable",
                    Severity.ERROR,
                    HealthState.FAILED,
                    "double-bit ECC error reported by the driver",
                    uuid,
                    now,
                    {"error.delta": 1},
                )
            )
        elif kind & int(n.const("nvmlEventTypeDramRetirementFailure", 0)):
            self.sink(
                HealthEvent(
                    "accel.memory.row_remap.failure",
                    Severity.ERROR,
                    HealthState.FAILED,
                    "memory row retirement failed",
                    uuid,
                    now,
                )
            )

    def stop(self) -> None:
        self._stop_flag.set()
        self.join(timeout=2 * self.WAIT_MS / 1000 + 1)


def _address(handle: Any) -> int | None:
    """The address behind an NVML device handle (a ctypes pointer)."""
    return ctypes.cast(handle, ctypes.c_void_p).value


_VALUE_TYPES = (
    ("NVML_VALUE_TYPE_DOUBLE", 0, "dVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_INT", 1, "uiVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG", 2, "ulVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3, "ullVal"),
    ("NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4, "sllVal"),
    ("NVML_VALUE_TYPE_SIGNED_INT", 5, "siVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_SHORT", 6, "usVal"),
)


def _link_sample(link: int, f: dict[tuple[str, int | None], float]) -> LinkSample:
    state = f.get(("state", link))
    tx, rx = f.get(("tx_kib", link)), f.get(("rx_kib", link))
    errors = {
        kind: int(f["err:" + kind, link])
        for kind in ("crc", "replay", "recovery")
        if ("err:" + kind, link) in f
    }
    return LinkSample(
        index=link,
        link_type="nvlink",
        up=None if state is None else bool(state),
        tx_bytes=int(tx * 1024) if tx is not None else None,
        rx_bytes=int(rx * 1024) if rx is not None else None,
        errors=errors,
    )


def _opt_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _opt_int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _replace(info: DeviceInfo, **changes: Any) -> DeviceInfo:
    import dataclasses

    return dataclasses.replace(info, **changes)
