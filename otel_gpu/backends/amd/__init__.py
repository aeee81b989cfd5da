"""The AMD backend, on AMD SMI through its Python package ``amdsmi`` (ROCm ``amd-smi-lib``).

Static facts are read once at :meth:`AmdBackend.open`: identity (UUID, ASIC, board, VBIOS),
PCI address, NUMA node and CPU list (sysfs, then amdsmi), VRAM size, power-cap range, PCIe
maximum link, the energy counter's resolution, compute/memory partitions and the xGMI topology
(second pass: a link's peer may be enumerated after it). Each sweep then reads a device with
few calls (DESIGN §9):

====================================  =========================================================
hot path, every sweep                 ``amdsmi_get_gpu_metrics_info`` (one batch: gfx/umc/VCN
                                      activity, edge/hotspot/HBM temperatures, socket power,
                                      energy accumulator, clocks, throttle residency counters,
                                      PCIe width/speed/replays, per-link xGMI bytes and status,
                                      per-partition gfx busy), ``amdsmi_get_gpu_memory_usage``
                                      (VRAM), ``amdsmi_get_gpu_total_ecc_count``
slow path, every ``slow_every`` sweeps power cap, retired/pending pages (bad page table),
                                      processes (when enabled)
====================================  =========================================================

Where ``gpu_metrics`` is not supported (older or consumer GPUs) the sweep falls back to
``amdsmi_get_gpu_activity``, ``amdsmi_get_power_info`` and ``amdsmi_get_temp_metric``.

Mapping to the vendor-neutral model:

- ``average_gfx_activity`` is ``utilization_ratio`` and engine ``gfx``; ``average_umc_activity``
  is ``memory_bandwidth_utilization_ratio``; VCN (encode and decode share it) is engine ``mm``.
- temperatures: ``edge`` -> ``gpu``, ``hotspot`` (junction) -> ``hotspot``, ``mem`` (HBM) ->
  ``memory``. MI300-series GPUs have no edge sensor: they report hotspot and memory only.
- throttling comes from the growth of the firmware's residency counters between sweeps
  (``ppt`` -> ``power``, ``socket_thm`` -> ``thermal``, ``hbm_thm``/``vr_thm`` ->
  ``hw_thermal``, ``prochot`` -> ``hw_slowdown``), else from ``throttle_status`` (a boolean in
  the Python API: its reason is ``unspecified``).
- energy: ``energy_accumulator`` x ``counter_resolution`` (µJ, from ``amdsmi_get_energy_count``;
  15.259 µJ when that call is unsupported) -> J.
- xGMI: one :class:`LinkInfo` per xGMI port (``amdsmi_get_link_metrics`` names each port's peer
  BDF); a port's bytes come from ``xgmi_read_data_acc`` (received) and ``xgmi_write_data_acc``
  (sent), in KB (x1024). Without ``amdsmi_get_link_metrics`` the peers come from
  ``amdsmi_topo_get_link_type`` (one link per directly connected peer).
- partitions (MI300 CPX/DPX..., NPS2/4): amdsmi lists one processor handle per partition. The
  handles of one physical GPU (same PCI domain:bus:device) become one device with a child per
  partition (``parent_id``; ``kfd`` partition id in ``extra``). The parent carries the
  socket-wide readings; a child its partition's VRAM (when memory is partitioned) and gfx busy.
- bad pages: ``RESERVED`` -> retired ``remapped``, ``PENDING`` -> ``pending``,
  ``UNRESERVABLE`` -> ``failed``.

A device whose calls return ``AMDSMI_STATUS_NOT_FOUND`` or ``DRIVER_NOT_LOADED`` is reported
lost (its partitions with it) while the others go on; it is probed again with exponential
backoff. Driver events (VM fault, thermal throttle, GPU reset) are read by a thread polling
``AmdSmiEventReader`` and delivered at once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from otel_gpu.backends._common import LibraryBackend, LostState
from otel_gpu.backends.amd._lib import AmdCallError, AmdSmi, handle_address, na
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

__all__ = ["AmdBackend", "pcie_generation"]

_log = logging.getLogger(__name__)
_KB = 1024
DEFAULT_ENERGY_RESOLUTION_UJ = 15.259  # amdsmi.h: energy_accumulator "15.259uJ per 1ns"

# gpu_metrics residency accumulators -> throttle reason (growth between sweeps = active).
_RESIDENCY = (
    ("ppt_residency_acc", "power"),
    ("socket_thm_residency_acc", "thermal"),
    ("hbm_thm_residency_acc", "hw_thermal"),
    ("vr_thm_residency_acc", "hw_thermal"),
    ("prochot_residency_acc", "hw_slowdown"),
)
# PCIe link speed (gpu_metrics: 0.1 GT/s) -> generation.
_GEN_BY_SPEED = {25: 1, 50: 2, 80: 3, 160: 4, 320: 5, 640: 6, 1280: 7}
_PAGE_STATES = {0: "remapped", 1: "pending", 2: "failed"}  # AmdSmiMemoryPageStatus
_EVENTS = ("VMFAULT", "THERMAL_THROTTLE", "GPU_PRE_RESET", "GPU_POST_RESET")


def pcie_generation(speed_tenths_gts: int) -> int | None:
    """PCIe generation of a link speed given in 0.1 GT/s (``320`` -> 5)."""
    return _GEN_BY_SPEED.get(int(speed_tenths_gts))


def _num(value: Any) -> float | None:
    """A numeric amdsmi value, or None for "N/A" (and anything that is not a number)."""
    if na(value) or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _mean(values: Any) -> float | None:
    """Mean of the numeric entries of an amdsmi list ("N/A" entries skipped)."""
    if not isinstance(values, (list, tuple)):
        return _num(values)
    nums = [v for v in (_num(x) for x in values) if v is not None]
    return sum(nums) / len(nums) if nums else None


def _ratio(percent: Any) -> float | None:
    value = _num(percent)
    return None if value is None else max(0.0, min(1.0, value / 100.0))


def _text(value: Any) -> str | None:
    if value is None or na(value):
        return None
    text = str(value).strip()
    return text or None


def _cpu_list(text: str) -> str | None:
    return text.strip() or None


@dataclass
class _Child:
    """A partition of a physical GPU (its own amdsmi handle)."""

    info: DeviceInfo
    handle: Any
    partition_id: int


@dataclass
class _Device:
    """Per-physical-GPU state kept between sweeps."""

    info: DeviceInfo
    handle: Any
    children: list[_Child] = field(default_factory=list)
    ports: tuple[int, ...] = ()
    energy_resolution_uj: float = DEFAULT_ENERGY_RESOLUTION_UJ
    memory_partitioned: bool = False
    residency: dict[str, float] = field(default_factory=dict)
    slow: dict[str, Any] = field(default_factory=dict)
    lost: LostState = field(default_factory=LostState)
    broken_reason: str | None = None  # unreadable since inventory (not lost): keeps failing


@dataclass
class _Handle:
    """One amdsmi processor handle as enumerated (a GPU or one partition of it)."""

    position: int
    handle: Any
    uuid: str | None = None
    bdf: str | None = None
    partition_id: int = 0
    error: OtelGpuError | None = None


class AmdBackend(LibraryBackend):
    """AMD GPUs through amdsmi. ``sysfs_root`` is where ``sys/bus/pci`` is read (tests);
    ``slow_every`` sets how many sweeps pass between slow-path reads; ``clock`` is monotonic
    seconds (backoff)."""

    name: ClassVar[str] = "amd"
    call_error: ClassVar[type[Exception]] = AmdCallError
    auto: ClassVar[bool] = True
    fallback_for: ClassVar[str | None] = None

    @property
    def library(self) -> AmdSmi:
        """The vendor library handle."""
        return self.smi

    def __init__(
        self,
        options: str | None = None,
        *,
        sysfs_root: Path = Path("/"),
        slow_every: int = 6,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(options, sysfs_root=sysfs_root, slow_every=slow_every, clock=clock)
        self.smi = AmdSmi()
        self._devices: list[_Device] = []
        self._events: _EventThread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def probe(self) -> Probe:
        """Initialise amdsmi and count GPUs. Never raises."""
        smi = AmdSmi()
        try:
            smi.start()
            handles = smi.call("amdsmi_get_processor_handles") or []
            count = len(handles)
        except OtelGpuError as err:
            return Probe(False, getattr(err, "reason", str(err)))
        except Exception as err:
            return Probe(False, f"amdsmi probe failed: {type(err).__name__}: {err}")
        finally:
            smi.stop()
        if count == 0:
            return Probe(False, "amdsmi found no AMD GPU (is the amdgpu driver loaded?)", 0)
        return Probe(True, f"amdsmi: {count} GPU handle(s)", count)

    # -- inventory ---------------------------------------------------------------------------

    def _enumerate(self) -> list[_Handle]:
        s = self.smi
        handles = s.call("amdsmi_get_processor_handles") or []
        out: list[_Handle] = []
        for i, h in enumerate(handles):
            entry = _Handle(i, h)
            where = f"amd-gpu-{i}"
            try:
                entry.uuid = _text(s.call("amdsmi_get_gpu_device_uuid", h, device=where))
                bdf = _text(s.call("amdsmi_get_gpu_device_bdf", h, device=where))
                entry.bdf = normalize_pci_bus_id(bdf) if bdf else None
                kfd = s.try_call("amdsmi_get_gpu_kfd_info", h, device=where)
                part = _num((kfd or {}).get("current_partition_id"))
                entry.partition_id = int(part) if part is not None else 0
            except (DeviceLost, AmdCallError) as err:
                entry.error = err
            except ValueError:
                _log.warning("AMD GPU %d: unparsable BDF", i)
            out.append(entry)
        return out

    def _read_inventory(self) -> Inventory:
        s = self.smi
        entries = self._enumerate()
        groups: dict[tuple[str, ...], list[_Handle]] = {}
        for e in entries:
            key = tuple(e.bdf.rsplit(".", 1)[0].split(":")) if e.bdf else (f"#{e.position}",)
            groups.setdefault(key, []).append(e)
        self._devices = []
        for members in groups.values():
            members.sort(key=lambda m: (m.partition_id, m.position))
            primary = members[0]
            index = len(self._devices)
            if primary.error is not None:
                info = DeviceInfo(
                    index=index,
                    id=primary.uuid or f"amd-gpu-{primary.position}",
                    vendor="amd",
                    model="unknown (unreadable)",
                    backend=self.name,
                    local_index=index,
                    pci_bus_id=primary.bdf,
                )
                dev = _Device(info, primary.handle)
                if isinstance(primary.error, DeviceLost):
                    self._mark_lost(dev, primary.error.reason, self._clock())
                else:
                    dev.broken_reason = str(primary.error)
                self._devices.append(dev)
                continue
            dev = self._static(index, primary)
            if len(members) > 1:
                self._partitions(dev, members)
            self._devices.append(dev)
        by_bus: dict[str | None, int] = {
            d.info.pci_bus_id: d.info.index for d in self._devices if d.info.pci_bus_id
        }
        for dev in self._devices:
            if not dev.lost.lost and dev.broken_reason is None:
                links = self._links(dev, by_bus)
                dev.info = dataclasses.replace(dev.info, links=links)
                dev.ports = tuple(link.index for link in links)
        children: list[DeviceInfo] = []
        next_index = len(self._devices)
        for dev in self._devices:
            for child in dev.children:
                child.info = dataclasses.replace(
                    child.info, index=next_index, local_index=next_index
                )
                children.append(child.info)
                next_index += 1
        versions: dict[str, str] = {}
        first = next((d for d in self._devices if not d.lost.lost), None)
        if first is not None:
            driver = s.try_call("amdsmi_get_gpu_driver_info", first.handle, device=first.info.id)
            if driver and _text(driver.get("driver_version")):
                versions["amd.driver"] = str(_text(driver.get("driver_version")))
        rocm = s.try_call("amdsmi_get_rocm_version", quantity="rocm_version")
        if isinstance(rocm, (tuple, list)) and len(rocm) == 2 and rocm[0]:
            versions["rocm"] = str(rocm[1])
        return Inventory(tuple([d.info for d in self._devices] + children), versions)

    def _static(self, index: int, e: _Handle) -> _Device:
        s, h = self.smi, e.handle
        uuid = e.uuid or f"amd-gpu-{e.position}"
        q: dict[str, str] = {"device": uuid}
        asic = s.try_call("amdsmi_get_gpu_asic_info", h, **q) or {}
        board = s.try_call("amdsmi_get_gpu_board_info", h, **q) or {}
        vbios = s.try_call("amdsmi_get_gpu_vbios_info", h, **q) or {}
        vram = s.enum("AmdSmiMemoryType", "VRAM", 0)
        total = s.try_call("amdsmi_get_gpu_memory_total", h, vram, quantity="vram_total", **q)
        cap = s.try_call("amdsmi_get_power_cap_info", h, **q) or {}
        pcie = (s.try_call("amdsmi_get_pcie_info", h, **q) or {}).get("pcie_static", {})
        energy = s.try_call("amdsmi_get_energy_count", h, **q) or {}
        resolution = _num(energy.get("counter_resolution"))
        compute = _text(s.try_call("amdsmi_get_gpu_compute_partition", h, **q))
        memory = _text(s.try_call("amdsmi_get_gpu_memory_partition", h, **q))
        extra: dict[str, str] = {}
        for key, value in (
            ("amd.compute_partition", compute),
            ("amd.memory_partition", memory),
            ("amd.oam_id", _text(asic.get("oam_id"))),
            ("amd.asic_serial", _text(asic.get("asic_serial"))),
        ):
            if value:
                extra[key] = value
        max_gen = _num(pcie.get("pcie_interface_version"))
        max_width = _num(pcie.get("max_pcie_width"))
        if max_gen is None and _num(pcie.get("max_pcie_speed")) is not None:
            max_gen = pcie_generation(int((_num(pcie.get("max_pcie_speed")) or 0) / 100))
        info = DeviceInfo(
            index=index,
            id=uuid,
            vendor="amd",
            model=_text(asic.get("market_name")) or _text(board.get("product_name")) or "AMD GPU",
            backend=self.name,
            local_index=index,
            serial=_text(board.get("product_serial")) or _text(asic.get("asic_serial")),
            firmware_version=_text(vbios.get("version")),
            board_part_number=_text(board.get("model_number")) or _text(vbios.get("part_number")),
            pci_bus_id=e.bdf,
            numa_node=self._numa(h, uuid, e.bdf),
            cpu_affinity=self._cpus(e.bdf),
            memory_total_bytes=int(total) if isinstance(total, int) else None,
            power_limit_default_w=_uw(cap.get("default_power_cap")),
            power_limit_min_w=_uw(cap.get("min_power_cap")),
            power_limit_max_w=_uw(cap.get("max_power_cap")),
            compute_capability=_text(asic.get("target_graphics_version")),
            pcie_max_generation=int(max_gen) if max_gen else None,
            pcie_max_width=int(max_width) if max_width else None,
            extra=extra,
        )
        dev = _Device(info, h, energy_resolution_uj=resolution or DEFAULT_ENERGY_RESOLUTION_UJ)
        dev.memory_partitioned = bool(memory and memory.upper() not in ("NPS1", "N/A"))
        # A first metrics read: the baseline of the throttle residency counters.
        baseline = s.try_call("amdsmi_get_gpu_metrics_info", h, quantity="gpu_metrics", **q)
        if isinstance(baseline, dict):
            dev.residency = _residency(baseline)
        return dev

    def _partitions(self, dev: _Device, members: list[_Handle]) -> None:
        s, parent = self.smi, dev.info
        compute = parent.extra.get("amd.compute_partition", "compute")
        vram = s.enum("AmdSmiMemoryType", "VRAM", 0)
        seen = {parent.id}
        for m in members:
            uuid = m.uuid if m.uuid and m.uuid not in seen else f"{parent.id}-p{m.partition_id}"
            seen.add(uuid)
            total = None
            if dev.memory_partitioned and m.error is None:
                total = s.try_call(
                    "amdsmi_get_gpu_memory_total",
                    m.handle,
                    vram,
                    device=uuid,
                    quantity="vram_total",
                )
            info = DeviceInfo(
                index=0,
                id=uuid,
                vendor="amd",
                model=f"{parent.model} {compute} partition {m.partition_id}",
                backend=self.name,
                parent_id=parent.id,
                pci_bus_id=parent.pci_bus_id,
                numa_node=parent.numa_node,
                cpu_affinity=parent.cpu_affinity,
                memory_total_bytes=int(total) if isinstance(total, int) else None,
                extra={
                    "amd.partition_id": str(m.partition_id),
                    "amd.partition_bdf": m.bdf or "",
                    **{k: v for k, v in parent.extra.items() if k.endswith("_partition")},
                },
            )
            dev.children.append(_Child(info, m.handle, m.partition_id))
        if dev.memory_partitioned and all(c.info.memory_total_bytes for c in dev.children):
            whole = sum(c.info.memory_total_bytes or 0 for c in dev.children)
            dev.info = dataclasses.replace(dev.info, memory_total_bytes=whole)

    def _numa(self, handle: Any, device: str, bus: str | None) -> int | None:
        """Host NUMA node: sysfs ``numa_node`` of the PCI device, else amdsmi."""
        if bus is not None:
            try:
                node = int((self._root / "sys/bus/pci/devices" / bus / "numa_node").read_text())
                return node if node >= 0 else None
            except (OSError, ValueError):
                pass
        node = self.smi.try_call("amdsmi_topo_get_numa_node_number", handle, device=device)
        # A c_uint32 of -1 (no NUMA affinity) reads as 4294967295.
        return int(node) if isinstance(node, int) and 0 <= node < 4096 else None

    def _cpus(self, bus: str | None) -> str | None:
        if bus is None:
            return None
        try:
            return _cpu_list(
                (self._root / "sys/bus/pci/devices" / bus / "local_cpulist").read_text()
            )
        except OSError:
            return None

    def _links(self, dev: _Device, by_bus: dict[str | None, int]) -> tuple[LinkInfo, ...]:
        s, h, uuid = self.smi, dev.handle, dev.info.id
        xgmi = {
            int(v)
            for v in (
                s.enum("AmdSmiLinkType", "AMDSMI_LINK_TYPE_XGMI"),
                s.enum("AmdSmiIoLinkType", "XGMI"),
            )
            if v is not None
        } or {2}
        status = s.try_call("amdsmi_get_gpu_xgmi_link_status", h, device=uuid) or {}
        states = list(status.get("status") or [])
        metrics = s.try_call("amdsmi_get_link_metrics", h, device=uuid)
        links: list[LinkInfo] = []
        if isinstance(metrics, dict):
            entries = list(metrics.get("links") or [])[: int(metrics.get("num_links") or 0)]
            for port, entry in enumerate(entries):
                if int(entry.get("link_type", -1)) not in xgmi:
                    continue
                try:
                    peer_bus = normalize_pci_bus_id(str(entry.get("bdf")))
                except ValueError:
                    peer_bus = None
                peer_index = by_bus.get(peer_bus)
                state = states[port] if port < len(states) else "U"
                links.append(
                    LinkInfo(
                        index=port,
                        link_type="xgmi",
                        up=state != "D",
                        remote_kind="gpu" if peer_index is not None else "unknown",
                        remote_pci_bus_id=peer_bus,
                        remote_device_index=peer_index,
                    )
                )
            return tuple(links)
        # No per-port metrics: one link per directly connected peer, from the KFD topology.
        for peer in self._devices:
            if peer is dev or peer.lost.lost or peer.broken_reason is not None:
                continue
            kind = s.try_call(
                "amdsmi_topo_get_link_type", h, peer.handle, device=uuid, quantity="link_type"
            )
            if not isinstance(kind, dict) or int(kind.get("type", -1)) not in xgmi:
                continue
            if int(kind.get("hops", 1)) > 1:
                continue
            links.append(
                LinkInfo(
                    index=len(links),
                    link_type="xgmi",
                    up=True,
                    remote_kind="gpu",
                    remote_pci_bus_id=peer.info.pci_bus_id,
                    remote_device_index=peer.info.index,
                )
            )
        return tuple(links)

    # -- sampling ----------------------------------------------------------------------------

    def _units(self) -> list[_Device]:
        return self._devices

    def _read_unit(self, unit: _Device, slow: bool) -> list[DeviceSample]:
        return self._sample_device(unit, slow)

    def _unit_failures(self, dev: _Device, reason: str, lost: bool) -> list[DeviceFailure]:
        prefix = "parent GPU lost: " if lost else "parent GPU unreadable: "
        return [DeviceFailure(dev.info.id, reason, lost=lost)] + [
            DeviceFailure(c.info.id, prefix + reason, lost=lost) for c in dev.children
        ]

    def _retry_lost(self, dev: _Device, now: float) -> bool:
        """Ask a lost GPU again when its backoff has passed; True when it answers."""
        if not dev.lost.due(now):
            return False
        try:
            self.smi.call("amdsmi_get_gpu_device_uuid", dev.handle, device=dev.info.id)
        except (DeviceLost, AmdCallError) as err:
            self._mark_lost(dev, str(err), now)
            return False
        dev.lost.recovered(f"{dev.info.name} ({dev.info.id})")
        dev.residency.clear()
        return True

    def _sample_device(self, dev: _Device, slow: bool) -> list[DeviceSample]:
        s, h, uuid = self.smi, dev.handle, dev.info.id
        vram = s.enum("AmdSmiMemoryType", "VRAM", 0)
        m = s.call("amdsmi_get_gpu_metrics_info", h, device=uuid, quantity="gpu_metrics")
        if not isinstance(m, dict):
            m = self._metrics_fallback(dev)
        used = None
        if not (dev.memory_partitioned and dev.children):  # else: the sum of the partitions
            used = s.call("amdsmi_get_gpu_memory_usage", h, vram, device=uuid, quantity="vram_used")
        ecc = s.call("amdsmi_get_gpu_total_ecc_count", h, device=uuid, quantity="ecc") or {}
        if slow:
            dev.slow = self._slow_reads(dev)
        gfx = _ratio(m.get("average_gfx_activity"))
        mm = _ratio(_mean(m.get("vcn_activity")))
        if mm is None:
            mm = _ratio(m.get("average_mm_activity"))
        engines = {k: v for k, v in (("gfx", gfx), ("mm", mm)) if v is not None}
        temps = {
            loc: value
            for loc, key in (
                ("gpu", "temperature_edge"),
                ("hotspot", "temperature_hotspot"),
                ("memory", "temperature_mem"),
            )
            if (value := _num(m.get(key))) is not None
        }
        clocks: dict[str, float] = {}
        for domain, keys in (
            ("graphics", ("current_gfxclk", "current_gfxclks", "average_gfxclk_frequency")),
            ("memory", ("current_uclk", "average_uclk_frequency")),
            ("video", ("current_vclk0", "current_vclk0s", "average_vclk0_frequency")),
        ):
            mhz = _first(m, keys)
            if mhz is not None:
                clocks[domain] = mhz * 1e6
        power = _num(m.get("current_socket_power"))
        if power is None:
            power = _num(m.get("average_socket_power"))
        acc = _num(m.get("energy_accumulator"))
        energy = acc * dev.energy_resolution_uj / 1e6 if acc is not None else None
        width = _num(m.get("pcie_link_width"))
        speed = _num(m.get("pcie_link_speed"))
        parent_used = int(used) if isinstance(used, int) else None
        children = self._sample_children(dev, m, slow) if dev.children else []
        if dev.memory_partitioned and children:
            child_used = [c.memory_used_bytes for c in children]
            if all(u is not None for u in child_used):
                parent_used = sum(u or 0 for u in child_used)
        sample = DeviceSample(
            device_id=uuid,
            utilization_ratio=gfx,
            memory_bandwidth_utilization_ratio=_ratio(m.get("average_umc_activity")),
            memory_used_bytes=parent_used,
            memory_total_bytes=dev.info.memory_total_bytes,
            power_w=power,
            power_limit_w=dev.slow.get("power_limit_w"),
            energy_j=energy,
            temperatures_c=temps,
            clocks_hz=clocks,
            throttle_reasons=self._throttle(dev, m),
            ecc_corrected_total=_int(ecc.get("correctable_count")),
            ecc_uncorrected_total=_int(ecc.get("uncorrectable_count")),
            pcie_replay_total=_int(m.get("pcie_replay_count_acc")),
            pcie_generation=pcie_generation(int(speed)) if speed else None,
            pcie_width=int(width) if width else None,
            retired_rows=dev.slow.get("retired", {}),
            links=self._link_samples(dev, m),
            engines=engines,
            processes=dev.slow.get("processes"),
        )
        return [sample, *children]

    def _metrics_fallback(self, dev: _Device) -> dict[str, Any]:
        """The few ``gpu_metrics`` keys the sweep needs, from the one-value calls."""
        s, h, uuid = self.smi, dev.handle, dev.info.id
        out: dict[str, Any] = {}
        activity = s.call("amdsmi_get_gpu_activity", h, device=uuid, quantity="activity") or {}
        out["average_gfx_activity"] = activity.get("gfx_activity")
        out["average_umc_activity"] = activity.get("umc_activity")
        out["average_mm_activity"] = activity.get("mm_activity")
        power = s.call("amdsmi_get_power_info", h, device=uuid, quantity="power_info") or {}
        out["current_socket_power"] = power.get("current_socket_power")
        out["average_socket_power"] = power.get("average_socket_power")
        kinds = getattr(s.mod, "AmdSmiTemperatureType", None)
        current = s.enum("AmdSmiTemperatureMetric", "CURRENT")
        for key, sensor in (
            ("temperature_edge", "EDGE"),
            ("temperature_hotspot", "HOTSPOT"),
            ("temperature_mem", "VRAM"),
        ):
            kind = getattr(kinds, sensor, None)
            if kind is None or current is None:
                continue
            out[key] = s.call(
                "amdsmi_get_temp_metric", h, kind, current, device=uuid, quantity=f"temp_{key}"
            )
        return out

    def _sample_children(self, dev: _Device, m: dict[str, Any], slow: bool) -> list[DeviceSample]:
        s = self.smi
        vram = s.enum("AmdSmiMemoryType", "VRAM", 0)
        busy = m.get("xcp_stats.gfx_busy_inst")
        out: list[DeviceSample] = []
        for child in dev.children:
            used = None
            if dev.memory_partitioned:
                used = s.call(
                    "amdsmi_get_gpu_memory_usage",
                    child.handle,
                    vram,
                    device=child.info.id,
                    quantity="vram_used",
                )
            util = None
            if isinstance(busy, list) and child.partition_id < len(busy):
                util = _ratio(_mean(busy[child.partition_id]))
            out.append(
                DeviceSample(
                    device_id=child.info.id,
                    utilization_ratio=util,
                    memory_used_bytes=int(used) if isinstance(used, int) else None,
                    memory_total_bytes=child.info.memory_total_bytes,
                    engines={"gfx": util} if util is not None else {},
                )
            )
        return out

    def _throttle(self, dev: _Device, m: dict[str, Any]) -> frozenset[str] | None:
        """Reasons whose residency counter grew since the last sweep (else throttle_status)."""
        counters = _residency(m)
        if counters and dev.residency:
            active = {
                reason
                for key, reason in _RESIDENCY
                if key in counters and counters[key] > dev.residency.get(key, counters[key])
            }
            dev.residency = counters
            return frozenset(active)
        dev.residency = counters
        status = m.get("throttle_status")
        if isinstance(status, bool):
            return frozenset({"unspecified"}) if status else frozenset()
        return None

    def _link_samples(self, dev: _Device, m: dict[str, Any]) -> tuple[LinkSample, ...]:
        if not dev.ports:
            return ()
        reads = m.get("xgmi_read_data_acc")
        writes = m.get("xgmi_write_data_acc")
        status = m.get("xgmi_link_status")
        out = []
        for port in dev.ports:
            rx = _at(reads, port)
            tx = _at(writes, port)
            up = _at(status, port)
            out.append(
                LinkSample(
                    index=port,
                    link_type="xgmi",
                    up=None if up is None else bool(up),
                    tx_bytes=int(tx * _KB) if tx is not None else None,
                    rx_bytes=int(rx * _KB) if rx is not None else None,
                )
            )
        return tuple(out)

    def _slow_reads(self, dev: _Device) -> dict[str, Any]:
        s, h, uuid = self.smi, dev.handle, dev.info.id
        out: dict[str, Any] = {}
        cap = s.try_call("amdsmi_get_power_cap_info", h, device=uuid) or {}
        out["power_limit_w"] = _uw(cap.get("power_cap"))
        pages = s.try_call("amdsmi_get_gpu_bad_page_info", h, device=uuid, quantity="bad_pages")
        if pages is not None:
            retired = dict.fromkeys(_PAGE_STATES.values(), 0)
            for page in pages:
                state = _PAGE_STATES.get(int(page.get("status", 0)))
                if state:
                    retired[state] += 1
            out["retired"] = retired
        if self.collect_processes:
            procs = s.try_call("amdsmi_get_gpu_process_list", h, device=uuid, quantity="processes")
            if procs is not None:
                out["processes"] = tuple(
                    ProcessSample(
                        pid=int(p["pid"]),
                        memory_used_bytes=_int((p.get("memory_usage") or {}).get("vram_mem")),
                        name=_text(p.get("name")),
                    )
                    for p in procs
                )
        return out

    # -- events ------------------------------------------------------------------------------

    def start_events(self, sink: EventSink) -> None:
        """Start the thread that reads amdsmi event notifications (VM fault, thermal
        throttle, GPU reset)."""
        if self._events is not None:
            return
        self.inventory()
        handles: dict[int, str] = {}
        readers: list[Any] = []
        for dev in self._devices:
            if dev.lost.lost or dev.broken_reason is not None:
                continue
            pairs = [(dev.handle, dev.info.id)] + [
                (c.handle, dev.info.id) for c in dev.children if c.handle is not dev.handle
            ]
            for handle, owner in pairs:
                address = handle_address(handle)
                if address is not None:
                    handles[address] = owner
                try:
                    readers.append(self.smi.event_reader(handle, list(_EVENTS)))
                except Exception as err:  # not supported, no permission: metrics go on
                    _log.info("%s: no amdsmi events: %s", owner, err)
        if not readers:
            return
        self._events = _EventThread(self.smi, readers, handles, sink)
        self._events.start()

    def stop_events(self) -> None:
        """Stop and join the event thread."""
        if self._events is not None:
            self._events.stop()
            self._events = None


class _EventThread(threading.Thread):
    """Polls ``AmdSmiEventReader.read``; one read returns the events of every registered GPU."""

    WAIT_MS = 500

    def __init__(
        self, smi: AmdSmi, readers: list[Any], handles: dict[int, str], sink: EventSink
    ) -> None:
        super().__init__(name="otel-gpu-amdsmi-events", daemon=True)
        self.smi = smi
        self.readers = readers
        self.handles = handles
        self.sink = sink
        self._stop_flag = threading.Event()

    def run(self) -> None:
        reader = self.readers[0]
        while not self._stop_flag.is_set():
            try:
                events = reader.read(self.WAIT_MS, 10)
            except Exception as err:
                if not self.smi.is_no_data(err):
                    _log.debug("amdsmi event read: %s", err)
                    self._stop_flag.wait(1.0)
                continue
            for event in events or ():
                try:
                    self._deliver(event)
                except Exception:
                    _log.warning("could not handle an amdsmi event", exc_info=True)
        for r in self.readers:
            try:
                r.stop()
            except Exception as err:
                _log.debug("AmdSmiEventReader.stop: %s", err)

    def _deliver(self, event: dict[str, Any]) -> None:
        kind = str(event.get("event", ""))
        address = handle_address(event.get("processor_handle"))
        device = self.handles.get(address) if address is not None else None
        message = str(event.get("message", "")).strip()
        spec = {
            "VMFAULT": ("amd.vm_fault", Severity.INFO, HealthState.OK, "GPU VM (page) fault"),
            "THERMAL_THROTTLE": (
                "accel.throttle.thermal",
                Severity.WARN,
                HealthState.DEGRADED,
                "thermal throttling reported by the driver",
            ),
            "GPU_PRE_RESET": (
                "amd.gpu.reset",
                Severity.ERROR,
                HealthState.DEGRADED,
                "GPU reset started",
            ),
            "GPU_POST_RESET": ("amd.gpu.reset", Severity.INFO, HealthState.OK, "GPU reset done"),
        }.get(kind)
        if spec is None:
            return
        name, severity, state, text = spec
        attrs: dict[str, str | int | float | bool] = {"amd.event": kind}
        if name == "accel.throttle.thermal":
            attrs["accel.throttle.reason"] = "thermal"
        self.sink(
            HealthEvent(
                name,
                severity,
                state,
                f"{text}: {message}" if message else text,
                device,
                time.time_ns(),
                attrs,
            )
        )

    def stop(self) -> None:
        self._stop_flag.set()
        self.join(timeout=2 * self.WAIT_MS / 1000 + 1)


def _residency(m: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, _ in _RESIDENCY:
        value = _num(m.get(key))
        if value is not None:
            out[key] = value
    return out


def _first(m: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    """The first of ``keys`` that holds a number (a per-instance list counts as its mean)."""
    for key in keys:
        value = _mean(m.get(key))
        if value is not None:
            return value
    return None


def _at(values: Any, index: int) -> float | None:
    if isinstance(values, (list, tuple)) and 0 <= index < len(values):
        return _num(values[index])
    return None


def _int(value: Any) -> int | None:
    number = _num(value)
    return None if number is None else int(number)


def _uw(value: Any) -> float | None:
    """A power value in µW as W (None for N/A and for 0: "no cap" is not a 0 W cap)."""
    number = _num(value)
    return number / 1e6 if number else None
