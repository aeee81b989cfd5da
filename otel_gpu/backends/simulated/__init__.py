"""The simulated backend: a seeded, deterministic node of any size, vendor and topology.

It ships in the package as the embedded default for demos and tests (``--backend simulated``)
and behaves like a real backend: static inventory read once, one sweep per collection with
cumulative counters that grow, per-device failures and scripted faults (see
:mod:`otel_gpu.backends.simulated.spec`). It is never chosen by ``--backend auto``.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import ClassVar

from otel_gpu.backends._common import sample_by_sweep
from otel_gpu.backends.simulated.spec import Fault, SimSpec, parse_spec
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
    Snapshot,
)
from otel_gpu.hal.protocol import EventSink, Probe

__all__ = ["SimSpec", "SimulatedBackend", "parse_spec"]

_GIB = 1 << 30
# PCI addresses of the GPUs of a DGX H100 (then continued for larger nodes).
_DGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_MIG_PROFILES = ((3, 40), (2, 20), (1, 10), (1, 10), (1, 10), (1, 10), (1, 10))


class SimulatedBackend:
    """A simulated node described by a :class:`SimSpec` (or a spec string).

    ``timer`` returns monotonic seconds; energy integrates power over it, so tests can drive
    time. The sweep counter (``cycle``) drives scripted faults.
    """

    name: ClassVar[str] = "simulated"
    auto: ClassVar[bool] = False
    fallback_for: ClassVar[str | None] = None
    HANG_S: ClassVar[float] = 60.0

    def __init__(
        self,
        options: str | SimSpec | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = options if isinstance(options, SimSpec) else parse_spec(options)
        self._timer = timer
        self._rng = random.Random(self.spec.seed)
        self._inventory: Inventory | None = None
        self._cycle = 0
        self._last_t: float | None = None
        self._energy: dict[str, float] = {}
        self._counters: dict[tuple[str, str], int] = {}
        self._sink: EventSink | None = None
        self._lock = threading.Lock()
        self._released = threading.Event()
        self.opened = False
        self.closed = False

    @property
    def cycle(self) -> int:
        """Number of sweeps done so far."""
        return self._cycle

    def probe(self) -> Probe:
        """Always available."""
        return Probe(True, f"simulated {self.spec.count}x {self.spec.model}", self.spec.count)

    def open(self) -> None:
        """Build the static inventory."""
        self._inventory = self._build_inventory()
        self.opened = True

    def close(self) -> None:
        """Nothing to release; records that close was called."""
        self.closed = True
        self._sink = None
        self._released.set()

    def start_events(self, sink: EventSink) -> None:
        """Scripted Xid faults are delivered to ``sink`` during the sweep they are due."""
        self._sink = sink

    def stop_events(self) -> None:
        """Stop delivering events."""
        self._sink = None

    # -- inventory -------------------------------------------------------------------------

    def _uuid(self, prefix: str, *key: object) -> str:
        return f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_OID, repr((self.spec.seed, *key)))}"

    def _build_inventory(self) -> Inventory:
        spec, preset = self.spec, self.spec.preset
        devices: list[DeviceInfo] = []
        physical: list[DeviceInfo] = []
        id_prefix = {"nvidia": "GPU", "amd": "AMD", "intel": "XPU", "tpu": "TPU", "neuron": "NRN"}
        for i in range(spec.count):
            bus = _DGX_BUSES[i] if i < len(_DGX_BUSES) else (i // 8) * 0x100 + _DGX_BUSES[i % 8]
            domain, bus_no = divmod(bus, 0x100)
            dev = DeviceInfo(
                index=i,
                id=self._uuid(id_prefix[spec.vendor], i),
                vendor=spec.vendor,
                model=spec.model,
                backend=self.name,
                kind=preset.kind,
                serial=f"SIM{spec.seed:04d}{i:06d}",
                firmware_version="96.00.99.00.01" if spec.vendor == "nvidia" else "sim-1.0",
                board_part_number="692-2G520-0200-000" if spec.vendor == "nvidia" else None,
                pci_bus_id=f"{domain:04x}:{bus_no:02x}:00.0",
                numa_node=0 if i < max(1, spec.count // 2) else 1,
                cpu_affinity="0-55" if i < max(1, spec.count // 2) else "56-111",
                memory_total_bytes=int(spec.memory_gib * _GIB),
                power_limit_default_w=spec.power_limit_w,
                power_limit_min_w=spec.power_limit_w / 3 if spec.power_limit_w else None,
                power_limit_max_w=spec.power_limit_w,
                compute_capability="9.0" if spec.vendor == "nvidia" else None,
                mig_mode=(i in spec.mig) if spec.vendor == "nvidia" else None,
                pcie_max_generation=5,
                pcie_max_width=16,
                temperature_slowdown_c=87.0,
                temperature_shutdown_c=92.0,
                links=self._links(i),
                extra={"cores": str(preset.cores)} if preset.cores else {},
            )
            physical.append(dev)
        devices.extend(physical)
        for parent_index, instances in sorted(spec.mig.items()):
            parent = physical[parent_index]
            for gi in range(instances):
                slices, mem = _MIG_PROFILES[gi]
                devices.append(
                    DeviceInfo(
                        index=len(devices),
                        id=self._uuid("MIG", parent_index, gi),
                        vendor=spec.vendor,
                        model=f"{spec.model} MIG {slices}g.{mem}gb",
                        backend=self.name,
                        kind=preset.kind,
                        parent_id=parent.id,
                        pci_bus_id=parent.pci_bus_id,
                        numa_node=parent.numa_node,
                        memory_total_bytes=mem * _GIB,
                        extra={"mig.gpu_instance_id": str(gi + 1), "mig.compute_instance_id": "0"},
                    )
                )
        versions = {
            "nvidia": {"nvidia.driver": "550.54.15", "cuda": "12.4"},
            "amd": {"amd.driver": "6.8.5", "rocm": "6.2.0"},
            "intel": {"intel.driver": "1.3.29735", "level_zero": "1.17"},
            "tpu": {"tpu.runtime": "2.16.0"},
            "neuron": {"neuron.driver": "2.18.12", "neuron.runtime": "2.21"},
        }[spec.vendor]
        return Inventory(tuple(devices), versions)

    def _links(self, i: int) -> tuple[LinkInfo, ...]:
        spec, preset = self.spec, self.spec.preset
        if spec.topology == "pcie" or (spec.count == 1 and spec.topology == "mesh"):
            return ()
        if spec.topology == "nvswitch":
            return tuple(
                LinkInfo(
                    index=k,
                    link_type=preset.link_type,
                    up=True,
                    remote_kind="switch",
                    remote_id=f"nvswitch{k % 4}",
                )
                for k in range(preset.links or 18)
            )
        peers = [p for p in range(spec.count) if p != i][: preset.links or spec.count - 1]
        return tuple(
            LinkInfo(
                index=k,
                link_type=preset.link_type,
                up=True,
                remote_kind="gpu",
                remote_device_index=p,
            )
            for k, p in enumerate(peers)
        )

    def inventory(self) -> Inventory:
        """The static inventory built at open."""
        if self._inventory is None:
            self.open()
        assert self._inventory is not None
        return self._inventory

    # -- sampling --------------------------------------------------------------------------

    def _active(self, kind: str, device: int) -> Fault | None:
        """The fault of ``kind`` on ``device`` active at the current cycle, if any."""
        for fault in self.spec.faults:
            if fault.kind == kind and fault.device == device and fault.cycle <= self._cycle:
                return fault
        return None

    def _lost(self, device: int) -> bool:
        lost = self._active("lost", device)
        if lost is None:
            return False
        recover = self._active("recover", device)
        return recover is None or recover.cycle < lost.cycle

    def _count(self, device_id: str, key: str, increment: int) -> int:
        value = self._counters.get((device_id, key), 0) + increment
        self._counters[(device_id, key)] = value
        return value

    def sample(self) -> Snapshot:
        """One sweep: every device's values for the current cycle, then advance the cycle."""
        return sample_by_sweep(self.sweep)

    def sweep(self, emit: Callable[[DeviceSample | DeviceFailure], None]) -> None:
        """One sweep handing each device to ``emit`` as it is read. A ``hang`` fault blocks the
        sweep on its device (as a wedged driver call would) for ``HANG_S`` or until close."""
        with self._lock:
            inventory = self.inventory()
            now = self._timer()
            dt = 0.0 if self._last_t is None else max(0.0, now - self._last_t)
            self._last_t = now
            lost_parents: set[str] = set()
            for dev in inventory.devices:
                if dev.parent_id is not None:
                    if dev.parent_id in lost_parents:
                        emit(DeviceFailure(dev.id, "parent GPU is lost", lost=True))
                    else:
                        emit(self._sample_mig(dev))
                    continue
                if self._due("hang", dev.index):
                    self._released.wait(self.HANG_S)
                if self._lost(dev.index):
                    emit(DeviceFailure(dev.id, "GPU is lost (simulated)", lost=True))
                    lost_parents.add(dev.id)
                    continue
                emit(self._sample_device(dev, dt))
            self._emit_scripted_events(inventory)
            self._cycle += 1

    def _wave(self, dev: DeviceInfo, period: float, phase: float = 0.0) -> float:
        """A deterministic 0..1 load curve per device, plus a little seeded noise."""
        base = 0.55 + 0.35 * math.sin((self._cycle + dev.index * 1.7 + phase) / period)
        return min(1.0, max(0.0, base + self._rng.uniform(-0.05, 0.05)))

    def _sample_device(self, dev: DeviceInfo, dt: float) -> DeviceSample:
        spec = self.spec
        util = 0.0 if spec.idle else self._wave(dev, 3.0)
        total = dev.memory_total_bytes or 0
        busy_memory = 0.35 + 0.5 * self._wave(dev, 7.0, 1.0)
        used = int(total * (0.001 if spec.idle else busy_memory))
        limit = spec.power_limit_w
        power = None if limit is None else round(limit * (0.12 + 0.8 * util), 3)
        energy = None
        if power is not None:
            energy = self._energy.get(dev.id, 1_000_000.0 + dev.index * 1000.0) + power * dt
            self._energy[dev.id] = energy
        hot = self._active("hot", dev.index) is not None
        temp = 95.0 if hot else round(38.0 + 40.0 * util, 1)
        temps: dict[str, float] = {"gpu": temp}
        if spec.vendor in ("nvidia", "amd"):
            temps["memory"] = round(temp + 6.0, 1)
        if spec.vendor == "amd":
            temps["hotspot"] = round(temp + 12.0, 1)
        throttle: set[str] = set()
        if self._active("throttle-thermal", dev.index):
            throttle.add("thermal")
        if self._active("throttle-power", dev.index):
            throttle.add("power")
        ecc_u = self._count(dev.id, "ecc_u", 1 if self._due("ecc", dev.index) else 0)
        ecc_c = self._count(dev.id, "ecc_c", 3 if self._active("ecc-corrected", dev.index) else 0)
        bytes_per_s = 2.0e9 * util
        tx = self._count(dev.id, "pcie_tx", int(bytes_per_s * dt))
        rx = self._count(dev.id, "pcie_rx", int(bytes_per_s * 1.3 * dt))
        links = tuple(
            LinkSample(
                index=link.index,
                link_type=link.link_type,
                up=not (link.index == 0 and self._active("link-down", dev.index) is not None),
                tx_bytes=self._count(dev.id, f"l{link.index}tx", int(25e9 * util * dt)),
                rx_bytes=self._count(dev.id, f"l{link.index}rx", int(25e9 * util * dt)),
                errors={"crc": 0, "replay": 0, "recovery": 0},
            )
            for link in dev.links
        )
        retired = {"remapped": 0, "pending": 0, "failed": 0}
        if self._active("retirement-pending", dev.index):
            retired["pending"] = 1
        if self._active("row-remap-failure", dev.index):
            retired["failed"] = 1
        cores = int(dev.extra.get("cores", "0"))
        engines: dict[str, float] = {}
        if spec.vendor == "intel":
            engines = {"compute": util, "copy": util * 0.3, "media": 0.0, "render": util * 0.1}
        elif spec.vendor == "neuron":
            engines = {f"core{c}": self._wave(dev, 3.0, c) for c in range(cores)}
        pcie_width = 8 if self._active("pcie-degraded", dev.index) else 16
        clocks = {
            "graphics": 1.98e9 * (0.5 + util / 2),
            "sm": 1.98e9 * (0.5 + util / 2),
            "memory": 2.619e9,
        }
        return DeviceSample(
            device_id=dev.id,
            utilization_ratio=round(util, 4),
            encoder_utilization_ratio=0.0 if spec.vendor in ("nvidia", "amd") else None,
            decoder_utilization_ratio=0.0 if spec.vendor in ("nvidia", "amd") else None,
            memory_bandwidth_utilization_ratio=round(util * 0.6, 4),
            memory_used_bytes=used,
            memory_total_bytes=total,
            power_w=power,
            power_limit_w=limit,
            energy_j=energy,
            temperatures_c=temps,
            clocks_hz=clocks if spec.vendor not in ("tpu", "neuron") else {},
            throttle_reasons=frozenset(throttle),
            ecc_corrected_total=ecc_c,
            ecc_uncorrected_total=ecc_u,
            pcie_replay_total=0,
            pcie_tx_bytes=tx,
            pcie_rx_bytes=rx,
            pcie_generation=5,
            pcie_width=pcie_width,
            retired_rows=retired if spec.vendor in ("nvidia", "amd") else {},
            links=links,
            engines=engines,
            processes=()
            if spec.idle
            else (ProcessSample(pid=4242 + dev.index, memory_used_bytes=used // 2, name="python"),),
        )

    def _sample_mig(self, dev: DeviceInfo) -> DeviceSample:
        total = dev.memory_total_bytes or 0
        return DeviceSample(
            device_id=dev.id,
            memory_used_bytes=int(total * 0.25 * (1 + self._wave(dev, 5.0))),
            memory_total_bytes=total,
        )

    def _due(self, kind: str, device: int) -> bool:
        """True on exactly the cycle a one-shot fault (ecc, xid) fires."""
        return any(
            f.kind == kind and f.device == device and f.cycle == self._cycle
            for f in self.spec.faults
        )

    def _emit_scripted_events(self, inventory: Inventory) -> None:
        sink = self._sink
        if sink is None:
            return
        for fault in self.spec.faults:
            if fault.kind != "xid" or fault.cycle != self._cycle:
                continue
            dev = inventory.devices[fault.device]
            code = fault.code or 0
            sink(
                HealthEvent(
                    name="nvidia.xid",
                    severity=Severity.ERROR,
                    state=HealthState.DEGRADED,
                    message=f"Xid {code} on {dev.name} (simulated)",
                    device_id=dev.id,
                    timestamp_ns=time.time_ns(),
                    attributes={"nvidia.xid.code": code},
                )
            )
