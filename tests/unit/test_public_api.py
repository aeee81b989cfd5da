"""The public surface, pinned: a change here is a change users see (STYLE 1)."""

from __future__ import annotations

import importlib
import inspect

import pytest

PUBLIC = {
    "otel_gpu": [
        "BackendUnavailable",
        "ConfigError",
        "DeviceLost",
        "DeviceManager",
        "GpuTelemetry",
        "NotSupported",
        "OtelGpuError",
        "UnknownBackend",
        "__version__",
    ],
    "otel_gpu.hal": [
        "Backend",
        "BackendFactory",
        "BackendStatus",
        "ClockDomain",
        "DeviceFailure",
        "DeviceFilter",
        "DeviceInfo",
        "DeviceManager",
        "DeviceSample",
        "EventSink",
        "EventSource",
        "HealthEvent",
        "HealthState",
        "Inventory",
        "LinkInfo",
        "LinkSample",
        "Probe",
        "ProcessSample",
        "Registry",
        "Selector",
        "Severity",
        "Snapshot",
        "VendorValue",
        "interconnect_domains",
        "normalize_pci_bus_id",
        "parse_selectors",
        "probe_all",
    ],
    "otel_gpu.otel": [
        "EXPORTER_CHOICES",
        "METRICS",
        "EventLogger",
        "GpuTelemetry",
        "Instrument",
        "MetricSpec",
        "Providers",
        "SnapshotCache",
        "build_providers",
        "build_resource",
        "device_attributes",
        "host_attributes",
        "topology_attributes",
    ],
    "otel_gpu.health": [
        "CATALOG",
        "XID_CLASSES",
        "EventSpec",
        "Finding",
        "HealthMonitor",
        "HealthThresholds",
        "XidClass",
        "classify",
        "worst_state",
    ],
    "otel_gpu.errors": [
        "BackendUnavailable",
        "ConfigError",
        "DeviceLost",
        "NotSupported",
        "OtelGpuError",
        "UnknownBackend",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in mod.__all__:
        assert getattr(mod, name) is not None, name


def test_error_tree() -> None:
    from otel_gpu import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.OtelGpuError)
    assert issubclass(errors.UnknownBackend, errors.ConfigError)


def test_public_callables_have_docstrings() -> None:
    for module in PUBLIC:
        mod = importlib.import_module(module)
        for name in mod.__all__:
            obj = getattr(mod, name)
            # Type aliases (EventSink = Callable[...]) carry no docstring of their own.
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert obj.__doc__, f"{module}.{name} has no docstring"
