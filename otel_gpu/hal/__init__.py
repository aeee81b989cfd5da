"""Hardware abstraction layer: the model, the Backend protocol, the registry and the manager.

Imports nothing vendor-specific.
"""

from otel_gpu.hal.manager import BackendStatus, DeviceFilter, DeviceManager, probe_all
from otel_gpu.hal.model import (
    ClockDomain,
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
    VendorValue,
    interconnect_domains,
    normalize_pci_bus_id,
)
from otel_gpu.hal.protocol import Backend, BackendFactory, EventSink, EventSource, Probe
from otel_gpu.hal.registry import Registry, Selector, parse_selectors

__all__ = [
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
]
