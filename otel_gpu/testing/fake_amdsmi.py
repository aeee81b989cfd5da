"""A scenario-driven fake of AMD SMI's Python package ``amdsmi``.

`install` puts a fake ``amdsmi`` module into ``sys.modules`` (or makes ``import amdsmi`` fail
the way it fails on a host without ROCm), so the real AMD backend runs unchanged above it. The
fake answers with the return structures of amdsmi's own ``amdsmi_interface.py`` (ROCm 6.4 /
amdsmi 7.0.x, the ``amdsmi`` wheel on PyPI): the same dict keys and nesting, ``"N/A"`` where
amdsmi's ``_validate_if_max_uint`` turns an all-ones field into ``"N/A"``, booleans for
``throttle_status``, ``c_void_p`` processor handles, and ``AmdSmiLibraryException`` carrying
the real ``amdsmi_status_t`` codes. Every call is counted::

    with install("amd-mi300x-8") as fake:
        import amdsmi
        amdsmi.amdsmi_init()
        h = amdsmi.amdsmi_get_processor_handles()[0]
        fake.advance(10.0)                       # the fake's clock: counters grow
        amdsmi.amdsmi_get_gpu_metrics_info(h)["energy_accumulator"]
        assert fake.calls["amdsmi_get_gpu_metrics_info"] == 1

A `Scenario` is plain data (a JSON file under ``scenarios/amd/``, a dict or dataclasses); the
JSON schema is the field list of `Scenario` and `GpuSpec` plus the compaction keys
``base`` (another scenario to start from), ``template``, ``count``, ``per_index`` and
``overrides`` (see `Scenario.from_dict`). Values are deterministic: jitter is a hash of (seed,
GPU, quantity, time bucket); time is the fake's clock (`FakeAmdSmi.now`), which only moves with
`FakeAmdSmi.advance` unless a ``timer=`` is injected. Energy, xGMI, PCIe and throttle-residency
counters are integrals over that clock, so they only grow.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import enum
import hashlib
import importlib.abc
import importlib.machinery
import importlib.resources
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_gpu.testing._scenario_files import builtin_names, read_scenario

__all__ = [
    "STATUS",
    "EventSpec",
    "FakeAmdSmi",
    "GpuSpec",
    "Scenario",
    "ScenarioError",
    "builtin_scenarios",
    "install",
    "load_scenario",
]

# amdsmi_status_t (amdsmi.h, ROCm 6.4): the codes the fake raises.
STATUS: dict[str, int] = {
    "SUCCESS": 0,
    "INVAL": 1,
    "NOT_SUPPORTED": 2,
    "NOT_YET_IMPLEMENTED": 3,
    "FAIL_LOAD_MODULE": 4,
    "FAIL_LOAD_SYMBOL": 5,
    "DRM_ERROR": 6,
    "API_FAILED": 7,
    "TIMEOUT": 8,
    "RETRY": 9,
    "NO_PERM": 10,
    "INTERRUPT": 11,
    "IO": 12,
    "ADDRESS_FAULT": 13,
    "FILE_ERROR": 14,
    "OUT_OF_RESOURCES": 15,
    "INTERNAL_EXCEPTION": 16,
    "INPUT_OUT_OF_BOUNDS": 17,
    "INIT_ERROR": 18,
    "BUSY": 30,
    "NOT_FOUND": 31,
    "NOT_INIT": 32,
    "NO_SLOT": 33,
    "DRIVER_NOT_LOADED": 34,
    "NO_DATA": 40,
    "INSUFFICIENT_SIZE": 41,
    "AMDGPU_RESTART_ERR": 54,
    "UNKNOWN_ERROR": 0xFFFFFFFF,
}
_INFO = {
    1: "AMDSMI_STATUS_INVAL - Invalid parameters",
    2: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    3: "AMDSMI_STATUS_NOT_YET_IMPLEMENTED - Feature not yet implemented",
    7: "AMDSMI_STATUS_API_FAILED - API call failed",
    8: "AMDSMI_STATUS_TIMEOUT - Timeout in API call",
    9: "AMDSMI_STATUS_RETRY - Retry operation",
    10: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    12: "AMDSMI_STATUS_IO - I/O Error",
    18: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    31: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    32: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    34: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Processor driver not loaded",
    40: "AMDSMI_STATUS_NO_DATA - No data was found for given input",
}

_U16, _U32, _U64 = 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
_MAX_XGMI_LINKS = 8  # AMDSMI_MAX_NUM_XGMI_LINKS
_MAX_XCP = 8
_MAX_XCC = 8
_RESOLUTION_UJ = 15.259  # counter_resolution of amdsmi_get_energy_count on Instinct GPUs
_EVENT_NAMES = (
    "NONE",
    "VMFAULT",
    "THERMAL_THROTTLE",
    "GPU_PRE_RESET",
    "GPU_POST_RESET",
    "MIGRATE_START",
    "MIGRATE_END",
    "PAGE_FAULT_START",
    "PAGE_FAULT_END",
    "QUEUE_EVICTION",
    "QUEUE_RESTORE",
    "UNMAP_FROM_GPU",
    "PROCESS_START",
    "PROCESS_END",
)
_RESIDENCY_KEYS = {
    "ppt": "ppt_residency_acc",
    "socket_thm": "socket_thm_residency_acc",
    "hbm_thm": "hbm_thm_residency_acc",
    "vr_thm": "vr_thm_residency_acc",
    "prochot": "prochot_residency_acc",
}


class ScenarioError(ValueError):
    """A scenario file or dict that does not describe a valid fake node."""


# --------------------------------------------------------------------------------------------
# Scenario data
# --------------------------------------------------------------------------------------------


@dataclass
class GpuSpec:
    """One AMD GPU of a scenario (values in amdsmi's own units: W, MHz, °C, %, bytes).

    ``metrics_na`` lists ``amdsmi_get_gpu_metrics_info`` keys the GPU does not report (they
    read ``"N/A"``). ``not_supported`` lists functions that raise ``NOT_SUPPORTED``;
    ``missing_functions`` functions this amdsmi does not have. ``error`` makes every call on
    the GPU's handles raise that status once ``error_after_calls`` calls were made to it and
    the clock reached ``error_after_s``.
    ``partitions`` splits it (``{"compute": "CPX", "memory": "NPS4", "count": 8}``): one
    processor handle per partition, BDF function = partition id. ``throttle`` lists active
    residency counters (``ppt``, ``socket_thm``, ``hbm_thm``, ``vr_thm``, ``prochot``).
    """

    market_name: str = "AMD Instinct MI300X"
    device_id: int = 0x74A1
    rev_id: int = 0x00
    subsystem_id: str = "0x74a1"
    target_graphics_version: str = "gfx942"
    num_compute_units: int = 304
    oam_id: int | None = None
    uuid: str = ""
    bdf: str = "0000:0c:00.0"
    numa_node: int = 0
    asic_serial: str = ""
    product_serial: str = ""
    board_model_number: str = "102-G30211-0C"
    board_product_name: str = "AMD Instinct MI300X OAM"
    vbios_name: str = "AMD MI300X_HW_SRIOV_CVS_1VF"
    vbios_version: str = "022.040.003.043.000001"
    vbios_part_number: str = "113-M3000100-102"
    vbios_build_date: str = "2024/05/13 10:32"
    driver_version: str = "6.8.5"
    vram_total_bytes: int = 206_141_652_992
    vram_used_bytes: int = 60_129_542_144
    power_cap_w: float = 750.0
    power_cap_default_w: float = 750.0
    power_cap_min_w: float = 0.0
    power_cap_max_w: float = 750.0
    socket_power_w: float = 420.0
    energy_start_j: float = 3_600_000.0
    gfx_activity: float = 72.0
    umc_activity: float = 38.0
    vcn_activity: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    temperature_edge: float = 0.0
    temperature_hotspot: float = 58.0
    temperature_mem: float = 49.0
    temperature_vrsoc: float = 44.0
    gfxclk_mhz: float = 2100.0
    uclk_mhz: float = 1300.0
    socclk_mhz: float = 1143.0
    vclk0_mhz: float = 29.0
    pcie_width: int = 16
    pcie_speed: int = 320  # 0.1 GT/s
    pcie_max_width: int = 16
    pcie_max_speed_mts: int = 32000
    pcie_version: int = 5
    pcie_replays: int = 0
    xgmi_kb_per_s: float = 12_000_000.0
    ecc_correctable: int = 0
    ecc_uncorrectable: int = 0
    ecc_deferred: int = 0
    bad_pages: list[str] = field(default_factory=list)  # "RESERVED" | "PENDING" | ...
    throttle: list[str] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    partitions: dict[str, Any] = field(default_factory=dict)
    metrics_na: list[str] = field(
        default_factory=lambda: [
            "temperature_edge",
            "temperature_vrgfx",
            "temperature_vrmem",
            "average_socket_power",
            "average_mm_activity",
            "current_gfxclk",
            "current_socclk",
            "current_vclk0",
            "current_dclk0",
            "current_vclk1",
            "current_dclk1",
            "current_fan_speed",
            "average_gfxclk_frequency",
            "average_socclk_frequency",
            "average_uclk_frequency",
            "average_vclk0_frequency",
            "average_dclk0_frequency",
            "average_vclk1_frequency",
            "average_dclk1_frequency",
        ]
    )
    not_supported: list[str] = field(default_factory=list)
    missing_functions: list[str] = field(default_factory=list)
    error: str | None = None
    error_after_calls: int = 0
    error_after_s: float = 0.0
    jitter: dict[str, float] = field(
        default_factory=lambda: {"gfx_activity": 4.0, "socket_power_w": 15.0}
    )


@dataclass
class EventSpec:
    """A driver event delivered by ``AmdSmiEventReader.read`` once the clock passes ``after_s``."""

    after_s: float
    gpu: int
    event: str
    message: str = ""


@dataclass
class Scenario:
    """A fake AMD node. ``library``: ``"ok"``, ``"missing"`` (``import amdsmi`` raises
    ``KeyError('libamd_smi.so')`` as it does without ROCm) or ``"no_package"``
    (``ImportError``). ``init_error`` makes ``amdsmi_init`` raise that status. ``xgmi``:
    ``"mesh"`` joins every GPU to every other (one xGMI port per peer), ``"none"`` none."""

    name: str = "custom"
    description: str = ""
    seed: int = 0
    library: str = "ok"
    init_error: str | None = None
    rocm_version: str = "6.4.1"
    lib_version: tuple[int, int, int] = (25, 5, 1)
    xgmi: str = "mesh"
    gpus: list[GpuSpec] = field(default_factory=list)
    events: list[EventSpec] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        """Build a scenario from JSON-like data.

        ``base`` names a built-in scenario to start from; ``gpus`` lists GPU specs, or
        ``count`` GPUs are built from ``template`` with ``per_index`` lists (one value per GPU)
        and ``overrides`` (``{"3": {...}}``) applied on top.
        """
        raw = dict(data)
        if "base" in raw:
            base = _scenario_dict(str(raw.pop("base")))
            for key in ("template", "per_index", "overrides"):
                if key in raw and key in base and isinstance(base[key], dict):
                    merged = dict(base[key])
                    if key == "overrides":
                        for idx, extra in raw[key].items():
                            merged[idx] = {**merged.get(idx, {}), **extra}
                    else:
                        merged.update(raw[key])
                    raw[key] = merged
            raw = {**base, **raw}
        known = {f.name for f in dataclasses.fields(cls)}
        gpu_fields = {f.name for f in dataclasses.fields(GpuSpec)}
        gpus_raw: list[dict[str, Any]]
        if "gpus" in raw and "count" not in raw:
            gpus_raw = [dict(g) for g in raw["gpus"]]
        else:
            count = int(raw.get("count", len(raw.get("gpus", [])) or 1))
            template = dict(raw.get("template", {}))
            gpus_raw = [dict(template) for _ in range(count)]
            for key, values in dict(raw.get("per_index", {})).items():
                if len(values) != count:
                    raise ScenarioError(f"per_index.{key}: {len(values)} values for {count} GPUs")
                for i, value in enumerate(values):
                    gpus_raw[i][key] = value
            for idx, extra in dict(raw.get("overrides", {})).items():
                i = int(idx)
                if not 0 <= i < count:
                    raise ScenarioError(f"overrides: no GPU {i}")
                gpus_raw[i].update(extra)
        gpus = []
        for i, g in enumerate(gpus_raw):
            unknown = set(g) - gpu_fields
            if unknown:
                raise ScenarioError(f"GPU {i}: unknown keys {sorted(unknown)}")
            gpus.append(GpuSpec(**g))
        seed = int(raw.get("seed", 0))
        for i, gpu in enumerate(gpus):
            if not gpu.uuid:
                gpu.uuid = _uuid(seed, i)
            if not gpu.asic_serial:
                gpu.asic_serial = f"0x{(seed * 7919 + i * 104729) & 0xFFFFFFFFFFFFFFFF:016X}"
            if not gpu.product_serial:
                gpu.product_serial = f"692{seed:04d}{i:05d}"
        events = [EventSpec(**e) for e in raw.get("events", [])]
        kwargs = {
            k: v
            for k, v in raw.items()
            if k in known and k not in ("gpus", "events", "lib_version")
        }
        if "lib_version" in raw:
            kwargs["lib_version"] = tuple(raw["lib_version"])
        extra = set(raw) - known - {"template", "count", "per_index", "overrides"}
        if extra:
            raise ScenarioError(f"unknown scenario keys {sorted(extra)}")
        return cls(gpus=gpus, events=events, **kwargs)


def _uuid(seed: int, index: int) -> str:
    digest = hashlib.sha256(f"amd:{seed}:{index}".encode()).hexdigest()
    # amdsmi UUIDs: "<device id>ff74a1-..." shaped, 8-4-4-4-12 hex.
    return f"{digest[:2]}ff74a1-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped under ``otel_gpu/testing/scenarios/amd``."""
    return builtin_names("amd")


def _scenario_dict(name: str) -> dict[str, Any]:
    return read_scenario("amd", "AMD", name, ScenarioError)


def load_scenario(scenario: str | Path | Mapping[str, Any] | Scenario) -> Scenario:
    """A built-in scenario by name, a JSON file, a dict, or a `Scenario` as is."""
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, Mapping):
        return Scenario.from_dict(scenario)
    return Scenario.from_dict(_scenario_dict(str(scenario)))


# --------------------------------------------------------------------------------------------
# The fake module
# --------------------------------------------------------------------------------------------


class _Exceptions:
    """``amdsmi_exception.py``'s classes, rebuilt (same names, attributes and messages)."""

    def __init__(self) -> None:
        class AmdSmiException(Exception):
            """Base smi exception class"""

        class AmdSmiLibraryException(AmdSmiException):
            def __init__(self, err_code: int) -> None:
                err_code = abs(err_code)
                super().__init__(err_code)
                self.err_code = err_code
                self.err_info = _INFO.get(
                    err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred"
                )

            def __str__(self) -> str:
                return f"Error code:\n\t{self.err_code} | {self.err_info}"

            def get_error_info(self, detailed: bool = True) -> str:
                return str(self.err_info) if detailed else str(self.err_info).split(" - ")[0]

            def get_error_code(self) -> int:
                return int(self.err_code)

        class AmdSmiRetryException(AmdSmiLibraryException):
            def __init__(self) -> None:
                super().__init__(STATUS["RETRY"])

        class AmdSmiTimeoutException(AmdSmiLibraryException):
            def __init__(self) -> None:
                super().__init__(STATUS["TIMEOUT"])

        class AmdSmiParameterException(AmdSmiException):
            def __init__(self, received: Any, expected: Any, msg: str | None = None) -> None:
                super().__init__(msg)
                self.actualType = type(received)
                self.expectedType = expected
                self.err_msg = msg or (
                    f"Invalid parameter:\nActual type: {type(received)}\nExpected type: {expected}"
                )

            def __str__(self) -> str:
                return str(self.err_msg)

        self.AmdSmiException = AmdSmiException
        self.AmdSmiLibraryException = AmdSmiLibraryException
        self.AmdSmiRetryException = AmdSmiRetryException
        self.AmdSmiTimeoutException = AmdSmiTimeoutException
        self.AmdSmiParameterException = AmdSmiParameterException


@dataclass
class _HandleSpec:
    gpu: int
    partition: int
    handle: ctypes.c_void_p


class FakeAmdSmi:
    """The state behind one installed fake ``amdsmi`` module.

    ``calls`` counts every amdsmi function called (by name); ``gpu_calls`` the calls made on
    each GPU's handles. ``init_count`` is the number of ``amdsmi_init`` not yet balanced by
    ``amdsmi_shut_down``.
    """

    def __init__(self, scenario: Scenario, timer: Callable[[], float] | None = None) -> None:
        self.scenario = scenario
        self.calls: Counter[str] = Counter()
        self.gpu_calls: Counter[int] = Counter()
        self.init_count = 0
        self._timer = timer
        self._t = 0.0
        self._lock = threading.Lock()
        self._recovered: set[int] = set()
        self._delivered: set[int] = set()
        self._registered: dict[int, int] = {}  # handle address -> event mask
        self.exc = _Exceptions()
        self._handles: list[_HandleSpec] = []
        for gi, g in enumerate(scenario.gpus):
            count = int(g.partitions.get("count", 1)) if g.partitions else 1
            for p in range(count):
                address = 0x7F00_0000_0000 + gi * 0x1_0000 + p * 0x100
                self._handles.append(_HandleSpec(gi, p, ctypes.c_void_p(address)))
        self._by_address = {h.handle.value: h for h in self._handles}
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
        self.gpu_calls.clear()

    def recover_gpu(self, index: int) -> None:
        """Make a GPU whose ``error`` fires answer again."""
        self._recovered.add(index)

    def close(self) -> None:
        """Nothing to release (kept for symmetry with the NVML fake)."""

    # -- helpers -----------------------------------------------------------------------------

    def _jitter(self, gpu: int, key: str) -> float:
        spec = self.scenario.gpus[gpu]
        amplitude = float(spec.jitter.get(key, 0.0))
        if not amplitude:
            return 0.0
        bucket = int(self.now // 1.0)
        digest = hashlib.sha256(f"{self.scenario.seed}:{gpu}:{key}:{bucket}".encode()).digest()
        return amplitude * (int.from_bytes(digest[:4], "big") / 0xFFFFFFFF * 2 - 1)

    def _raise(self, name: str) -> None:
        raise self.exc.AmdSmiLibraryException(STATUS[name])

    def _lookup(self, handle: Any, function: str) -> _HandleSpec:
        if not isinstance(handle, ctypes.c_void_p):
            raise self.exc.AmdSmiParameterException(handle, ctypes.c_void_p)
        spec = self._by_address.get(handle.value)
        if spec is None:
            self._raise("INVAL")
        assert spec is not None
        gpu = self.scenario.gpus[spec.gpu]
        self.gpu_calls[spec.gpu] += 1
        if (
            gpu.error
            and spec.gpu not in self._recovered
            and self.gpu_calls[spec.gpu] > gpu.error_after_calls
            and self.now >= gpu.error_after_s
        ):
            self._raise(gpu.error)
        if function in gpu.not_supported:
            self._raise("NOT_SUPPORTED")
        return spec

    # -- module ------------------------------------------------------------------------------

    def _build_module(self) -> types.ModuleType:
        mod = types.ModuleType("amdsmi")
        mod.__doc__ = "fake amdsmi (otel_gpu.testing.fake_amdsmi)"
        mod.__version__ = "7.0.2+fake"  # type: ignore[attr-defined]
        wrapper = types.ModuleType("amdsmi.amdsmi_wrapper")
        for name, code in STATUS.items():
            setattr(wrapper, f"AMDSMI_STATUS_{name}", code)
        wrapper.amdsmi_processor_handle = ctypes.c_void_p  # type: ignore[attr-defined]
        mod.amdsmi_wrapper = wrapper  # type: ignore[attr-defined]
        for name in (
            "AmdSmiException",
            "AmdSmiLibraryException",
            "AmdSmiRetryException",
            "AmdSmiTimeoutException",
            "AmdSmiParameterException",
        ):
            setattr(mod, name, getattr(self.exc, name))
        for name, enum_cls in _enums().items():
            setattr(mod, name, enum_cls)
        fake = self

        class AmdSmiEventReader:
            """``amdsmi_interface.AmdSmiEventReader``: registers a mask, reads all GPUs."""

            def __init__(self, processor_handle: Any, event_types: Sequence[Any]) -> None:
                enum_cls = mod.AmdSmiEvtNotificationType
                for event_type in event_types:
                    if not isinstance(event_type, enum_cls):
                        raise fake.exc.AmdSmiParameterException(event_type, enum_cls)
                fake.calls["amdsmi_init_gpu_event_notification"] += 1
                spec = fake._lookup(processor_handle, "amdsmi_init_gpu_event_notification")
                fake.calls["amdsmi_set_gpu_event_notification_mask"] += 1
                mask = 0
                for event_type in event_types:
                    if event_type != enum_cls.NONE:
                        mask |= 1 << (int(event_type) - 1)
                self.processor_handle = processor_handle
                fake._registered[spec.handle.value or 0] = mask

            def read(self, timestamp: int, num_elem: int = 10) -> list[dict[str, Any]]:
                return fake._read_events(int(timestamp), int(num_elem))

            def stop(self) -> None:
                fake.calls["amdsmi_stop_gpu_event_notification"] += 1
                fake._registered.pop(self.processor_handle.value, None)

            def __enter__(self) -> AmdSmiEventReader:
                return self

            def __exit__(self, *exc: object) -> None:
                self.stop()

        mod.AmdSmiEventReader = AmdSmiEventReader  # type: ignore[attr-defined]
        missing = {f for g in self.scenario.gpus for f in g.missing_functions}
        for name in dir(self):
            if not name.startswith("amdsmi_") or name in missing:
                continue
            setattr(mod, name, self._counted(name, getattr(self, name)))
        return mod

    def _counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            return fn(*args)

        call.__name__ = name
        return call

    def _require_init(self) -> None:
        if self.init_count <= 0:
            self._raise("NOT_INIT")

    # -- library ------------------------------------------------------------------------------

    def amdsmi_init(self, flag: Any = None) -> None:
        if flag is not None and not isinstance(flag, self.module.AmdSmiInitFlags):
            raise self.exc.AmdSmiParameterException(flag, self.module.AmdSmiInitFlags)
        if self.scenario.init_error:
            self._raise(self.scenario.init_error)
        self.init_count += 1

    def amdsmi_shut_down(self) -> None:
        self.init_count -= 1

    def amdsmi_get_processor_handles(self) -> list[ctypes.c_void_p]:
        self._require_init()
        return [ctypes.c_void_p(h.handle.value) for h in self._handles]

    def amdsmi_get_lib_version(self) -> dict[str, Any]:
        major, minor, release = self.scenario.lib_version
        return {"major": major, "minor": minor, "release": release, "build": ""}

    def amdsmi_get_rocm_version(self) -> tuple[bool, str]:
        return True, self.scenario.rocm_version

    # -- identity ------------------------------------------------------------------------------

    def _gpu(self, handle: Any, function: str) -> tuple[_HandleSpec, GpuSpec]:
        self._require_init()
        spec = self._lookup(handle, function)
        return spec, self.scenario.gpus[spec.gpu]

    def amdsmi_get_gpu_device_uuid(self, handle: Any) -> str:
        _, g = self._gpu(handle, "amdsmi_get_gpu_device_uuid")
        return g.uuid

    def amdsmi_get_gpu_device_bdf(self, handle: Any) -> str:
        spec, g = self._gpu(handle, "amdsmi_get_gpu_device_bdf")
        base = g.bdf.rsplit(".", 1)[0]
        return f"{base}.{spec.partition:x}" if g.partitions else g.bdf

    def amdsmi_get_gpu_kfd_info(self, handle: Any) -> dict[str, Any]:
        spec, _ = self._gpu(handle, "amdsmi_get_gpu_kfd_info")
        return {
            "kfd_id": 40000 + spec.gpu * 100 + spec.partition,
            "node_id": 2 + len(self._handles[: self._handles.index(spec)]),
            "current_partition_id": spec.partition,
        }

    def amdsmi_get_gpu_asic_info(self, handle: Any) -> dict[str, Any]:
        _, g = self._gpu(handle, "amdsmi_get_gpu_asic_info")
        return {
            "market_name": g.market_name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": hex(g.device_id),
            "rev_id": f"0x{g.rev_id:02x}",
            "asic_serial": g.asic_serial,
            "oam_id": g.oam_id if g.oam_id is not None else "N/A",
            "num_compute_units": g.num_compute_units,
            "target_graphics_version": g.target_graphics_version,
            "subsystem_id": g.subsystem_id,
        }

    def amdsmi_get_gpu_board_info(self, handle: Any) -> dict[str, Any]:
        _, g = self._gpu(handle, "amdsmi_get_gpu_board_info")
        return {
            "model_number": g.board_model_number or "N/A",
            "product_serial": g.product_serial or "N/A",
            "fru_id": "N/A",
            "product_name": g.board_product_name or "N/A",
            "manufacturer_name": "AMD",
        }

    def amdsmi_get_gpu_vbios_info(self, handle: Any) -> dict[str, Any]:
        _, g = self._gpu(handle, "amdsmi_get_gpu_vbios_info")
        return {
            "name": g.vbios_name,
            "build_date": g.vbios_build_date,
            "part_number": g.vbios_part_number,
            "version": g.vbios_version,
        }

    def amdsmi_get_gpu_driver_info(self, handle: Any) -> dict[str, Any]:
        _, g = self._gpu(handle, "amdsmi_get_gpu_driver_info")
        return {"driver_name": "amdgpu", "driver_version": g.driver_version, "driver_date": "N/A"}

    def amdsmi_topo_get_numa_node_number(self, handle: Any) -> int:
        _, g = self._gpu(handle, "amdsmi_topo_get_numa_node_number")
        return g.numa_node if g.numa_node >= 0 else _U32

    def amdsmi_get_gpu_compute_partition(self, handle: Any) -> str:
        _, g = self._gpu(handle, "amdsmi_get_gpu_compute_partition")
        return str(g.partitions.get("compute", "SPX"))

    def amdsmi_get_gpu_memory_partition(self, handle: Any) -> str:
        _, g = self._gpu(handle, "amdsmi_get_gpu_memory_partition")
        return str(g.partitions.get("memory", "NPS1"))

    def amdsmi_get_pcie_info(self, handle: Any) -> dict[str, Any]:
        _, g = self._gpu(handle, "amdsmi_get_pcie_info")
        return {
            "pcie_static": {
                "max_pcie_width": g.pcie_max_width,
                "max_pcie_speed": g.pcie_max_speed_mts,
                "pcie_interface_version": g.pcie_version,
                "slot_type": "OAM",
            },
            "pcie_metric": {
                "pcie_width": g.pcie_width,
                "pcie_speed": g.pcie_speed * 100,
                "pcie_bandwidth": "N/A",
                "pcie_replay_count": g.pcie_replays,
                "pcie_l0_to_recovery_count": 0,
                "pcie_replay_roll_over_count": 0,
                "pcie_nak_sent_count": 0,
                "pcie_nak_received_count": 0,
                "pcie_lc_perf_other_end_recovery_count": 0,
            },
        }

    # -- memory, power, energy ------------------------------------------------------------------

    def _memory_share(self, spec: _HandleSpec, g: GpuSpec, value: int) -> int:
        memory = str(g.partitions.get("memory", "NPS1")).upper()
        if g.partitions and memory != "NPS1":
            return value // int(g.partitions.get("count", 1))
        return value

    def amdsmi_get_gpu_memory_total(self, handle: Any, mem_type: Any) -> int:
        spec, g = self._gpu(handle, "amdsmi_get_gpu_memory_total")
        if not isinstance(mem_type, self.module.AmdSmiMemoryType):
            raise self.exc.AmdSmiParameterException(mem_type, self.module.AmdSmiMemoryType)
        if mem_type != self.module.AmdSmiMemoryType.VRAM:
            return 0
        return self._memory_share(spec, g, g.vram_total_bytes)

    def amdsmi_get_gpu_memory_usage(self, handle: Any, mem_type: Any) -> int:
        spec, g = self._gpu(handle, "amdsmi_get_gpu_memory_usage")
        if not isinstance(mem_type, self.module.AmdSmiMemoryType):
            raise self.exc.AmdSmiParameterException(mem_type, self.module.AmdSmiMemoryType)
        if mem_type != self.module.AmdSmiMemoryType.VRAM:
            return 0
        return self._memory_share(spec, g, g.vram_used_bytes)

    def amdsmi_get_gpu_vram_usage(self, handle: Any) -> dict[str, Any]:
        _, g = self._gpu(handle, "amdsmi_get_gpu_vram_usage")
        return {"vram_total": g.vram_total_bytes >> 20, "vram_used": g.vram_used_bytes >> 20}

    def amdsmi_get_power_cap_info(self, handle: Any) -> dict[str, Any]:
        _, g = self._gpu(handle, "amdsmi_get_power_cap_info")
        return {
            "power_cap": int(g.power_cap_w * 1e6),
            "default_power_cap": int(g.power_cap_default_w * 1e6),
            "dpm_cap": 2100,
            "min_power_cap": int(g.power_cap_min_w * 1e6),
            "max_power_cap": int(g.power_cap_max_w * 1e6),
        }

    def amdsmi_get_power_info(self, handle: Any, sensor_ind: int = 0) -> dict[str, Any]:
        spec, g = self._gpu(handle, "amdsmi_get_power_info")
        power = round(g.socket_power_w + self._jitter(spec.gpu, "socket_power_w"))
        return {
            "current_socket_power": power,
            "average_socket_power": "N/A",
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": int(g.power_cap_w * 1e6),
        }

    def _energy_counts(self, spec: _HandleSpec, g: GpuSpec) -> int:
        joules = g.energy_start_j + g.socket_power_w * self.now
        return int(joules * 1e6 / _RESOLUTION_UJ)

    def amdsmi_get_energy_count(self, handle: Any) -> dict[str, Any]:
        spec, g = self._gpu(handle, "amdsmi_get_energy_count")
        return {
            "energy_accumulator": self._energy_counts(spec, g),
            "counter_resolution": _RESOLUTION_UJ,
            "timestamp": int(self.now * 1e9),
        }

    def amdsmi_get_gpu_activity(self, handle: Any) -> dict[str, Any]:
        spec, g = self._gpu(handle, "amdsmi_get_gpu_activity")
        gfx = min(100, max(0, int(g.gfx_activity + self._jitter(spec.gpu, "gfx_activity"))))
        return {
            "gfx_activity": gfx,
            "umc_activity": int(g.umc_activity),
            "mm_activity": int(max(g.vcn_activity or [0])),
        }

    def amdsmi_get_temp_metric(self, handle: Any, sensor: Any, metric: Any) -> int:
        _, g = self._gpu(handle, "amdsmi_get_temp_metric")
        kind = self.module.AmdSmiTemperatureType
        value = {
            kind.EDGE: g.temperature_edge,
            kind.HOTSPOT: g.temperature_hotspot,
            kind.VRAM: g.temperature_mem,
        }.get(sensor)
        if not value:
            self._raise("NOT_SUPPORTED")
        return int(value or 0)

    # -- the batched metrics table ---------------------------------------------------------------

    def amdsmi_get_gpu_metrics_info(self, handle: Any) -> dict[str, Any]:
        spec, g = self._gpu(handle, "amdsmi_get_gpu_metrics_info")
        return self._metrics(spec, g)

    def _metrics(self, spec: _HandleSpec, g: GpuSpec) -> dict[str, Any]:
        t = self.now
        gfx = min(100, max(0, round(g.gfx_activity + self._jitter(spec.gpu, "gfx_activity"))))
        power = round(g.socket_power_w + self._jitter(spec.gpu, "socket_power_w"))
        links = self._ports(spec.gpu)
        reads = [_U64] * _MAX_XGMI_LINKS
        writes = [_U64] * _MAX_XGMI_LINKS
        status = [_U16] * _MAX_XGMI_LINKS
        for port in range(len(links)):
            kb = g.xgmi_kb_per_s * (0.5 + gfx / 200.0)
            reads[port] = int(1_000_000 + kb * t)
            writes[port] = int(2_000_000 + kb * 0.9 * t)
            status[port] = 1
        ticks = int(t * 1000)  # accumulation_counter: 1 ms firmware ticks
        residency = {key: 0 for key in _RESIDENCY_KEYS.values()}
        for name in g.throttle:
            residency[_RESIDENCY_KEYS[name]] = ticks
        partitions = int(g.partitions.get("count", 1)) if g.partitions else 1
        per_xcp = max(1, _MAX_XCC // partitions)
        busy: list[list[Any]] = []
        for xcp in range(_MAX_XCP):
            row = [_U32] * _MAX_XCC
            if xcp < partitions:
                for x in range(per_xcp):
                    row[x] = max(0, min(100, gfx - 3 * xcp + x % 3))
            busy.append(row)
        raw: dict[str, Any] = {
            "common_header.structure_size": 1184,
            "common_header.format_revision": 1,
            "common_header.content_revision": 6,
            "temperature_edge": int(g.temperature_edge),
            "temperature_hotspot": int(g.temperature_hotspot + gfx / 20),
            "temperature_mem": int(g.temperature_mem + gfx / 40),
            "temperature_vrgfx": _U16,
            "temperature_vrsoc": int(g.temperature_vrsoc),
            "temperature_vrmem": _U16,
            "average_gfx_activity": gfx,
            "average_umc_activity": int(g.umc_activity),
            "average_mm_activity": int(max(g.vcn_activity or [0])),
            "average_socket_power": power,
            "energy_accumulator": self._energy_counts(spec, g),
            "system_clock_counter": int(t * 1e9),
            "average_gfxclk_frequency": int(g.gfxclk_mhz),
            "average_socclk_frequency": int(g.socclk_mhz),
            "average_uclk_frequency": int(g.uclk_mhz),
            "average_vclk0_frequency": int(g.vclk0_mhz),
            "average_dclk0_frequency": int(g.vclk0_mhz),
            "average_vclk1_frequency": int(g.vclk0_mhz),
            "average_dclk1_frequency": int(g.vclk0_mhz),
            "current_gfxclk": int(g.gfxclk_mhz),
            "current_socclk": int(g.socclk_mhz),
            "current_uclk": int(g.uclk_mhz),
            "current_vclk0": int(g.vclk0_mhz),
            "current_dclk0": int(g.vclk0_mhz),
            "current_vclk1": int(g.vclk0_mhz),
            "current_dclk1": int(g.vclk0_mhz),
            "throttle_status": 1 if g.throttle else 0,
            "current_fan_speed": _U16,
            "pcie_link_width": g.pcie_width,
            "pcie_link_speed": g.pcie_speed,
            "gfx_activity_acc": int(gfx * t * 10) % _U32,
            "mem_activity_acc": int(g.umc_activity * t * 10) % _U32,
            "temperature_hbm": [_U16] * 4,
            "firmware_timestamp": int(t * 1e8),
            "voltage_soc": _U16,
            "voltage_gfx": _U16,
            "voltage_mem": _U16,
            "indep_throttle_status": 1 if g.throttle else 0,
            "current_socket_power": power,
            "vcn_activity": [int(v) for v in g.vcn_activity] + [_U16] * (4 - len(g.vcn_activity)),
            "gfxclk_lock_status": 0,
            "xgmi_link_width": 16 if links else _U16,
            "xgmi_link_speed": 32 if links else _U16,
            "pcie_bandwidth_acc": int(25 * t),
            "pcie_bandwidth_inst": 25,
            "pcie_l0_to_recov_count_acc": 0,
            "pcie_replay_count_acc": g.pcie_replays,
            "pcie_replay_rover_count_acc": 0,
            "xgmi_read_data_acc": reads,
            "xgmi_write_data_acc": writes,
            "current_gfxclks": [int(g.gfxclk_mhz) - i for i in range(_MAX_XCC)],
            "current_socclks": [int(g.socclk_mhz)] * 4,
            "current_vclk0s": [int(g.vclk0_mhz)] * 4,
            "current_dclk0s": [int(g.vclk0_mhz)] * 4,
            "jpeg_activity": [0] * 32,
            "pcie_nak_sent_count_acc": 0,
            "pcie_nak_rcvd_count_acc": 0,
            "accumulation_counter": ticks,
            **residency,
            "num_partition": partitions,
            "pcie_lc_perf_other_end_recovery": 0,
            "vram_max_bandwidth": 5_300_000,
            "xgmi_link_status": status,
        }
        out = {key: _validate(key, value) for key, value in raw.items()}
        out["xcp_stats.gfx_busy_inst"] = [[_validate("activity", v) for v in row] for row in busy]
        for key in (
            "xcp_stats.jpeg_busy",
            "xcp_stats.vcn_busy",
            "xcp_stats.gfx_busy_acc",
            "xcp_stats.gfx_below_host_limit_acc",
            "xcp_stats.gfx_below_host_limit_ppt_acc",
            "xcp_stats.gfx_below_host_limit_thm_acc",
            "xcp_stats.gfx_low_utilization_acc",
            "xcp_stats.gfx_below_host_limit_total_acc",
        ):
            out[key] = [["N/A"] * _MAX_XCC for _ in range(_MAX_XCP)]
        for key in g.metrics_na:
            if key in out:
                out[key] = ["N/A" for _ in out[key]] if isinstance(out[key], list) else "N/A"
        return out

    # -- RAS --------------------------------------------------------------------------------------

    def amdsmi_get_gpu_total_ecc_count(self, handle: Any) -> dict[str, Any]:
        _, g = self._gpu(handle, "amdsmi_get_gpu_total_ecc_count")
        return {
            "correctable_count": g.ecc_correctable,
            "uncorrectable_count": g.ecc_uncorrectable,
            "deferred_count": g.ecc_deferred,
        }

    def amdsmi_get_gpu_bad_page_info(self, handle: Any) -> list[dict[str, Any]]:
        _, g = self._gpu(handle, "amdsmi_get_gpu_bad_page_info")
        states = self.module.AmdSmiMemoryPageStatus
        return [
            {
                "value": i,
                "page_address": 0x3_0000_0000 + i * 0x1000,
                "page_size": 4096,
                "status": int(states[name]),
            }
            for i, name in enumerate(g.bad_pages)
        ]

    # -- topology --------------------------------------------------------------------------------

    def _physical(self) -> list[int]:
        return list(range(len(self.scenario.gpus)))

    def _ports(self, gpu: int) -> list[int]:
        """The peer GPU of each xGMI port of ``gpu`` (port order)."""
        if self.scenario.xgmi != "mesh":
            return []
        return [p for p in self._physical() if p != gpu]

    def _bdf0(self, gpu: int) -> str:
        return self.scenario.gpus[gpu].bdf.rsplit(".", 1)[0] + ".0"

    def amdsmi_get_link_metrics(self, handle: Any) -> dict[str, Any]:
        spec, g = self._gpu(handle, "amdsmi_get_link_metrics")
        peers = self._ports(spec.gpu)
        metrics = self._metrics(spec, g)
        links = []
        for port in range(_MAX_XGMI_LINKS):
            if port < len(peers):
                links.append(
                    {
                        "bdf": self._bdf0(peers[port]),
                        "bit_rate": 32,
                        "max_bandwidth": 64,
                        "link_type": int(self.module.AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI),
                        "read": metrics["xgmi_read_data_acc"][port],
                        "write": metrics["xgmi_write_data_acc"][port],
                    }
                )
            else:
                links.append(
                    {
                        "bdf": "0000:00:00.0",
                        "bit_rate": 0,
                        "max_bandwidth": 0,
                        "link_type": 0,
                        "read": 0,
                        "write": 0,
                    }
                )
        return {"num_links": len(peers), "links": links}

    def amdsmi_get_gpu_xgmi_link_status(self, handle: Any) -> dict[str, Any]:
        spec, _ = self._gpu(handle, "amdsmi_get_gpu_xgmi_link_status")
        peers = self._ports(spec.gpu)
        return {"status": ["U"] * len(peers), "total_links": len(peers)}

    def amdsmi_topo_get_link_type(self, src: Any, dst: Any) -> dict[str, Any]:
        a, _ = self._gpu(src, "amdsmi_topo_get_link_type")
        b, _ = self._gpu(dst, "amdsmi_topo_get_link_type")
        kind = self.module.AmdSmiLinkType
        if a.gpu != b.gpu and b.gpu in self._ports(a.gpu):
            return {"hops": 1, "type": int(kind.AMDSMI_LINK_TYPE_XGMI)}
        return {"hops": 2, "type": int(kind.AMDSMI_LINK_TYPE_PCIE)}

    def amdsmi_topo_get_link_weight(self, src: Any, dst: Any) -> int:
        a, _ = self._gpu(src, "amdsmi_topo_get_link_weight")
        b, _ = self._gpu(dst, "amdsmi_topo_get_link_weight")
        return 15 if b.gpu in self._ports(a.gpu) else 40

    def amdsmi_get_link_topology_nearest(self, handle: Any, link_type: Any) -> dict[str, Any]:
        spec, _ = self._gpu(handle, "amdsmi_get_link_topology_nearest")
        if int(link_type) != int(self.module.AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI):
            return {"processor_list": []}
        peers = set(self._ports(spec.gpu))
        return {
            "processor_list": [
                ctypes.c_void_p(h.handle.value)
                for h in self._handles
                if h.gpu in peers and h.partition == 0
            ]
        }

    # -- processes ---------------------------------------------------------------------------------

    def amdsmi_get_gpu_process_list(self, handle: Any) -> list[dict[str, Any]]:
        _, g = self._gpu(handle, "amdsmi_get_gpu_process_list")
        return [
            {
                "name": str(p.get("name", "N/A")),
                "pid": int(p["pid"]),
                "mem": int(p.get("vram", 0)),
                "engine_usage": {"gfx": int(p.get("gfx_ns", 0)), "enc": 0},
                "memory_usage": {
                    "gtt_mem": int(p.get("gtt", 0)),
                    "cpu_mem": int(p.get("cpu", 0)),
                    "vram_mem": int(p.get("vram", 0)),
                },
                "cu_occupancy": p.get("cu_occupancy", "N/A"),
            }
            for p in g.processes
        ]

    # -- events ------------------------------------------------------------------------------------

    def _read_events(self, timeout_ms: int, num_elem: int) -> list[dict[str, Any]]:
        self.calls["amdsmi_get_gpu_event_notification"] += 1
        kinds = self.module.AmdSmiEvtNotificationType
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        while True:
            due: list[dict[str, Any]] = []
            for i, ev in enumerate(self.scenario.events):
                if i in self._delivered or ev.after_s > self.now or len(due) >= num_elem:
                    continue
                spec = next(
                    (h for h in self._handles if h.gpu == ev.gpu and h.partition == 0), None
                )
                if spec is None:
                    continue
                mask = self._registered.get(spec.handle.value or 0, 0)
                if not mask & (1 << (int(kinds[ev.event]) - 1)):
                    continue
                self._delivered.add(i)
                due.append(
                    {
                        "processor_handle": ctypes.c_void_p(spec.handle.value),
                        "event": ev.event,
                        "message": ev.message,
                    }
                )
            if due:
                return due
            if time.monotonic() >= deadline:
                self._raise("NO_DATA")
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))


def _validate(key: str, value: Any) -> Any:
    """amdsmi's ``_validate_if_max_uint``: all-ones -> "N/A", activity > 100 -> "N/A"."""
    activity = key.endswith("_activity") or key == "activity"
    if isinstance(value, list):
        return [_validate(key, v) for v in value]
    if key in ("throttle_status", "indep_throttle_status"):
        return bool(value)
    if value in (_U16, _U32, _U64) or (activity and isinstance(value, int) and value > 100):
        return "N/A"
    return value


def _enums() -> dict[str, Any]:
    """amdsmi's IntEnums the backend touches, with the values of ``amdsmi_wrapper.py``."""
    return {
        "AmdSmiInitFlags": enum.IntEnum(
            "AmdSmiInitFlags",
            {
                "INIT_ALL_PROCESSORS": 0xFFFFFFFF,
                "INIT_AMD_CPUS": 1,
                "INIT_AMD_GPUS": 2,
                "INIT_AMD_APUS": 3,
                "INIT_NON_AMD_CPUS": 4,
                "INIT_NON_AMD_GPUS": 8,
            },
        ),
        "AmdSmiMemoryType": enum.IntEnum("AmdSmiMemoryType", {"VRAM": 0, "VIS_VRAM": 1, "GTT": 2}),
        "AmdSmiEvtNotificationType": enum.IntEnum(
            "AmdSmiEvtNotificationType", {n: i for i, n in enumerate(_EVENT_NAMES)}
        ),
        "AmdSmiLinkType": enum.IntEnum(
            "AmdSmiLinkType",
            {
                "AMDSMI_LINK_TYPE_INTERNAL": 0,
                "AMDSMI_LINK_TYPE_PCIE": 1,
                "AMDSMI_LINK_TYPE_XGMI": 2,
                "AMDSMI_LINK_TYPE_NOT_APPLICABLE": 3,
                "AMDSMI_LINK_TYPE_UNKNOWN": 4,
            },
        ),
        "AmdSmiMemoryPageStatus": enum.IntEnum(
            "AmdSmiMemoryPageStatus", {"RESERVED": 0, "PENDING": 1, "UNRESERVABLE": 2}
        ),
        "AmdSmiTemperatureType": enum.IntEnum(
            "AmdSmiTemperatureType",
            {"EDGE": 0, "HOTSPOT": 1, "JUNCTION": 1, "VRAM": 2, "HBM_0": 3, "PLX": 7},
        ),
        "AmdSmiTemperatureMetric": enum.IntEnum(
            "AmdSmiTemperatureMetric", {"CURRENT": 0, "MAX": 1, "CRITICAL": 5, "EMERGENCY": 7}
        ),
    }


# --------------------------------------------------------------------------------------------
# Installing
# --------------------------------------------------------------------------------------------


class _FailingLoader(importlib.abc.Loader):
    """Executes ``amdsmi`` the way the real one fails without ``libamd_smi.so``."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        # amdsmi_wrapper.py: find_smi_library() fails, prints, then indexes the dict.
        raise KeyError("libamd_smi.so")


class _FailingFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "amdsmi":
            return importlib.machinery.ModuleSpec("amdsmi", _FailingLoader())
        return None


@contextlib.contextmanager
def install(
    scenario: str | Path | Mapping[str, Any] | Scenario,
    timer: Callable[[], float] | None = None,
) -> Iterator[FakeAmdSmi]:
    """Install a fake ``amdsmi`` for ``scenario`` in ``sys.modules`` for the ``with`` block.

    ``timer`` (monotonic seconds) drives the fake's clock instead of `FakeAmdSmi.advance`.
    """
    spec = load_scenario(scenario)
    fake = FakeAmdSmi(spec, timer)
    saved = {k: v for k, v in sys.modules.items() if k == "amdsmi" or k.startswith("amdsmi.")}
    for key in saved:
        del sys.modules[key]
    finder: _FailingFinder | None = None
    if spec.library == "missing":
        finder = _FailingFinder()
        sys.meta_path.insert(0, finder)
    elif spec.library == "no_package":
        sys.modules["amdsmi"] = None  # type: ignore[assignment]
    else:
        sys.modules["amdsmi"] = fake.module
        sys.modules["amdsmi.amdsmi_wrapper"] = fake.module.amdsmi_wrapper
    try:
        yield fake
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)
        for key in [k for k in sys.modules if k == "amdsmi" or k.startswith("amdsmi.")]:
            del sys.modules[key]
        sys.modules.update(saved)
