"""The Resource: the host, and the node's accelerator topology under ``accel.*`` (DESIGN §5)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import AttributeValue

from otel_gpu.hal.model import Inventory, interconnect_domains

__all__ = ["build_resource", "host_attributes", "topology_attributes"]

DEFAULT_SERVICE_NAME = "otel-gpu"


def topology_attributes(inventory: Inventory) -> dict[str, AttributeValue]:
    """Topology attributes: device count, vendors, versions and parallel per-device arrays.

    Arrays are in node-wide device index order; an unknown NUMA node is ``-1`` and an unknown
    PCI address ``""`` (OTel arrays cannot hold nulls). ``accel.interconnect.domains`` lists
    each NVLink/xGMI connected component as ``"0,1,2,3"``.
    """
    devices = inventory.devices
    attrs: dict[str, AttributeValue] = {
        "accel.device.count": len(devices),
        "accel.vendors": list(inventory.vendors),
        "accel.device.ids": [d.id for d in devices],
        "accel.device.models": [d.model for d in devices],
        "accel.device.pci_bus_ids": [d.pci_bus_id or "" for d in devices],
        "accel.device.numa_nodes": [-1 if d.numa_node is None else d.numa_node for d in devices],
        "accel.interconnect.domains": [
            ",".join(str(i) for i in group) for group in interconnect_domains(devices)
        ],
    }
    for key, value in sorted(inventory.versions.items()):
        attrs[f"accel.{key}.version"] = value
    return attrs


def host_attributes(root: Path | None = None) -> dict[str, AttributeValue]:
    """``host.name`` and, where readable, ``host.id`` (the machine id).

    The machine id is read under ``root`` (default ``OTEL_GPU_HOST_ROOT``, else ``/``): in a
    container, mount the host's ``/`` and point that variable at it, or the id would be the
    image's. In Kubernetes the hostname is the pod's: set ``host.name`` through
    ``OTEL_RESOURCE_ATTRIBUTES`` (the shipped manifests do), which wins over it.
    """
    if root is None:
        root = Path(os.environ.get("OTEL_GPU_HOST_ROOT") or "/")
    attrs: dict[str, AttributeValue] = {"host.name": socket.gethostname()}
    for candidate in ("etc/machine-id", "var/lib/dbus/machine-id"):
        try:
            machine_id = (root / candidate).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if machine_id:
            attrs["host.id"] = machine_id
            break
    return attrs


def build_resource(inventory: Inventory) -> Resource:
    """The agent's Resource: SDK defaults + ``OTEL_RESOURCE_ATTRIBUTES``/``OTEL_SERVICE_NAME``,
    host identity and topology. Values from the environment win over ours, except topology.
    """
    env = Resource.create({})
    attrs: dict[str, AttributeValue] = {**host_attributes(), **env.attributes}
    service = str(attrs.get("service.name", ""))
    if not service or service.startswith("unknown_service"):
        attrs["service.name"] = DEFAULT_SERVICE_NAME
    attrs.update(topology_attributes(inventory))
    return Resource(attrs, env.schema_url)
