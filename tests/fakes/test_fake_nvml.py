"""The fake NVML, driven only through the real pynvml API (its ctypes code runs unchanged)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from otel_gpu.testing import fake_nvml
from otel_gpu.testing.fake_nvml import (
    FakeNvml,
    GpuSpec,
    MigDeviceSpec,
    ProcessSpec,
    Scenario,
    ScenarioError,
    builtin_scenarios,
    install,
    load_scenario,
)

ALL_SCENARIOS = [
    "a100-8-nvlink-mesh",
    "a100-mig",
    "gpu-lost",
    "h100-sxm-8-nvswitch",
    "l40s-4-pcie",
    "mixed-busid",
    "old-driver",
    "xid-events",
]


@pytest.fixture
def nvml(request: pytest.FixtureRequest) -> Iterator[FakeNvml]:
    """``@pytest.mark.parametrize("nvml", ["name"], indirect=True)``: installed and initialized."""
    with install(request.param) as fake:
        pynvml.nvmlInit()
        yield fake


def scenario(name: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("nvml", [name], indirect=True)


def address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def field_values(handle: Any, ids: list[Any]) -> list[Any]:
    return list(pynvml.nvmlDeviceGetFieldValues(handle, ids))


def simple(**gpu: Any) -> Scenario:
    return Scenario(name="simple", gpus=[GpuSpec(**gpu)])


# ------------------------------------------------------------------ scenarios load and enumerate


def test_builtin_scenarios_are_all_there() -> None:
    assert builtin_scenarios() == ALL_SCENARIOS


@pytest.mark.parametrize("name", ALL_SCENARIOS)
def test_every_scenario_enumerates(name: str) -> None:
    expected = load_scenario(name)
    with install(name) as fake:
        pynvml.nvmlInit()
        assert pynvml.nvmlSystemGetDriverVersion() == expected.driver_version
        assert pynvml.nvmlSystemGetCudaDriverVersion() == expected.cuda_driver_version
        count = pynvml.nvmlDeviceGetCount()
        assert count == len(expected.gpus) > 0
        uuids = set()
        for i in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            assert address(handle) == fake.handle_address(i)
            assert pynvml.nvmlDeviceGetName(handle) == expected.gpus[i].name
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            assert uuid.startswith("GPU-")
            uuids.add(uuid)
            assert address(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == address(handle)
            pci = pynvml.nvmlDeviceGetPciInfo(handle)
            assert address(pynvml.nvmlDeviceGetHandleByPciBusId(pci.busId)) == address(handle)
            assert pynvml.nvmlDeviceGetMinorNumber(handle) == i
            assert pynvml.nvmlDeviceGetSerial(handle)
            assert pynvml.nvmlDeviceGetVbiosVersion(handle)
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            assert total == expected.gpus[i].memory_total_mib * 1024 * 1024
        assert len(uuids) == count
        pynvml.nvmlShutdown()


def test_scenario_copy_is_private_and_deterministic() -> None:
    base = load_scenario("h100-sxm-8-nvswitch")
    first, second = FakeNvml(base), FakeNvml(base)
    assert [g.uuid for g in first.gpus] == [g.uuid for g in second.gpus]
    first.gpus[0].ecc_volatile_uncorrected = 9
    assert second.gpus[0].ecc_volatile_uncorrected == 0
    assert base.gpus[0].uuid == ""  # derived identities live in the fake's copy


def test_template_per_index_and_overrides(tmp_path: Path) -> None:
    data = {
        "name": "t",
        "count": 3,
        "template": {"name": "X", "power_usage_mw": 100},
        "per_index": {"numa_node": [0, 0, 1]},
        "gpus": [{"name": "first"}],
        "overrides": {"2": {"power_usage_mw": 300, "cpu_affinity": "0-2,8"}},
    }
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    loaded = load_scenario(path)
    assert [g.name for g in loaded.gpus] == ["first", "X", "X"]
    assert [g.numa_node for g in loaded.gpus] == [0, 0, 1]
    assert [g.power_usage_mw for g in loaded.gpus] == [100, 100, 300]
    assert loaded.gpus[2].cpu_affinity == [0, 1, 2, 8]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpus": [{"nmae": "typo"}]}, "unknown key"),
        ({"gpus": [{"nvlink_remote": ["gpu:5"]}]}, "no peer GPU"),
        ({"gpus": [{"nvlink_remote": ["switch:0"]}]}, "no nvswitch"),
        ({"gpus": [{"nvlink_remote": ["bogus"]}]}, "bad link target"),
        ({"gpus": [{"pci_bus_id": "zz"}]}, "bad PCI bus id"),
        ({"gpus": [{}], "events": [{"gpu": 3}]}, "no GPU"),
        ({"gpus": [{}], "events": [{"gpu": 0, "type": "meteor"}]}, "unknown event type"),
        ({"gpus": [{}], "init_error": "NOPE"}, "unknown NVML error"),
        ({"gpus": [{"memory_total_mib": "lots"}]}, "expected an integer"),
        ({"count": 2, "template": {}, "per_index": {"numa_node": [0]}}, "expected a list of 2"),
        ({"gpus": [{"nvlink_errors": {"crc": 1}}]}, "unknown NVLink error counter"),
    ],
)
def test_bad_scenarios_fail_with_a_clear_message(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_dict(data)


def test_every_gpu_field_round_trips_through_json() -> None:
    spec = GpuSpec(
        mig_devices=[MigDeviceSpec("1g.10gb", 7)],
        processes=[ProcessSpec(1)],
        nvlink_link_errors={1: {"replay": 2}},
        cpu_affinity=[0, 1],
        nvlink_remote=["none"],
    )
    data = json.loads(json.dumps(dataclasses.asdict(spec)))
    assert GpuSpec.from_dict(data) == spec


def test_python_built_scenarios_accept_link_shorthand() -> None:
    built = Scenario(gpus=[GpuSpec(nvlink_remote=["gpu:1*2"]), GpuSpec(nvlink_remote=["gpu:0*2"])])
    assert built.gpus[0].nvlink_remote == ["gpu:1", "gpu:1"]
    fake = FakeNvml(built)
    with install(fake) as installed:
        assert installed is fake
        pynvml.nvmlInit()
        assert nvlink_domains() == [[0, 1]]


def test_unknown_scenario_name() -> None:
    with pytest.raises(ScenarioError, match="no scenario"):
        load_scenario("does-not-exist")


# ------------------------------------------------------------------ install, init, call counting


def test_install_restores_pynvml() -> None:
    before = pynvml.nvmlLib
    with install(None) as fake:
        assert pynvml.nvmlLib is fake
        pynvml.nvmlInit()
        pynvml.nvmlDeviceGetCount()
        assert "nvmlDeviceGetCount_v2" in pynvml._nvmlGetFunctionPointer_cache
    assert pynvml.nvmlLib is before
    assert "nvmlDeviceGetCount_v2" not in pynvml._nvmlGetFunctionPointer_cache
    assert pynvml._nvmlLib_refcount == 0


def test_uninitialized_before_init_and_after_shutdown() -> None:
    with install(None) as fake:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        pynvml.nvmlInit()
        pynvml.nvmlInit()  # refcounted, like the real library
        pynvml.nvmlShutdown()
        assert fake.init_count == 1
        assert pynvml.nvmlDeviceGetCount() == 1
        pynvml.nvmlShutdown()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlShutdown()


@pytest.mark.parametrize(
    ("error", "exception"),
    [
        ("LIBRARY_NOT_FOUND", "NVMLError_LibraryNotFound"),
        ("DRIVER_NOT_LOADED", "NVMLError_DriverNotLoaded"),
        ("NO_PERMISSION", "NVMLError_NoPermission"),
    ],
)
def test_init_errors(error: str, exception: str) -> None:
    with install(Scenario(gpus=[GpuSpec()], init_error=error)) as fake:
        with pytest.raises(getattr(pynvml, exception)):
            pynvml.nvmlInit()
        assert fake.init_count == 0
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()


def test_calls_are_counted_and_reset() -> None:
    with install(None) as fake:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for _ in range(3):
            pynvml.nvmlDeviceGetPowerUsage(handle)
        assert fake.calls["nvmlDeviceGetPowerUsage"] == 3
        assert fake.calls["nvmlInitWithFlags"] == 1  # what pynvml.nvmlInit really calls
        assert fake.calls["nvmlDeviceGetHandleByIndex_v2"] == 1
        assert fake.lookups["nvmlDeviceGetPowerUsage"] == 1  # pynvml caches the pointer
        fake.reset_calls()
        assert not fake.calls
        pynvml.nvmlDeviceGetPowerUsage(handle)
        assert fake.calls == {"nvmlDeviceGetPowerUsage": 1}


def test_unknown_functions_are_function_not_found() -> None:
    assert "nvmlDeviceGetFieldValues" in FakeNvml.implemented_functions()
    with install(None) as fake:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetGspFirmwareVersion(handle)
        assert fake.lookups["nvmlDeviceGetGspFirmwareVersion"] == 1
        assert "nvmlDeviceGetGspFirmwareVersion" not in fake.calls


# ------------------------------------------------------------ identity, memory, power, thermal


@scenario("h100-sxm-8-nvswitch")
def test_static_identity_and_limits(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(4)
    pci = pynvml.nvmlDeviceGetPciInfo(handle)
    assert (pci.busId, pci.busIdLegacy) == ("00000000:9A:00.0", "0000:9A:00.0")
    assert (pci.domain, pci.bus, pci.device, pci.pciDeviceId) == (0, 0x9A, 0, 0x233010DE)
    assert pynvml.nvmlDeviceGetCudaComputeCapability(handle) == (9, 0)
    assert pynvml.nvmlDeviceGetArchitecture(handle) == pynvml.NVML_DEVICE_ARCH_HOPPER
    assert pynvml.nvmlDeviceGetBoardPartNumber(handle) == "692-2G520-0200-000"
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle) == 700000
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700000
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle) == [200000, 700000]
    thresholds = {
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
        pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87,
        pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 95,
    }
    for kind, value in thresholds.items():
        assert pynvml.nvmlDeviceGetTemperatureThreshold(handle, kind) == value
    assert pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM) == 1980
    assert pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM) == 2619
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle) == 5
    assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle) == 16
    assert pynvml.nvmlDeviceGetNumaNodeId(handle) == 1
    mask = pynvml.nvmlDeviceGetCpuAffinity(handle, 4)  # 4 x 64 bits
    cpus = [w * 64 + b for w in range(4) for b in range(64) if mask[w] >> b & 1]
    assert cpus == [*range(56, 112), *range(168, 224)]
    node_mask = pynvml.nvmlDeviceGetMemoryAffinity(handle, 1, pynvml.NVML_AFFINITY_SCOPE_NODE)
    assert node_mask[0] == 0b10


def test_memory_v1_folds_reserved_into_used_and_v2_checks_the_version() -> None:
    with install(simple(memory_total_mib=1000, memory_reserved_mib=10, memory_used_mib=300)):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        mib = 1024 * 1024
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
        assert (v1.total, v1.used, v1.free) == (1000 * mib, 310 * mib, 690 * mib)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        assert (v2.total, v2.reserved, v2.used, v2.free) == (
            1000 * mib,
            10 * mib,
            300 * mib,
            690 * mib,
        )
        with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
            pynvml.nvmlDeviceGetMemoryInfo(handle, version=0x01000028)


def test_energy_integrates_power_over_the_fake_clock() -> None:
    with install(simple(power_usage_mw=250_000, energy_mj=1_000)) as fake:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) == 1_000
        fake.advance(10.0)
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) == 1_000 + 2_500_000
        fake.advance(0.5)
        (value,) = field_values(handle, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])
        assert value.nvmlReturn == pynvml.NVML_SUCCESS
        assert value.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        assert value.value.ullVal == 1_000 + 2_625_000
        assert value.timestamp == int((fake.scenario.epoch_s + 10.5) * 1e6)


@scenario("h100-sxm-8-nvswitch")
def test_jitter_is_deterministic_and_energy_monotonic(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    powers, energies = [], []
    for _ in range(20):
        powers.append(pynvml.nvmlDeviceGetPowerUsage(handle))
        energies.append(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        nvml.advance(1.0)
    assert len(set(powers)) > 1
    assert all(582_000 <= p <= 642_000 for p in powers)
    assert energies == sorted(energies)
    assert energies[-1] - energies[0] == sum(powers[:-1])  # mW x 1 s = mJ
    twin = FakeNvml("h100-sxm-8-nvswitch")
    replay = []
    for _ in range(20):
        replay.append(twin._dyn(twin._gpus[0], "power_usage_mw"))
        twin.advance(1.0)
    assert replay == powers


def test_injected_timer_drives_time() -> None:
    clock = [100.0]
    with install(simple(power_usage_mw=1_000), timer=lambda: clock[0]) as fake:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        clock[0] += 3.0
        assert fake.now() == 3.0
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) == 3_000


@scenario("h100-sxm-8-nvswitch")
def test_temperature_utilization_and_clocks(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    temperature = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    assert 59 <= temperature <= 63
    assert pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU) == temperature
    utilization = pynvml.nvmlDeviceGetUtilizationRates(handle)
    assert 94 <= utilization.gpu <= 100
    assert 52 <= utilization.memory <= 64
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_GRAPHICS) == 1980
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == 0
    assert pynvml.nvmlDeviceGetDecoderUtilization(handle) == [0, 167000]
    with pytest.raises(pynvml.NVMLError_NotSupported):  # per the scenario's not_supported
        pynvml.nvmlDeviceGetEncoderUtilization(handle)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # Hopper: row remapping instead
        pynvml.nvmlDeviceGetRetiredPages(handle, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # SXM: no fan
        pynvml.nvmlDeviceGetFanSpeed(handle)


@scenario("l40s-4-pcie")
def test_l40s_throttled_gpu_and_missing_sensors(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    assert reasons == pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle) == reasons
    assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == 1740
    assert pynvml.nvmlDeviceGetEncoderUtilization(handle)[0] == 12
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperatureThreshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)
    (memory_temperature,) = field_values(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert memory_temperature.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    calls: list[Callable[[], Any]] = [
        lambda: pynvml.nvmlDeviceGetNvLinkState(handle, 0),
        lambda: pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, 0),
        lambda: pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, 0),
        lambda: pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, 0),
        lambda: pynvml.nvmlDeviceGetMigMode(handle),
    ]
    for call in calls:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 0


def test_numa_node_not_supported() -> None:
    with install(simple(numa_node=None)):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNumaNodeId(handle)


# ------------------------------------------------------------------ ECC, retirement, field values


@scenario("h100-sxm-8-nvswitch")
def test_field_values_each_carry_their_own_return(nvml: FakeNvml) -> None:
    nvml.advance(2.0)
    handle = pynvml.nvmlDeviceGetHandleByIndex(5)
    ids = [
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        (pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_POWER_SCOPE_GPU),
        (pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_POWER_SCOPE_MODULE),
        pynvml.NVML_FI_DEV_MEMORY_TEMP,
        pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
        pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
        pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX, 3),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 18),
        pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L7,
        pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 7),
        (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 7),
        pynvml.NVML_FI_DEV_REMAPPED_COR,
        pynvml.NVML_FI_DEV_REMAPPED_PENDING,
        pynvml.NVML_FI_DEV_RETIRED_SBE,
        pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT,
        pynvml.NVML_FI_DEV_NVSWITCH_CONNECTED_LINK_COUNT,
        pynvml.NVML_FI_MAX + 5,
    ]
    values = field_values(handle, ids)
    ok = pynvml.NVML_SUCCESS
    results = [(v.nvmlReturn, v.valueType) for v in values]
    ull, uint = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert results[0] == (ok, ull)
    assert results[1] == (ok, uint)
    assert values[2].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert results[3] == (ok, uint)
    assert [v.value.ullVal for v in values[4:7]] == [12, 0, 40]
    assert values[7].value.uiVal == 0
    assert values[8].value.ullVal == 2 * 1_200_000_000
    assert values[9].value.ullVal == 2 * 2_400_000_000
    assert values[10].value.ullVal == 2 * 9_000_000
    assert values[11].value.ullVal == 18 * 2 * 9_000_000
    assert values[12].value.ullVal == 2 * 9_000_000 * 17 // 16
    assert values[13].nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT  # link 18 of 0..17
    assert [v.value.ullVal for v in values[14:18]] == [3, 3, 1, 3]
    assert [v.value.uiVal for v in values[18:20]] == [1, 0]
    assert values[20].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # retired pages: no
    assert [v.value.uiVal for v in values[21:23]] == [18, 18]
    assert values[23].nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert [v.fieldId for v in values[:2]] == [ids[0], pynvml.NVML_FI_DEV_POWER_INSTANT]


@scenario("h100-sxm-8-nvswitch")
def test_ecc_and_remapped_rows(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(5)
    assert pynvml.nvmlDeviceGetEccMode(handle) == [1, 1]
    corrected = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    assert pynvml.nvmlDeviceGetTotalEccErrors(handle, corrected, pynvml.NVML_VOLATILE_ECC) == 12
    assert pynvml.nvmlDeviceGetTotalEccErrors(handle, corrected, pynvml.NVML_AGGREGATE_ECC) == 40
    dram = pynvml.NVML_MEMORY_LOCATION_DRAM
    counter = pynvml.nvmlDeviceGetMemoryErrorCounter(
        handle, corrected, pynvml.NVML_VOLATILE_ECC, dram
    )
    assert counter == 12
    assert pynvml.nvmlDeviceGetRemappedRows(handle) == (1, 0, 0, 0)
    nvml.gpus[5].ecc_volatile_uncorrected = 2  # a test may change the node while it runs
    nvml.gpus[5].remapped_rows_failure = True
    uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert pynvml.nvmlDeviceGetTotalEccErrors(handle, uncorrected, pynvml.NVML_VOLATILE_ECC) == 2
    assert pynvml.nvmlDeviceGetRemappedRows(handle) == (1, 0, 0, 1)


@scenario("old-driver")
def test_old_driver(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(3)
    missing: list[Callable[[], Any]] = [
        lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2),
        lambda: pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU),
        lambda: pynvml.nvmlDeviceGetRemappedRows(handle),
        lambda: pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle),
        lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
        lambda: pynvml.nvmlDeviceGetNumaNodeId(handle),
    ]
    for call in missing:
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            call()
    # pynvml's unversioned wrapper only calls _v3 and turns FunctionNotFound into an error that
    # is not an NVMLError at all
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)
    # the older entry points still work
    assert pynvml.nvmlDeviceGetMemoryInfo(handle).total == 32510 * 1024 * 1024
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 41
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle) == 0
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)
    assert [(p.pid, p.usedGpuMemory) for p in processes] == [(3100, 8100 * 1024 * 1024)]
    assert pynvml.nvmlDeviceGetRetiredPages(handle, 0) == [0x1A2B3000, 0x1A2B4000]
    pages = pynvml.nvmlDeviceGetRetiredPages_v2(handle, 0)
    assert [p["address"] for p in pages] == [0x1A2B3000, 0x1A2B4000]
    assert pynvml.nvmlDeviceGetRetiredPages(handle, 1) == []
    assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle) == 0
    values = field_values(
        handle,
        [
            pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
            pynvml.NVML_FI_DEV_RETIRED_SBE,
            pynvml.NVML_FI_DEV_REMAPPED_COR,
            pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
            pynvml.NVML_FI_DEV_POWER_INSTANT,
        ],
    )
    assert [v.nvmlReturn for v in values] == [
        pynvml.NVML_SUCCESS,
        pynvml.NVML_SUCCESS,
        pynvml.NVML_ERROR_NOT_SUPPORTED,  # Volta: no row remapper
        pynvml.NVML_ERROR_INVALID_ARGUMENT,  # field id newer than the driver
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
    ]
    assert [v.value.ullVal for v in values[:2]] == [133, 2]
    assert nvml.lookups["nvmlDeviceGetMemoryInfo_v2"] == 1
    assert "nvmlDeviceGetMemoryInfo_v2" not in nvml.calls


def test_missing_field_values_function() -> None:
    with install(Scenario(gpus=[GpuSpec()], missing_functions=["nvmlDeviceGetFieldValues"])):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])


def test_not_supported_by_field_name_or_function() -> None:
    spec = simple(not_supported=["NVML_FI_DEV_MEMORY_TEMP", "nvmlDeviceGetPowerUsage"])
    with install(spec):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        ids = [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
        assert [v.nvmlReturn for v in field_values(handle, ids)] == [
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            pynvml.NVML_SUCCESS,
        ]
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetPowerUsage(handle)
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) == 0


# ------------------------------------------------------------------ processes and MIG


@scenario("h100-sxm-8-nvswitch")
def test_running_processes_v3(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    (process,) = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert (process.pid, process.usedGpuMemory) == (4242, 60900 * 1024 * 1024)
    assert (process.gpuInstanceId, process.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2  # size query, then fetch
    assert pynvml.nvmlSystemGetProcessName(4242) == "python3"
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle) == []


def test_process_count_protocol_at_the_c_level() -> None:
    processes = [{"pid": p, "used_memory_mib": 1} for p in (1, 2, 3)]
    with install({"gpus": [{"processes": processes}]}) as fake:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        function = fake.nvmlDeviceGetComputeRunningProcesses_v3
        count = ctypes.c_uint(0)
        assert function(handle, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        assert count.value == 3
        infos = (pynvml.c_nvmlProcessInfo_v3_t * 2)()
        count.value = 2
        assert function(handle, ctypes.byref(count), infos) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        infos = (pynvml.c_nvmlProcessInfo_v3_t * 3)()
        assert function(handle, ctypes.byref(count), infos) == pynvml.NVML_SUCCESS
        assert [infos[i].pid for i in range(count.value)] == [1, 2, 3]


@scenario("a100-mig")
def test_mig_devices(nvml: FakeNvml) -> None:
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert pynvml.nvmlDeviceIsMigDeviceHandle(parent).value == 0  # pynvml returns the c_uint
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    found = []
    for index in range(7):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
        except pynvml.NVMLError_NotFound:
            continue
        assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
        back = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        assert address(back) == address(parent)
        uuid = pynvml.nvmlDeviceGetUUID(mig)
        assert uuid.startswith("MIG-")
        assert address(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == address(mig)
        found.append(
            (
                pynvml.nvmlDeviceGetName(mig),
                pynvml.nvmlDeviceGetGpuInstanceId(mig),
                pynvml.nvmlDeviceGetComputeInstanceId(mig),
                pynvml.nvmlDeviceGetMemoryInfo(mig, version=pynvml.nvmlMemory_v2).total >> 20,
                [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)],
                pynvml.nvmlDeviceGetAttributes(mig).gpuInstanceSliceCount,
            )
        )
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetPowerUsage(mig)
    assert found == [
        ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 2, 0, 40192, [5101], 3),
        ("NVIDIA A100-SXM4-80GB MIG 2g.20gb", 3, 0, 19968, [], 2),
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9, 0, 9728, [5202], 1),
    ]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 7)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(parent)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # MIG on: no whole-GPU utilization
        pynvml.nvmlDeviceGetUtilizationRates(parent)
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses(parent)
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in processes] == [
        (5101, 2, 0),
        (5202, 9, 0),
    ]
    assert nvml.handle_address(0, 2) == address(
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)
    )


@scenario("a100-8-nvlink-mesh")
def test_mig_capable_but_disabled(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(handle) == [0, 0]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 0
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)


# ------------------------------------------------------------------ NVLink topology


def nvlink_domains() -> list[list[int]]:
    """Connected components over NVLink, as the inventory computes them (via remote PCI)."""
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    index_of = {}
    for i, handle in enumerate(handles):
        pci = pynvml.nvmlDeviceGetPciInfo(handle)
        index_of[(pci.domain, pci.bus, pci.device)] = f"gpu{i}"
    edges: dict[str, set[str]] = {f"gpu{i}": set() for i in range(count)}
    for i, handle in enumerate(handles):
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
            except pynvml.NVMLError_InvalidArgument:
                break
            except pynvml.NVMLError_NotSupported:
                break
            remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            node = index_of.get((remote.domain, remote.bus, remote.device), f"sw:{remote.busId}")
            edges[f"gpu{i}"].add(node)
            edges.setdefault(node, set()).add(f"gpu{i}")
    seen: set[str] = set()
    domains = []
    for start in (f"gpu{i}" for i in range(count)):
        if start in seen or not edges[start]:
            continue
        stack, component = [start], set()
        while stack:
            node = stack.pop()
            if node not in component:
                component.add(node)
                stack.extend(edges[node])
        seen |= component
        domains.append(sorted(int(n[3:]) for n in component if n.startswith("gpu")))
    return domains


@scenario("h100-sxm-8-nvswitch")
def test_h100_links_end_at_nvswitches(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(3)
    switches = set()
    for link in range(18):
        assert pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_NVLINK_STATE_ACTIVE
        assert pynvml.nvmlDeviceGetNvLinkVersion(handle, link) == pynvml.NVML_NVLINK_VERSION_4_0
        kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        assert kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
        assert remote.pciDeviceId == 0x22A310DE
        switches.add(remote.busId)
    assert switches == set(nvml.scenario.nvswitches)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(handle, 18)
    assert nvlink_domains() == [list(range(8))]
    h5 = pynvml.nvmlDeviceGetHandleByIndex(5)
    crc = pynvml.nvmlDeviceGetNvLinkErrorCounter(h5, 7, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
    replay = pynvml.nvmlDeviceGetNvLinkErrorCounter(h5, 7, pynvml.NVML_NVLINK_ERROR_DL_REPLAY)
    assert (crc, replay) == (3, 1)
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(h5, 6, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 0


@scenario("a100-8-nvlink-mesh")
def test_a100_two_full_meshes(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(5)
    kinds = {pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link) for link in range(12)}
    assert kinds == {pynvml.NVML_NVLINK_DEVICE_TYPE_GPU}
    assert nvlink_domains() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    nvml.gpus[5].nvlink_down = [0, 1, 2, 3]  # the 4 links to GPU 4 go down
    assert pynvml.nvmlDeviceGetNvLinkState(handle, 0) == pynvml.NVML_NVLINK_STATE_INACTIVE
    throughput = field_values(handle, [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)])
    assert throughput[0].value.ullVal == 0


@scenario("mixed-busid")
def test_mixed_bus_id_spellings(nvml: FakeNvml) -> None:
    bus_ids = [
        pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).busId for i in range(4)
    ]
    assert bus_ids == ["00000000:1B:00.0", "0000:3b:00.0", "0000:86:00.0", "0001:af:00.0"]
    third = pynvml.nvmlDeviceGetHandleByIndex(3)
    assert pynvml.nvmlDeviceGetPciInfo(third).domain == 1
    for spelling in ("00000001:AF:00.0", "1:af:0.0", "0001:AF:00"):
        assert address(pynvml.nvmlDeviceGetHandleByPciBusId(spelling)) == address(third)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByPciBusId("0000:af:00.0")  # domain 0: not that GPU
    remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    assert remote.busId == "0000:3b:00.0"  # the peer's spelling, verbatim
    assert remote.busIdLegacy == "0000:3B:00.0"
    assert nvlink_domains() == [[0, 1], [2, 3]]


# ------------------------------------------------------------------ faults: lost GPU, errors


@scenario("gpu-lost")
def test_gpu_lost_after_n_calls(nvml: FakeNvml) -> None:
    good = pynvml.nvmlDeviceGetHandleByIndex(0)
    doomed = pynvml.nvmlDeviceGetHandleByIndex(1)  # call 1 on GPU 1
    for _ in range(19):  # calls 2..20
        pynvml.nvmlDeviceGetPowerUsage(doomed)
    calls: list[Callable[[], Any]] = [
        lambda: pynvml.nvmlDeviceGetPowerUsage(doomed),
        lambda: pynvml.nvmlDeviceGetUUID(doomed),
        lambda: pynvml.nvmlDeviceGetFieldValues(doomed, [pynvml.NVML_FI_DEV_MEMORY_TEMP]),
        lambda: pynvml.nvmlDeviceGetHandleByIndex(1),
    ]
    for call in calls:
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    assert pynvml.nvmlDeviceGetCount() == 2  # still enumerated
    assert pynvml.nvmlDeviceGetPowerUsage(good) == 95000
    nvml.recover_gpu(1)
    assert pynvml.nvmlDeviceGetPowerUsage(doomed) == 95000
    nvml.lose_gpu(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(good)


def test_gpu_recovers_after_calls() -> None:
    with install(simple(lost_after_calls=1, recover_after_calls=2)):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)  # call 1
        outcomes = []
        for _ in range(4):
            try:
                pynvml.nvmlDeviceGetPowerUsage(handle)
                outcomes.append("ok")
            except pynvml.NVMLError_GpuIsLost:
                outcomes.append("lost")
        assert outcomes == ["lost", "lost", "ok", "ok"]


def test_injected_faults_and_unknown_error_every() -> None:
    with install(Scenario(gpus=[GpuSpec(), GpuSpec()], unknown_error_every=3)) as fake:
        pynvml.nvmlInit()
        h0 = pynvml.nvmlDeviceGetHandleByIndex(0)  # device call 1
        h1 = pynvml.nvmlDeviceGetHandleByIndex(1)  # 2
        with pytest.raises(pynvml.NVMLError_Unknown):
            pynvml.nvmlDeviceGetPowerUsage(h0)  # 3
        fake.scenario.unknown_error_every = 0
        fake.fail("nvmlDeviceGetPowerUsage", "TIMEOUT", gpu=1, times=1)
        assert pynvml.nvmlDeviceGetPowerUsage(h0) == 70000
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlDeviceGetPowerUsage(h1)
        assert pynvml.nvmlDeviceGetPowerUsage(h1) == 70000  # only once
        fake.fail("nvmlSystemGetDriverVersion", "NVML_ERROR_LIB_RM_VERSION_MISMATCH")
        with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
            pynvml.nvmlSystemGetDriverVersion()
        fake.clear_faults()
        assert pynvml.nvmlSystemGetDriverVersion() == "550.90.07"


# ------------------------------------------------------------------ events


def registered_set(gpus: range, mask: int) -> Any:
    event_set = pynvml.nvmlEventSetCreate()
    for i in gpus:
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(i), mask, event_set)
    return event_set


@scenario("h100-sxm-8-nvswitch")
def test_event_wait_times_out_then_gets_injected_xid(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
    assert supported & pynvml.nvmlEventTypeXidCriticalError
    event_set = registered_set(range(8), pynvml.nvmlEventTypeXidCriticalError)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 20)
    assert nvml.inject_event(2, "dbe") == 0  # nobody registered for DBE
    assert nvml.inject_xid(2, 94) == 1
    data = pynvml.nvmlEventSetWait_v2(event_set, 0)
    assert data.eventType == pynvml.nvmlEventTypeXidCriticalError
    assert data.eventData == 94
    assert address(data.device) == address(handle)
    assert pynvml.nvmlDeviceGetUUID(data.device) == pynvml.nvmlDeviceGetUUID(handle)
    assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    pynvml.nvmlEventSetFree(event_set)


@scenario("h100-sxm-8-nvswitch")
def test_event_wait_blocks_until_an_event_arrives(nvml: FakeNvml) -> None:
    event_set = registered_set(range(1), pynvml.nvmlEventTypeXidCriticalError)
    received: list[int] = []
    waiting = threading.Event()

    def waiter() -> None:
        waiting.set()
        received.append(pynvml.nvmlEventSetWait_v2(event_set, 10_000).eventData)

    thread = threading.Thread(target=waiter)
    thread.start()
    waiting.wait()
    pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(0))  # not blocked by it
    nvml.inject_xid(0, 31)
    thread.join(timeout=10)
    assert received == [31]


def test_closing_the_fake_wakes_a_waiter() -> None:
    outcome: list[type[BaseException]] = []
    with install(None):
        pynvml.nvmlInit()
        event_set = registered_set(range(1), pynvml.nvmlEventTypeXidCriticalError)
        started = threading.Event()

        def waiter() -> None:
            started.set()
            try:
                pynvml.nvmlEventSetWait_v2(event_set, 60_000)
            except pynvml.NVMLError as e:
                outcome.append(type(e))

        thread = threading.Thread(target=waiter)
        thread.start()
        started.wait()
    thread.join(timeout=10)
    assert outcome == [pynvml.NVMLError_Uninitialized]


@scenario("xid-events")
def test_scripted_events_follow_the_fake_clock(nvml: FakeNvml) -> None:
    mask = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
    event_set = registered_set(range(2), mask)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 10)  # t = 0: nothing due yet
    nvml.advance(0.25)
    received = []
    for _ in range(3):
        data = pynvml.nvmlEventSetWait_v2(event_set, 10)
        gpu = 0 if address(data.device) == nvml.handle_address(0) else 1
        received.append((gpu, data.eventType, data.eventData))
    assert received == [
        (0, pynvml.nvmlEventTypeXidCriticalError, 13),
        (1, pynvml.nvmlEventTypeXidCriticalError, 48),
        (1, pynvml.nvmlEventTypeDoubleBitEccError, 0),
    ]
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 10)
    gpu1 = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetPowerUsage(gpu1) == 120000
    nvml.advance(0.3)
    data = pynvml.nvmlEventSetWait_v2(event_set, 10)
    assert data.eventData == 79
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(gpu1)
    # a set registered late still gets the scripted events once
    late = registered_set(range(1), pynvml.nvmlEventTypeXidCriticalError)
    assert pynvml.nvmlEventSetWait_v2(late, 10).eventData == 13


def test_scripted_event_wakes_a_waiter_when_the_clock_advances() -> None:
    spec = Scenario.from_dict(
        {"gpus": [{}], "events": [{"after_s": 5.0, "gpu": 0, "type": "xid", "code": 45}]}
    )
    with install(spec) as fake:
        pynvml.nvmlInit()
        event_set = registered_set(range(1), pynvml.nvmlEventTypeXidCriticalError)
        received: list[int] = []
        started = threading.Event()

        def waiter() -> None:
            started.set()
            received.append(pynvml.nvmlEventSetWait_v2(event_set, 10_000).eventData)

        thread = threading.Thread(target=waiter)
        thread.start()
        started.wait()
        fake.advance(5.0)
        thread.join(timeout=10)
        assert received == [45]


def test_registering_unsupported_events() -> None:
    with install(simple(supported_event_types=pynvml.nvmlEventTypeXidCriticalError)):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        event_set = pynvml.nvmlEventSetCreate()
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeAll, event_set)
        pynvml.nvmlEventSetFree(event_set)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlEventSetWait_v2(event_set, 0)


def test_public_api() -> None:
    assert sorted(fake_nvml.__all__) == [
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
