"""Health: the event catalog, Xid classes and the edge-triggered checks over HAL snapshots.

Vendor neutral: every check reads the normalized model, so AMD, Intel, TPU and Neuron devices
get them wherever their backend supplies the data.
"""

from otel_gpu.health.catalog import CATALOG, EventSpec
from otel_gpu.health.monitor import Finding, HealthMonitor, HealthThresholds, worst_state
from otel_gpu.health.xid import XID_CLASSES, XidClass, classify

__all__ = [
    "CATALOG",
    "XID_CLASSES",
    "EventSpec",
    "Finding",
    "HealthMonitor",
    "HealthThresholds",
    "XidClass",
    "classify",
    "worst_state",
]
