"""A scenario-driven fake NVML that sits *beneath* pynvml.

`install` sets ``pynvml.nvmlLib`` to a `FakeNvml`. pynvml then runs its real wrapper code (struct
versions, ``byref`` outputs, the count / ``NVML_ERROR_INSUFFICIENT_SIZE`` protocol, per-entry
``nvmlReturn`` of field values) and looks every C function up with ``getattr(nvmlLib, name)``. The
fake answers that lookup with a callable that receives the same ctypes arguments the C function
would, writes its results into them as the C library does and returns an ``nvmlReturn_t`` int. A
name the scenario lists as missing, or one the fake does not implement, raises `AttributeError`, so
pynvml raises ``NVMLError_FunctionNotFound`` exactly as with an old driver.

    with install("h100-sxm-8-nvswitch") as fake:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        fake.advance(10.0)                      # the fake's clock: energy and counters grow
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1

A `Scenario` is plain data (JSON file, dict or dataclasses); `load_scenario` resolves the built-in
ones (`builtin_scenarios`). The JSON schema is the field list of `Scenario` and `GpuSpec`, plus
the compaction keys ``template``/``count``/``per_index``/``overrides`` (see `Scenario.from_dict`).

Values are deterministic: jitter is a hash of (seed, GPU, quantity, time bucket); time is the fake's
clock (`FakeNvml.now`), which only moves with `FakeNvml.advance` unless a ``timer=`` is injected.
Energy, PCIe and NVLink byte counters are integrals over that clock, so they only grow.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import hashlib
import importlib
import importlib.resources
import json
import math
import re
import threading
import time
import uuid as uuid_module
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "EventSpec",
    "FakeNvml",
    "FaultSpec",
    "GpuSpec",
    "MigDeviceSpec",
    "ProcessSpec",
    "Scenario",
    "ScenarioError",
    "builtin_scenarios",
    "install",
    "load_scenario",
]

# --------------------------------------------------------------------------------------------------
# NVML ABI constants (from nvml.h; kept here so the fake checks pynvml instead of echoing it)
# --------------------------------------------------------------------------------------------------

_RETURN_CODES: dict[str, int] = {
    "SUCCESS": 0,
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "IRQ_ISSUE": 11,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17,
    "LIB_RM_VERSION_MISMATCH": 18,
    "IN_USE": 19,
    "MEMORY": 20,
    "NO_DATA": 21,
    "INSUFFICIENT_RESOURCES": 23,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "NOT_READY": 27,
    "UNKNOWN": 999,
}
_SUCCESS = 0
_UNINITIALIZED = 1
_INVALID_ARGUMENT = 2
_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_INSUFFICIENT_SIZE = 7
_TIMEOUT = 10
_GPU_IS_LOST = 15
_ARGUMENT_VERSION_MISMATCH = 25
_UNKNOWN = 999

_EVENT_SBE = 0x1
_EVENT_DBE = 0x2
_EVENT_PSTATE = 0x4
_EVENT_XID = 0x8
_EVENT_CLOCK = 0x10
_EVENT_POWER_SOURCE = 0x80
_EVENT_MIG_CONFIG = 0x100
_EVENT_TYPES: dict[str, int] = {
    "sbe": _EVENT_SBE,
    "single_bit_ecc": _EVENT_SBE,
    "dbe": _EVENT_DBE,
    "double_bit_ecc": _EVENT_DBE,
    "pstate": _EVENT_PSTATE,
    "xid": _EVENT_XID,
    "clock": _EVENT_CLOCK,
    "power_source": _EVENT_POWER_SOURCE,
    "mig_config": _EVENT_MIG_CONFIG,
}

_NVLINK_DEVICE_GPU = 0x00
_NVLINK_DEVICE_IBMNPU = 0x01
_NVLINK_DEVICE_SWITCH = 0x02

_UINT_MAX = 0xFFFFFFFF
_MIB = 1024 * 1024
_BITS_PER_WORD = 64  # pynvml passes c_ulonglong arrays for the affinity masks

# nvmlValueType_t
_VT_DOUBLE = 0
_VT_UINT = 1
_VT_ULL = 3

# Struct versions are NVML_STRUCT_VERSION(name, v) = (v << 24) | sizeof(struct):
# nvmlMemory_v2 = 0x02000028, nvmlTemperature_v1 = 0x0100000C.
_MEMORY_V2_SIZE = 40
_TEMPERATURE_V1_SIZE = 12

# Field ids (nvml.h NVML_FI_DEV_*) this fake serves. NVLink per-link error fields come in two
# id ranges (L0-L5 and L6-L11); index i of each tuple is link i.
_FI_ECC_CURRENT, _FI_ECC_PENDING = 1, 2
_FI_ECC_SBE_VOL_TOTAL, _FI_ECC_DBE_VOL_TOTAL = 3, 4
_FI_ECC_SBE_AGG_TOTAL, _FI_ECC_DBE_AGG_TOTAL = 5, 6
_FI_ECC_SBE_VOL_DEV, _FI_ECC_DBE_VOL_DEV = 11, 12
_FI_ECC_SBE_AGG_DEV, _FI_ECC_DBE_AGG_DEV = 22, 23
_FI_RETIRED_SBE, _FI_RETIRED_DBE, _FI_RETIRED_PENDING = 29, 30, 31
_FI_RETIRED_PENDING_SBE, _FI_RETIRED_PENDING_DBE = 92, 93
_FI_MEMORY_TEMP = 82
_FI_TOTAL_ENERGY_CONSUMPTION = 83
_FI_NVLINK_SPEED_MBPS_COMMON = 90
_FI_NVLINK_LINK_COUNT = 91
_FI_PCIE_REPLAY_COUNTER = 94
_FI_PCIE_REPLAY_ROLLOVER_COUNTER = 95
_FI_NVLINK_THROUGHPUT_DATA_TX, _FI_NVLINK_THROUGHPUT_DATA_RX = 138, 139
_FI_NVLINK_THROUGHPUT_RAW_TX, _FI_NVLINK_THROUGHPUT_RAW_RX = 140, 141
_FI_REMAPPED_COR, _FI_REMAPPED_UNC, _FI_REMAPPED_PENDING, _FI_REMAPPED_FAILURE = 142, 143, 144, 145
_FI_NVSWITCH_CONNECTED_LINK_COUNT = 147
_FI_NVLINK_ERROR_DL_REPLAY, _FI_NVLINK_ERROR_DL_RECOVERY, _FI_NVLINK_ERROR_DL_CRC = 161, 162, 163
_FI_NVLINK_GET_SPEED, _FI_NVLINK_GET_STATE, _FI_NVLINK_GET_VERSION = 164, 165, 166
_FI_POWER_AVERAGE, _FI_POWER_INSTANT = 185, 186
_FI_POWER_MIN_LIMIT, _FI_POWER_MAX_LIMIT = 187, 188
_FI_POWER_DEFAULT_LIMIT, _FI_POWER_CURRENT_LIMIT = 189, 190
_FI_ENERGY = 191
_FI_POWER_REQUESTED_LIMIT = 192
_FI_PCIE_COUNT_TX_BYTES, _FI_PCIE_COUNT_RX_BYTES = 197, 198
# Throttle-time counters (ns spent throttled for a reason) -> the clock-event-reason bits.
_FI_THROTTLE_NS = {
    74: 0x4,  # NVML_FI_DEV_PERF_POLICY_POWER: SW power cap
    75: 0x20 | 0x40,  # NVML_FI_DEV_PERF_POLICY_THERMAL: SW or HW thermal slowdown
    76: 0x10,  # NVML_FI_DEV_PERF_POLICY_SYNC_BOOST
    269: 0x20,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
    270: 0x40,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
    271: 0x80,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
}
_FI_MAX = 308  # one greater than the largest field id of the NVML this fake mimics (R575+)


def _lanes(first: int, second: int) -> tuple[int, ...]:
    return tuple(range(first, first + 6)) + tuple(range(second, second + 6))


# kind -> (per-link field ids for links 0..11, the _TOTAL field id)
_NVLINK_ERROR_FIELDS: dict[str, tuple[tuple[int, ...], int]] = {
    "crc_flit": (_lanes(32, 96), 38),
    "crc_data": (_lanes(39, 102), 45),
    "replay": (_lanes(46, 108), 52),
    "recovery": (_lanes(53, 114), 59),
    "ecc_data": (tuple(range(148, 160)), 160),
}
_NVLINK_SPEED_FIELDS = _lanes(84, 132)
_NVLINK_ERROR_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")  # enum order

_FIELD_NAMES: dict[int, str] = {
    _FI_ECC_CURRENT: "NVML_FI_DEV_ECC_CURRENT",
    _FI_ECC_PENDING: "NVML_FI_DEV_ECC_PENDING",
    _FI_ECC_SBE_VOL_TOTAL: "NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
    _FI_ECC_DBE_VOL_TOTAL: "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    _FI_ECC_SBE_AGG_TOTAL: "NVML_FI_DEV_ECC_SBE_AGG_TOTAL",
    _FI_ECC_DBE_AGG_TOTAL: "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
    _FI_ECC_SBE_VOL_DEV: "NVML_FI_DEV_ECC_SBE_VOL_DEV",
    _FI_ECC_DBE_VOL_DEV: "NVML_FI_DEV_ECC_DBE_VOL_DEV",
    _FI_ECC_SBE_AGG_DEV: "NVML_FI_DEV_ECC_SBE_AGG_DEV",
    _FI_ECC_DBE_AGG_DEV: "NVML_FI_DEV_ECC_DBE_AGG_DEV",
    _FI_RETIRED_SBE: "NVML_FI_DEV_RETIRED_SBE",
    _FI_RETIRED_DBE: "NVML_FI_DEV_RETIRED_DBE",
    _FI_RETIRED_PENDING: "NVML_FI_DEV_RETIRED_PENDING",
    _FI_RETIRED_PENDING_SBE: "NVML_FI_DEV_RETIRED_PENDING_SBE",
    _FI_RETIRED_PENDING_DBE: "NVML_FI_DEV_RETIRED_PENDING_DBE",
    _FI_MEMORY_TEMP: "NVML_FI_DEV_MEMORY_TEMP",
    _FI_TOTAL_ENERGY_CONSUMPTION: "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    _FI_NVLINK_SPEED_MBPS_COMMON: "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON",
    _FI_NVLINK_LINK_COUNT: "NVML_FI_DEV_NVLINK_LINK_COUNT",
    _FI_PCIE_REPLAY_COUNTER: "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
    _FI_PCIE_REPLAY_ROLLOVER_COUNTER: "NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER",
    _FI_NVLINK_THROUGHPUT_DATA_TX: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    _FI_NVLINK_THROUGHPUT_DATA_RX: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
    _FI_NVLINK_THROUGHPUT_RAW_TX: "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX",
    _FI_NVLINK_THROUGHPUT_RAW_RX: "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX",
    _FI_REMAPPED_COR: "NVML_FI_DEV_REMAPPED_COR",
    _FI_REMAPPED_UNC: "NVML_FI_DEV_REMAPPED_UNC",
    _FI_REMAPPED_PENDING: "NVML_FI_DEV_REMAPPED_PENDING",
    _FI_REMAPPED_FAILURE: "NVML_FI_DEV_REMAPPED_FAILURE",
    _FI_NVSWITCH_CONNECTED_LINK_COUNT: "NVML_FI_DEV_NVSWITCH_CONNECTED_LINK_COUNT",
    _FI_NVLINK_ERROR_DL_REPLAY: "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
    _FI_NVLINK_ERROR_DL_RECOVERY: "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
    _FI_NVLINK_ERROR_DL_CRC: "NVML_FI_DEV_NVLINK_ERROR_DL_CRC",
    _FI_NVLINK_GET_SPEED: "NVML_FI_DEV_NVLINK_GET_SPEED",
    _FI_NVLINK_GET_STATE: "NVML_FI_DEV_NVLINK_GET_STATE",
    _FI_NVLINK_GET_VERSION: "NVML_FI_DEV_NVLINK_GET_VERSION",
    _FI_POWER_AVERAGE: "NVML_FI_DEV_POWER_AVERAGE",
    _FI_POWER_INSTANT: "NVML_FI_DEV_POWER_INSTANT",
    _FI_POWER_MIN_LIMIT: "NVML_FI_DEV_POWER_MIN_LIMIT",
    _FI_POWER_MAX_LIMIT: "NVML_FI_DEV_POWER_MAX_LIMIT",
    _FI_POWER_DEFAULT_LIMIT: "NVML_FI_DEV_POWER_DEFAULT_LIMIT",
    _FI_POWER_CURRENT_LIMIT: "NVML_FI_DEV_POWER_CURRENT_LIMIT",
    _FI_ENERGY: "NVML_FI_DEV_ENERGY",
    _FI_POWER_REQUESTED_LIMIT: "NVML_FI_DEV_POWER_REQUESTED_LIMIT",
    _FI_PCIE_COUNT_TX_BYTES: "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
    _FI_PCIE_COUNT_RX_BYTES: "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
}
_FIELD_ERROR_NAMES = {
    "crc_flit": "CRC_FLIT_ERROR_COUNT",
    "crc_data": "CRC_DATA_ERROR_COUNT",
    "replay": "REPLAY_ERROR_COUNT",
    "recovery": "RECOVERY_ERROR_COUNT",
    "ecc_data": "ECC_DATA_ERROR_COUNT",
}
for _kind, (_ids, _total) in _NVLINK_ERROR_FIELDS.items():
    for _link, _fid in enumerate(_ids):
        _FIELD_NAMES[_fid] = f"NVML_FI_DEV_NVLINK_{_FIELD_ERROR_NAMES[_kind]}_L{_link}"
    _FIELD_NAMES[_total] = f"NVML_FI_DEV_NVLINK_{_FIELD_ERROR_NAMES[_kind]}_TOTAL"
for _link, _fid in enumerate(_NVLINK_SPEED_FIELDS):
    _FIELD_NAMES[_fid] = f"NVML_FI_DEV_NVLINK_SPEED_MBPS_L{_link}"

# The quantity each field belongs to: a GPU's ``not_supported`` may name the quantity, the field
# constant ("NVML_FI_DEV_MEMORY_TEMP") or the NVML function.
_FIELD_QUANTITY: dict[int, str] = {}
for _fid in (_FI_ECC_CURRENT, _FI_ECC_PENDING):
    _FIELD_QUANTITY[_fid] = "ecc_mode"
for _fid in range(3, 29):
    _FIELD_QUANTITY[_fid] = "ecc_errors"
for _fid in (
    _FI_RETIRED_SBE,
    _FI_RETIRED_DBE,
    _FI_RETIRED_PENDING,
    _FI_RETIRED_PENDING_SBE,
    _FI_RETIRED_PENDING_DBE,
):
    _FIELD_QUANTITY[_fid] = "retired_pages"
for _ids, _total in _NVLINK_ERROR_FIELDS.values():
    for _fid in (*_ids, _total):
        _FIELD_QUANTITY[_fid] = "nvlink_errors"
for _fid in (_FI_NVLINK_ERROR_DL_REPLAY, _FI_NVLINK_ERROR_DL_RECOVERY, _FI_NVLINK_ERROR_DL_CRC):
    _FIELD_QUANTITY[_fid] = "nvlink_errors"
for _fid in (
    *_NVLINK_SPEED_FIELDS,
    _FI_NVLINK_SPEED_MBPS_COMMON,
    _FI_NVLINK_LINK_COUNT,
    _FI_NVSWITCH_CONNECTED_LINK_COUNT,
    _FI_NVLINK_GET_SPEED,
    _FI_NVLINK_GET_STATE,
    _FI_NVLINK_GET_VERSION,
):
    _FIELD_QUANTITY[_fid] = "nvlink"
for _fid in range(_FI_NVLINK_THROUGHPUT_DATA_TX, _FI_NVLINK_THROUGHPUT_RAW_RX + 1):
    _FIELD_QUANTITY[_fid] = "nvlink_throughput"
for _fid in range(_FI_REMAPPED_COR, _FI_REMAPPED_FAILURE + 1):
    _FIELD_QUANTITY[_fid] = "remapped_rows"
_FIELD_QUANTITY[_FI_MEMORY_TEMP] = "temperature_memory"
for _fid in _FI_THROTTLE_NS:
    _FIELD_QUANTITY[_fid] = "clock_event_reasons"
_FIELD_QUANTITY[_FI_TOTAL_ENERGY_CONSUMPTION] = "energy"
_FIELD_QUANTITY[_FI_ENERGY] = "energy"
_FIELD_QUANTITY[_FI_PCIE_REPLAY_COUNTER] = "pcie_replay"
_FIELD_QUANTITY[_FI_PCIE_REPLAY_ROLLOVER_COUNTER] = "pcie_replay"
_FIELD_QUANTITY[_FI_PCIE_COUNT_TX_BYTES] = "pcie_throughput"
_FIELD_QUANTITY[_FI_PCIE_COUNT_RX_BYTES] = "pcie_throughput"
_FIELD_QUANTITY[_FI_POWER_AVERAGE] = "power_usage"
_FIELD_QUANTITY[_FI_POWER_INSTANT] = "power_usage"
for _fid in range(_FI_POWER_MIN_LIMIT, _FI_POWER_REQUESTED_LIMIT + 1):
    if _fid != _FI_ENERGY:
        _FIELD_QUANTITY[_fid] = "power_limit"

_BUILTIN_PACKAGE = "otel_gpu.testing"


# --------------------------------------------------------------------------------------------------
# Scenario data
# --------------------------------------------------------------------------------------------------


class ScenarioError(ValueError):
    """A scenario file or dict is malformed: unknown key, bad value, dangling reference."""


def _to_int(value: Any, where: str) -> int:
    """Accept JSON ints and hex/decimal strings ("0x233010DE")."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            pass
    raise ScenarioError(f"{where}: expected an integer, got {value!r}")


def _opt_int(value: Any, where: str) -> int | None:
    return None if value is None else _to_int(value, where)


def _parse_cpu_list(value: Any, where: str) -> list[int]:
    """``"0-55,112-167"`` or ``[0, 1, 2]`` -> sorted CPU ids."""
    if isinstance(value, str):
        cpus: set[int] = set()
        for part in filter(None, (p.strip() for p in value.split(","))):
            lo, _, hi = part.partition("-")
            try:
                cpus.update(range(int(lo), int(hi or lo) + 1))
            except ValueError as e:
                raise ScenarioError(f"{where}: bad CPU list {value!r}") from e
        return sorted(cpus)
    if isinstance(value, Sequence):
        return sorted({_to_int(v, where) for v in value})
    raise ScenarioError(f"{where}: expected a CPU list, got {value!r}")


_LINK_RE = re.compile(r"^(gpu|switch|npu|none)(?::([^*]+))?(?:\*(\d+))?$")


def _expand_links(value: Any, where: str) -> list[str]:
    """Expand ``["switch:0*5", "gpu:3*4", "none"]`` to one entry per link."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ScenarioError(f"{where}: expected a list of link targets, got {value!r}")
    links: list[str] = []
    for entry in value:
        m = _LINK_RE.match(str(entry))
        if m is None:
            raise ScenarioError(
                f"{where}: bad link target {entry!r} (use gpu:N, switch:N, npu:BUSID or none, "
                "optionally *COUNT)"
            )
        kind, arg, repeat = m.groups()
        if (kind == "none") != (arg is None):
            raise ScenarioError(f"{where}: bad link target {entry!r}")
        links.extend([kind if arg is None else f"{kind}:{arg}"] * int(repeat or 1))
    return links


def _mapping(data: Any, where: str) -> dict[str, Any]:
    """``data`` as a dict, or a ScenarioError saying an object was expected."""
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{where}: expected an object, got {type(data).__name__}")
    return dict(data)


def _list(data: Any, where: str) -> list[Any]:
    """``data`` as a list, or a ScenarioError saying a list was expected."""
    if not isinstance(data, list):
        raise ScenarioError(f"{where}: expected a list, got {type(data).__name__}")
    return data


def _check_keys(cls: type[Any], data: Mapping[str, Any], where: str) -> None:
    _mapping(data, where)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")


@dataclass
class ProcessSpec:
    """A compute process running on a GPU (or on one MIG instance of it)."""

    pid: int
    used_memory_mib: int = 0
    name: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "process") -> ProcessSpec:
        """Build from a JSON object with the field names of this class."""
        _check_keys(cls, data, where)
        return cls(
            pid=_to_int(data["pid"], f"{where}.pid"),
            used_memory_mib=_to_int(data.get("used_memory_mib", 0), f"{where}.used_memory_mib"),
            name=str(data.get("name", "")),
            gpu_instance_id=_opt_int(data.get("gpu_instance_id"), f"{where}.gpu_instance_id"),
            compute_instance_id=_opt_int(
                data.get("compute_instance_id"), f"{where}.compute_instance_id"
            ),
        )


@dataclass
class MigDeviceSpec:
    """One MIG device (a compute instance inside a GPU instance) of a MIG-enabled GPU."""

    profile: str  # "3g.40gb"
    gpu_instance_id: int
    compute_instance_id: int = 0
    memory_total_mib: int = 0
    memory_used_mib: int = 0
    uuid: str = ""  # "" -> derived: "MIG-<uuid>"
    index: int | None = None  # MIG device index under the parent; None -> position in the list
    multiprocessor_count: int = 0  # 0 -> 14 per GPU slice

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "mig_device") -> MigDeviceSpec:
        """Build from a JSON object with the field names of this class."""
        _check_keys(cls, data, where)
        return cls(
            profile=str(data["profile"]),
            gpu_instance_id=_to_int(data["gpu_instance_id"], f"{where}.gpu_instance_id"),
            compute_instance_id=_to_int(data.get("compute_instance_id", 0), where),
            memory_total_mib=_to_int(data.get("memory_total_mib", 0), where),
            memory_used_mib=_to_int(data.get("memory_used_mib", 0), where),
            uuid=str(data.get("uuid", "")),
            index=_opt_int(data.get("index"), f"{where}.index"),
            multiprocessor_count=_to_int(data.get("multiprocessor_count", 0), where),
        )

    @property
    def slices(self) -> int:
        """GPU slices of the profile: 3 for "3g.40gb"."""
        m = re.match(r"^(\d+)g", self.profile)
        return int(m.group(1)) if m else 1


@dataclass
class EventSpec:
    """A scripted event: at fake time ``after_s`` it is delivered to every event set registered for
    that GPU and event type (sets registered later still get it once, so a slow test cannot miss
    it). ``type`` is xid/sbe/dbe/pstate/clock/power_source/mig_config or the event mask itself;
    ``code`` is the Xid. ``lost`` makes the GPU fall off the bus at that moment (Xid 79)."""

    after_s: float
    gpu: int
    type: str | int = "xid"
    code: int = 0
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    lost: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "event") -> EventSpec:
        """Build from a JSON object with the field names of this class."""
        _check_keys(cls, data, where)
        spec = cls(
            after_s=float(data.get("after_s", 0.0)),
            gpu=_to_int(data["gpu"], f"{where}.gpu"),
            type=data.get("type", "xid"),
            code=_to_int(data.get("code", 0), f"{where}.code"),
            gpu_instance_id=_opt_int(data.get("gpu_instance_id"), where),
            compute_instance_id=_opt_int(data.get("compute_instance_id"), where),
            lost=bool(data.get("lost", False)),
        )
        _event_mask(spec.type, where)
        return spec


def _event_mask(kind: str | int, where: str = "event") -> int:
    if isinstance(kind, int):
        return kind
    try:
        return _EVENT_TYPES[kind.lower()]
    except KeyError:
        raise ScenarioError(
            f"{where}: unknown event type {kind!r}; known: {sorted(_EVENT_TYPES)}"
        ) from None


def _return_code(error: str | int, where: str = "error") -> int:
    if isinstance(error, int):
        return error
    name = error.upper().removeprefix("NVML_ERROR_")
    try:
        return _RETURN_CODES[name]
    except KeyError:
        raise ScenarioError(f"{where}: unknown NVML error {error!r}") from None


@dataclass
class FaultSpec:
    """Make ``function`` return ``error`` (a NVML_ERROR_* name or code), optionally only for one
    GPU (its handle is the first argument) and only ``times`` times."""

    function: str
    error: str | int
    gpu: int | None = None
    times: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "fault") -> FaultSpec:
        """Build from a JSON object with the field names of this class."""
        _check_keys(cls, data, where)
        spec = cls(
            function=str(data["function"]),
            error=data["error"],
            gpu=_opt_int(data.get("gpu"), f"{where}.gpu"),
            times=_opt_int(data.get("times"), f"{where}.times"),
        )
        _return_code(spec.error, where)
        return spec


@dataclass
class GpuSpec:
    """Everything the fake reports for one physical GPU. JSON keys are these field names.

    Units are in the names (``_mib``, ``_mw``, ``_mj``, ``_mhz``, ``_per_s``). ``None`` for an
    optional quantity means the GPU does not have it (NVML_ERROR_NOT_SUPPORTED). Empty identity
    strings are derived deterministically from the scenario seed and the GPU index.
    """

    # identity
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    serial: str = ""
    vbios_version: str = "96.00.99.00.01"
    board_part_number: str = "692-2G520-0200-000"
    pci_bus_id: str = ""  # reported verbatim; any of "00000000:1B:00.0", "0000:1b:00.0", ...
    pci_device_id: int = 0x233010DE
    pci_subsystem_id: int = 0x16C110DE
    minor_number: int | None = None  # None -> the index
    architecture: int = 9  # NVML_DEVICE_ARCH_HOPPER
    brand: int = 14  # NVML_BRAND_NVIDIA
    compute_capability: tuple[int, int] = (9, 0)
    multiprocessor_count: int = 132
    persistence_mode: bool = True
    performance_state: int = 0
    fan_speed: int | None = None  # percent; None: passively cooled (SXM)
    # memory: v2 reports used/reserved apart; v1 folds reserved into used
    memory_total_mib: int = 81559
    memory_reserved_mib: int = 0
    memory_used_mib: int = 0
    # power
    power_usage_mw: int = 70000
    power_limit_mw: int = 700000
    enforced_power_limit_mw: int | None = None  # None -> power_limit_mw
    default_power_limit_mw: int | None = None  # None -> power_limit_mw
    power_min_limit_mw: int = 200000
    power_max_limit_mw: int = 700000
    energy_mj: int = 0  # counter value at fake time 0
    # thermal, Celsius
    temperature_gpu: int = 35
    temperature_memory: int | None = 40  # None: no memory sensor (GDDR boards)
    temperature_slowdown: int | None = 89
    temperature_shutdown: int | None = 92
    temperature_gpu_max: int | None = 87
    temperature_memory_max: int | None = 95
    # utilization, percent
    utilization_gpu: int = 0
    utilization_memory: int = 0
    encoder_utilization: int = 0
    decoder_utilization: int = 0
    # clocks, MHz
    clock_graphics_mhz: int = 1980
    clock_sm_mhz: int = 1980
    clock_mem_mhz: int = 2619
    clock_video_mhz: int = 1545
    max_clock_graphics_mhz: int = 1980
    max_clock_sm_mhz: int = 1980
    max_clock_mem_mhz: int = 2619
    max_clock_video_mhz: int = 1755
    clock_event_reasons: int = 0  # nvmlClocksEventReason* bitmask
    # ECC and memory retirement
    ecc_mode_current: bool = True
    ecc_mode_pending: bool = True
    ecc_volatile_corrected: int = 0
    ecc_volatile_uncorrected: int = 0
    ecc_aggregate_corrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    retired_pages_sbe: list[int] = field(default_factory=list)  # page addresses
    retired_pages_dbe: list[int] = field(default_factory=list)
    retired_pages_pending: bool = False
    remapped_rows_corrected: int = 0
    remapped_rows_uncorrected: int = 0
    remapped_rows_pending: bool = False
    remapped_rows_failure: bool = False
    # PCIe
    pcie_link_gen: int = 5
    pcie_link_width: int = 16
    pcie_max_link_gen: int = 5
    pcie_max_link_width: int = 16
    pcie_replay_counter: int = 0
    pcie_tx_bytes: int = 0  # counter values at fake time 0 ...
    pcie_rx_bytes: int = 0
    pcie_tx_bytes_per_s: int = 0  # ... growing at these rates
    pcie_rx_bytes_per_s: int = 0
    # NVLink: one target per link: "gpu:N", "switch:N" (index into Scenario.nvswitches),
    # "npu:BUSID" or "none"; "X*K" repeats. Empty: no NVLink (every NvLink call NOT_SUPPORTED).
    nvlink_remote: list[str] = field(default_factory=list)
    nvlink_down: list[int] = field(default_factory=list)  # links reporting state 0
    nvlink_version: int = 6  # NVML_NVLINK_VERSION_4_0
    nvlink_speed_mbps: int = 26562
    nvlink_errors: dict[str, int] = field(default_factory=dict)  # per link: replay, recovery,
    nvlink_link_errors: dict[int, dict[str, int]] = field(default_factory=dict)  # crc_flit, ...
    nvlink_tx_kib_per_s: int = 0  # per active link, data; raw = data * 17 / 16
    nvlink_rx_kib_per_s: int = 0
    # host topology
    numa_node: int | None = None  # None: NOT_SUPPORTED
    cpu_affinity: list[int] = field(default_factory=list)  # JSON: "0-55,112-167" or a list
    # MIG; mig_mode None: the GPU is not MIG capable
    mig_mode: int | None = None
    mig_mode_pending: int | None = None  # None -> mig_mode
    mig_max_devices: int = 7
    mig_devices: list[MigDeviceSpec] = field(default_factory=list)
    processes: list[ProcessSpec] = field(default_factory=list)
    # events
    supported_event_types: int = _EVENT_SBE | _EVENT_DBE | _EVENT_PSTATE | _EVENT_XID
    # dynamics: amplitude of deterministic jitter per quantity key (power_usage_mw,
    # utilization_gpu, utilization_memory, temperature_gpu, temperature_memory, clock_sm_mhz, ...)
    jitter: dict[str, float] = field(default_factory=dict)
    # faults
    not_supported: list[str] = field(default_factory=list)  # quantities, NVML_FI_* or functions
    lost_after_calls: int | None = None  # calls touching the GPU before it falls off the bus
    recover_after_calls: int | None = None  # calls answered GPU_IS_LOST before it comes back

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "gpu") -> GpuSpec:
        """Build from a JSON object; converts hex strings, CPU lists and link shorthands."""
        _check_keys(cls, data, where)
        values: dict[str, Any] = dict(data)
        for f in dataclasses.fields(cls):
            if f.name not in values:
                continue
            raw = values[f.name]
            key = f"{where}.{f.name}"
            converter = _GPU_FIELD_CONVERTERS.get(f.name) or _SCALAR_CONVERTERS.get(str(f.type))
            if converter is None:
                raise ScenarioError(f"{key}: no converter for {f.type}")  # pragma: no cover
            try:
                values[f.name] = converter(raw, key)
            except ScenarioError:
                raise
            except (TypeError, AttributeError, ValueError) as e:
                raise ScenarioError(f"{key}: bad value {raw!r} ({e})") from e
        counters = [*values.get("nvlink_errors", {})]
        for per_link in values.get("nvlink_link_errors", {}).values():
            counters.extend(per_link)
        for kind in counters:
            if kind not in _NVLINK_ERROR_COUNTERS:
                raise ScenarioError(
                    f"{where}: unknown NVLink error counter {kind!r}; known: "
                    f"{list(_NVLINK_ERROR_COUNTERS)}"
                )
        return cls(**values)


def _pair(raw: Any, key: str) -> tuple[int, int]:
    if not isinstance(raw, Sequence) or isinstance(raw, str) or len(raw) != 2:
        raise ScenarioError(f"{key}: expected [major, minor], got {raw!r}")
    return _to_int(raw[0], key), _to_int(raw[1], key)


_SCALAR_CONVERTERS: dict[str, Callable[[Any, str], Any]] = {
    "int": _to_int,
    "int | None": _opt_int,
    "bool": lambda raw, key: bool(raw),
    "str": lambda raw, key: str(raw),
}
_GPU_FIELD_CONVERTERS: dict[str, Callable[[Any, str], Any]] = {
    "compute_capability": _pair,
    "cpu_affinity": _parse_cpu_list,
    "nvlink_remote": _expand_links,
    "nvlink_down": lambda raw, key: [_to_int(v, key) for v in raw],
    "retired_pages_sbe": lambda raw, key: [_to_int(v, key) for v in raw],
    "retired_pages_dbe": lambda raw, key: [_to_int(v, key) for v in raw],
    "nvlink_errors": lambda raw, key: {str(k): _to_int(v, key) for k, v in raw.items()},
    "nvlink_link_errors": lambda raw, key: {
        _to_int(link, key): {str(k): _to_int(v, key) for k, v in errs.items()}
        for link, errs in raw.items()
    },
    "mig_devices": lambda raw, key: [
        MigDeviceSpec.from_dict(d, f"{key}[{i}]") for i, d in enumerate(raw)
    ],
    "processes": lambda raw, key: [
        ProcessSpec.from_dict(d, f"{key}[{i}]") for i, d in enumerate(raw)
    ],
    "jitter": lambda raw, key: {str(k): float(v) for k, v in raw.items()},
    "not_supported": lambda raw, key: [str(v) for v in raw],
}


@dataclass
class Scenario:
    """A whole node as NVML would see it. Load with `Scenario.from_dict`, `Scenario.from_file` or
    `load_scenario`; or build it from dataclasses."""

    name: str = "custom"
    description: str = ""
    seed: int = 0
    driver_version: str = "550.90.07"
    cuda_driver_version: int = 12040  # 1000 * major + 10 * minor
    nvml_version: str = "12.550.90.07"
    gpus: list[GpuSpec] = field(default_factory=list)
    nvswitches: list[str] = field(default_factory=list)  # PCI bus ids, targets of "switch:N"
    nvswitch_pci_device_id: int = 0x22A310DE
    missing_functions: list[str] = field(default_factory=list)  # -> FUNCTION_NOT_FOUND
    max_field_id: int = _FI_MAX - 1  # newer field ids answer INVALID_ARGUMENT (old drivers)
    init_error: str | None = None  # e.g. "DRIVER_NOT_LOADED": every nvmlInit* returns it
    unknown_error_every: int = 0  # every Nth call touching any device returns NVML_ERROR_UNKNOWN
    faults: list[FaultSpec] = field(default_factory=list)
    call_delay_s: dict[str, float] = field(default_factory=dict)  # function -> real sleep
    events: list[EventSpec] = field(default_factory=list)
    sample_period_s: float = 1.0  # jitter changes once per period of fake time
    epoch_s: float = 1_717_200_000.0  # wall-clock time at fake time 0 (field value timestamps)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check cross references (link targets, event GPUs, MIG ids); raise ScenarioError."""
        n = len(self.gpus)
        for i, gpu in enumerate(self.gpus):
            gpu.nvlink_remote = _expand_links(gpu.nvlink_remote, f"gpus[{i}].nvlink_remote")
            for link, target in enumerate(gpu.nvlink_remote):
                kind, _, arg = target.partition(":")
                if kind == "gpu" and not (arg.isdecimal() and int(arg) < n and int(arg) != i):
                    raise ScenarioError(f"gpus[{i}].nvlink_remote[{link}]: no peer GPU {arg!r}")
                if kind == "switch" and not (arg.isdecimal() and int(arg) < len(self.nvswitches)):
                    raise ScenarioError(f"gpus[{i}].nvlink_remote[{link}]: no nvswitch {arg!r}")
            if gpu.pci_bus_id and _parse_bus_id(gpu.pci_bus_id) is None:
                raise ScenarioError(f"gpus[{i}].pci_bus_id: bad PCI bus id {gpu.pci_bus_id!r}")
            seen: set[int] = set()
            for j, mig in enumerate(gpu.mig_devices):
                index = j if mig.index is None else mig.index
                if index in seen or index >= gpu.mig_max_devices:
                    raise ScenarioError(f"gpus[{i}].mig_devices[{j}]: bad MIG index {index}")
                seen.add(index)
        for bus_id in self.nvswitches:
            if _parse_bus_id(bus_id) is None:
                raise ScenarioError(f"nvswitches: bad PCI bus id {bus_id!r}")
        for k, event in enumerate(self.events):
            if not 0 <= event.gpu < n:
                raise ScenarioError(f"events[{k}].gpu: no GPU {event.gpu}")
        if self.init_error is not None:
            _return_code(self.init_error, "init_error")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        """Build a scenario from JSON-like data (see :meth:`_from_dict`); any malformed value
        is a :class:`ScenarioError`, one line naming the problem."""
        try:
            return cls._from_dict(data)
        except ScenarioError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            what = f"missing key {err}" if isinstance(err, KeyError) else str(err)
            raise ScenarioError(f"scenario: {what}") from None

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        """Build a scenario from JSON-like data.

        GPUs come from ``gpus`` (a list of GpuSpec objects) and/or ``template`` + ``count``: GPU i
        is ``template``, updated with ``per_index[key][i]`` for each key of ``per_index``, then
        with ``gpus[i]`` (if present), then with ``overrides[str(i)]``. Updates are shallow: a
        key replaces the template's value.
        """
        data = _mapping(data, "scenario")
        template = data.pop("template", None)
        if template is not None:
            template = _mapping(template, "template")
        gpu_list = [
            _mapping(g, f"gpus[{i}]") for i, g in enumerate(_list(data.pop("gpus", []), "gpus"))
        ]
        per_index = _mapping(data.pop("per_index", {}), "per_index")
        overrides = _mapping(data.pop("overrides", {}), "overrides")
        for key, value in overrides.items():
            _mapping(value, f"overrides.{key}")
        count = data.pop("count", None)
        count = _to_int(count, "count") if count is not None else None
        if count is None:
            count = len(gpu_list) if gpu_list or template is None else 1
        if not isinstance(gpu_list, list) or len(gpu_list) > count:
            raise ScenarioError("gpus: expected a list of at most `count` GPU objects")
        for key, column in per_index.items():
            if not isinstance(column, list) or len(column) != count:
                raise ScenarioError(f"per_index.{key}: expected a list of {count} values")
        for key in overrides:
            if not (str(key).isdecimal() and int(key) < count):
                raise ScenarioError(f"overrides: no GPU {key!r}")
        gpus: list[GpuSpec] = []
        for i in range(count):
            merged: dict[str, Any] = dict(template or {})
            merged.update({key: column[i] for key, column in per_index.items()})
            if i < len(gpu_list):
                merged.update(gpu_list[i])
            merged.update(overrides.get(str(i), {}))
            gpus.append(GpuSpec.from_dict(merged, f"gpus[{i}]"))
        _check_keys(cls, data, "scenario")
        kwargs: dict[str, Any] = dict(data)
        kwargs["gpus"] = gpus
        kwargs["events"] = [
            EventSpec.from_dict(e, f"events[{k}]")
            for k, e in enumerate(_list(data.get("events", []), "events"))
        ]
        kwargs["faults"] = [
            FaultSpec.from_dict(e, f"faults[{k}]")
            for k, e in enumerate(_list(data.get("faults", []), "faults"))
        ]
        for key in ("seed", "cuda_driver_version", "nvswitch_pci_device_id", "max_field_id"):
            if key in kwargs:
                kwargs[key] = _to_int(kwargs[key], key)
        if "unknown_error_every" in kwargs:
            kwargs["unknown_error_every"] = _to_int(kwargs["unknown_error_every"], "unknown_err")
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str | Path) -> Scenario:
        """Load a JSON scenario file."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ScenarioError(f"{path}: {e}") from e
        if not isinstance(data, dict):
            raise ScenarioError(f"{path}: expected a JSON object")
        return cls.from_dict(data)


def _builtin_dir() -> Any:
    return importlib.resources.files(_BUILTIN_PACKAGE).joinpath("scenarios").joinpath("nvml")


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped in ``otel_gpu/testing/scenarios/nvml/``."""
    return sorted(
        entry.name.removesuffix(".json")
        for entry in _builtin_dir().iterdir()
        if entry.name.endswith(".json")
    )


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name ("h100-sxm-8-nvswitch"), or a JSON file by path."""
    if isinstance(name_or_path, str) and name_or_path in builtin_scenarios():
        entry = _builtin_dir().joinpath(f"{name_or_path}.json")
        try:
            data = json.loads(entry.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ScenarioError(f"built-in scenario {name_or_path}: {e}") from e
        return Scenario.from_dict(data)
    path = Path(name_or_path)
    if path.is_file():
        return Scenario.from_file(path)
    raise ScenarioError(
        f"no scenario {str(name_or_path)!r}: not a file, and not one of {builtin_scenarios()}"
    )


# --------------------------------------------------------------------------------------------------
# ctypes plumbing
# --------------------------------------------------------------------------------------------------


class _NvmlFail(Exception):
    """Raised inside an implementation to return an nvmlReturn_t."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _as_int(arg: Any) -> int:
    """A by-value argument: a Python int or a ctypes scalar (c_uint, c_int32, c_ulonglong)."""
    if isinstance(arg, int):
        return arg
    value = getattr(arg, "value", None)
    if isinstance(value, int):
        return value
    raise _NvmlFail(_INVALID_ARGUMENT)


def _deref(arg: Any) -> Any:
    """The object behind an output argument: ``byref(x)`` -> x, ``pointer(x)`` -> x, an array as
    is. NULL (None) is an invalid argument, as in C."""
    if arg is None:
        raise _NvmlFail(_INVALID_ARGUMENT)
    obj = getattr(arg, "_obj", None)  # ctypes CArgObject, what byref() returns
    if obj is not None:
        return obj
    if isinstance(arg, ctypes._Pointer):
        return arg.contents
    return arg


def _address(handle: Any) -> int:
    """The address an opaque handle (nvmlDevice_t, nvmlEventSet_t) points at."""
    if handle is None:
        return 0
    if isinstance(handle, int):
        return handle
    if isinstance(handle, ctypes.c_void_p):
        return handle.value or 0
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return 0


def _store_pointer(out: Any, address: int) -> None:
    """``*out = address`` for an output handle (``byref(c_nvmlDevice_t())``)."""
    ctypes.c_void_p.from_buffer(_deref(out)).value = address


def _store(out: Any, value: int | float) -> None:
    """``*out = value`` for a scalar output (``byref(c_uint())``)."""
    _deref(out).value = value


def _store_str(buf: Any, length: Any, text: str) -> None:
    """Copy ``text`` NUL-terminated into a char buffer of ``length`` bytes, as NVML does."""
    data = text.encode()
    if buf is None:
        raise _NvmlFail(_INVALID_ARGUMENT)
    if len(data) + 1 > _as_int(length):
        raise _NvmlFail(_INSUFFICIENT_SIZE)
    ctypes.memmove(_deref(buf), data + b"\0", len(data) + 1)


def _struct_version(version: int, size: int) -> int:
    return (version << 24) | size


def _parse_bus_id(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) from any of NVML's accepted spellings, in hex."""
    m = re.match(
        r"^\s*(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?\s*$",
        text,
    )
    if m is None:
        return None
    domain, bus, device, function = m.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16), int(function or "0", 16)


def _unit(seed: int, *key: object) -> float:
    """A deterministic value in [-1, 1] for the key."""
    digest = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / float(1 << 63) - 1.0


def _derived_uuid(seed: int, *key: object) -> str:
    digest = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=16).digest()
    return str(uuid_module.UUID(bytes=digest, version=4))


# --------------------------------------------------------------------------------------------------
# Runtime state
# --------------------------------------------------------------------------------------------------


class _Handle:
    """A stable, real address to hand out as an opaque NVML handle."""

    def __init__(self) -> None:
        self._cell = (ctypes.c_char * 8)()
        self.address = ctypes.addressof(self._cell)


class _Gpu(_Handle):
    def __init__(self, index: int, spec: GpuSpec, seed: int) -> None:
        super().__init__()
        self.index = index
        self.spec = spec
        if not spec.uuid:
            spec.uuid = "GPU-" + _derived_uuid(seed, "gpu", index)
        if not spec.serial:
            spec.serial = f"1{int(_unit(seed, 'serial', index) * 1e11) + 10**11:012d}"
        if not spec.pci_bus_id:
            spec.pci_bus_id = f"00000000:{index + 1:02X}:00.0"
        self.calls = 0  # calls that touched this GPU
        self.forced_lost: bool | None = None
        self.energy_bucket = 0  # energy integrated over whole buckets [0, energy_bucket)
        self.energy_acc = 0.0
        self.energy_last = 0
        self.migs: list[_Mig] = [
            _Mig(self, j if m.index is None else m.index, m, seed)
            for j, m in enumerate(spec.mig_devices)
        ]

    def lost(self) -> bool:
        if self.forced_lost is not None:
            return self.forced_lost
        after = self.spec.lost_after_calls
        if after is None or self.calls <= after:
            return False
        recover = self.spec.recover_after_calls
        return recover is None or self.calls <= after + recover


class _Mig(_Handle):
    def __init__(self, parent: _Gpu, index: int, spec: MigDeviceSpec, seed: int) -> None:
        super().__init__()
        self.parent = parent
        self.index = index
        self.spec = spec
        if not spec.uuid:
            spec.uuid = "MIG-" + _derived_uuid(
                seed, "mig", parent.index, spec.gpu_instance_id, spec.compute_instance_id
            )


@dataclass
class _Event:
    gpu: _Gpu
    event_type: int
    data: int
    gpu_instance_id: int
    compute_instance_id: int


class _EventSet(_Handle):
    def __init__(self) -> None:
        super().__init__()
        self.registered: dict[int, int] = {}  # GPU index -> event mask
        self.queue: deque[_Event] = deque()
        self.scripted_done: set[int] = set()


class _NvmlFunction:
    """What ``getattr(nvmlLib, name)`` returns: called like a ctypes function pointer.

    Attributes such as ``restype`` may be set on it, as pynvml does for nvmlErrorString.
    """

    def __init__(self, fake: FakeNvml, name: str, impl: Callable[..., Any]) -> None:
        self.__name__ = name
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None
        self._fake = fake
        self._impl = impl

    def __call__(self, *args: Any) -> Any:
        return self._fake._dispatch(self.__name__, self._impl, args)

    def __repr__(self) -> str:
        return f"<fake NVML function {self.__name__}>"


_NO_INIT_NEEDED = frozenset(
    {"nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString"}
)
_IMPL_PREFIX = "_c_"

# Functions a MIG device handle answers; every other device function returns NOT_SUPPORTED on one.
_MIG_FUNCTIONS = frozenset(
    {
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetAttributes_v2",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetMaxMigDeviceCount",
    }
)

# The quantity (for GpuSpec.not_supported) each device function reads.
_FUNCTION_QUANTITY: dict[str, str] = {
    "nvmlDeviceGetName": "name",
    "nvmlDeviceGetUUID": "uuid",
    "nvmlDeviceGetSerial": "serial",
    "nvmlDeviceGetVbiosVersion": "vbios_version",
    "nvmlDeviceGetBoardPartNumber": "board_part_number",
    "nvmlDeviceGetPciInfo_v3": "pci_info",
    "nvmlDeviceGetPciInfoExt": "pci_info",
    "nvmlDeviceGetMinorNumber": "minor_number",
    "nvmlDeviceGetArchitecture": "architecture",
    "nvmlDeviceGetBrand": "brand",
    "nvmlDeviceGetCudaComputeCapability": "compute_capability",
    "nvmlDeviceGetAttributes_v2": "attributes",
    "nvmlDeviceGetPersistenceMode": "persistence_mode",
    "nvmlDeviceGetPerformanceState": "performance_state",
    "nvmlDeviceGetFanSpeed": "fan_speed",
    "nvmlDeviceGetMemoryInfo": "memory",
    "nvmlDeviceGetMemoryInfo_v2": "memory",
    "nvmlDeviceGetPowerUsage": "power_usage",
    "nvmlDeviceGetPowerManagementLimit": "power_limit",
    "nvmlDeviceGetEnforcedPowerLimit": "power_limit",
    "nvmlDeviceGetPowerManagementLimitConstraints": "power_limit",
    "nvmlDeviceGetPowerManagementDefaultLimit": "power_limit",
    "nvmlDeviceGetTotalEnergyConsumption": "energy",
    "nvmlDeviceGetTemperature": "temperature_gpu",
    "nvmlDeviceGetTemperatureV": "temperature_gpu",
    "nvmlDeviceGetTemperatureThreshold": "temperature_thresholds",
    "nvmlDeviceGetUtilizationRates": "utilization",
    "nvmlDeviceGetEncoderUtilization": "encoder_utilization",
    "nvmlDeviceGetDecoderUtilization": "decoder_utilization",
    "nvmlDeviceGetClockInfo": "clocks",
    "nvmlDeviceGetClock": "clocks",
    "nvmlDeviceGetMaxClockInfo": "max_clocks",
    "nvmlDeviceGetCurrentClocksEventReasons": "clock_event_reasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons": "clock_event_reasons",
    "nvmlDeviceGetEccMode": "ecc_mode",
    "nvmlDeviceGetTotalEccErrors": "ecc_errors",
    "nvmlDeviceGetMemoryErrorCounter": "ecc_errors",
    "nvmlDeviceGetRetiredPages": "retired_pages",
    "nvmlDeviceGetRetiredPages_v2": "retired_pages",
    "nvmlDeviceGetRetiredPagesPendingStatus": "retired_pages",
    "nvmlDeviceGetRemappedRows": "remapped_rows",
    "nvmlDeviceGetCurrPcieLinkGeneration": "pcie_link",
    "nvmlDeviceGetCurrPcieLinkWidth": "pcie_link",
    "nvmlDeviceGetMaxPcieLinkGeneration": "pcie_link",
    "nvmlDeviceGetMaxPcieLinkWidth": "pcie_link",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": "pcie_link",
    "nvmlDeviceGetPcieReplayCounter": "pcie_replay",
    "nvmlDeviceGetPcieThroughput": "pcie_throughput",
    "nvmlDeviceGetNvLinkState": "nvlink",
    "nvmlDeviceGetNvLinkVersion": "nvlink",
    "nvmlDeviceGetNvLinkRemotePciInfo_v2": "nvlink",
    "nvmlDeviceGetNvLinkRemoteDeviceType": "nvlink",
    "nvmlDeviceGetNvLinkErrorCounter": "nvlink_errors",
    "nvmlDeviceGetNumaNodeId": "numa_node",
    "nvmlDeviceGetMemoryAffinity": "memory_affinity",
    "nvmlDeviceGetCpuAffinity": "cpu_affinity",
    "nvmlDeviceGetCpuAffinityWithinScope": "cpu_affinity",
    "nvmlDeviceGetMigMode": "mig",
    "nvmlDeviceGetMaxMigDeviceCount": "mig",
    "nvmlDeviceGetMigDeviceHandleByIndex": "mig",
    "nvmlDeviceGetComputeRunningProcesses_v2": "processes",
    "nvmlDeviceGetComputeRunningProcesses_v3": "processes",
    "nvmlDeviceGetGraphicsRunningProcesses_v3": "processes",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3": "processes",
    "nvmlDeviceGetSupportedEventTypes": "events",
    "nvmlDeviceRegisterEvents": "events",
}


# --------------------------------------------------------------------------------------------------
# The fake library
# --------------------------------------------------------------------------------------------------


class FakeNvml:
    """The object installed as ``pynvml.nvmlLib``: NVML's C functions as attributes.

    Args:
        scenario: a `Scenario`, its JSON-like dict, a built-in name or a JSON path; deep-copied,
            so one Scenario object can seed many fakes. ``None``: one default H100.
        timer: a clock (seconds) driving the fake's time; ``None`` (the default) keeps time still
            until `advance` moves it, which is what deterministic tests want.

    Attributes:
        scenario: the fake's own copy; ``scenario.gpus[i]`` may be edited while it runs (raise an
            ECC counter, drop a link) and the next call reports it.
        calls: NVML function name -> number of calls made (lookups of missing functions are not
            calls; see ``lookups``).
        lookups: NVML function name -> ``getattr`` lookups by pynvml, including missing ones.
    """

    def __init__(
        self,
        scenario: Scenario | Mapping[str, Any] | str | Path | None = None,
        *,
        timer: Callable[[], float] | None = None,
    ) -> None:
        if scenario is None:
            scenario = Scenario(gpus=[GpuSpec()])
        elif isinstance(scenario, (str, Path)):
            scenario = load_scenario(scenario)
        elif not isinstance(scenario, Scenario):
            scenario = Scenario.from_dict(scenario)
        self.scenario: Scenario = copy.deepcopy(scenario)
        self.calls: Counter[str] = Counter()
        self.lookups: Counter[str] = Counter()
        self._cond = threading.Condition(threading.RLock())
        self._timer = timer
        self._t0 = timer() if timer is not None else 0.0
        self._offset = 0.0
        self._init_count = 0
        self._closed = False
        self._device_calls = 0
        self._gpus = [_Gpu(i, g, self.scenario.seed) for i, g in enumerate(self.scenario.gpus)]
        self._by_address: dict[int, _Gpu | _Mig] = {}
        for gpu in self._gpus:
            self._by_address[gpu.address] = gpu
            for mig in gpu.migs:
                self._by_address[mig.address] = mig
        self._event_sets: dict[int, _EventSet] = {}
        self._scripted = sorted(enumerate(self.scenario.events), key=lambda e: e[1].after_s)
        self._scripted_lost_done: set[int] = set()
        self._faults = [dataclasses.replace(f) for f in self.scenario.faults]
        self._hangs: list[tuple[str, int | None, float, threading.Event]] = []
        self._functions: dict[str, _NvmlFunction] = {}

    # ---------------------------------------------------------------- public API for tests

    @property
    def gpus(self) -> list[GpuSpec]:
        """The live GPU specs (same objects as ``scenario.gpus``)."""
        return self.scenario.gpus

    @property
    def init_count(self) -> int:
        """nvmlInit calls not yet matched by nvmlShutdown (0: not initialized)."""
        return self._init_count

    @classmethod
    def implemented_functions(cls) -> list[str]:
        """Every NVML function name this fake implements (before ``missing_functions``)."""
        return sorted(
            name.removeprefix(_IMPL_PREFIX)
            for name in dir(cls)
            if name.startswith(_IMPL_PREFIX + "nvml")
        )

    def now(self) -> float:
        """The fake's time in seconds since it was created (plus every `advance`)."""
        base = self._timer() - self._t0 if self._timer is not None else 0.0
        return max(0.0, base + self._offset)

    def advance(self, seconds: float) -> None:
        """Move the fake's clock forward: counters integrate, jitter moves on, scripted events
        whose time has come are delivered to waiting event sets."""
        if seconds < 0:
            raise ValueError("the fake's clock only moves forward")
        with self._cond:
            self._offset += seconds
            self._cond.notify_all()

    def reset_calls(self) -> None:
        """Forget ``calls`` and ``lookups``."""
        with self._cond:
            self.calls.clear()
            self.lookups.clear()

    def inject_event(
        self,
        gpu_index: int,
        event_type: str | int,
        data: int = 0,
        *,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> int:
        """Fire an event now on GPU ``gpu_index``; returns how many event sets it reached (those
        registered for that GPU and type)."""
        mask = _event_mask(event_type)
        with self._cond:
            gpu = self._gpus[gpu_index]
            event = _Event(
                gpu,
                mask,
                data,
                _UINT_MAX if gpu_instance_id is None else gpu_instance_id,
                _UINT_MAX if compute_instance_id is None else compute_instance_id,
            )
            reached = 0
            for event_set in self._event_sets.values():
                if event_set.registered.get(gpu_index, 0) & mask:
                    event_set.queue.append(event)
                    reached += 1
            self._cond.notify_all()
            return reached

    def inject_xid(self, gpu_index: int, code: int, **kwargs: int | None) -> int:
        """`inject_event` of an Xid critical error with ``code`` as its event data."""
        return self.inject_event(gpu_index, _EVENT_XID, code, **kwargs)

    def lose_gpu(self, gpu_index: int) -> None:
        """GPU ``gpu_index`` falls off the bus: every call on it returns NVML_ERROR_GPU_IS_LOST."""
        with self._cond:
            self._gpus[gpu_index].forced_lost = True

    def recover_gpu(self, gpu_index: int) -> None:
        """Undo `lose_gpu` (and any ``lost_after_calls``) for GPU ``gpu_index``."""
        with self._cond:
            self._gpus[gpu_index].forced_lost = False

    def fail(
        self, function: str, error: str | int, *, gpu: int | None = None, times: int | None = None
    ) -> None:
        """Make ``function`` return ``error`` ("UNKNOWN", "TIMEOUT", 999, ...), for one GPU or all,
        ``times`` times or until `clear_faults`."""
        _return_code(error)
        with self._cond:
            self._faults.append(FaultSpec(function, error, gpu, times))

    def clear_faults(self) -> None:
        """Remove every fault added by `fail` or the scenario's ``faults``."""
        with self._cond:
            self._faults.clear()

    def hang(
        self, function: str, *, gpu: int | None = None, seconds: float = 30.0
    ) -> threading.Event:
        """Make ``function`` block (for one GPU or all) as a wedged driver call would: up to
        ``seconds``, or until the returned event is set. A blocking C call cannot be
        interrupted, so callers must be designed around it."""
        release = threading.Event()
        with self._cond:
            self._hangs.append((function, gpu, seconds, release))
        return release

    def handle_address(self, gpu_index: int, mig_index: int | None = None) -> int:
        """The address behind the handle of a GPU (or one of its MIG devices), to compare with
        ``ctypes.cast(handle, c_void_p).value``."""
        gpu = self._gpus[gpu_index]
        if mig_index is None:
            return gpu.address
        return next(m.address for m in gpu.migs if m.index == mig_index)

    def close(self) -> None:
        """Wake every thread blocked in nvmlEventSetWait (it returns NVML_ERROR_UNINITIALIZED)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ---------------------------------------------------------------- what pynvml sees

    def __getattr__(self, name: str) -> _NvmlFunction:
        if not name.startswith("nvml"):
            raise AttributeError(name)
        # __getattr__ runs only for names not found normally; the lock exists by then.
        with self._cond:
            self.lookups[name] += 1
            if name in self.scenario.missing_functions:
                raise AttributeError(f"fake NVML ({self.scenario.name}): {name} is missing")
            function = self._functions.get(name)
            if function is None:
                impl = getattr(self, _IMPL_PREFIX + name, None)
                if impl is None:
                    raise AttributeError(f"fake NVML does not implement {name}")
                function = self._functions[name] = _NvmlFunction(self, name, impl)
            return function

    def _dispatch(self, name: str, impl: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        delay = self.scenario.call_delay_s.get(name)
        if delay:
            time.sleep(delay)
        for function, gpu_index, seconds, release in list(self._hangs):
            if function != name:
                continue
            if gpu_index is not None:
                target = self._by_address.get(_address(args[0])) if args else None
                gpu = target.parent if isinstance(target, _Mig) else target
                if gpu is None or gpu.index != gpu_index:
                    continue
            release.wait(seconds)  # outside the lock: other threads' calls go on
        with self._cond:
            self.calls[name] += 1
            try:
                if name not in _NO_INIT_NEEDED and (self._init_count == 0 or self._closed):
                    return _UNINITIALIZED
                self._apply_scripted_loss()
                self._apply_faults(name, args)
                return impl(*args)
            except _NvmlFail as e:
                return e.code

    # ---------------------------------------------------------------- internals

    def _apply_faults(self, name: str, args: tuple[Any, ...]) -> None:
        for fault in list(self._faults):
            if fault.function != name:
                continue
            if fault.gpu is not None:
                target = self._by_address.get(_address(args[0])) if args else None
                gpu = target.parent if isinstance(target, _Mig) else target
                if gpu is None or gpu.index != fault.gpu:
                    continue
            if fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
            raise _NvmlFail(_return_code(fault.error))

    def _apply_scripted_loss(self) -> None:
        now = self.now()
        for k, event in self._scripted:
            if event.after_s > now:
                break
            if event.lost and k not in self._scripted_lost_done:
                self._scripted_lost_done.add(k)
                self._gpus[event.gpu].forced_lost = True

    def _touch(self, gpu: _Gpu) -> None:
        """Account one call on ``gpu``; fail it if the GPU is lost or an error is injected."""
        gpu.calls += 1
        self._device_calls += 1
        if gpu.lost():
            raise _NvmlFail(_GPU_IS_LOST)
        every = self.scenario.unknown_error_every
        if every and self._device_calls % every == 0:
            raise _NvmlFail(_UNKNOWN)

    def _resolve(self, handle: Any, function: str) -> _Gpu | _Mig:
        target = self._by_address.get(_address(handle))
        if target is None:
            raise _NvmlFail(_INVALID_ARGUMENT)
        gpu = target.parent if isinstance(target, _Mig) else target
        self._touch(gpu)
        if isinstance(target, _Mig) and function not in _MIG_FUNCTIONS:
            raise _NvmlFail(_NOT_SUPPORTED)
        self._check_supported(gpu, function)
        return target

    def _device(self, handle: Any, function: str) -> _Gpu:
        """The physical GPU behind ``handle``; a MIG handle is NOT_SUPPORTED."""
        target = self._resolve(handle, function)
        if isinstance(target, _Mig):
            raise _NvmlFail(_NOT_SUPPORTED)
        return target

    @staticmethod
    def _check_supported(gpu: _Gpu, function: str, quantity: str | None = None) -> None:
        not_supported = gpu.spec.not_supported
        if not not_supported:
            return
        if function in not_supported:
            raise _NvmlFail(_NOT_SUPPORTED)
        quantity = quantity or _FUNCTION_QUANTITY.get(function)
        if quantity is not None and quantity in not_supported:
            raise _NvmlFail(_NOT_SUPPORTED)

    def _dyn(self, gpu: _Gpu, key: str, t: float | None = None) -> int:
        """Quantity ``key`` of ``gpu`` at fake time ``t``: its spec value plus seeded jitter."""
        base = getattr(gpu.spec, key)
        if base is None:
            raise _NvmlFail(_NOT_SUPPORTED)
        amplitude = gpu.spec.jitter.get(key, 0.0)
        if not amplitude:
            return int(base)
        t = self.now() if t is None else t
        bucket = math.floor(t / self.scenario.sample_period_s)
        value = round(int(base) + amplitude * _unit(self.scenario.seed, gpu.index, key, bucket))
        if key.startswith("utilization") or key.endswith("_utilization"):
            value = min(value, 100)
        return max(0, value)

    def _energy_mj(self, gpu: _Gpu) -> int:
        """Energy counter: the integral of the (jittered) power over the fake's time."""
        period = self.scenario.sample_period_s
        t = self.now()
        current = math.floor(t / period)
        while gpu.energy_bucket < current:
            power = self._dyn(gpu, "power_usage_mw", gpu.energy_bucket * period)
            gpu.energy_acc += power * period
            gpu.energy_bucket += 1
        partial = self._dyn(gpu, "power_usage_mw", t) * (t - gpu.energy_bucket * period)
        value = gpu.spec.energy_mj + int(gpu.energy_acc + partial)
        gpu.energy_last = max(gpu.energy_last, value)
        return gpu.energy_last

    def _pci_fields(self, bus_id: str, device_id: int, subsystem_id: int) -> dict[str, Any]:
        parsed = _parse_bus_id(bus_id)
        if parsed is None:
            raise _NvmlFail(_UNKNOWN)
        domain, bus, device, function = parsed
        return {
            "busIdLegacy": f"{domain:04X}:{bus:02X}:{device:02X}.{function}".encode(),
            "domain": domain,
            "bus": bus,
            "device": device,
            "pciDeviceId": device_id,
            "pciSubSystemId": subsystem_id,
            "busId": bus_id.encode(),
        }

    def _fill_pci(self, out: Any, bus_id: str, device_id: int, subsystem_id: int) -> None:
        info = _deref(out)
        for key, value in self._pci_fields(bus_id, device_id, subsystem_id).items():
            if hasattr(info, key):
                setattr(info, key, value)

    def _link(self, gpu: _Gpu, link: Any) -> str:
        """The remote of ``link``; NOT_SUPPORTED without NVLink, INVALID_ARGUMENT out of range."""
        links = gpu.spec.nvlink_remote
        if not links:
            raise _NvmlFail(_NOT_SUPPORTED)
        index = _as_int(link)
        if not 0 <= index < len(links):
            raise _NvmlFail(_INVALID_ARGUMENT)
        return links[index]

    def _link_active(self, gpu: _Gpu, link: int) -> bool:
        return gpu.spec.nvlink_remote[link] != "none" and link not in gpu.spec.nvlink_down

    def _nvlink_error(self, gpu: _Gpu, link: int, kind: str) -> int:
        per_link = gpu.spec.nvlink_link_errors.get(link, {})
        return per_link.get(kind, gpu.spec.nvlink_errors.get(kind, 0))

    def _nvlink_kib(self, gpu: _Gpu, link: int, direction: str, raw: bool) -> int:
        if not self._link_active(gpu, link):
            return 0
        rate = gpu.spec.nvlink_tx_kib_per_s if direction == "tx" else gpu.spec.nvlink_rx_kib_per_s
        data = int(rate * self.now())
        return data * 17 // 16 if raw else data

    def _processes(self, target: _Gpu | _Mig) -> list[ProcessSpec]:
        if isinstance(target, _Mig):
            return [
                p
                for p in target.parent.spec.processes
                if p.gpu_instance_id == target.spec.gpu_instance_id
                and p.compute_instance_id in (None, target.spec.compute_instance_id)
            ]
        return list(target.spec.processes)

    def _fill_processes(self, target: _Gpu | _Mig, count: Any, infos: Any) -> None:
        procs = self._processes(target)
        c_count = _deref(count)
        capacity = c_count.value
        c_count.value = len(procs)
        if not procs:
            return
        if infos is None or capacity < len(procs):
            raise _NvmlFail(_INSUFFICIENT_SIZE)
        array = _deref(infos)
        mig_enabled = isinstance(target, _Mig) or target.spec.mig_mode == 1
        for i, proc in enumerate(procs):
            entry = array[i]
            entry.pid = proc.pid
            entry.usedGpuMemory = proc.used_memory_mib * _MIB
            gi, ci = proc.gpu_instance_id, proc.compute_instance_id
            entry.gpuInstanceId = gi if mig_enabled and gi is not None else _UINT_MAX
            entry.computeInstanceId = ci if mig_enabled and ci is not None else _UINT_MAX

    def _pages(self, gpu: _Gpu, cause: Any, count: Any, pages: Any, times: Any) -> None:
        kind = _as_int(cause)
        if kind == 0:
            addresses = gpu.spec.retired_pages_sbe
        elif kind == 1:
            addresses = gpu.spec.retired_pages_dbe
        else:
            raise _NvmlFail(_INVALID_ARGUMENT)
        c_count = _deref(count)
        capacity = c_count.value
        c_count.value = len(addresses)
        if not addresses:
            return
        if pages is None or capacity < len(addresses):
            raise _NvmlFail(_INSUFFICIENT_SIZE)
        page_array = _deref(pages)
        time_array = _deref(times) if times is not None else None
        for i, address in enumerate(addresses):
            page_array[i] = address
            if time_array is not None:
                time_array[i] = int(self.scenario.epoch_s) - 86400 * (len(addresses) - i)

    def _mask(self, out: Any, size: Any, bits: Sequence[int]) -> None:
        words = _as_int(size)
        array = _deref(out)
        if words <= 0:
            raise _NvmlFail(_INVALID_ARGUMENT)
        for i in range(words):
            array[i] = 0
        for bit in bits:
            word = bit // _BITS_PER_WORD
            if word < words:
                array[word] |= 1 << (bit % _BITS_PER_WORD)

    def _field_value(self, target: _Gpu | _Mig, fid: int, scope: int) -> tuple[int, int | float]:
        """(valueType, value) of one field; raises _NvmlFail for its per-field nvmlReturn."""
        if fid > self.scenario.max_field_id or fid >= _FI_MAX:
            raise _NvmlFail(_INVALID_ARGUMENT)
        if isinstance(target, _Mig):
            raise _NvmlFail(_NOT_SUPPORTED)
        gpu = target
        spec = gpu.spec
        quantity = _FIELD_QUANTITY.get(fid)
        if quantity is None:
            raise _NvmlFail(_NOT_SUPPORTED)
        if _FIELD_NAMES.get(fid) in spec.not_supported:
            raise _NvmlFail(_NOT_SUPPORTED)
        self._check_supported(gpu, "", quantity)

        if fid in (_FI_ECC_CURRENT, _FI_ECC_PENDING):
            on = spec.ecc_mode_current if fid == _FI_ECC_CURRENT else spec.ecc_mode_pending
            return _VT_UINT, int(on)
        if quantity == "ecc_errors":
            if not spec.ecc_mode_current:
                raise _NvmlFail(_NOT_SUPPORTED)
            totals = {
                _FI_ECC_SBE_VOL_TOTAL: spec.ecc_volatile_corrected,
                _FI_ECC_DBE_VOL_TOTAL: spec.ecc_volatile_uncorrected,
                _FI_ECC_SBE_AGG_TOTAL: spec.ecc_aggregate_corrected,
                _FI_ECC_DBE_AGG_TOTAL: spec.ecc_aggregate_uncorrected,
                _FI_ECC_SBE_VOL_DEV: spec.ecc_volatile_corrected,
                _FI_ECC_DBE_VOL_DEV: spec.ecc_volatile_uncorrected,
                _FI_ECC_SBE_AGG_DEV: spec.ecc_aggregate_corrected,
                _FI_ECC_DBE_AGG_DEV: spec.ecc_aggregate_uncorrected,
            }
            return _VT_ULL, totals.get(fid, 0)  # L1/L2/register/texture: none
        if quantity == "retired_pages":
            retired = {
                _FI_RETIRED_SBE: len(spec.retired_pages_sbe),
                _FI_RETIRED_DBE: len(spec.retired_pages_dbe),
                _FI_RETIRED_PENDING: int(spec.retired_pages_pending),
                _FI_RETIRED_PENDING_SBE: 0,
                _FI_RETIRED_PENDING_DBE: int(spec.retired_pages_pending),
            }
            return _VT_ULL, retired[fid]
        if fid == _FI_MEMORY_TEMP:
            return _VT_UINT, self._dyn(gpu, "temperature_memory")
        if fid in _FI_THROTTLE_NS:
            # Time throttled grows with the clock while a matching reason is active.
            active = spec.clock_event_reasons & _FI_THROTTLE_NS[fid]
            return _VT_ULL, int(self.now() * 1e9) if active else 0
        if fid in (_FI_TOTAL_ENERGY_CONSUMPTION, _FI_ENERGY):
            return _VT_ULL, self._energy_mj(gpu)
        if fid == _FI_PCIE_REPLAY_COUNTER:
            return _VT_UINT, spec.pcie_replay_counter
        if fid == _FI_PCIE_REPLAY_ROLLOVER_COUNTER:
            return _VT_UINT, 0
        if fid in (_FI_PCIE_COUNT_TX_BYTES, _FI_PCIE_COUNT_RX_BYTES):
            t = self.now()
            if fid == _FI_PCIE_COUNT_TX_BYTES:
                return _VT_ULL, spec.pcie_tx_bytes + int(spec.pcie_tx_bytes_per_s * t)
            return _VT_ULL, spec.pcie_rx_bytes + int(spec.pcie_rx_bytes_per_s * t)
        if fid in (_FI_POWER_AVERAGE, _FI_POWER_INSTANT):
            if scope != 0:  # NVML_POWER_SCOPE_GPU only; module/memory power not modelled
                raise _NvmlFail(_NOT_SUPPORTED)
            return _VT_UINT, self._dyn(gpu, "power_usage_mw")
        if quantity == "power_limit":
            limits = {
                _FI_POWER_MIN_LIMIT: spec.power_min_limit_mw,
                _FI_POWER_MAX_LIMIT: spec.power_max_limit_mw,
                _FI_POWER_DEFAULT_LIMIT: spec.default_power_limit_mw or spec.power_limit_mw,
                _FI_POWER_CURRENT_LIMIT: spec.enforced_power_limit_mw or spec.power_limit_mw,
                _FI_POWER_REQUESTED_LIMIT: spec.power_limit_mw,
            }
            return _VT_UINT, limits[fid]
        if quantity == "remapped_rows":
            remapped = {
                _FI_REMAPPED_COR: spec.remapped_rows_corrected,
                _FI_REMAPPED_UNC: spec.remapped_rows_uncorrected,
                _FI_REMAPPED_PENDING: int(spec.remapped_rows_pending),
                _FI_REMAPPED_FAILURE: int(spec.remapped_rows_failure),
            }
            return _VT_UINT, remapped[fid]
        return self._nvlink_field(gpu, fid, scope)

    def _nvlink_field(self, gpu: _Gpu, fid: int, scope: int) -> tuple[int, int | float]:
        spec = gpu.spec
        links = spec.nvlink_remote
        if not links:
            raise _NvmlFail(_NOT_SUPPORTED)

        def scoped_link() -> int:
            if not 0 <= scope < len(links):
                raise _NvmlFail(_INVALID_ARGUMENT)
            return scope

        if fid == _FI_NVLINK_LINK_COUNT:
            return _VT_UINT, len(links)
        if fid == _FI_NVSWITCH_CONNECTED_LINK_COUNT:
            return _VT_UINT, sum(1 for t in links if t.startswith("switch:"))
        if fid == _FI_NVLINK_SPEED_MBPS_COMMON:
            return _VT_UINT, spec.nvlink_speed_mbps
        if fid in _NVLINK_SPEED_FIELDS:
            link = _NVLINK_SPEED_FIELDS.index(fid)
            if link >= len(links):
                raise _NvmlFail(_NOT_SUPPORTED)
            return _VT_UINT, spec.nvlink_speed_mbps if self._link_active(gpu, link) else 0
        if fid == _FI_NVLINK_GET_SPEED:
            link = scoped_link()
            return _VT_UINT, spec.nvlink_speed_mbps if self._link_active(gpu, link) else 0
        if fid == _FI_NVLINK_GET_STATE:
            return _VT_UINT, int(self._link_active(gpu, scoped_link()))
        if fid == _FI_NVLINK_GET_VERSION:
            scoped_link()
            return _VT_UINT, spec.nvlink_version
        if _FI_NVLINK_THROUGHPUT_DATA_TX <= fid <= _FI_NVLINK_THROUGHPUT_RAW_RX:
            direction = "tx" if fid in (138, 140) else "rx"
            raw = fid >= _FI_NVLINK_THROUGHPUT_RAW_TX
            if scope == _UINT_MAX:
                return _VT_ULL, sum(
                    self._nvlink_kib(gpu, link, direction, raw) for link in range(len(links))
                )
            return _VT_ULL, self._nvlink_kib(gpu, scoped_link(), direction, raw)
        dl = {
            _FI_NVLINK_ERROR_DL_REPLAY: ("replay",),
            _FI_NVLINK_ERROR_DL_RECOVERY: ("recovery",),
            _FI_NVLINK_ERROR_DL_CRC: ("crc_flit", "crc_data"),
        }
        if fid in dl:
            link = scoped_link()
            return _VT_ULL, sum(self._nvlink_error(gpu, link, kind) for kind in dl[fid])
        for kind, (ids, total) in _NVLINK_ERROR_FIELDS.items():
            if fid == total:
                return _VT_ULL, sum(
                    self._nvlink_error(gpu, link, kind) for link in range(len(links))
                )
            if fid in ids:
                link = ids.index(fid)
                if link >= len(links):
                    raise _NvmlFail(_NOT_SUPPORTED)
                return _VT_ULL, self._nvlink_error(gpu, link, kind)
        raise _NvmlFail(_NOT_SUPPORTED)

    def _pending_event(self, event_set: _EventSet) -> _Event | None:
        now = self.now()
        for k, spec in self._scripted:
            if spec.after_s > now:
                break
            if k in event_set.scripted_done:
                continue
            mask = _event_mask(spec.type)
            if event_set.registered.get(spec.gpu, 0) & mask:
                event_set.scripted_done.add(k)
                event_set.queue.append(
                    _Event(
                        self._gpus[spec.gpu],
                        mask,
                        spec.code,
                        _UINT_MAX if spec.gpu_instance_id is None else spec.gpu_instance_id,
                        _UINT_MAX if spec.compute_instance_id is None else spec.compute_instance_id,
                    )
                )
        return event_set.queue.popleft() if event_set.queue else None

    def _next_scripted_in(self, event_set: _EventSet) -> float | None:
        now = self.now()
        for k, spec in self._scripted:
            if k not in event_set.scripted_done and spec.after_s > now:
                return spec.after_s - now
        return None

    # ================================================================ NVML C functions
    # Each _c_<name> takes the C arguments as pynvml passes them and returns an nvmlReturn_t.

    # ---- init, system

    def _init(self) -> int:
        if self.scenario.init_error is not None:
            return _return_code(self.scenario.init_error)
        self._init_count += 1
        self._closed = False
        return _SUCCESS

    def _c_nvmlInit(self) -> int:
        return self._init()

    def _c_nvmlInit_v2(self) -> int:
        return self._init()

    def _c_nvmlInitWithFlags(self, flags: Any) -> int:
        _as_int(flags)
        return self._init()

    def _c_nvmlShutdown(self) -> int:
        if self._init_count == 0:
            return _UNINITIALIZED
        self._init_count -= 1
        self._cond.notify_all()
        return _SUCCESS

    def _c_nvmlErrorString(self, result: Any) -> bytes:
        code = _as_int(result)
        names = {v: k for k, v in _RETURN_CODES.items()}
        return names.get(code, "Unknown Error").replace("_", " ").title().encode()

    def _c_nvmlSystemGetDriverVersion(self, buf: Any, length: Any) -> int:
        _store_str(buf, length, self.scenario.driver_version)
        return _SUCCESS

    def _c_nvmlSystemGetNVMLVersion(self, buf: Any, length: Any) -> int:
        _store_str(buf, length, self.scenario.nvml_version)
        return _SUCCESS

    def _c_nvmlSystemGetCudaDriverVersion(self, out: Any) -> int:
        _store(out, self.scenario.cuda_driver_version)
        return _SUCCESS

    def _c_nvmlSystemGetCudaDriverVersion_v2(self, out: Any) -> int:
        _store(out, self.scenario.cuda_driver_version)
        return _SUCCESS

    def _c_nvmlSystemGetProcessName(self, pid: Any, buf: Any, length: Any) -> int:
        wanted = _as_int(pid)
        for gpu in self._gpus:
            for proc in gpu.spec.processes:
                if proc.pid == wanted and proc.name:
                    _store_str(buf, length, proc.name)
                    return _SUCCESS
        return _NOT_FOUND

    # ---- enumeration and handles

    def _c_nvmlDeviceGetCount_v2(self, out: Any) -> int:
        _store(out, len(self._gpus))
        return _SUCCESS

    def _c_nvmlDeviceGetCount(self, out: Any) -> int:
        return self._c_nvmlDeviceGetCount_v2(out)

    def _c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> int:
        i = _as_int(index)
        if not 0 <= i < len(self._gpus):
            return _INVALID_ARGUMENT
        self._touch(self._gpus[i])
        _store_pointer(out, self._gpus[i].address)
        return _SUCCESS

    def _c_nvmlDeviceGetHandleByIndex(self, index: Any, out: Any) -> int:
        return self._c_nvmlDeviceGetHandleByIndex_v2(index, out)

    def _c_nvmlDeviceGetHandleByUUID(self, uuid: Any, out: Any) -> int:
        wanted = _deref(uuid).value if not isinstance(uuid, bytes) else uuid
        if not wanted:
            return _INVALID_ARGUMENT
        text = wanted.decode(errors="replace")
        for gpu in self._gpus:
            if gpu.spec.uuid == text:
                self._touch(gpu)
                _store_pointer(out, gpu.address)
                return _SUCCESS
            for mig in gpu.migs:
                if mig.spec.uuid == text and gpu.spec.mig_mode == 1:
                    self._touch(gpu)
                    _store_pointer(out, mig.address)
                    return _SUCCESS
        return _NOT_FOUND

    def _c_nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: Any, out: Any) -> int:
        wanted = _deref(bus_id).value if not isinstance(bus_id, bytes) else bus_id
        parsed = _parse_bus_id(wanted.decode(errors="replace")) if wanted else None
        if parsed is None:
            return _INVALID_ARGUMENT
        for gpu in self._gpus:
            if _parse_bus_id(gpu.spec.pci_bus_id) == parsed:
                self._touch(gpu)
                _store_pointer(out, gpu.address)
                return _SUCCESS
        return _NOT_FOUND

    def _c_nvmlDeviceGetHandleByPciBusId(self, bus_id: Any, out: Any) -> int:
        return self._c_nvmlDeviceGetHandleByPciBusId_v2(bus_id, out)

    def _c_nvmlDeviceGetIndex(self, handle: Any, out: Any) -> int:
        _store(out, self._device(handle, "nvmlDeviceGetIndex").index)
        return _SUCCESS

    # ---- identity

    def _c_nvmlDeviceGetName(self, handle: Any, buf: Any, length: Any) -> int:
        target = self._resolve(handle, "nvmlDeviceGetName")
        if isinstance(target, _Mig):
            name = f"{target.parent.spec.name} MIG {target.spec.profile}"
        else:
            name = target.spec.name
        _store_str(buf, length, name)
        return _SUCCESS

    def _c_nvmlDeviceGetUUID(self, handle: Any, buf: Any, length: Any) -> int:
        target = self._resolve(handle, "nvmlDeviceGetUUID")
        _store_str(buf, length, target.spec.uuid)
        return _SUCCESS

    def _c_nvmlDeviceGetSerial(self, handle: Any, buf: Any, length: Any) -> int:
        _store_str(buf, length, self._device(handle, "nvmlDeviceGetSerial").spec.serial)
        return _SUCCESS

    def _c_nvmlDeviceGetVbiosVersion(self, handle: Any, buf: Any, length: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetVbiosVersion")
        _store_str(buf, length, gpu.spec.vbios_version)
        return _SUCCESS

    def _c_nvmlDeviceGetBoardPartNumber(self, handle: Any, buf: Any, length: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetBoardPartNumber")
        _store_str(buf, length, gpu.spec.board_part_number)
        return _SUCCESS

    def _c_nvmlDeviceGetPciInfo_v3(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetPciInfo_v3")
        self._fill_pci(out, gpu.spec.pci_bus_id, gpu.spec.pci_device_id, gpu.spec.pci_subsystem_id)
        return _SUCCESS

    def _c_nvmlDeviceGetPciInfoExt(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetPciInfoExt")
        info = _deref(out)
        if info.version != _struct_version(1, ctypes.sizeof(info)):
            return _ARGUMENT_VERSION_MISMATCH
        self._fill_pci(out, gpu.spec.pci_bus_id, gpu.spec.pci_device_id, gpu.spec.pci_subsystem_id)
        info.baseClass, info.subClass = 0x3, 0x2  # 3D controller
        return _SUCCESS

    def _c_nvmlDeviceGetMinorNumber(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetMinorNumber")
        minor = gpu.spec.minor_number
        _store(out, gpu.index if minor is None else minor)
        return _SUCCESS

    def _c_nvmlDeviceGetArchitecture(self, handle: Any, out: Any) -> int:
        _store(out, self._device(handle, "nvmlDeviceGetArchitecture").spec.architecture)
        return _SUCCESS

    def _c_nvmlDeviceGetBrand(self, handle: Any, out: Any) -> int:
        _store(out, self._device(handle, "nvmlDeviceGetBrand").spec.brand)
        return _SUCCESS

    def _c_nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetCudaComputeCapability")
        _store(major, gpu.spec.compute_capability[0])
        _store(minor, gpu.spec.compute_capability[1])
        return _SUCCESS

    def _c_nvmlDeviceGetAttributes_v2(self, handle: Any, out: Any) -> int:
        target = self._resolve(handle, "nvmlDeviceGetAttributes_v2")
        attrs = _deref(out)
        if isinstance(target, _Mig):
            slices = target.spec.slices
            attrs.multiprocessorCount = target.spec.multiprocessor_count or 14 * slices
            attrs.gpuInstanceSliceCount = slices
            attrs.computeInstanceSliceCount = slices
            attrs.memorySizeMB = target.spec.memory_total_mib
            attrs.sharedCopyEngineCount = slices
            attrs.sharedDecoderCount = slices // 2
        else:
            attrs.multiprocessorCount = target.spec.multiprocessor_count
            attrs.gpuInstanceSliceCount = 7 if target.spec.mig_mode is not None else 1
            attrs.computeInstanceSliceCount = attrs.gpuInstanceSliceCount
            attrs.memorySizeMB = target.spec.memory_total_mib
            attrs.sharedCopyEngineCount = 7
            attrs.sharedDecoderCount = 5
        return _SUCCESS

    def _c_nvmlDeviceGetPersistenceMode(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetPersistenceMode")
        _store(out, int(gpu.spec.persistence_mode))
        return _SUCCESS

    def _c_nvmlDeviceGetPerformanceState(self, handle: Any, out: Any) -> int:
        _store(out, self._device(handle, "nvmlDeviceGetPerformanceState").spec.performance_state)
        return _SUCCESS

    def _c_nvmlDeviceGetFanSpeed(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetFanSpeed")
        _store(out, self._dyn(gpu, "fan_speed"))
        return _SUCCESS

    # ---- memory

    def _c_nvmlDeviceGetMemoryInfo(self, handle: Any, out: Any) -> int:
        target = self._resolve(handle, "nvmlDeviceGetMemoryInfo")
        total, reserved, used = self._memory(target)
        memory = _deref(out)
        memory.total = total
        memory.used = used + reserved  # v1 counts the driver's reservation as used
        memory.free = total - used - reserved
        return _SUCCESS

    def _c_nvmlDeviceGetMemoryInfo_v2(self, handle: Any, out: Any) -> int:
        target = self._resolve(handle, "nvmlDeviceGetMemoryInfo_v2")
        memory = _deref(out)
        if memory.version != _struct_version(2, _MEMORY_V2_SIZE):
            return _ARGUMENT_VERSION_MISMATCH
        total, reserved, used = self._memory(target)
        memory.total = total
        memory.reserved = reserved
        memory.used = used
        memory.free = total - reserved - used
        return _SUCCESS

    @staticmethod
    def _memory(target: _Gpu | _Mig) -> tuple[int, int, int]:
        if isinstance(target, _Mig):
            return target.spec.memory_total_mib * _MIB, 0, target.spec.memory_used_mib * _MIB
        spec = target.spec
        return (
            spec.memory_total_mib * _MIB,
            spec.memory_reserved_mib * _MIB,
            spec.memory_used_mib * _MIB,
        )

    # ---- power and energy

    def _c_nvmlDeviceGetPowerUsage(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetPowerUsage")
        _store(out, self._dyn(gpu, "power_usage_mw"))
        return _SUCCESS

    def _c_nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetTotalEnergyConsumption")
        _store(out, self._energy_mj(gpu))
        return _SUCCESS

    def _c_nvmlDeviceGetPowerManagementLimit(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetPowerManagementLimit")
        _store(out, gpu.spec.power_limit_mw)
        return _SUCCESS

    def _c_nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, out: Any) -> int:
        spec = self._device(handle, "nvmlDeviceGetEnforcedPowerLimit").spec
        _store(out, spec.enforced_power_limit_mw or spec.power_limit_mw)
        return _SUCCESS

    def _c_nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any, out: Any) -> int:
        spec = self._device(handle, "nvmlDeviceGetPowerManagementDefaultLimit").spec
        _store(out, spec.default_power_limit_mw or spec.power_limit_mw)
        return _SUCCESS

    def _c_nvmlDeviceGetPowerManagementLimitConstraints(
        self, handle: Any, min_out: Any, max_out: Any
    ) -> int:
        spec = self._device(handle, "nvmlDeviceGetPowerManagementLimitConstraints").spec
        _store(min_out, spec.power_min_limit_mw)
        _store(max_out, spec.power_max_limit_mw)
        return _SUCCESS

    # ---- thermal

    def _c_nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetTemperature")
        if _as_int(sensor) != 0:  # NVML_TEMPERATURE_GPU is the only sensor
            return _INVALID_ARGUMENT
        _store(out, self._dyn(gpu, "temperature_gpu"))
        return _SUCCESS

    def _c_nvmlDeviceGetTemperatureV(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetTemperatureV")
        temperature = _deref(out)
        if temperature.version != _struct_version(1, _TEMPERATURE_V1_SIZE):
            return _ARGUMENT_VERSION_MISMATCH
        if temperature.sensorType != 0:
            return _INVALID_ARGUMENT
        temperature.temperature = self._dyn(gpu, "temperature_gpu")
        return _SUCCESS

    def _c_nvmlDeviceGetTemperatureThreshold(self, handle: Any, kind: Any, out: Any) -> int:
        spec = self._device(handle, "nvmlDeviceGetTemperatureThreshold").spec
        thresholds = {
            0: spec.temperature_shutdown,
            1: spec.temperature_slowdown,
            2: spec.temperature_memory_max,
            3: spec.temperature_gpu_max,
        }
        value = thresholds.get(_as_int(kind))
        if value is None:
            return _NOT_SUPPORTED
        _store(out, value)
        return _SUCCESS

    # ---- utilization and clocks

    def _c_nvmlDeviceGetUtilizationRates(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetUtilizationRates")
        utilization = _deref(out)
        utilization.gpu = self._dyn(gpu, "utilization_gpu")
        utilization.memory = self._dyn(gpu, "utilization_memory")
        return _SUCCESS

    def _c_nvmlDeviceGetEncoderUtilization(self, handle: Any, out: Any, period: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetEncoderUtilization")
        _store(out, self._dyn(gpu, "encoder_utilization"))
        _store(period, 167000)  # µs, as the driver reports
        return _SUCCESS

    def _c_nvmlDeviceGetDecoderUtilization(self, handle: Any, out: Any, period: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetDecoderUtilization")
        _store(out, self._dyn(gpu, "decoder_utilization"))
        _store(period, 167000)
        return _SUCCESS

    _CLOCK_KEYS = ("graphics", "sm", "mem", "video")  # nvmlClockType_t order

    def _clock(self, gpu: _Gpu, kind: Any, maximum: bool) -> int:
        index = _as_int(kind)
        if not 0 <= index < len(self._CLOCK_KEYS):
            raise _NvmlFail(_INVALID_ARGUMENT)
        key = f"clock_{self._CLOCK_KEYS[index]}_mhz"
        return int(getattr(gpu.spec, "max_" + key)) if maximum else self._dyn(gpu, key)

    def _c_nvmlDeviceGetClockInfo(self, handle: Any, kind: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetClockInfo")
        _store(out, self._clock(gpu, kind, maximum=False))
        return _SUCCESS

    def _c_nvmlDeviceGetMaxClockInfo(self, handle: Any, kind: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetMaxClockInfo")
        _store(out, self._clock(gpu, kind, maximum=True))
        return _SUCCESS

    def _c_nvmlDeviceGetClock(self, handle: Any, kind: Any, clock_id: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetClock")
        _store(out, self._clock(gpu, kind, maximum=_as_int(clock_id) != 0))
        return _SUCCESS

    def _c_nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        _store(out, gpu.spec.clock_event_reasons)
        return _SUCCESS

    def _c_nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
        _store(out, gpu.spec.clock_event_reasons)
        return _SUCCESS

    # ---- ECC, retired pages, remapped rows

    def _c_nvmlDeviceGetEccMode(self, handle: Any, current: Any, pending: Any) -> int:
        spec = self._device(handle, "nvmlDeviceGetEccMode").spec
        _store(current, int(spec.ecc_mode_current))
        _store(pending, int(spec.ecc_mode_pending))
        return _SUCCESS

    def _ecc_count(self, gpu: _Gpu, error_type: Any, counter_type: Any) -> int:
        spec = gpu.spec
        if not spec.ecc_mode_current:
            raise _NvmlFail(_NOT_SUPPORTED)
        counts = {
            (0, 0): spec.ecc_volatile_corrected,
            (1, 0): spec.ecc_volatile_uncorrected,
            (0, 1): spec.ecc_aggregate_corrected,
            (1, 1): spec.ecc_aggregate_uncorrected,
        }
        key = (_as_int(error_type), _as_int(counter_type))
        if key not in counts:
            raise _NvmlFail(_INVALID_ARGUMENT)
        return counts[key]

    def _c_nvmlDeviceGetTotalEccErrors(
        self, handle: Any, error_type: Any, counter_type: Any, out: Any
    ) -> int:
        gpu = self._device(handle, "nvmlDeviceGetTotalEccErrors")
        _store(out, self._ecc_count(gpu, error_type, counter_type))
        return _SUCCESS

    def _c_nvmlDeviceGetMemoryErrorCounter(
        self, handle: Any, error_type: Any, counter_type: Any, location: Any, out: Any
    ) -> int:
        gpu = self._device(handle, "nvmlDeviceGetMemoryErrorCounter")
        count = self._ecc_count(gpu, error_type, counter_type)
        _store(out, count if _as_int(location) == 2 else 0)  # all in device memory (DRAM)
        return _SUCCESS

    def _c_nvmlDeviceGetRetiredPages(self, handle: Any, cause: Any, count: Any, pages: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetRetiredPages")
        self._pages(gpu, cause, count, pages, None)
        return _SUCCESS

    def _c_nvmlDeviceGetRetiredPages_v2(
        self, handle: Any, cause: Any, count: Any, pages: Any, times: Any = None
    ) -> int:
        # pynvml's size query passes 4 arguments to this 5-argument function; C would read
        # garbage for ``times``, harmless there because ``pages`` is NULL too.
        gpu = self._device(handle, "nvmlDeviceGetRetiredPages_v2")
        self._pages(gpu, cause, count, pages, times)
        return _SUCCESS

    def _c_nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        _store(out, int(gpu.spec.retired_pages_pending))
        return _SUCCESS

    def _c_nvmlDeviceGetRemappedRows(
        self, handle: Any, corrected: Any, uncorrected: Any, pending: Any, failure: Any
    ) -> int:
        spec = self._device(handle, "nvmlDeviceGetRemappedRows").spec
        _store(corrected, spec.remapped_rows_corrected)
        _store(uncorrected, spec.remapped_rows_uncorrected)
        _store(pending, int(spec.remapped_rows_pending))
        _store(failure, int(spec.remapped_rows_failure))
        return _SUCCESS

    # ---- PCIe

    def _c_nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, out: Any) -> int:
        _store(out, self._device(handle, "nvmlDeviceGetCurrPcieLinkGeneration").spec.pcie_link_gen)
        return _SUCCESS

    def _c_nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetCurrPcieLinkWidth")
        _store(out, gpu.spec.pcie_link_width)
        return _SUCCESS

    def _c_nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetMaxPcieLinkGeneration")
        _store(out, gpu.spec.pcie_max_link_gen)
        return _SUCCESS

    def _c_nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetGpuMaxPcieLinkGeneration")
        _store(out, gpu.spec.pcie_max_link_gen)
        return _SUCCESS

    def _c_nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetMaxPcieLinkWidth")
        _store(out, gpu.spec.pcie_max_link_width)
        return _SUCCESS

    def _c_nvmlDeviceGetPcieReplayCounter(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetPcieReplayCounter")
        _store(out, gpu.spec.pcie_replay_counter)
        return _SUCCESS

    def _c_nvmlDeviceGetPcieThroughput(self, handle: Any, counter: Any, out: Any) -> int:
        spec = self._device(handle, "nvmlDeviceGetPcieThroughput").spec
        direction = _as_int(counter)
        if direction not in (0, 1):
            return _INVALID_ARGUMENT
        rate = spec.pcie_tx_bytes_per_s if direction == 0 else spec.pcie_rx_bytes_per_s
        _store(out, rate // 1024)  # KB/s over the driver's 20 ms window
        return _SUCCESS

    # ---- NVLink

    def _c_nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetNvLinkState")
        self._link(gpu, link)
        _store(out, int(self._link_active(gpu, _as_int(link))))
        return _SUCCESS

    def _c_nvmlDeviceGetNvLinkVersion(self, handle: Any, link: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetNvLinkVersion")
        self._link(gpu, link)
        _store(out, gpu.spec.nvlink_version)
        return _SUCCESS

    def _c_nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: Any, link: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetNvLinkRemotePciInfo_v2")
        kind, _, arg = self._link(gpu, link).partition(":")
        if kind == "gpu":
            peer = self._gpus[int(arg)].spec
            self._fill_pci(out, peer.pci_bus_id, peer.pci_device_id, peer.pci_subsystem_id)
        elif kind == "switch":
            bus_id = self.scenario.nvswitches[int(arg)]
            self._fill_pci(out, bus_id, self.scenario.nvswitch_pci_device_id, 0)
        elif kind == "npu":
            self._fill_pci(out, arg, 0x04EA1014, 0)  # IBM NPU
        else:
            return _NOT_SUPPORTED
        return _SUCCESS

    def _c_nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetNvLinkRemoteDeviceType")
        kind = self._link(gpu, link).partition(":")[0]
        types = {
            "gpu": _NVLINK_DEVICE_GPU,
            "switch": _NVLINK_DEVICE_SWITCH,
            "npu": _NVLINK_DEVICE_IBMNPU,
        }
        if kind not in types:
            return _NOT_SUPPORTED
        _store(out, types[kind])
        return _SUCCESS

    def _c_nvmlDeviceGetNvLinkErrorCounter(
        self, handle: Any, link: Any, counter: Any, out: Any
    ) -> int:
        gpu = self._device(handle, "nvmlDeviceGetNvLinkErrorCounter")
        self._link(gpu, link)
        kind = _as_int(counter)
        if not 0 <= kind < len(_NVLINK_ERROR_COUNTERS):
            return _INVALID_ARGUMENT
        _store(out, self._nvlink_error(gpu, _as_int(link), _NVLINK_ERROR_COUNTERS[kind]))
        return _SUCCESS

    # ---- host topology

    def _c_nvmlDeviceGetNumaNodeId(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetNumaNodeId")
        if gpu.spec.numa_node is None:
            return _NOT_SUPPORTED
        _store(out, gpu.spec.numa_node)
        return _SUCCESS

    def _c_nvmlDeviceGetMemoryAffinity(self, handle: Any, size: Any, out: Any, scope: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetMemoryAffinity")
        _as_int(scope)
        if gpu.spec.numa_node is None:
            return _NOT_SUPPORTED
        self._mask(out, size, [gpu.spec.numa_node])
        return _SUCCESS

    def _c_nvmlDeviceGetCpuAffinity(self, handle: Any, size: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetCpuAffinity")
        self._mask(out, size, gpu.spec.cpu_affinity)
        return _SUCCESS

    def _c_nvmlDeviceGetCpuAffinityWithinScope(
        self, handle: Any, size: Any, out: Any, scope: Any
    ) -> int:
        gpu = self._device(handle, "nvmlDeviceGetCpuAffinityWithinScope")
        _as_int(scope)
        self._mask(out, size, gpu.spec.cpu_affinity)
        return _SUCCESS

    # ---- MIG

    def _c_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        spec = self._device(handle, "nvmlDeviceGetMigMode").spec
        if spec.mig_mode is None:
            return _NOT_SUPPORTED
        _store(current, spec.mig_mode)
        _store(pending, spec.mig_mode if spec.mig_mode_pending is None else spec.mig_mode_pending)
        return _SUCCESS

    def _c_nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, out: Any) -> int:
        target = self._resolve(handle, "nvmlDeviceGetMaxMigDeviceCount")
        if isinstance(target, _Mig) or target.spec.mig_mode != 1:
            _store(out, 0)  # not MIG capable, MIG disabled, or asked of a MIG device
        else:
            _store(out, target.spec.mig_max_devices)
        return _SUCCESS

    def _c_nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if gpu.spec.mig_mode != 1:
            return _NOT_SUPPORTED if gpu.spec.mig_mode is None else _INVALID_ARGUMENT
        i = _as_int(index)
        if not 0 <= i < gpu.spec.mig_max_devices:
            return _INVALID_ARGUMENT
        mig = next((m for m in gpu.migs if m.index == i), None)
        if mig is None:
            return _NOT_FOUND
        _store_pointer(out, mig.address)
        return _SUCCESS

    def _c_nvmlDeviceIsMigDeviceHandle(self, handle: Any, out: Any) -> int:
        target = self._resolve(handle, "nvmlDeviceIsMigDeviceHandle")
        _store(out, int(isinstance(target, _Mig)))
        return _SUCCESS

    def _c_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, out: Any) -> int:
        target = self._resolve(handle, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        if not isinstance(target, _Mig):
            return _INVALID_ARGUMENT
        _store_pointer(out, target.parent.address)
        return _SUCCESS

    def _c_nvmlDeviceGetGpuInstanceId(self, handle: Any, out: Any) -> int:
        target = self._resolve(handle, "nvmlDeviceGetGpuInstanceId")
        if not isinstance(target, _Mig):
            return _NOT_SUPPORTED
        _store(out, target.spec.gpu_instance_id)
        return _SUCCESS

    def _c_nvmlDeviceGetComputeInstanceId(self, handle: Any, out: Any) -> int:
        target = self._resolve(handle, "nvmlDeviceGetComputeInstanceId")
        if not isinstance(target, _Mig):
            return _NOT_SUPPORTED
        _store(out, target.spec.compute_instance_id)
        return _SUCCESS

    # ---- processes (count in/out: NULL buffer or short count -> INSUFFICIENT_SIZE + count)

    def _c_nvmlDeviceGetComputeRunningProcesses_v3(
        self, handle: Any, count: Any, infos: Any
    ) -> int:
        target = self._resolve(handle, "nvmlDeviceGetComputeRunningProcesses_v3")
        self._fill_processes(target, count, infos)
        return _SUCCESS

    def _c_nvmlDeviceGetComputeRunningProcesses_v2(
        self, handle: Any, count: Any, infos: Any
    ) -> int:
        target = self._resolve(handle, "nvmlDeviceGetComputeRunningProcesses_v2")
        self._fill_processes(target, count, infos)
        return _SUCCESS

    def _c_nvmlDeviceGetGraphicsRunningProcesses_v3(
        self, handle: Any, count: Any, infos: Any
    ) -> int:
        self._resolve(handle, "nvmlDeviceGetGraphicsRunningProcesses_v3")
        _store(count, 0)
        return _SUCCESS

    def _c_nvmlDeviceGetMPSComputeRunningProcesses_v3(
        self, handle: Any, count: Any, infos: Any
    ) -> int:
        self._resolve(handle, "nvmlDeviceGetMPSComputeRunningProcesses_v3")
        _store(count, 0)
        return _SUCCESS

    # ---- field values

    def _c_nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> int:
        target = self._resolve(handle, "nvmlDeviceGetFieldValues")
        n = _as_int(count)
        if n < 0:
            return _INVALID_ARGUMENT
        array = _deref(values)
        timestamp = int((self.scenario.epoch_s + self.now()) * 1_000_000)
        for i in range(n):
            entry = array[i]
            entry.timestamp = timestamp
            entry.latencyUsec = 0
            try:
                value_type, value = self._field_value(target, entry.fieldId, entry.scopeId)
            except _NvmlFail as e:
                entry.nvmlReturn = e.code
                continue
            entry.nvmlReturn = _SUCCESS
            entry.valueType = value_type
            if value_type == _VT_DOUBLE:
                entry.value.dVal = float(value)
            elif value_type == _VT_UINT:
                entry.value.uiVal = int(value)
            else:
                entry.value.ullVal = int(value)
        return _SUCCESS

    # ---- events

    def _c_nvmlEventSetCreate(self, out: Any) -> int:
        event_set = _EventSet()
        self._event_sets[event_set.address] = event_set
        _store_pointer(out, event_set.address)
        return _SUCCESS

    def _event_set(self, handle: Any) -> _EventSet:
        event_set = self._event_sets.get(_address(handle))
        if event_set is None:
            raise _NvmlFail(_INVALID_ARGUMENT)
        return event_set

    def _c_nvmlDeviceGetSupportedEventTypes(self, handle: Any, out: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceGetSupportedEventTypes")
        _store(out, gpu.spec.supported_event_types)
        return _SUCCESS

    def _c_nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        gpu = self._device(handle, "nvmlDeviceRegisterEvents")
        target = self._event_set(event_set)
        mask = _as_int(types)
        if mask & ~gpu.spec.supported_event_types:
            return _NOT_SUPPORTED
        target.registered[gpu.index] = target.registered.get(gpu.index, 0) | mask
        self._cond.notify_all()
        return _SUCCESS

    def _c_nvmlEventSetWait_v2(self, event_set: Any, out: Any, timeout_ms: Any) -> int:
        target = self._event_set(event_set)
        data = _deref(out)
        deadline = time.monotonic() + _as_int(timeout_ms) / 1000.0
        while True:
            if self._closed or self._init_count == 0:
                return _UNINITIALIZED
            if self._event_sets.get(target.address) is not target:
                return _INVALID_ARGUMENT  # freed while waiting
            event = self._pending_event(target)
            if event is not None:
                ctypes.c_void_p.from_buffer(
                    data, type(data).device.offset
                ).value = event.gpu.address
                data.eventType = event.event_type
                data.eventData = event.data
                data.gpuInstanceId = event.gpu_instance_id
                data.computeInstanceId = event.compute_instance_id
                return _SUCCESS
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _TIMEOUT
            next_due = self._next_scripted_in(target)
            self._cond.wait(remaining if next_due is None else min(remaining, next_due))

    def _c_nvmlEventSetWait(self, event_set: Any, out: Any, timeout_ms: Any) -> int:
        return self._c_nvmlEventSetWait_v2(event_set, out, timeout_ms)

    def _c_nvmlEventSetFree(self, event_set: Any) -> int:
        target = self._event_set(event_set)
        del self._event_sets[target.address]
        self._cond.notify_all()
        return _SUCCESS


# --------------------------------------------------------------------------------------------------
# Installing beneath pynvml
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def install(
    scenario: FakeNvml | Scenario | Mapping[str, Any] | str | Path | None = None,
    *,
    timer: Callable[[], float] | None = None,
) -> Iterator[FakeNvml]:
    """Install a `FakeNvml` as ``pynvml.nvmlLib`` for the duration of the block.

    ``scenario`` is anything `FakeNvml` accepts, or a ready `FakeNvml` (then ``timer`` is unused).

    Clears pynvml's function-pointer cache and init refcount on entry, and restores the previous
    library, cache and refcount on exit (also waking any thread blocked in nvmlEventSetWait).
    """
    pynvml = vars(importlib.import_module("pynvml"))  # the module's globals; pynvml is untyped
    fake = scenario if isinstance(scenario, FakeNvml) else FakeNvml(scenario, timer=timer)
    cache: dict[str, Any] = pynvml["_nvmlGetFunctionPointer_cache"]
    has_refcount = "_nvmlLib_refcount" in pynvml
    with pynvml["libLoadLock"]:
        saved_lib = pynvml.get("nvmlLib")
        saved_cache = dict(cache)
        saved_refcount = pynvml.get("_nvmlLib_refcount", 0)
        pynvml["nvmlLib"] = fake
        cache.clear()
        if has_refcount:
            pynvml["_nvmlLib_refcount"] = 0
    try:
        yield fake
    finally:
        fake.close()
        with pynvml["libLoadLock"]:
            pynvml["nvmlLib"] = saved_lib
            cache.clear()
            cache.update(saved_cache)
            if has_refcount:
                pynvml["_nvmlLib_refcount"] = saved_refcount
