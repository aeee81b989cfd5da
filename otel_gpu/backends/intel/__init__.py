"""The Intel backend, on Level Zero Sysman through Intel's Python bindings ``pyzes``.

Level Zero Sysman is the primary (and only) path: ``xpu-smi`` is a command-line front end
over the same library and is not used. Sysman enumerates one device per card; a
multi-tile card (Data Center GPU Max 1550: two tiles, or "stacks") exposes per-tile
components flagged ``onSubdevice``. Each tile becomes a child device (``parent_id`` = the card,
like a MIG instance) with its own utilization, memory, power, clocks and temperatures; the card
carries the card-level readings and the aggregates (utilization and engines: the mean of its
tiles; memory: the sum; temperatures: the hottest tile; throttling: the union).

Static facts are read once at :meth:`IntelBackend.open`: identity (UUID, serial, board, name),
PCI address and maximum link, NUMA node and CPU list (sysfs), tile UUIDs, and the component
handles of each card (engine groups, memory modules, power domains, frequency domains,
temperature sensors, RAS error sets) with their properties. Each sweep then reads:

====================================  =========================================================
hot path, every sweep                 ``zesEngineGetActivity`` (the ``*_ALL`` engine groups:
                                      compute, copy, media, render), ``zesMemoryGetState`` and
                                      ``zesMemoryGetBandwidth`` per HBM module,
                                      ``zesPowerGetEnergyCounter`` per power domain,
                                      ``zesFrequencyGetState`` (GPU domains: actual clock and
                                      throttle reasons), ``zesTemperatureGetState`` (GPU and
                                      memory sensors), ``zesDevicePciGetStats`` (bytes, replays,
                                      current link), ``zesRasGetState`` per error set
slow path, every ``slow_every`` sweeps sustained power limit (``zesPowerGetLimitsExt``), memory
                                      and media clocks, processes (when enabled)
====================================  =========================================================

Units: engine activity and energy are counters with microsecond timestamps, so utilization is
Δactive/Δtime and power is Δenergy/Δtime between two reads (a baseline is taken at open, so the
first sweep has both); energy is µJ -> J; clocks MHz -> Hz; power limits mW -> W; memory and
PCIe counters are bytes. RAS: ``ecc_*_total`` is the sum of the hardware categories (compute,
non-compute, cache errors) of the correctable / uncorrectable sets; resets, driver and
programming errors are not counted. Throttle reasons: average/burst power cap and power ->
``power``, thermal limit -> ``thermal``, PSU alert -> ``hw_power_brake``, hardware range ->
``hw_slowdown``, current limit -> ``current_limit``, voltage -> ``voltage``; the software range
(a user-set frequency window) is not a throttle.

A card whose calls return ``ZE_RESULT_ERROR_DEVICE_LOST`` (or ``DEVICE_REQUIRES_RESET``) is
reported lost (its tiles with it) while the others go on; it is probed again with backoff.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from otel_gpu.backends._common import LibraryBackend, LostState
from otel_gpu.backends.intel._lib import RasProperties, RasState, Zes, ZesCallError
from otel_gpu.errors import DeviceLost, OtelGpuError
from otel_gpu.hal.model import (
    DeviceFailure,
    DeviceInfo,
    DeviceSample,
    Inventory,
    ProcessSample,
    normalize_pci_bus_id,
)
from otel_gpu.hal.protocol import Probe

__all__ = ["IntelBackend", "format_uuid", "throttle_reasons"]

_log = logging.getLogger(__name__)

# zes_engine_group_t of the aggregate groups read each sweep -> engine name.
_ENGINE_GROUPS = {
    "ZES_ENGINE_GROUP_ALL": "all",
    "ZES_ENGINE_GROUP_COMPUTE_ALL": "compute",
    "ZES_ENGINE_GROUP_MEDIA_ALL": "media",
    "ZES_ENGINE_GROUP_COPY_ALL": "copy",
    "ZES_ENGINE_GROUP_RENDER_ALL": "render",
}
_FREQ_DOMAINS = {
    "ZES_FREQ_DOMAIN_GPU": "graphics",
    "ZES_FREQ_DOMAIN_MEMORY": "memory",
    "ZES_FREQ_DOMAIN_MEDIA": "video",
}
_TEMP_SENSORS = {
    "ZES_TEMP_SENSORS_GPU": "gpu",
    "ZES_TEMP_SENSORS_MEMORY": "memory",
    "ZES_TEMP_SENSORS_GLOBAL": "global",
}
# zes_freq_throttle_reason_flags_t bit -> reason (None: not a throttle).
_THROTTLE_BITS: tuple[tuple[int, str | None], ...] = (
    (1 << 0, "power"),  # AVE_PWR_CAP
    (1 << 1, "power"),  # BURST_PWR_CAP
    (1 << 2, "current_limit"),  # CURRENT_LIMIT
    (1 << 3, "thermal"),  # THERMAL_LIMIT
    (1 << 4, "hw_power_brake"),  # PSU_ALERT
    (1 << 5, None),  # SW_RANGE: the user's frequency window
    (1 << 6, "hw_slowdown"),  # HW_RANGE
    (1 << 7, "voltage"),  # VOLTAGE
    (1 << 8, "thermal"),  # THERMAL
    (1 << 9, "power"),  # POWER
)
_RAS_HW_CATEGORIES = (3, 4, 5)  # COMPUTE_ERRORS, NON_COMPUTE_ERRORS, CACHE_ERRORS
_RAS_UNCORRECTABLE = 1  # zes_ras_error_type_t
_MEM_LOC_DEVICE = 1  # zes_mem_loc_t
_POWER_LEVEL_SUSTAINED = 1  # zes_power_level_t
_LIMIT_UNIT_POWER = 2  # zes_limit_unit_t


def format_uuid(raw: Any) -> str:
    """A 16-byte Level Zero UUID as ``8-4-4-4-12`` hex (bytes in memory order)."""
    data = bytes(raw)
    text = data.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"


def throttle_reasons(mask: int) -> frozenset[str]:
    """The reasons of a ``zes_freq_throttle_reason_flags_t`` bitmask."""
    return frozenset(reason for bit, reason in _THROTTLE_BITS if mask & bit and reason)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.split(b"\0", 1)[0].decode("utf-8", "replace")
    text = str(value).strip() if value is not None else ""
    return None if not text or text.lower() in ("unknown", "n/a") else text


@dataclass
class _Part:
    """A component handle of a card (engine group, memory module...) and where it lives."""

    handle: Any
    kind: str  # engine/domain/sensor name, or RAS "correctable"/"uncorrectable"
    tile: int | None  # subdevice id, None for card-level components


@dataclass
class _Counter:
    """The previous read of a (value, microsecond timestamp) counter."""

    value: float
    ts_us: float


@dataclass
class _Card:
    """Per-card state kept between sweeps."""

    info: DeviceInfo
    handle: Any
    tiles: list[DeviceInfo] = field(default_factory=list)
    engines: list[_Part] = field(default_factory=list)
    memory: list[_Part] = field(default_factory=list)
    power: list[_Part] = field(default_factory=list)
    freqs: list[_Part] = field(default_factory=list)
    temps: list[_Part] = field(default_factory=list)
    ras: list[_Part] = field(default_factory=list)
    pci_bytes: bool = False
    pci_replays: bool = False
    prev: dict[tuple[str, int], _Counter] = field(default_factory=dict)
    slow: dict[str, Any] = field(default_factory=dict)
    lost: LostState = field(default_factory=LostState)
    inventoried: bool = True  # False: unreadable at open, a placeholder with no components
    broken_reason: str | None = None  # unreadable (not lost) since open: keeps failing


@dataclass
class _Reading:
    """What one sweep read for one scope (the card, or one tile)."""

    engines: dict[str, list[float]] = field(default_factory=dict)
    mem_used: list[int] = field(default_factory=list)
    mem_total: list[int] = field(default_factory=list)
    bandwidth: list[tuple[float, float]] = field(default_factory=list)  # (bytes/s used, max)
    power_w: float | None = None
    energy_j: float | None = None
    clocks: dict[str, list[float]] = field(default_factory=dict)
    temps: dict[str, list[float]] = field(default_factory=dict)
    throttle: set[str] | None = None
    ecc: dict[int, int] = field(default_factory=dict)  # zes_ras_error_type_t -> count


class IntelBackend(LibraryBackend):
    """Intel GPUs through Level Zero Sysman (pyzes). ``sysfs_root`` is where ``sys/bus/pci`` is
    read (tests); ``slow_every`` sets how many sweeps pass between slow-path reads; ``clock``
    is monotonic seconds (backoff)."""

    name: ClassVar[str] = "intel"
    call_error: ClassVar[type[Exception]] = ZesCallError
    auto: ClassVar[bool] = True
    fallback_for: ClassVar[str | None] = None

    @property
    def library(self) -> Zes:
        """The vendor library handle."""
        return self.zes

    def __init__(
        self,
        options: str | None = None,
        *,
        sysfs_root: Path = Path("/"),
        slow_every: int = 6,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(options, sysfs_root=sysfs_root, slow_every=slow_every, clock=clock)
        self.zes = Zes()
        self._cards: list[_Card] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def probe(self) -> Probe:
        """zesInit and count Sysman devices. Never raises."""
        zes = Zes()
        try:
            zes.start()
            count = len(self._device_handles(zes))
        except OtelGpuError as err:
            return Probe(False, getattr(err, "reason", str(err)))
        except Exception as err:
            return Probe(False, f"Level Zero probe failed: {type(err).__name__}: {err}")
        finally:
            zes.stop()
        if count == 0:
            return Probe(False, "Level Zero Sysman found no Intel GPU", 0)
        return Probe(True, f"Level Zero Sysman: {count} GPU(s)", count)

    # -- inventory ---------------------------------------------------------------------------

    @staticmethod
    def _device_handles(zes: Zes) -> list[Any]:
        mod = zes.mod
        out: list[Any] = []
        for driver in zes.enum("zesDriverGet", None, mod.zes_driver_handle_t):
            out.extend(zes.enum("zesDeviceGet", driver, mod.zes_device_handle_t))
        return out

    def _read_inventory(self) -> Inventory:
        handles = self._device_handles(self.zes)
        self._cards = []
        versions: dict[str, str] = {}
        for i, h in enumerate(handles):
            try:
                card, driver = self._static(i, h)
                if driver:
                    versions.setdefault("intel.driver", driver)
            except (DeviceLost, ZesCallError) as err:
                info = DeviceInfo(
                    index=i,
                    id=f"intel-gpu-{i}",
                    vendor="intel",
                    model="unknown (unreadable)",
                    backend=self.name,
                    local_index=i,
                )
                card = _Card(info, h, inventoried=False)
                if isinstance(err, DeviceLost):
                    self._mark_lost(card, err.reason, self._clock())
                else:
                    card.broken_reason = str(err)
            self._cards.append(card)
        tiles: list[DeviceInfo] = []
        index = len(self._cards)
        for card in self._cards:
            renumbered = []
            for tile in card.tiles:
                renumbered.append(dataclasses.replace(tile, index=index, local_index=index))
                index += 1
            card.tiles = renumbered
            tiles.extend(renumbered)
        return Inventory(tuple([c.info for c in self._cards] + tiles), versions)

    def _static(self, i: int, h: Any) -> tuple[_Card, str | None]:
        z, _mod = self.zes, self.zes.mod
        where = f"intel-gpu-{i}"
        props = z.struct("zes_device_properties_t", "ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES")
        z.call("zesDeviceGetProperties", h, ctypes.byref(props), device=where)
        uuid = format_uuid(props.core.uuid.id)
        q = {"device": uuid}
        pci = z.struct("zes_pci_properties_t", "ZES_STRUCTURE_TYPE_PCI_PROPERTIES")
        bus = None
        pci_ok = z.try_call("zesDevicePciGetProperties", h, ctypes.byref(pci), **q)
        if pci_ok:
            a = pci.address
            try:
                bus = normalize_pci_bus_id(
                    f"{a.domain:04x}:{a.bus:02x}:{a.device:02x}.{a.function:x}"
                )
            except ValueError:
                _log.warning("Intel GPU %d: unparsable PCI address", i)
        model = _text(props.core.name) or _text(props.modelName) or "Intel GPU"
        info = DeviceInfo(
            index=i,
            id=uuid,
            vendor="intel",
            model=model,
            backend=self.name,
            local_index=i,
            serial=_text(props.serialNumber),
            board_part_number=_text(props.boardNumber),
            pci_bus_id=bus,
            numa_node=self._numa(bus),
            cpu_affinity=self._sysfs(bus, "local_cpulist"),
            pcie_max_generation=pci.maxSpeed.gen if pci_ok and pci.maxSpeed.gen > 0 else None,
            pcie_max_width=pci.maxSpeed.width if pci_ok and pci.maxSpeed.width > 0 else None,
            extra={"intel.device_id": f"0x{props.core.deviceId:04x}"},
        )
        card = _Card(info, h)
        card.pci_bytes = bool(pci_ok and pci.haveBandwidthCounters)
        card.pci_replays = bool(pci_ok and pci.haveReplayCounters)
        self._components(card)
        card.tiles = self._tiles(card, int(props.numSubdevices))
        # Card totals and limits from the component properties read above.
        totals = card.slow.pop("mem_physical", {})
        card_limit = card.slow.pop("power_props", {}).get(None)
        card.info = dataclasses.replace(
            card.info,
            memory_total_bytes=sum(totals.values()) or None,
            power_limit_default_w=card_limit[0] if card_limit else None,
            power_limit_min_w=card_limit[1] if card_limit else None,
            power_limit_max_w=card_limit[2] if card_limit else None,
            extra={**info.extra, "intel.tiles": str(len(card.tiles))} if card.tiles else info.extra,
        )
        card.tiles = [
            dataclasses.replace(t, memory_total_bytes=totals.get(n))
            for n, t in enumerate(card.tiles)
        ]
        self._read(card)  # baselines of the activity and energy counters
        return card, _text(props.driverVersion)

    def _tiles(self, card: _Card, count: int) -> list[DeviceInfo]:
        if count <= 1:
            return []
        z, mod = self.zes, self.zes.mod
        parent = card.info
        uuids: dict[int, str] = {}
        n = ctypes.c_uint32(0)
        if (
            z.try_call(
                "zesDeviceGetSubDevicePropertiesExp",
                card.handle,
                ctypes.byref(n),
                None,
                device=parent.id,
            )
            and n.value
        ):
            array = (mod.zes_subdevice_exp_properties_t * n.value)()
            for item in array:
                item.stype = int(mod.ZES_STRUCTURE_TYPE_SUBDEVICE_EXP_PROPERTIES)
            if z.try_call(
                "zesDeviceGetSubDevicePropertiesExp",
                card.handle,
                ctypes.byref(n),
                array,
                device=parent.id,
            ):
                uuids = {int(p.subdeviceId): format_uuid(p.uuid.id) for p in array[: n.value]}
        return [
            DeviceInfo(
                index=0,
                id=uuids.get(t) or f"{parent.id}/tile{t}",
                vendor="intel",
                model=f"{parent.model} (tile {t})",
                backend=self.name,
                parent_id=parent.id,
                pci_bus_id=parent.pci_bus_id,
                numa_node=parent.numa_node,
                cpu_affinity=parent.cpu_affinity,
                extra={"intel.tile": str(t)},
            )
            for t in range(count)
        ]

    def _components(self, card: _Card) -> None:
        z, mod, h, uuid = self.zes, self.zes.mod, card.handle, card.info.id
        groups = {int(getattr(mod, k)): v for k, v in _ENGINE_GROUPS.items() if hasattr(mod, k)}
        for eh in z.enum("zesDeviceEnumEngineGroups", h, mod.zes_engine_handle_t, device=uuid):
            p = z.struct("zes_engine_properties_t", "ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES")
            if z.try_call("zesEngineGetProperties", eh, ctypes.byref(p), device=uuid):
                kind = groups.get(int(p.type))
                if kind is not None:
                    card.engines.append(_Part(eh, kind, _tile(p)))
        physical: dict[int | None, int] = {}
        for mh in z.enum("zesDeviceEnumMemoryModules", h, mod.zes_mem_handle_t, device=uuid):
            p = z.struct("zes_mem_properties_t", "ZES_STRUCTURE_TYPE_MEM_PROPERTIES")
            if z.try_call("zesMemoryGetProperties", mh, ctypes.byref(p), device=uuid):
                if int(p.location) != _MEM_LOC_DEVICE:
                    continue
                card.memory.append(_Part(mh, "memory", _tile(p)))
                key = _tile(p)
                physical[key] = physical.get(key, 0) + int(p.physicalSize)
        card.slow["mem_physical"] = physical
        limits: dict[int | None, tuple[float | None, float | None, float | None]] = {}
        for ph in z.enum("zesDeviceEnumPowerDomains", h, mod.zes_pwr_handle_t, device=uuid):
            p = z.struct("zes_power_properties_t", "ZES_STRUCTURE_TYPE_POWER_PROPERTIES")
            if z.try_call("zesPowerGetProperties", ph, ctypes.byref(p), device=uuid):
                card.power.append(_Part(ph, "power", _tile(p)))
                limits[_tile(p)] = (_mw(p.defaultLimit), _mw(p.minLimit), _mw(p.maxLimit))
        card.slow["power_props"] = limits
        domains = {int(getattr(mod, k)): v for k, v in _FREQ_DOMAINS.items() if hasattr(mod, k)}
        for fh in z.enum("zesDeviceEnumFrequencyDomains", h, mod.zes_freq_handle_t, device=uuid):
            p = z.struct("zes_freq_properties_t", "ZES_STRUCTURE_TYPE_FREQ_PROPERTIES")
            if z.try_call("zesFrequencyGetProperties", fh, ctypes.byref(p), device=uuid):
                kind = domains.get(int(p.type))
                if kind is not None:
                    card.freqs.append(_Part(fh, kind, _tile(p)))
        sensors = {int(getattr(mod, k)): v for k, v in _TEMP_SENSORS.items() if hasattr(mod, k)}
        for th in z.enum("zesDeviceEnumTemperatureSensors", h, mod.zes_temp_handle_t, device=uuid):
            p = z.struct("zes_temp_properties_t", "ZES_STRUCTURE_TYPE_TEMP_PROPERTIES")
            if z.try_call("zesTemperatureGetProperties", th, ctypes.byref(p), device=uuid):
                kind = sensors.get(int(p.type))
                if kind is not None:
                    card.temps.append(_Part(th, kind, _tile(p)))
        # "all" only where a tile (or the card) has no compute group; the card-level "global"
        # sensor only when no GPU sensor covers the card: fewer calls per sweep.
        computes = {e.tile for e in card.engines if e.kind == "compute"}
        card.engines = [e for e in card.engines if e.kind != "all" or e.tile not in computes]
        if any(t.kind == "gpu" for t in card.temps):
            card.temps = [t for t in card.temps if t.kind != "global"]
        for rh in z.enum(
            "zesDeviceEnumRasErrorSets", h, z.ras_handle_type(), device=uuid, quantity="ras"
        ):
            p = RasProperties(stype=0xF)
            if z.try_call("zesRasGetProperties", rh, ctypes.byref(p), device=uuid):
                kind = "uncorrectable" if p.type == _RAS_UNCORRECTABLE else "correctable"
                card.ras.append(_Part(rh, kind, _tile(p)))

    def _numa(self, bus: str | None) -> int | None:
        text = self._sysfs(bus, "numa_node")
        try:
            node = int(text) if text is not None else -1
        except ValueError:
            return None
        return node if node >= 0 else None

    def _sysfs(self, bus: str | None, name: str) -> str | None:
        if bus is None:
            return None
        try:
            return (self._root / "sys/bus/pci/devices" / bus / name).read_text().strip() or None
        except OSError:
            return None

    # -- sampling ----------------------------------------------------------------------------

    def _units(self) -> list[_Card]:
        return self._cards

    def _read_unit(self, unit: _Card, slow: bool) -> list[DeviceSample]:
        return self._sample_card(unit, slow)

    def _unit_failures(self, card: _Card, reason: str, lost: bool) -> list[DeviceFailure]:
        prefix = "card lost: " if lost else "card unreadable: "
        return [DeviceFailure(card.info.id, reason, lost=lost)] + [
            DeviceFailure(t.id, prefix + reason, lost=lost) for t in card.tiles
        ]

    def _retry_lost(self, card: _Card, now: float) -> bool:
        """Ask a lost card again when its backoff has passed; True when it answers."""
        if not card.lost.due(now) or not card.inventoried:
            return False
        props = self.zes.struct("zes_device_properties_t", "ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES")
        try:
            self.zes.call(
                "zesDeviceGetProperties", card.handle, ctypes.byref(props), device=card.info.id
            )
        except (DeviceLost, ZesCallError) as err:
            self._mark_lost(card, str(err), now)
            return False
        card.lost.recovered(f"{card.info.name} ({card.info.id})")
        card.prev.clear()
        return True

    def _read(self, card: _Card) -> dict[int | None, _Reading]:
        """One read of every hot-path component, grouped by scope (None = the card)."""
        z, mod, uuid = self.zes, self.zes.mod, card.info.id
        scopes: dict[int | None, _Reading] = {None: _Reading()}

        def scope(tile: int | None) -> _Reading:
            return scopes.setdefault(tile, _Reading())

        for n, part in enumerate(card.engines):
            stats = mod.zes_engine_stats_t()
            if z.call(
                "zesEngineGetActivity",
                part.handle,
                ctypes.byref(stats),
                device=uuid,
                quantity=f"engine_{part.kind}",
            ):
                ratio = self._rate(card, ("engine", n), stats.activeTime, stats.timestamp)
                if ratio is not None:
                    scope(part.tile).engines.setdefault(part.kind, []).append(min(1.0, ratio))
        for n, part in enumerate(card.memory):
            state = z.struct("zes_mem_state_t", "ZES_STRUCTURE_TYPE_MEM_STATE")
            if z.call(
                "zesMemoryGetState",
                part.handle,
                ctypes.byref(state),
                device=uuid,
                quantity="memory_state",
            ):
                r = scope(part.tile)
                r.mem_used.append(int(state.size) - int(state.free))
                r.mem_total.append(int(state.size))
            bw = mod.zes_mem_bandwidth_t()
            if z.call(
                "zesMemoryGetBandwidth",
                part.handle,
                ctypes.byref(bw),
                device=uuid,
                quantity="memory_bandwidth",
            ):
                rate = self._rate(
                    card, ("membw", n), bw.readCounter + bw.writeCounter, bw.timestamp
                )
                if rate is not None and bw.maxBandwidth:
                    scope(part.tile).bandwidth.append((rate * 1e6, float(bw.maxBandwidth)))
        for n, part in enumerate(card.power):
            energy = mod.zes_power_energy_counter_t()
            if z.call(
                "zesPowerGetEnergyCounter",
                part.handle,
                ctypes.byref(energy),
                device=uuid,
                quantity="energy",
            ):
                r = scope(part.tile)
                r.energy_j = energy.energy / 1e6
                rate = self._rate(card, ("energy", n), energy.energy, energy.timestamp)
                r.power_w = rate  # µJ per µs = W
        for part in card.freqs:
            if part.kind != "graphics":
                continue
            state = z.struct("zes_freq_state_t", "ZES_STRUCTURE_TYPE_FREQ_STATE")
            if z.call(
                "zesFrequencyGetState",
                part.handle,
                ctypes.byref(state),
                device=uuid,
                quantity="frequency",
            ):
                r = scope(part.tile)
                if state.actual > 0:
                    r.clocks.setdefault("graphics", []).append(state.actual * 1e6)
                r.throttle = (r.throttle or set()) | set(throttle_reasons(state.throttleReasons))
        for part in card.temps:
            value = ctypes.c_double(0.0)
            if z.call(
                "zesTemperatureGetState",
                part.handle,
                ctypes.byref(value),
                device=uuid,
                quantity=f"temperature_{part.kind}",
            ):
                kind = "gpu" if part.kind == "global" else part.kind
                scope(part.tile).temps.setdefault(kind, []).append(float(value.value))
        for part in card.ras:
            state = RasState(stype=0x22)
            if z.call(
                "zesRasGetState", part.handle, 0, ctypes.byref(state), device=uuid, quantity="ras"
            ):
                r = scope(part.tile)
                ras_type = _RAS_UNCORRECTABLE if part.kind == "uncorrectable" else 0
                r.ecc[ras_type] = r.ecc.get(ras_type, 0) + sum(
                    int(state.category[c]) for c in _RAS_HW_CATEGORIES
                )
        return scopes

    def _rate(self, card: _Card, key: tuple[str, int], value: float, ts_us: float) -> float | None:
        """Growth of a counter per microsecond since its last read (None on the first)."""
        prev = card.prev.get(key)
        card.prev[key] = _Counter(float(value), float(ts_us))
        if prev is None or ts_us <= prev.ts_us or value < prev.value:
            return None
        return (float(value) - prev.value) / (float(ts_us) - prev.ts_us)

    def _sample_card(self, card: _Card, slow: bool) -> list[DeviceSample]:
        z, uuid = self.zes, card.info.id
        scopes = self._read(card)
        stats = self.zes.struct("zes_pci_stats_t")
        pci = z.call(
            "zesDevicePciGetStats",
            card.handle,
            ctypes.byref(stats),
            device=uuid,
            quantity="pci_stats",
        )
        if slow:
            card.slow = self._slow_reads(card)
        tile_readings = [scopes.get(n, _Reading()) for n in range(len(card.tiles))]
        whole = _combine(scopes[None], tile_readings)
        sample = _to_sample(uuid, whole, card.info.memory_total_bytes)
        clocks = dict(sample.clocks_hz)
        clocks.update(card.slow.get("clocks", {}))
        sample = dataclasses.replace(
            sample,
            clocks_hz=clocks,
            power_limit_w=card.slow.get("power_limit_w"),
            pcie_tx_bytes=int(stats.txCounter) if pci and card.pci_bytes else None,
            pcie_rx_bytes=int(stats.rxCounter) if pci and card.pci_bytes else None,
            pcie_replay_total=int(stats.replayCounter) if pci and card.pci_replays else None,
            pcie_generation=stats.speed.gen if pci and stats.speed.gen > 0 else None,
            pcie_width=stats.speed.width if pci and stats.speed.width > 0 else None,
            processes=card.slow.get("processes"),
        )
        tiles = [
            _to_sample(tile.id, reading, tile.memory_total_bytes)
            for tile, reading in zip(card.tiles, tile_readings, strict=True)
        ]
        return [sample, *tiles]

    def _slow_reads(self, card: _Card) -> dict[str, Any]:
        z, mod, uuid = self.zes, self.zes.mod, card.info.id
        out: dict[str, Any] = {}
        for part in card.power:
            if part.tile is not None:
                continue
            count = ctypes.c_uint32(0)
            if (
                not z.try_call(
                    "zesPowerGetLimitsExt",
                    part.handle,
                    ctypes.byref(count),
                    None,
                    device=uuid,
                    quantity="power_limits",
                )
                or not count.value
            ):
                continue
            limits = (mod.zes_power_limit_ext_desc_t * count.value)()
            for item in limits:
                item.stype = int(mod.ZES_STRUCTURE_TYPE_POWER_LIMIT_EXT_DESC)
            if z.try_call(
                "zesPowerGetLimitsExt",
                part.handle,
                ctypes.byref(count),
                limits,
                device=uuid,
                quantity="power_limits",
            ):
                for item in limits[: count.value]:
                    if (
                        item.level == _POWER_LEVEL_SUSTAINED
                        and item.limitUnit == _LIMIT_UNIT_POWER
                        and item.enabled
                        and item.limit > 0
                    ):
                        out["power_limit_w"] = item.limit / 1000.0
        clocks: dict[str, list[float]] = {}
        for part in card.freqs:
            if part.kind == "graphics":
                continue
            state = z.struct("zes_freq_state_t", "ZES_STRUCTURE_TYPE_FREQ_STATE")
            if (
                z.try_call(
                    "zesFrequencyGetState",
                    part.handle,
                    ctypes.byref(state),
                    device=uuid,
                    quantity=f"frequency_{part.kind}",
                )
                and state.actual > 0
            ):
                clocks.setdefault(part.kind, []).append(state.actual * 1e6)
        out["clocks"] = {k: sum(v) / len(v) for k, v in clocks.items()}
        if self.collect_processes:
            out["processes"] = self._processes(card)
        return out

    def _processes(self, card: _Card) -> tuple[ProcessSample, ...] | None:
        z, mod, uuid = self.zes, self.zes.mod, card.info.id
        count = ctypes.c_uint32(0)
        if not z.try_call(
            "zesDeviceProcessesGetState",
            card.handle,
            ctypes.byref(count),
            None,
            device=uuid,
            quantity="processes",
        ):
            return None
        if not count.value:
            return ()
        procs = (mod.zes_process_state_t * count.value)()
        for item in procs:
            item.stype = int(mod.ZES_STRUCTURE_TYPE_PROCESS_STATE)
        if not z.try_call(
            "zesDeviceProcessesGetState",
            card.handle,
            ctypes.byref(count),
            procs,
            device=uuid,
            quantity="processes",
        ):
            return None
        return tuple(
            ProcessSample(pid=int(p.processId), memory_used_bytes=int(p.memSize))
            for p in procs[: count.value]
        )


def _tile(props: Any) -> int | None:
    return int(props.subdeviceId) if props.onSubdevice else None


def _mw(value: int) -> float | None:
    return value / 1000.0 if value and value > 0 else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _combine(card: _Reading, tiles: list[_Reading]) -> _Reading:
    """The card's reading: its own card-level components, else the aggregate of its tiles."""
    if not tiles:
        return card
    out = _Reading()
    for r in [card, *tiles]:
        for k, v in r.engines.items():
            out.engines.setdefault(k, []).extend(v)
        for k, v in r.clocks.items():
            out.clocks.setdefault(k, []).extend(v)
        for k, v in r.temps.items():
            out.temps.setdefault(k, []).extend(v)
        out.mem_used.extend(r.mem_used)
        out.mem_total.extend(r.mem_total)
        out.bandwidth.extend(r.bandwidth)
        if r.throttle is not None:
            out.throttle = (out.throttle or set()) | r.throttle
        for ras_type, count in r.ecc.items():
            out.ecc[ras_type] = out.ecc.get(ras_type, 0) + count
    if card.energy_j is not None:  # the card-level power domain, when there is one
        out.energy_j, out.power_w = card.energy_j, card.power_w
    elif tiles and all(t.energy_j is not None for t in tiles):
        out.energy_j = sum(t.energy_j or 0.0 for t in tiles)
        powers = [t.power_w for t in tiles]
        out.power_w = sum(p or 0.0 for p in powers) if all(p is not None for p in powers) else None
    return out


def _to_sample(device_id: str, r: _Reading, total: int | None) -> DeviceSample:
    engines = {k: v for k, vals in r.engines.items() if (v := _mean(vals)) is not None}
    util = engines.get("compute", engines.get("all", engines.get("render")))
    bandwidth = None
    if r.bandwidth:
        bandwidth = min(1.0, sum(b for b, _ in r.bandwidth) / sum(m for _, m in r.bandwidth))
    return DeviceSample(
        device_id=device_id,
        utilization_ratio=util,
        memory_bandwidth_utilization_ratio=bandwidth,
        memory_used_bytes=sum(r.mem_used) if r.mem_used else None,
        memory_total_bytes=sum(r.mem_total) if r.mem_total else total,
        power_w=r.power_w,
        energy_j=r.energy_j,
        temperatures_c={k: max(v) for k, v in r.temps.items() if v},
        clocks_hz={k: v for k, vals in r.clocks.items() if (v := _mean(vals)) is not None},
        throttle_reasons=frozenset(r.throttle) if r.throttle is not None else None,
        ecc_corrected_total=r.ecc.get(0),
        ecc_uncorrected_total=r.ecc.get(_RAS_UNCORRECTABLE),
        engines={k: v for k, v in engines.items() if k != "all"},
    )
