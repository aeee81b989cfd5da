"""Process scope: the devices and processes that belong to *this* process (``OTEL_GPU_SCOPE``).

A training job started under ``opentelemetry-instrument`` usually owns a few devices of the
node. With ``OTEL_GPU_SCOPE=process`` the plug-in reports only the devices the vendor runtimes
let this process see, and per-process memory only for this process and its children:

=========  ===================================================================================
vendor     variables, applied in order (each one selects among what the previous one left)
=========  ===================================================================================
nvidia     ``CUDA_VISIBLE_DEVICES``
amd        ``ROCR_VISIBLE_DEVICES``, then ``HIP_VISIBLE_DEVICES``
intel      ``ZE_AFFINITY_MASK`` (the device part of ``device.subdevice``)
tpu        ``TPU_VISIBLE_CHIPS``
=========  ===================================================================================

Entries are indices (the vendor's own enumeration, which is PCI bus order: set
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA agrees) or device ids and unique id prefixes
(``GPU-8f3c``, ``MIG-…``). As the runtimes do, the list ends at the first entry that names no
device (``CUDA_VISIBLE_DEVICES=0,-1,2`` is device 0 only), and an empty value hides every device
of that vendor. A variable that is unset leaves that vendor's devices alone. Naming a MIG
instance keeps the instance and its parent GPU (whose power and temperature it shares).

Inside a container NVML reports host PIDs, which never match the container's own: the
per-process series is then empty, while the device series are unaffected.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from otel_gpu.hal.manager import DeviceFilter
from otel_gpu.hal.model import DeviceInfo

__all__ = ["VISIBILITY_VARIABLES", "VisibleDevices", "own_pids", "visible_devices"]

#: Per vendor, the visibility variables its runtimes read, outermost first.
VISIBILITY_VARIABLES: Mapping[str, tuple[str, ...]] = {
    "nvidia": ("CUDA_VISIBLE_DEVICES",),
    "amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
    "intel": ("ZE_AFFINITY_MASK",),
    "tpu": ("TPU_VISIBLE_CHIPS",),
}


@dataclasses.dataclass(frozen=True, slots=True)
class VisibleDevices(DeviceFilter):
    """A :class:`DeviceFilter` that also applies the vendors' visibility variables.

    ``base`` is the ``OTEL_GPU_DEVICES`` selection (``None``: every device); ``visible`` maps a
    vendor to the raw values of its variables, in order (see :data:`VISIBILITY_VARIABLES`).
    """

    base: DeviceFilter | None = None
    visible: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def keeps(self, device: DeviceInfo, parents: dict[str, DeviceInfo]) -> bool:
        """Whether ``device`` is selected by ``base`` and visible to this process."""
        if self.base is not None and not self.base.keeps(device, parents):
            return False
        values = dict(self.visible).get(device.vendor)
        if values is None:
            return True
        physical, instances = _select(device.vendor, values, parents.values())
        if device.parent_id is None:
            return device.id in physical or any(
                parents[i].parent_id == device.id for i in instances if i in parents
            )
        return device.id in instances or device.parent_id in physical


def visible_devices(
    base: DeviceFilter | None = None, env: Mapping[str, str] | None = None
) -> VisibleDevices:
    """The process-scope filter for ``env`` (default ``os.environ``) on top of ``base``."""
    env = os.environ if env is None else env
    visible = tuple(
        (vendor, tuple(env[name] for name in names if name in env))
        for vendor, names in VISIBILITY_VARIABLES.items()
        if any(name in env for name in names)
    )
    return VisibleDevices(base=base, visible=visible)


def _select(
    vendor: str, values: tuple[str, ...], devices: Iterable[DeviceInfo]
) -> tuple[set[str], set[str]]:
    """Apply each value of ``values`` in turn; return (physical ids, MIG/partition ids)."""
    mine = [d for d in devices if d.vendor == vendor]
    current = sorted(
        (d for d in mine if d.parent_id is None),
        key=lambda d: (d.index if d.local_index is None else d.local_index, d.index),
    )
    children = [d for d in mine if d.parent_id is not None]
    instances: set[str] = set()
    for value in values:
        chosen: list[DeviceInfo] = []
        instances = set()
        for raw in value.split(","):
            entry = raw.strip()
            if vendor == "intel":
                entry = entry.partition(".")[0]
            if entry.isdecimal():
                index = int(entry)
                if index >= len(current):
                    break
                chosen.append(current[index])
                continue
            match = _by_prefix(entry, current)
            if match is not None:
                chosen.append(match)
                continue
            child = _by_prefix(entry, children)
            if child is None:
                break  # an invalid entry ends the list, as in the vendor runtimes
            instances.add(child.id)
        current = list({d.id: d for d in chosen}.values())
    return {d.id for d in current}, instances


def _by_prefix(entry: str, devices: list[DeviceInfo]) -> DeviceInfo | None:
    if not entry or entry.startswith("-"):
        return None
    low = entry.lower()
    found = [d for d in devices if d.id.lower().startswith(low)]
    return found[0] if len(found) == 1 else None


def own_pids(root: Path = Path("/"), pid: int | None = None) -> frozenset[int]:
    """This process's pid and those of its descendants, read from ``<root>/proc``.

    Uses ``/proc/<pid>/task/<tid>/children``; where that is unreadable, only ``pid`` itself.
    """
    start = os.getpid() if pid is None else pid
    found = {start}
    todo = [start]
    while todo:
        current = todo.pop()
        try:
            tasks = list((root / "proc" / str(current) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                text = (task / "children").read_text(encoding="ascii")
            except (OSError, UnicodeDecodeError):
                continue
            for word in text.split():
                if word.isdecimal() and int(word) not in found:
                    found.add(int(word))
                    todo.append(int(word))
    return frozenset(found)
