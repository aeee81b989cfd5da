"""TPU chips as sysfs shows them: PCI functions of vendor ``0x1ae0`` (Google) with a TPU device id.

The device-id table is tpu-info's (``tpu_info/device.py``): v2 and v3 share ``0x0027`` and
differ by subsystem id. Other Google PCI functions (the gVNIC network card is ``0x1ae0:0x0042``)
are not TPUs and are skipped. Each chip's device node is ``/dev/accel<N>`` (v2-v4) or
``/dev/vfio/<group>`` (v5e and later, bound to vfio-pci): the IOMMU group when sysfs names it,
else the chip's position, as tpu-info assumes. Every path is read below ``root`` (tests use a
checked-in tree); nothing here raises on a missing or unreadable file.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from otel_gpu.hal.model import normalize_pci_bus_id

__all__ = ["CHIP_TYPES", "GOOGLE_PCI_VENDOR", "ChipType", "TpuChip", "discover", "pcie_link"]

GOOGLE_PCI_VENDOR = 0x1AE0
_PCI_DEVICES = "sys/bus/pci/devices"
_GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class ChipType:
    """A TPU generation: ``model`` is JAX's ``device_kind`` (what ``jax.devices()`` shows)."""

    generation: str
    model: str
    hbm_gib: int
    cores_per_chip: int
    device_node: str  # "accel" or "vfio"

    @property
    def hbm_bytes(self) -> int:
        """HBM per chip, in bytes (the data-sheet figure; the runtime reports slightly less)."""
        return self.hbm_gib * _GIB


_V2 = ChipType("v2", "TPU v2", 8, 2, "accel")
_V3 = ChipType("v3", "TPU v3", 16, 2, "accel")
CHIP_TYPES: dict[int, ChipType] = {
    0x005E: ChipType("v4", "TPU v4", 32, 1, "accel"),
    0x0063: ChipType("v5e", "TPU v5 lite", 16, 1, "vfio"),
    0x0062: ChipType("v5p", "TPU v5", 95, 1, "vfio"),
    0x006F: ChipType("v6e", "TPU v6 lite", 32, 1, "vfio"),
    0x0076: ChipType("v7x", "TPU7x", 192, 2, "vfio"),
}
"""PCI device id -> chip type (v2/v3 are told apart by subsystem id, see :func:`chip_type`)."""


@dataclass(frozen=True, slots=True)
class TpuChip:
    """One TPU chip found in sysfs."""

    pci_bus_id: str
    type: ChipType
    numa_node: int | None
    cpu_affinity: str | None
    device_path: str | None
    pcie_max_generation: int | None
    pcie_max_width: int | None


def chip_type(device_id: int, subsystem_id: int | None) -> ChipType | None:
    """The TPU generation of a Google PCI function, or None when it is not a TPU."""
    if device_id == 0x0027:
        return {0x004E: _V2, 0x004F: _V3}.get(subsystem_id or -1)
    return CHIP_TYPES.get(device_id)


def discover(root: Path) -> list[TpuChip]:
    """Every TPU chip under ``root``, in PCI address order (taken as libtpu's device order)."""
    base = root / _PCI_DEVICES
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    found: list[tuple[str, Path, ChipType]] = []
    for entry in entries:
        if _hex(entry / "vendor") != GOOGLE_PCI_VENDOR:
            continue
        device_id = _hex(entry / "device")
        kind = chip_type(device_id, _hex(entry / "subsystem_device")) if device_id else None
        if kind is None:
            continue
        try:
            bus = normalize_pci_bus_id(entry.name)
        except ValueError:
            continue
        found.append((bus, entry, kind))
    found.sort()
    chips: list[TpuChip] = []
    for position, (bus, entry, kind) in enumerate(found):
        numa = _int(entry / "numa_node")
        chips.append(
            TpuChip(
                pci_bus_id=bus,
                type=kind,
                numa_node=numa if numa is not None and numa >= 0 else None,
                cpu_affinity=_text(entry / "local_cpulist"),
                device_path=_device_path(root, entry, kind, position),
                pcie_max_generation=_generation(_text(entry / "max_link_speed")),
                pcie_max_width=_width(_text(entry / "max_link_width")),
            )
        )
    return chips


def pcie_link(root: Path, pci_bus_id: str) -> tuple[int | None, int | None] | None:
    """Current PCIe ``(generation, width)`` of a chip; None when its PCI device is gone."""
    entry = root / _PCI_DEVICES / pci_bus_id
    if not entry.is_dir():
        return None
    return (
        _generation(_text(entry / "current_link_speed")),
        _width(_text(entry / "current_link_width")),
    )


def _device_path(root: Path, entry: Path, kind: ChipType, position: int) -> str | None:
    """The chip's /dev node (as seen on the host, without ``root``), if it exists."""
    candidates: list[str] = []
    if kind.device_node == "vfio":
        with contextlib.suppress(OSError):
            candidates.append(f"dev/vfio/{os.path.basename(os.readlink(entry / 'iommu_group'))}")
        candidates.append(f"dev/vfio/{position}")
    else:
        with contextlib.suppress(OSError):
            candidates.extend(f"dev/{p.name}" for p in sorted((entry / "accel").iterdir()))
        candidates.append(f"dev/accel{position}")
    for candidate in candidates:
        if (root / candidate).exists():
            return "/" + candidate
    return None


_SPEED_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_SPEED_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")


def _generation(speed: str | None) -> int | None:
    """``"16.0 GT/s PCIe"`` -> 4; None for ``"Unknown"`` or anything else."""
    m = _SPEED_RE.match(speed or "")
    return _SPEED_TO_GEN.get(float(m.group(1))) if m else None


def _width(text: str | None) -> int | None:
    try:
        width = int(text or "")
    except ValueError:
        return None
    return width if width > 0 else None


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip() or None
    except OSError:
        return None


def _hex(path: Path) -> int | None:
    text = _text(path)
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    try:
        return int(text) if text else None
    except ValueError:
        return None
