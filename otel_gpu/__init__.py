"""otel-gpu: accelerator telemetry for OpenTelemetry.

One agent and library for NVIDIA, AMD, Intel, Google TPU and AWS Neuron devices: utilization,
memory, power, energy, temperature, errors, topology and health, as OpenTelemetry metrics,
resource attributes and log records, pushed over OTLP or pulled by Prometheus.

Library use::

    from opentelemetry.sdk.metrics import MeterProvider
    from otel_gpu import DeviceManager, GpuTelemetry

    manager = DeviceManager.from_selector("simulated")
    telemetry = GpuTelemetry(manager, meter_provider)
    telemetry.start()
"""

__version__ = "0.1.0"

from otel_gpu.errors import (
    BackendUnavailable,
    ConfigError,
    DeviceLost,
    NotSupported,
    OtelGpuError,
    UnknownBackend,
)
from otel_gpu.hal.manager import DeviceManager
from otel_gpu.otel.bridge import GpuTelemetry

__all__ = [
    "BackendUnavailable",
    "ConfigError",
    "DeviceLost",
    "DeviceManager",
    "GpuTelemetry",
    "NotSupported",
    "OtelGpuError",
    "UnknownBackend",
    "__version__",
]
