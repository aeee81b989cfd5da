"""The ``gpu`` resource detector: in-process, and through OTEL_EXPERIMENTAL_RESOURCE_DETECTORS in
a fresh interpreter (the way an application's SDK loads it)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.resources import Resource, get_aggregated_resources

from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.config import Settings
from otel_gpu.errors import BackendUnavailable, ConfigError
from otel_gpu.hal.manager import DeviceManager
from otel_gpu.hal.protocol import Probe
from otel_gpu.hal.registry import Registry
from otel_gpu.otel.detector import GpuResourceDetector
from otel_gpu.otel.resource import topology_attributes


def _expected(spec: str = "") -> dict[str, object]:
    with DeviceManager([SimulatedBackend(spec or None)]) as manager:
        attrs = topology_attributes(manager.inventory)
    return {k: list(v) if isinstance(v, tuple | list) else v for k, v in attrs.items()}


def _plain(resource: Resource) -> dict[str, object]:
    return {
        k: list(v) if isinstance(v, tuple | list) else v for k, v in resource.attributes.items()
    }


class _Unavailable:
    name = "nvml"
    auto = True

    def __init__(self, _options: str | None = None) -> None:
        pass

    def probe(self) -> Probe:
        return Probe(False, "libnvidia-ml.so.1 not found: install the NVIDIA driver")


def test_detects_the_topology_of_the_simulated_node() -> None:
    settings = Settings(backend="simulated")
    resource = GpuResourceDetector(settings=settings, registry=Registry()).detect()
    attrs = _plain(resource)
    assert attrs == _expected()
    assert attrs["accel.device.count"] == 8
    assert attrs["accel.device.pci_bus_ids"][0] == "0000:18:00.0"  # type: ignore[index]
    assert attrs["accel.interconnect.domains"] == ["0,1,2,3,4,5,6,7"]
    assert attrs["accel.nvidia.driver.version"] == "550.54.15"


def test_process_scope_describes_the_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    settings = Settings(backend="simulated", scope="process")
    attrs = _plain(GpuResourceDetector(settings=settings, registry=Registry()).detect())
    ids = _expected()["accel.device.ids"]
    assert attrs["accel.device.count"] == 2
    assert attrs["accel.device.ids"] == [ids[2], ids[5]]  # type: ignore[index]


def test_no_accelerator_gives_an_empty_resource(caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry(extra={"nvml": _Unavailable})  # type: ignore[dict-item]
    only_nvml = Registry.__new__(Registry)
    only_nvml._factories = {"nvml": registry.factory("nvml")}
    only_nvml._errors = {}
    with caplog.at_level(logging.DEBUG, "otel_gpu"):
        resource = GpuResourceDetector(settings=Settings(), registry=only_nvml).detect()
    assert resource.attributes == {}
    assert "no accelerator found" in caplog.text
    with pytest.raises(BackendUnavailable):
        GpuResourceDetector(True, settings=Settings(), registry=only_nvml).detect()


def test_explicit_backend_unavailable_warns_or_raises(caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry(extra={"nvml": _Unavailable})  # type: ignore[dict-item]
    settings = Settings(backend="nvml")
    assert GpuResourceDetector(settings=settings, registry=registry).detect().attributes == {}
    assert any(r.levelno == logging.WARNING for r in caplog.records)
    assert "install the NVIDIA driver" in caplog.text
    with pytest.raises(BackendUnavailable):
        GpuResourceDetector(raise_on_error=True, settings=settings, registry=registry).detect()


def test_bad_configuration_honours_raise_on_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_GPU_BACKEND", "simulated:count=0")
    assert GpuResourceDetector().detect().attributes == {}
    with pytest.raises(ConfigError):
        GpuResourceDetector(raise_on_error=True).detect()
    # through the SDK's aggregation, raise_on_error propagates and the default swallows
    assert get_aggregated_resources([GpuResourceDetector()], Resource.get_empty()).attributes == {}
    with pytest.raises(ConfigError):
        get_aggregated_resources([GpuResourceDetector(True)], Resource.get_empty())


def test_sdk_disabled_detects_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    settings = Settings(backend="simulated")
    assert GpuResourceDetector(settings=settings, registry=Registry()).detect().attributes == {}


def test_detection_is_done_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[int] = []
    original = DeviceManager.open

    def counting_open(self: DeviceManager) -> object:
        opened.append(1)
        return original(self)

    monkeypatch.setattr(DeviceManager, "open", counting_open)
    monkeypatch.setenv("OTEL_GPU_BACKEND", "simulated:seed=4242")
    first = GpuResourceDetector().detect()
    second = GpuResourceDetector().detect()
    assert first.attributes == second.attributes
    assert first.attributes["accel.device.count"] == 8
    assert len(opened) == 1


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra)
    return env


SCRIPT = """
import json, logging
logging.basicConfig(level=logging.WARNING)
from opentelemetry.sdk._logs import LoggerProvider  # builds a Resource while importing
from opentelemetry.sdk.resources import Resource
attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in Resource.create().attributes.items()}
print(json.dumps(attrs))
"""


def test_sdk_loads_the_detector_from_the_environment() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=_child_env(
            OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="gpu",
            OTEL_GPU_BACKEND="simulated",
            OTEL_SERVICE_NAME="trainer",
            OTEL_RESOURCE_ATTRIBUTES="deployment.environment.name=test",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    attrs = json.loads(proc.stdout)
    expected = _expected()
    assert {k: attrs[k] for k in expected} == expected
    assert attrs["service.name"] == "trainer"
    assert attrs["deployment.environment.name"] == "test"
    assert "Failed to load resource detector" not in proc.stderr, proc.stderr
    assert proc.stderr == ""


def test_topology_equals_otel_gpu_inventory() -> None:
    inventory = subprocess.run(
        [sys.executable, "-m", "otel_gpu", "inventory", "--json", "--backend", "simulated"],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(inventory.stdout)["resource"] == _expected()


def test_without_the_variable_the_detector_does_not_run() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=_child_env(OTEL_GPU_BACKEND="simulated"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert not any(k.startswith("accel.") for k in json.loads(proc.stdout))


def test_node_without_accelerators_is_silent() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=_child_env(
            OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="gpu",
            OTEL_GPU_BACKEND="auto",
            PATH="/nonexistent",  # no nvidia-smi either
            LD_LIBRARY_PATH="/nonexistent",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert not any(k.startswith("accel.") for k in json.loads(proc.stdout))
    assert proc.stderr == ""
