"""Which of our devices a workload manager's device id names.

Device plugins and job mapping files name devices in their own ways; :class:`DeviceMatcher`
maps each to the ``DeviceInfo.id`` of the inventory (an empty tuple when it names none):

=================================  ===============================================================
id                                 device
=================================  ===============================================================
``GPU-8f3c…``, ``MIG-…``, any id   the device with that id (GPU, MIG instance, AMD/Intel UUID)
``GPU-8f3c…::2``                   time-sliced replica 2 of ``GPU-8f3c…`` (NVIDIA device plugin)
``MIG-GPU-8f3c…/1/0``              MIG instance with GPU instance 1 on ``GPU-8f3c…`` (old form)
``nvidia0``, ``nvidia0/vgpu1``     NVIDIA GPU 0 (GKE), ``nvidia0/gi2`` its GPU instance 2
``0000:1b:00.0``                   the device at that PCI address (AMD's device plugin)
``card1``, ``card1-0``             DRM card 1 (Intel's device plugin; ``-0`` is a shared replica),
                                   found through ``<root>/sys/class/drm/card1/device``
``0``, ``1``                       the vendor's GPU with that index (only for accelerator
                                   resources: ``nvidia.com/…``, ``amd.com/…``, ``gpu.intel.com/…``)
``0:1``                            MIG device 1 of GPU 0 (NVIDIA device plugin, index strategy):
                                   the GPU's second MIG instance in inventory order
=================================  ===============================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from otel_gpu.hal.model import DeviceInfo, Inventory, normalize_pci_bus_id

__all__ = ["ACCELERATOR_RESOURCES", "DeviceMatcher", "resource_vendor"]

#: Extended-resource name prefixes of accelerator device plugins, and the vendor they stand for.
ACCELERATOR_RESOURCES: Mapping[str, str] = {
    "nvidia.com/": "nvidia",
    "amd.com/": "amd",
    "gpu.intel.com/": "intel",
    "google.com/tpu": "tpu",
    "aws.amazon.com/neuron": "neuron",
}

_OLD_MIG = re.compile(r"^MIG-(?P<parent>GPU-[0-9a-fA-F-]+)/(?P<gi>\d+)/(?P<ci>\d+)$")
_GKE = re.compile(r"^nvidia(?P<index>\d+)(?:/gi(?P<gi>\d+))?(?:/vgpu\d+)?$")
_CARD = re.compile(r"^card(?P<card>\d+)(?:-\d+)?$")
_INDEXED_MIG = re.compile(r"^(?P<gpu>\d+):(?P<mig>\d+)$")


def resource_vendor(resource_name: str) -> str | None:
    """The vendor of an accelerator resource (``nvidia.com/gpu`` -> ``nvidia``), else ``None``."""
    for prefix, vendor in ACCELERATOR_RESOURCES.items():
        if resource_name.startswith(prefix):
            return vendor
    return None


class DeviceMatcher:
    """Resolves device ids of workload managers against one inventory.

    ``root`` is where ``/sys/class/drm`` is read (DRM card names of Intel's plug-in).
    """

    def __init__(self, inventory: Inventory, root: Path = Path("/")) -> None:
        self.inventory = inventory
        self._root = root
        self._by_id = {d.id: d for d in inventory.devices}
        self._by_lower_id = {d.id.lower(): d for d in inventory.devices}
        self._by_pci: dict[str, DeviceInfo] = {}
        for dev in inventory.devices:
            if dev.parent_id is None and dev.pci_bus_id:
                try:
                    self._by_pci.setdefault(normalize_pci_bus_id(dev.pci_bus_id), dev)
                except ValueError:
                    continue
        self._cards: dict[int, str | None] = {}

    def match(self, device_id: str, resource_name: str = "") -> tuple[str, ...]:
        """The inventory ids ``device_id`` names (empty when none)."""
        raw = device_id.strip()
        if not raw:
            return ()
        exact = self._by_id.get(raw) or self._by_lower_id.get(raw.lower())
        if exact is not None:
            return (exact.id,)
        if "::" in raw:  # NVIDIA device plugin time-slicing / MPS replica
            return self.match(raw.split("::", 1)[0], resource_name)
        old_mig = _OLD_MIG.match(raw)
        if old_mig:
            return self._mig(old_mig.group("parent"), old_mig.group("gi"))
        try:
            pci = normalize_pci_bus_id(raw)
        except ValueError:
            pci = None
        if pci is not None:
            dev = self._by_pci.get(pci)
            return (dev.id,) if dev is not None else ()
        vendor = resource_vendor(resource_name)
        if vendor is None:
            return ()
        gke = _GKE.match(raw)
        if gke and vendor == "nvidia":
            gpu = self._indexed("nvidia", int(gke.group("index")))
            if gpu is None:
                return ()
            if gke.group("gi") is not None:
                return self._mig(gpu, gke.group("gi"))
            return (gpu,)
        card = _CARD.match(raw)
        if card:
            found = self._card(int(card.group("card")))
            return (found,) if found is not None else ()
        if raw.isdecimal():
            found = self._indexed(vendor, int(raw))
            return (found,) if found is not None else ()
        indexed_mig = _INDEXED_MIG.match(raw)
        if indexed_mig:
            gpu = self._indexed(vendor, int(indexed_mig.group("gpu")))
            instances = [d.id for d in self.inventory.devices if gpu and d.parent_id == gpu]
            n = int(indexed_mig.group("mig"))
            return (instances[n],) if n < len(instances) else ()
        return ()

    def physical(self, index: int) -> str | None:
        """The id of the physical device with vendor-local index ``index`` (any vendor)."""
        return self._indexed(None, index)

    def _indexed(self, vendor: str | None, index: int) -> str | None:
        physical = [d for d in self.inventory.devices if d.parent_id is None]
        own = [d for d in physical if vendor is None or d.vendor == vendor] or physical
        for dev in own:
            local = dev.index if dev.local_index is None else dev.local_index
            if local == index:
                return dev.id
        return None

    def _mig(self, parent_id: str, gpu_instance: str) -> tuple[str, ...]:
        for dev in self.inventory.devices:
            if (
                dev.parent_id is not None
                and dev.parent_id.lower() == parent_id.lower()
                and dev.extra.get("mig.gpu_instance_id") == gpu_instance
            ):
                return (dev.id,)
        return ()

    def _card(self, card: int) -> str | None:
        if card not in self._cards:
            self._cards[card] = None
            link = self._root / "sys" / "class" / "drm" / f"card{card}" / "device"
            try:
                target = os.readlink(link)
            except OSError:
                target = None
            if target is not None:
                try:
                    dev = self._by_pci.get(normalize_pci_bus_id(Path(target).name))
                except ValueError:
                    dev = None
                self._cards[card] = dev.id if dev is not None else None
        return self._cards[card]
