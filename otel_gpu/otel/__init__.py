"""The OpenTelemetry bridge: the only package that imports ``opentelemetry``."""

from otel_gpu.otel.bridge import EventLogger, GpuTelemetry, SnapshotCache, device_attributes
from otel_gpu.otel.metrics import METRICS, Instrument, MetricSpec
from otel_gpu.otel.resource import build_resource, host_attributes, topology_attributes

__all__ = [
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
]


def __getattr__(name: str) -> object:
    # providers imports the SDK's logs module, whose import runs the resource detectors
    # (ours included): load it on first use only.
    if name in ("EXPORTER_CHOICES", "Providers", "build_providers"):
        from otel_gpu.otel import providers

        return getattr(providers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
