"""A scenario-driven fake of Intel's Level Zero Sysman bindings ``pyzes``.

`install` puts a fake ``pyzes`` module into ``sys.modules`` (or makes ``import pyzes`` fail the
way it fails without the Level Zero loader), so the real Intel backend runs unchanged above
it. The fake keeps pyzes' calling convention (pyzes 0.1.3, PyPI): every function returns a
``ze_result_t`` and fills the ctypes structures passed with ``byref``; enumerations follow the
count-then-array protocol; the structures, handle types and constants are pyzes' own (same
names, fields and values). The RAS functions pyzes lacks are served through
``getFunctionPointerList`` with the ``zes_api.h`` signatures, as the loader would. Every call is
counted::

    with install("intel-max-1550") as fake:
        import pyzes
        pyzes.zesInit(0)
        ...
        assert fake.calls["zesEngineGetActivity"] == 16

A `Scenario` is plain data (a JSON file under ``scenarios/intel/``, a dict or dataclasses):
the field list of `Scenario` and `CardSpec` plus ``base``, ``template``, ``count``,
``per_index`` and ``overrides``. Values are deterministic; time is the fake's clock
(`FakePyzes.now`, moved by `FakePyzes.advance` unless a ``timer=`` is injected) and the
activity, energy, bandwidth and PCIe counters integrate over it, in microseconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.abc
import importlib.machinery
import importlib.resources
import sys
import threading
import types
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from ctypes import (
    Structure,
    c_char,
    c_double,
    c_int32,
    c_int64,
    c_ubyte,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_gpu.testing._scenario_files import builtin_names, read_scenario

__all__ = [
    "RESULT",
    "CardSpec",
    "FakePyzes",
    "Scenario",
    "ScenarioError",
    "builtin_scenarios",
    "install",
    "load_scenario",
]

RESULT = {
    "SUCCESS": 0,
    "ERROR_DEVICE_LOST": 0x70000001,
    "ERROR_DEVICE_REQUIRES_RESET": 0x70000006,
    "ERROR_INSUFFICIENT_PERMISSIONS": 0x70010000,
    "ERROR_NOT_AVAILABLE": 0x70010001,
    "ERROR_UNINITIALIZED": 0x78000001,
    "ERROR_UNSUPPORTED_FEATURE": 0x78000003,
    "ERROR_INVALID_ARGUMENT": 0x78000004,
    "ERROR_INVALID_NULL_HANDLE": 0x78000005,
    "ERROR_INVALID_SIZE": 0x78000008,
    "ERROR_UNKNOWN": 0x7FFFFFFE,
}
_OK = 0


class ScenarioError(ValueError):
    """A scenario file or dict that does not describe a valid fake node."""


# --------------------------------------------------------------------------------------------
# pyzes 0.1.3: handle types, structures and constants (the subset the backend touches)
# --------------------------------------------------------------------------------------------


class zes_driver_handle_t(c_void_p):
    pass


class zes_device_handle_t(c_void_p):
    pass


class zes_mem_handle_t(c_void_p):
    pass


class zes_pwr_handle_t(c_void_p):
    pass


class zes_freq_handle_t(c_void_p):
    pass


class zes_temp_handle_t(c_void_p):
    pass


class zes_engine_handle_t(c_void_p):
    pass


class ze_device_uuid_t(Structure):
    _fields_ = (("id", c_ubyte * 16),)


class ze_device_properties_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("type", c_int32),
        ("vendorId", c_uint32),
        ("deviceId", c_uint32),
        ("flags", c_uint32),
        ("subdeviceId", c_uint32),
        ("coreClockRate", c_uint32),
        ("maxMemAllocSize", c_uint64),
        ("maxHardwareContexts", c_uint32),
        ("maxCommandQueuePriority", c_uint32),
        ("numThreadsPerEU", c_uint32),
        ("physicalEUSimdWidth", c_uint32),
        ("numEUsPerSubslice", c_uint32),
        ("numSubslicesPerSlice", c_uint32),
        ("numSlices", c_uint32),
        ("timerResolution", c_uint64),
        ("timestampValidBits", c_uint32),
        ("kernelTimestampValidBits", c_uint32),
        ("uuid", ze_device_uuid_t),
        ("name", c_char * 256),
    )


class zes_device_properties_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("core", ze_device_properties_t),
        ("numSubdevices", c_uint32),
        ("serialNumber", c_char * 64),
        ("boardNumber", c_char * 64),
        ("brandName", c_char * 64),
        ("modelName", c_char * 64),
        ("vendorName", c_char * 64),
        ("driverVersion", c_char * 64),
    )


class zes_uuid_t(Structure):
    _fields_ = (("id", c_ubyte * 16),)


class zes_subdevice_exp_properties_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("subdeviceId", c_uint32),
        ("uuid", zes_uuid_t),
    )


class zes_process_state_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("processId", c_uint32),
        ("memSize", c_uint64),
        ("sharedSize", c_uint64),
        ("engines", c_uint32),
    )


class zes_pci_address_t(Structure):
    _fields_ = (
        ("domain", c_uint32),
        ("bus", c_uint32),
        ("device", c_uint32),
        ("function", c_uint32),
    )


class zes_pci_speed_t(Structure):
    _fields_ = (("gen", c_int32), ("width", c_int32), ("maxBandwidth", c_int64))


class zes_pci_properties_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("address", zes_pci_address_t),
        ("maxSpeed", zes_pci_speed_t),
        ("haveBandwidthCounters", c_uint8),
        ("havePacketCounters", c_uint8),
        ("haveReplayCounters", c_uint8),
    )


class zes_pci_state_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("status", c_int32),
        ("qualityIssues", c_uint32),
        ("stabilityIssues", c_uint32),
        ("speed", zes_pci_speed_t),
    )


class zes_pci_stats_t(Structure):
    _fields_ = (
        ("timestamp", c_uint64),
        ("replayCounter", c_uint64),
        ("packetCounter", c_uint64),
        ("rxCounter", c_uint64),
        ("txCounter", c_uint64),
        ("speed", zes_pci_speed_t),
    )


class zes_mem_properties_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("type", c_int32),
        ("onSubdevice", c_uint8),
        ("subdeviceId", c_uint32),
        ("location", c_int32),
        ("physicalSize", c_uint64),
        ("busWidth", c_int32),
        ("numChannels", c_int32),
    )


class zes_mem_state_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("health", c_int32),
        ("free", c_uint64),
        ("size", c_uint64),
    )


class zes_mem_bandwidth_t(Structure):
    _fields_ = (
        ("readCounter", c_uint64),
        ("writeCounter", c_uint64),
        ("maxBandwidth", c_uint64),
        ("timestamp", c_uint64),
    )


class zes_power_properties_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("onSubdevice", c_uint8),
        ("subdeviceId", c_uint32),
        ("canControl", c_uint8),
        ("isEnergyThresholdSupported", c_uint8),
        ("defaultLimit", c_int32),
        ("minLimit", c_int32),
        ("maxLimit", c_int32),
    )


class zes_power_limit_ext_desc_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("level", c_int32),
        ("source", c_int32),
        ("limitUnit", c_int32),
        ("enabledStateLocked", c_uint8),
        ("enabled", c_uint8),
        ("intervalValueLocked", c_uint8),
        ("interval", c_int32),
        ("limitValueLocked", c_uint8),
        ("limit", c_int32),
    )


class zes_power_energy_counter_t(Structure):
    _fields_ = (("energy", c_uint64), ("timestamp", c_uint64))


class zes_freq_properties_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("type", c_int32),
        ("onSubdevice", c_uint8),
        ("subdeviceId", c_uint32),
        ("canControl", c_uint8),
        ("isThrottleEventSupported", c_uint8),
        ("min", c_double),
        ("max", c_double),
    )


class zes_freq_state_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("currentVoltage", c_double),
        ("request", c_double),
        ("tdp", c_double),
        ("efficient", c_double),
        ("actual", c_double),
        ("throttleReasons", c_uint32),
    )


class zes_temp_properties_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("type", c_int32),
        ("onSubdevice", c_uint8),
        ("subdeviceId", c_uint32),
        ("maxTemperature", c_double),
        ("isCriticalTempSupported", c_uint8),
        ("isThreshold1Supported", c_uint8),
        ("isThreshold2Supported", c_uint8),
    )


class zes_engine_properties_t(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("type", c_uint32),
        ("onSubdevice", c_uint8),
        ("subdeviceId", c_uint32),
    )


class zes_engine_stats_t(Structure):
    _fields_ = (("activeTime", c_uint64), ("timestamp", c_uint64))


# zes_api.h RAS structures (pyzes 0.1.3 has none; the loader exports the functions).
class _RasProperties(Structure):
    _fields_ = (
        ("stype", c_int32),
        ("pNext", c_void_p),
        ("type", c_int32),
        ("onSubdevice", c_uint8),
        ("subdeviceId", c_uint32),
    )


_CONSTANTS: dict[str, int] = {
    "ZE_RESULT_SUCCESS": 0,
    "ZE_RESULT_ERROR_DEVICE_LOST": 0x70000001,
    "ZE_RESULT_ERROR_UNINITIALIZED": 0x78000001,
    "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE": 0x78000003,
    "ZE_RESULT_ERROR_UNKNOWN": 0x7FFFFFFE,
    "ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES": 0x1,
    "ZES_STRUCTURE_TYPE_PCI_PROPERTIES": 0x2,
    "ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES": 0x5,
    "ZES_STRUCTURE_TYPE_FREQ_PROPERTIES": 0x9,
    "ZES_STRUCTURE_TYPE_MEM_PROPERTIES": 0xB,
    "ZES_STRUCTURE_TYPE_POWER_PROPERTIES": 0xD,
    "ZES_STRUCTURE_TYPE_TEMP_PROPERTIES": 0x14,
    "ZES_STRUCTURE_TYPE_PROCESS_STATE": 0x16,
    "ZES_STRUCTURE_TYPE_PCI_STATE": 0x17,
    "ZES_STRUCTURE_TYPE_FREQ_STATE": 0x1B,
    "ZES_STRUCTURE_TYPE_MEM_STATE": 0x1E,
    "ZES_STRUCTURE_TYPE_POWER_LIMIT_EXT_DESC": 0x27,
    "ZES_STRUCTURE_TYPE_SUBDEVICE_EXP_PROPERTIES": 0x00020004,
    "ZES_ENGINE_GROUP_ALL": 0,
    "ZES_ENGINE_GROUP_COMPUTE_ALL": 1,
    "ZES_ENGINE_GROUP_MEDIA_ALL": 2,
    "ZES_ENGINE_GROUP_COPY_ALL": 3,
    "ZES_ENGINE_GROUP_COMPUTE_SINGLE": 4,
    "ZES_ENGINE_GROUP_RENDER_SINGLE": 5,
    "ZES_ENGINE_GROUP_MEDIA_DECODE_SINGLE": 6,
    "ZES_ENGINE_GROUP_MEDIA_ENCODE_SINGLE": 7,
    "ZES_ENGINE_GROUP_COPY_SINGLE": 8,
    "ZES_ENGINE_GROUP_RENDER_ALL": 12,
    "ZES_MEM_TYPE_HBM": 0,
    "ZES_MEM_LOC_SYSTEM": 0,
    "ZES_MEM_LOC_DEVICE": 1,
    "ZES_MEM_HEALTH_OK": 1,
    "ZES_FREQ_DOMAIN_GPU": 0,
    "ZES_FREQ_DOMAIN_MEMORY": 1,
    "ZES_FREQ_DOMAIN_MEDIA": 2,
    "ZES_TEMP_SENSORS_GLOBAL": 0,
    "ZES_TEMP_SENSORS_GPU": 1,
    "ZES_TEMP_SENSORS_MEMORY": 2,
    "ZES_TEMP_SENSORS_GLOBAL_MIN": 3,
    "ZES_TEMP_SENSORS_GPU_MIN": 4,
    "ZES_TEMP_SENSORS_MEMORY_MIN": 5,
    "ZES_POWER_LEVEL_SUSTAINED": 1,
    "ZES_POWER_LEVEL_BURST": 2,
    "ZES_POWER_LEVEL_PEAK": 3,
    "ZES_LIMIT_UNIT_POWER": 2,
    "ZES_FREQ_THROTTLE_REASON_FLAG_AVE_PWR_CAP": 1 << 0,
    "ZES_FREQ_THROTTLE_REASON_FLAG_BURST_PWR_CAP": 1 << 1,
    "ZES_FREQ_THROTTLE_REASON_FLAG_CURRENT_LIMIT": 1 << 2,
    "ZES_FREQ_THROTTLE_REASON_FLAG_THERMAL_LIMIT": 1 << 3,
    "ZES_FREQ_THROTTLE_REASON_FLAG_PSU_ALERT": 1 << 4,
    "ZES_FREQ_THROTTLE_REASON_FLAG_SW_RANGE": 1 << 5,
    "ZES_FREQ_THROTTLE_REASON_FLAG_HW_RANGE": 1 << 6,
}
_STRUCTS = (
    zes_driver_handle_t,
    zes_device_handle_t,
    zes_mem_handle_t,
    zes_pwr_handle_t,
    zes_freq_handle_t,
    zes_temp_handle_t,
    zes_engine_handle_t,
    ze_device_uuid_t,
    ze_device_properties_t,
    zes_device_properties_t,
    zes_uuid_t,
    zes_subdevice_exp_properties_t,
    zes_process_state_t,
    zes_pci_address_t,
    zes_pci_speed_t,
    zes_pci_properties_t,
    zes_pci_state_t,
    zes_pci_stats_t,
    zes_mem_properties_t,
    zes_mem_state_t,
    zes_mem_bandwidth_t,
    zes_power_properties_t,
    zes_power_limit_ext_desc_t,
    zes_power_energy_counter_t,
    zes_freq_properties_t,
    zes_freq_state_t,
    zes_temp_properties_t,
    zes_engine_properties_t,
    zes_engine_stats_t,
)
_GEN_BANDWIDTH = {3: 985_000_000, 4: 1_969_000_000, 5: 3_938_000_000}  # bytes/s per lane


# --------------------------------------------------------------------------------------------
# Scenario data
# --------------------------------------------------------------------------------------------


@dataclass
class CardSpec:
    """One Intel GPU card (values in Level Zero's units: %, MHz, °C, W, bytes).

    Per-tile values are lists (one entry per tile). ``engine_groups`` lists the engine groups
    of each tile (``COMPUTE_ALL``... plus ``*_SINGLE`` engines, which the backend skips).
    ``throttle`` is each tile's ``zes_freq_throttle_reason_flags_t``. ``ras_correctable`` /
    ``ras_uncorrectable`` are each tile's counts per ``zes_ras_error_cat_t`` name.
    ``not_supported`` lists functions that return ``ZE_RESULT_ERROR_UNSUPPORTED_FEATURE``;
    ``error`` makes every call on the card return that result once ``error_after_calls``
    calls were made to it and the clock reached ``error_after_s``.
    """

    name: str = "Intel(R) Data Center GPU Max 1550"
    device_id: int = 0x0BD5
    uuid: str = ""
    serial: str = ""
    board_number: str = "unknown"
    brand: str = "Intel(R) Corporation"
    model_name: str = "Intel(R) Data Center GPU Max 1550"
    vendor_name: str = "Intel(R) Corporation"
    driver_version: str = "1.3.29735"
    bdf: str = "0000:29:00.0"
    tiles: int = 2
    hbm_bytes_per_tile: int = 68_719_476_736
    allocatable_bytes_per_tile: int = 68_182_605_824
    memory_used_bytes: list[int] = field(default_factory=lambda: [21_474_836_480] * 2)
    memory_bandwidth_max: int = 1_638_400_000_000
    memory_bandwidth_ratio: list[float] = field(default_factory=lambda: [0.35, 0.31])
    engine_groups: list[str] = field(
        default_factory=lambda: (
            ["ALL", "COMPUTE_ALL", "COPY_ALL"] + ["COMPUTE_SINGLE"] * 4 + ["COPY_SINGLE"] * 8
        )
    )
    compute_util: list[float] = field(default_factory=lambda: [82.0, 78.0])
    copy_util: list[float] = field(default_factory=lambda: [12.0, 10.0])
    tile_power_w: list[float] = field(default_factory=lambda: [205.0, 198.0])
    card_power_extra_w: float = 47.0
    energy_start_j: float = 2_000_000.0
    power_limit_w: float = 600.0
    power_limit_min_w: float = 300.0
    gpu_mhz: list[float] = field(default_factory=lambda: [1600.0, 1600.0])
    memory_mhz: float = 3200.0
    throttle: list[int] = field(default_factory=lambda: [0, 0])
    temp_gpu: list[float] = field(default_factory=lambda: [57.0, 61.0])
    temp_memory: list[float] = field(default_factory=lambda: [49.0, 51.0])
    temp_global: float = 61.0
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_max_gen: int = 5
    pcie_max_width: int = 16
    pcie_tx_bytes_per_s: float = 3_000_000_000.0
    pcie_rx_bytes_per_s: float = 4_500_000_000.0
    pcie_replays: int = 0
    ras_correctable: list[dict[str, int]] = field(default_factory=lambda: [{}, {}])
    ras_uncorrectable: list[dict[str, int]] = field(default_factory=lambda: [{}, {}])
    processes: list[dict[str, int]] = field(default_factory=list)
    not_supported: list[str] = field(default_factory=list)
    error: str | None = None
    error_after_calls: int = 0
    error_after_s: float = 0.0


_RAS_CATEGORIES = (
    "RESET",
    "PROGRAMMING_ERRORS",
    "DRIVER_ERRORS",
    "COMPUTE_ERRORS",
    "NON_COMPUTE_ERRORS",
    "CACHE_ERRORS",
    "DISPLAY_ERRORS",
)


@dataclass
class Scenario:
    """A fake Intel node. ``library``: ``"ok"``, ``"missing"`` (``import pyzes`` raises the
    ``OSError`` of ``CDLL('libze_loader.so.1')``) or ``"no_package"`` (``ImportError``).
    ``init_result`` makes ``zesInit`` return that ``ZE_RESULT_*`` name."""

    name: str = "custom"
    description: str = ""
    seed: int = 0
    library: str = "ok"
    init_result: str | None = None
    cards: list[CardSpec] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        """Build a scenario from JSON-like data (``base``, ``cards`` or ``count`` cards from
        ``template`` with ``per_index`` lists and ``overrides``)."""
        raw = dict(data)
        if "base" in raw:
            base = _scenario_dict(str(raw.pop("base")))
            for key in ("template", "per_index"):
                if key in raw and key in base:
                    raw[key] = {**base[key], **raw[key]}
            if "overrides" in raw and "overrides" in base:
                merged = dict(base["overrides"])
                for idx, extra in raw["overrides"].items():
                    merged[idx] = {**merged.get(idx, {}), **extra}
                raw["overrides"] = merged
            raw = {**base, **raw}
        fields = {f.name for f in dataclasses.fields(CardSpec)}
        if "cards" in raw and "count" not in raw:
            cards_raw = [dict(c) for c in raw["cards"]]
        else:
            count = int(raw.get("count", 1))
            cards_raw = [dict(raw.get("template", {})) for _ in range(count)]
            for key, values in dict(raw.get("per_index", {})).items():
                if len(values) != count:
                    raise ScenarioError(f"per_index.{key}: {len(values)} values, {count} cards")
                for i, value in enumerate(values):
                    cards_raw[i][key] = value
            for idx, extra in dict(raw.get("overrides", {})).items():
                if not 0 <= int(idx) < count:
                    raise ScenarioError(f"overrides: no card {idx}")
                cards_raw[int(idx)].update(extra)
        cards = []
        for i, c in enumerate(cards_raw):
            unknown = set(c) - fields
            if unknown:
                raise ScenarioError(f"card {i}: unknown keys {sorted(unknown)}")
            cards.append(CardSpec(**c))
        seed = int(raw.get("seed", 0))
        for i, card in enumerate(cards):
            if not card.uuid:
                card.uuid = hashlib.sha256(f"intel:{seed}:{i}".encode()).hexdigest()[:32]
            if not card.serial:
                card.serial = f"LQAC{seed:04d}{i:04d}"
        extra = (
            set(raw)
            - {f.name for f in dataclasses.fields(cls)}
            - {
                "template",
                "count",
                "per_index",
                "overrides",
                "cards",
            }
        )
        if extra:
            raise ScenarioError(f"unknown scenario keys {sorted(extra)}")
        return cls(
            name=str(raw.get("name", "custom")),
            description=str(raw.get("description", "")),
            seed=seed,
            library=str(raw.get("library", "ok")),
            init_result=raw.get("init_result"),
            cards=cards,
        )


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped under ``otel_gpu/testing/scenarios/intel``."""
    return builtin_names("intel")


def _scenario_dict(name: str) -> dict[str, Any]:
    return read_scenario("intel", "Intel", name, ScenarioError)


def load_scenario(scenario: str | Path | Mapping[str, Any] | Scenario) -> Scenario:
    """A built-in scenario by name, a JSON file, a dict, or a `Scenario` as is."""
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, Mapping):
        return Scenario.from_dict(scenario)
    return Scenario.from_dict(_scenario_dict(str(scenario)))


# --------------------------------------------------------------------------------------------
# The fake library
# --------------------------------------------------------------------------------------------


@dataclass
class _Obj:
    """What a handle address names."""

    kind: str  # driver, device, engine, mem, power, freq, temp, ras
    card: int = -1
    tile: int | None = None
    detail: str = ""


class _RawFunction:
    """A loader symbol as ``getFunctionPointerList`` returns it (argtypes/restype settable)."""

    def __init__(self, name: str, fn: Callable[..., int]) -> None:
        self.__name__ = name
        self._fn = fn
        self.argtypes: Any = None
        self.restype: Any = None

    def __call__(self, *args: Any) -> int:
        return self._fn(*args)


def _obj(ptr: Any) -> Any:
    """The object behind ``byref(x)`` (or ``x`` itself)."""
    return getattr(ptr, "_obj", ptr)


class FakePyzes:
    """The state behind one installed fake ``pyzes`` module.

    ``calls`` counts every Level Zero function called (by name); ``card_calls`` the calls
    made on each card's handles.
    """

    def __init__(self, scenario: Scenario, timer: Callable[[], float] | None = None) -> None:
        self.scenario = scenario
        self.calls: Counter[str] = Counter()
        self.card_calls: Counter[int] = Counter()
        self.initialized = False
        self._timer = timer
        self._t = 0.0
        self._lock = threading.Lock()
        self._recovered: set[int] = set()
        self._objects: dict[int, _Obj] = {}
        self._children: dict[tuple[int, str], list[int]] = {}
        self._next = 0x5000_0000
        self._driver = self._new(_Obj("driver"))
        for ci, card in enumerate(scenario.cards):
            self._new(_Obj("device", ci))
            self._build_card(ci, card)
        self.module = self._build_module()

    # -- clock -------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The fake's clock in seconds."""
        return self._timer() if self._timer is not None else self._t

    def advance(self, seconds: float) -> None:
        """Move the fake's clock (when no ``timer`` was injected)."""
        self._t += seconds

    def reset_calls(self) -> None:
        """Forget the call counts."""
        self.calls.clear()
        self.card_calls.clear()

    def recover_card(self, index: int) -> None:
        """Make a card whose ``error`` fires answer again."""
        self._recovered.add(index)

    def close(self) -> None:
        """Nothing to release (kept for symmetry with the other fakes)."""

    # -- objects -----------------------------------------------------------------------------

    def _new(self, obj: _Obj) -> int:
        address = self._next
        self._next += 0x40
        self._objects[address] = obj
        if obj.kind != "driver":
            self._children.setdefault((obj.card, obj.kind), []).append(address)
        return address

    def _build_card(self, ci: int, c: CardSpec) -> None:
        for t in range(max(1, c.tiles)):
            tile = t if c.tiles > 1 else None
            for group in c.engine_groups:
                self._new(_Obj("engine", ci, tile, group))
            self._new(_Obj("mem", ci, tile))
            self._new(_Obj("power", ci, tile))
            self._new(_Obj("freq", ci, tile, "GPU"))
            self._new(_Obj("freq", ci, tile, "MEMORY"))
            self._new(_Obj("temp", ci, tile, "GPU"))
            self._new(_Obj("temp", ci, tile, "MEMORY"))
            self._new(_Obj("temp", ci, tile, "GPU_MIN"))
            self._new(_Obj("ras", ci, tile, "CORRECTABLE"))
            self._new(_Obj("ras", ci, tile, "UNCORRECTABLE"))
        if c.tiles > 1:
            self._new(_Obj("power", ci, None))  # the card-level power domain
            self._new(_Obj("temp", ci, None, "GLOBAL"))

    def _device_address(self, ci: int) -> int:
        return next(a for a, o in self._objects.items() if o.kind == "device" and o.card == ci)

    def _resolve(self, handle: Any, kind: str, function: str) -> _Obj | int:
        """The object a handle names, or a ze_result_t to return."""
        address = getattr(handle, "value", handle)
        obj = self._objects.get(address) if isinstance(address, int) else None
        if obj is None or obj.kind != kind:
            return RESULT["ERROR_INVALID_NULL_HANDLE"]
        if obj.card >= 0:
            card = self.scenario.cards[obj.card]
            self.card_calls[obj.card] += 1
            if (
                card.error
                and obj.card not in self._recovered
                and self.card_calls[obj.card] > card.error_after_calls
                and self.now >= card.error_after_s
            ):
                return RESULT[card.error]
            if function in card.not_supported:
                return RESULT["ERROR_UNSUPPORTED_FEATURE"]
        return obj

    # -- module ------------------------------------------------------------------------------

    def _build_module(self) -> types.ModuleType:
        mod = types.ModuleType("pyzes")
        mod.__doc__ = "fake pyzes (otel_gpu.testing.fake_pyzes)"
        for cls in _STRUCTS:
            setattr(mod, cls.__name__, cls)
        for name, value in _CONSTANTS.items():
            setattr(mod, name, value)
        mod.gpuLib = object()  # type: ignore[attr-defined]
        for name in dir(self):
            if name.startswith("zes"):
                setattr(mod, name, self._counted(name, getattr(self, name)))
        raw: dict[str, Callable[..., int]] = {
            "zesDeviceEnumRasErrorSets": self._ras_enum,
            "zesRasGetProperties": self._ras_properties,
            "zesRasGetState": self._ras_state,
        }

        def get_function_pointer_list(name: str) -> Any:
            if name in raw:
                return _RawFunction(name, self._counted(name, raw[name]))
            fn = getattr(mod, name, None)
            if fn is None:
                raise AttributeError(f"libze_loader.so.1: undefined symbol: {name}")
            return fn

        mod.getFunctionPointerList = get_function_pointer_list  # type: ignore[attr-defined]
        return mod

    def _counted(self, name: str, fn: Callable[..., int]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            with self._lock:
                self.calls[name] += 1
            if name != "zesInit" and not self.initialized:
                return RESULT["ERROR_UNINITIALIZED"]
            return fn(*args)

        call.__name__ = name
        return call

    def _enumerate(self, card: Any, kind: str, function: str, count_ptr: Any, array: Any) -> int:
        obj = self._resolve(card, "device", function)
        if isinstance(obj, int):
            return obj
        items = self._children.get((obj.card, kind), [])
        count = _obj(count_ptr)
        if array is None:
            count.value = len(items)
            return _OK
        n = min(count.value, len(items))
        for i in range(n):
            array[i] = items[i]
        count.value = n
        return _OK

    # -- init, drivers, devices -----------------------------------------------------------------

    def zesInit(self, flags: int) -> int:
        if self.scenario.init_result:
            return RESULT[self.scenario.init_result]
        self.initialized = True
        return _OK

    def zesDriverGet(self, count_ptr: Any, array: Any) -> int:
        count = _obj(count_ptr)
        if array is None:
            count.value = 1
            return _OK
        if count.value >= 1:
            array[0] = self._driver
            count.value = 1
        return _OK

    def zesDeviceGet(self, driver: Any, count_ptr: Any, array: Any) -> int:
        if getattr(driver, "value", driver) != self._driver:
            return RESULT["ERROR_INVALID_NULL_HANDLE"]
        devices = [self._device_address(i) for i in range(len(self.scenario.cards))]
        count = _obj(count_ptr)
        if array is None:
            count.value = len(devices)
            return _OK
        n = min(count.value, len(devices))
        for i in range(n):
            array[i] = devices[i]
        count.value = n
        return _OK

    def zesDeviceGetProperties(self, device: Any, props_ptr: Any) -> int:
        obj = self._resolve(device, "device", "zesDeviceGetProperties")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        p = _obj(props_ptr)
        p.core.type = 1  # ZE_DEVICE_TYPE_GPU
        p.core.vendorId = 0x8086
        p.core.deviceId = c.device_id
        p.core.coreClockRate = 1600
        p.core.numSlices = 1
        p.core.maxMemAllocSize = c.allocatable_bytes_per_tile
        for i, b in enumerate(bytes.fromhex(c.uuid)[:16]):
            p.core.uuid.id[i] = b
        p.core.name = c.name.encode()
        p.numSubdevices = c.tiles if c.tiles > 1 else 0
        p.serialNumber = c.serial.encode()
        p.boardNumber = c.board_number.encode()
        p.brandName = c.brand.encode()
        p.modelName = c.model_name.encode()
        p.vendorName = c.vendor_name.encode()
        p.driverVersion = c.driver_version.encode()
        return _OK

    def zesDeviceGetSubDevicePropertiesExp(self, device: Any, count_ptr: Any, array: Any) -> int:
        obj = self._resolve(device, "device", "zesDeviceGetSubDevicePropertiesExp")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        tiles = c.tiles if c.tiles > 1 else 0
        count = _obj(count_ptr)
        if array is None:
            count.value = tiles
            return _OK
        for t in range(min(count.value, tiles)):
            array[t].subdeviceId = t
            raw = bytearray(bytes.fromhex(c.uuid)[:16])
            raw[15] ^= t + 1
            for i, b in enumerate(raw):
                array[t].uuid.id[i] = b
        count.value = min(count.value, tiles)
        return _OK

    def zesDeviceProcessesGetState(self, device: Any, count_ptr: Any, array: Any) -> int:
        obj = self._resolve(device, "device", "zesDeviceProcessesGetState")
        if isinstance(obj, int):
            return obj
        procs = self.scenario.cards[obj.card].processes
        count = _obj(count_ptr)
        if array is None:
            count.value = len(procs)
            return _OK
        for i, proc in enumerate(procs[: count.value]):
            array[i].processId = int(proc["pid"])
            array[i].memSize = int(proc.get("mem", 0))
            array[i].sharedSize = int(proc.get("shared", 0))
            array[i].engines = 1 << 1
        count.value = min(count.value, len(procs))
        return _OK

    # -- PCI ---------------------------------------------------------------------------------------

    def zesDevicePciGetProperties(self, device: Any, props_ptr: Any) -> int:
        obj = self._resolve(device, "device", "zesDevicePciGetProperties")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        domain, bus, rest = c.bdf.split(":")
        dev, fn = rest.split(".")
        p = _obj(props_ptr)
        p.address.domain, p.address.bus = int(domain, 16), int(bus, 16)
        p.address.device, p.address.function = int(dev, 16), int(fn, 16)
        p.maxSpeed.gen, p.maxSpeed.width = c.pcie_max_gen, c.pcie_max_width
        p.maxSpeed.maxBandwidth = _GEN_BANDWIDTH.get(c.pcie_max_gen, -1) * c.pcie_max_width
        p.haveBandwidthCounters = 1
        p.havePacketCounters = 1
        p.haveReplayCounters = 1
        return _OK

    def zesDevicePciGetState(self, device: Any, state_ptr: Any) -> int:
        obj = self._resolve(device, "device", "zesDevicePciGetState")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        s = _obj(state_ptr)
        s.status = 1
        s.speed.gen, s.speed.width = c.pcie_gen, c.pcie_width
        s.speed.maxBandwidth = _GEN_BANDWIDTH.get(c.pcie_gen, -1) * c.pcie_width
        return _OK

    def zesDevicePciGetStats(self, device: Any, stats_ptr: Any) -> int:
        obj = self._resolve(device, "device", "zesDevicePciGetStats")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        s = _obj(stats_ptr)
        t = self.now
        s.timestamp = int(t * 1e6)
        s.replayCounter = c.pcie_replays
        s.packetCounter = int(t * 1e6)
        s.rxCounter = int(10_000_000_000 + c.pcie_rx_bytes_per_s * t)
        s.txCounter = int(8_000_000_000 + c.pcie_tx_bytes_per_s * t)
        s.speed.gen, s.speed.width = c.pcie_gen, c.pcie_width
        s.speed.maxBandwidth = _GEN_BANDWIDTH.get(c.pcie_gen, -1) * c.pcie_width
        return _OK

    # -- engines -----------------------------------------------------------------------------------

    def zesDeviceEnumEngineGroups(self, device: Any, count_ptr: Any, array: Any) -> int:
        return self._enumerate(device, "engine", "zesDeviceEnumEngineGroups", count_ptr, array)

    def zesEngineGetProperties(self, engine: Any, props_ptr: Any) -> int:
        obj = self._resolve(engine, "engine", "zesEngineGetProperties")
        if isinstance(obj, int):
            return obj
        p = _obj(props_ptr)
        p.type = _CONSTANTS[f"ZES_ENGINE_GROUP_{obj.detail}"]
        p.onSubdevice = 0 if obj.tile is None else 1
        p.subdeviceId = obj.tile or 0
        return _OK

    def zesEngineGetActivity(self, engine: Any, stats_ptr: Any) -> int:
        obj = self._resolve(engine, "engine", "zesEngineGetActivity")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        t = obj.tile or 0
        percent = {
            "ALL": max(c.compute_util[t], c.copy_util[t]),
            "COMPUTE_ALL": c.compute_util[t],
            "COMPUTE_SINGLE": c.compute_util[t],
            "COPY_ALL": c.copy_util[t],
            "COPY_SINGLE": c.copy_util[t] / 2,
        }.get(obj.detail, 0.0)
        us = self.now * 1e6
        s = _obj(stats_ptr)
        s.timestamp = int(1_000_000_000 + us)
        s.activeTime = int(100_000_000 + us * percent / 100.0)
        return _OK

    # -- memory ------------------------------------------------------------------------------------

    def zesDeviceEnumMemoryModules(self, device: Any, count_ptr: Any, array: Any) -> int:
        return self._enumerate(device, "mem", "zesDeviceEnumMemoryModules", count_ptr, array)

    def zesMemoryGetProperties(self, mem: Any, props_ptr: Any) -> int:
        obj = self._resolve(mem, "mem", "zesMemoryGetProperties")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        p = _obj(props_ptr)
        p.type = _CONSTANTS["ZES_MEM_TYPE_HBM"]
        p.onSubdevice = 0 if obj.tile is None else 1
        p.subdeviceId = obj.tile or 0
        p.location = _CONSTANTS["ZES_MEM_LOC_DEVICE"]
        p.physicalSize = c.hbm_bytes_per_tile
        p.busWidth = -1
        p.numChannels = -1
        return _OK

    def zesMemoryGetState(self, mem: Any, state_ptr: Any) -> int:
        obj = self._resolve(mem, "mem", "zesMemoryGetState")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        s = _obj(state_ptr)
        s.health = _CONSTANTS["ZES_MEM_HEALTH_OK"]
        s.size = c.allocatable_bytes_per_tile
        s.free = c.allocatable_bytes_per_tile - c.memory_used_bytes[obj.tile or 0]
        return _OK

    def zesMemoryGetBandwidth(self, mem: Any, bw_ptr: Any) -> int:
        obj = self._resolve(mem, "mem", "zesMemoryGetBandwidth")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        t = self.now
        rate = c.memory_bandwidth_max * c.memory_bandwidth_ratio[obj.tile or 0]
        s = _obj(bw_ptr)
        s.readCounter = int(5_000_000_000 + rate * 0.6 * t)
        s.writeCounter = int(3_000_000_000 + rate * 0.4 * t)
        s.maxBandwidth = c.memory_bandwidth_max
        s.timestamp = int(2_000_000_000 + t * 1e6)
        return _OK

    # -- power -------------------------------------------------------------------------------------

    def zesDeviceEnumPowerDomains(self, device: Any, count_ptr: Any, array: Any) -> int:
        return self._enumerate(device, "power", "zesDeviceEnumPowerDomains", count_ptr, array)

    def zesPowerGetProperties(self, power: Any, props_ptr: Any) -> int:
        obj = self._resolve(power, "power", "zesPowerGetProperties")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        p = _obj(props_ptr)
        p.onSubdevice = 0 if obj.tile is None else 1
        p.subdeviceId = obj.tile or 0
        p.canControl = 1 if obj.tile is None else 0
        card_level = obj.tile is None
        p.defaultLimit = int(c.power_limit_w * 1000) if card_level else -1
        p.minLimit = int(c.power_limit_min_w * 1000) if card_level else -1
        p.maxLimit = int(c.power_limit_w * 1000) if card_level else -1
        return _OK

    def _power_w(self, c: CardSpec, tile: int | None) -> float:
        if tile is None:
            return sum(c.tile_power_w[: max(1, c.tiles)]) + c.card_power_extra_w
        return c.tile_power_w[tile]

    def zesPowerGetEnergyCounter(self, power: Any, energy_ptr: Any) -> int:
        obj = self._resolve(power, "power", "zesPowerGetEnergyCounter")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        t = self.now
        start = c.energy_start_j if obj.tile is None else c.energy_start_j / 3
        s = _obj(energy_ptr)
        s.energy = int((start + self._power_w(c, obj.tile) * t) * 1e6)
        s.timestamp = int(3_000_000_000 + t * 1e6)
        return _OK

    def zesPowerGetLimitsExt(self, power: Any, count_ptr: Any, array: Any) -> int:
        obj = self._resolve(power, "power", "zesPowerGetLimitsExt")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        limits = [
            (_CONSTANTS["ZES_POWER_LEVEL_SUSTAINED"], int(c.power_limit_w * 1000), 28000),
            (_CONSTANTS["ZES_POWER_LEVEL_PEAK"], int(c.power_limit_w * 1200), 0),
        ]
        count = _obj(count_ptr)
        if array is None:
            count.value = len(limits)
            return _OK
        for i, (level, limit, interval) in enumerate(limits[: count.value]):
            array[i].level = level
            array[i].source = 0
            array[i].limitUnit = _CONSTANTS["ZES_LIMIT_UNIT_POWER"]
            array[i].enabled = 1
            array[i].interval = interval
            array[i].limit = limit
        count.value = min(count.value, len(limits))
        return _OK

    # -- frequency ---------------------------------------------------------------------------------

    def zesDeviceEnumFrequencyDomains(self, device: Any, count_ptr: Any, array: Any) -> int:
        return self._enumerate(device, "freq", "zesDeviceEnumFrequencyDomains", count_ptr, array)

    def zesFrequencyGetProperties(self, freq: Any, props_ptr: Any) -> int:
        obj = self._resolve(freq, "freq", "zesFrequencyGetProperties")
        if isinstance(obj, int):
            return obj
        p = _obj(props_ptr)
        p.type = _CONSTANTS[f"ZES_FREQ_DOMAIN_{obj.detail}"]
        p.onSubdevice = 0 if obj.tile is None else 1
        p.subdeviceId = obj.tile or 0
        p.min, p.max = (800.0, 1600.0) if obj.detail == "GPU" else (3200.0, 3200.0)
        return _OK

    def zesFrequencyGetState(self, freq: Any, state_ptr: Any) -> int:
        obj = self._resolve(freq, "freq", "zesFrequencyGetState")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        t = obj.tile or 0
        s = _obj(state_ptr)
        if obj.detail == "GPU":
            s.actual = c.gpu_mhz[t]
            s.request = c.gpu_mhz[t]
            s.tdp = 1600.0
            s.efficient = 800.0
            s.throttleReasons = c.throttle[t]
        else:
            s.actual = s.request = s.tdp = c.memory_mhz
            s.efficient = -1.0
            s.throttleReasons = 0
        s.currentVoltage = -1.0
        return _OK

    # -- temperature -------------------------------------------------------------------------------

    def zesDeviceEnumTemperatureSensors(self, device: Any, count_ptr: Any, array: Any) -> int:
        return self._enumerate(device, "temp", "zesDeviceEnumTemperatureSensors", count_ptr, array)

    def zesTemperatureGetProperties(self, temp: Any, props_ptr: Any) -> int:
        obj = self._resolve(temp, "temp", "zesTemperatureGetProperties")
        if isinstance(obj, int):
            return obj
        p = _obj(props_ptr)
        p.type = _CONSTANTS[f"ZES_TEMP_SENSORS_{obj.detail}"]
        p.onSubdevice = 0 if obj.tile is None else 1
        p.subdeviceId = obj.tile or 0
        p.maxTemperature = 105.0 if obj.detail != "MEMORY" else 95.0
        return _OK

    def zesTemperatureGetState(self, temp: Any, value_ptr: Any) -> int:
        obj = self._resolve(temp, "temp", "zesTemperatureGetState")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        t = obj.tile or 0
        value = {
            "GPU": c.temp_gpu[t],
            "MEMORY": c.temp_memory[t],
            "GPU_MIN": c.temp_gpu[t] - 9,
            "GLOBAL": c.temp_global,
        }[obj.detail]
        _obj(value_ptr).value = float(value)
        return _OK

    # -- RAS (through getFunctionPointerList) --------------------------------------------------------

    def _ras_enum(self, device: Any, count_ptr: Any, array: Any) -> int:
        return self._enumerate(device, "ras", "zesDeviceEnumRasErrorSets", count_ptr, array)

    def _ras_properties(self, ras: Any, props_ptr: Any) -> int:
        obj = self._resolve(ras, "ras", "zesRasGetProperties")
        if isinstance(obj, int):
            return obj
        p = _obj(props_ptr)
        p.type = 1 if obj.detail == "UNCORRECTABLE" else 0
        p.onSubdevice = 0 if obj.tile is None else 1
        p.subdeviceId = obj.tile or 0
        return _OK

    def _ras_state(self, ras: Any, clear: int, state_ptr: Any) -> int:
        obj = self._resolve(ras, "ras", "zesRasGetState")
        if isinstance(obj, int):
            return obj
        c = self.scenario.cards[obj.card]
        counts = (c.ras_uncorrectable if obj.detail == "UNCORRECTABLE" else c.ras_correctable)[
            obj.tile or 0
        ]
        state = _obj(state_ptr)
        for i, name in enumerate(_RAS_CATEGORIES):
            state.category[i] = int(counts.get(name, 0))
        return _OK


# --------------------------------------------------------------------------------------------
# Installing
# --------------------------------------------------------------------------------------------


class _FailingLoader(importlib.abc.Loader):
    """Executes ``pyzes`` the way the real one fails without ``libze_loader.so.1``."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        # pyzes/__init__.py: _LoadZeLibrary() -> CDLL("/usr/lib/x86_64-linux-gnu/libze_loader.so.1")
        raise OSError(
            "/usr/lib/x86_64-linux-gnu/libze_loader.so.1: cannot open shared object file: "
            "No such file or directory"
        )


class _FailingFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "pyzes":
            return importlib.machinery.ModuleSpec("pyzes", _FailingLoader())
        return None


@contextlib.contextmanager
def install(
    scenario: str | Path | Mapping[str, Any] | Scenario,
    timer: Callable[[], float] | None = None,
) -> Iterator[FakePyzes]:
    """Install a fake ``pyzes`` for ``scenario`` in ``sys.modules`` for the ``with`` block.

    ``timer`` (monotonic seconds) drives the fake's clock instead of `FakePyzes.advance`.
    """
    spec = load_scenario(scenario)
    fake = FakePyzes(spec, timer)
    saved = {k: v for k, v in sys.modules.items() if k == "pyzes" or k.startswith("pyzes.")}
    for key in saved:
        del sys.modules[key]
    finder: _FailingFinder | None = None
    if spec.library == "missing":
        finder = _FailingFinder()
        sys.meta_path.insert(0, finder)
    elif spec.library == "no_package":
        sys.modules["pyzes"] = None  # type: ignore[assignment]
    else:
        sys.modules["pyzes"] = fake.module
    try:
        yield fake
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)
        for key in [k for k in sys.modules if k == "pyzes" or k.startswith("pyzes.")]:
            del sys.modules[key]
        sys.modules.update(saved)
