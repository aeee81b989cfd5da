"""The normalized, vendor-neutral data model.

Static facts about a device (read once) live in :class:`DeviceInfo` inside an :class:`Inventory`;
everything read per collection lives in a :class:`DeviceSample` inside one :class:`Snapshot`.
Units are converted at the backend boundary and named in the field (``power_w``,
``memory_used_bytes``, ``utilization_ratio`` in 0..1). ``None`` means "not supported or not
available": never 0, never NaN. Cumulative counters (energy, errors, bytes) are absolute values
since an arbitrary origin (driver load, boot); the OTel SDK turns them into CUMULATIVE sums.

The model fits every vendor without protocol changes:

- NVIDIA: MIG instances are devices with ``parent_id``; NVLink links are :class:`LinkInfo`.
- AMD: xGMI links are :class:`LinkInfo` with ``link_type="xgmi"``; partitions are devices with
  ``parent_id``; gfx/umc/mm utilization map to ``utilization_ratio``,
  ``memory_bandwidth_utilization_ratio`` and ``engines``.
- Intel: engine groups (compute, copy, media, render) are ``engines``.
- TPU: TensorCore duty cycle is ``utilization_ratio``; ``kind="tpu"``.
- Neuron: a device is a Neuron device (``kind="neuron"``); per-NeuronCore utilization is in
  ``engines`` keyed ``"core0"``, ``"core1"``...
- Anything else a vendor has is a :class:`VendorValue` named in its own namespace
  (``nvidia.*``, ``amd.*``...).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "ClockDomain",
    "DeviceFailure",
    "DeviceInfo",
    "DeviceSample",
    "HealthEvent",
    "HealthState",
    "Inventory",
    "LinkInfo",
    "LinkSample",
    "ProcessSample",
    "Severity",
    "Snapshot",
    "VendorValue",
    "interconnect_domains",
    "normalize_pci_bus_id",
]

_EMPTY: Mapping[str, str] = MappingProxyType({})


def _frozen_mapping(value: Mapping[str, object] | None) -> Mapping[str, object]:
    return MappingProxyType(dict(value or {}))


_PCI_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})"
    r"\.(?P<fn>[0-7])$"
)


def normalize_pci_bus_id(bus_id: str) -> str:
    """Return ``bus_id`` in the canonical ``dddd:bb:dd.f`` lower-case form.

    NVML reports ``00000000:1B:00.0`` (8-digit domain, upper case), sysfs ``0000:1b:00.0``;
    both name the same device. A string that is not a PCI address raises ``ValueError``.
    """
    m = _PCI_RE.match(bus_id.strip())
    if not m:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain = int(m.group("domain") or "0", 16)
    if domain > 0xFFFF:
        raise ValueError(f"PCI domain out of range: {bus_id!r}")
    return (
        f"{domain:04x}:{int(m.group('bus'), 16):02x}:{int(m.group('dev'), 16):02x}"
        f".{int(m.group('fn'))}"
    )


class ClockDomain(str, enum.Enum):
    """Values of ``accel.clock.domain``."""

    GRAPHICS = "graphics"
    SM = "sm"
    MEMORY = "memory"
    VIDEO = "video"


class HealthState(str, enum.Enum):
    """Values of ``hw.state`` (OTel hardware semantic conventions)."""

    OK = "ok"
    DEGRADED = "degraded"
    FAILED = "failed"
    PREDICTED_FAILURE = "predicted_failure"


class Severity(enum.IntEnum):
    """Event severity, numbered as OTel ``SeverityNumber`` (INFO=9, WARN=13, ERROR=17, FATAL=21)."""

    INFO = 9
    WARN = 13
    ERROR = 17
    FATAL = 21


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """One interconnect link of a device (NVLink, xGMI, ICI...), as found at inventory time.

    ``remote_kind`` is ``"gpu"``, ``"switch"`` (NVSwitch), ``"cpu"`` or ``"unknown"``.
    ``remote_device_index`` is the peer's global device index when the peer is a device on
    this node. ``remote_id`` identifies a switch (its PCI address) so that devices behind the
    same switch fabric share a domain.
    """

    index: int
    link_type: str
    up: bool
    remote_kind: str = "unknown"
    remote_pci_bus_id: str | None = None
    remote_device_index: int | None = None
    remote_id: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Static facts about one device, read once at inventory time.

    ``index`` is the node-wide index (``hw.name`` is ``gpu{index}``); ``id`` is the stable
    identifier (NVIDIA UUID, MIG UUID, AMD/Intel UUID or serial). ``parent_id`` is set on MIG
    instances and partitions. ``kind`` is ``"gpu"``, ``"tpu"`` or ``"neuron"``.
    """

    index: int
    id: str
    vendor: str
    model: str
    backend: str
    kind: str = "gpu"
    local_index: int | None = None
    parent_id: str | None = None
    serial: str | None = None
    firmware_version: str | None = None
    board_part_number: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None
    memory_total_bytes: int | None = None
    power_limit_default_w: float | None = None
    power_limit_min_w: float | None = None
    power_limit_max_w: float | None = None
    compute_capability: str | None = None
    mig_mode: bool | None = None
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    temperature_slowdown_c: float | None = None
    temperature_shutdown_c: float | None = None
    links: tuple[LinkInfo, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", _frozen_mapping(self.extra))

    @property
    def name(self) -> str:
        """The ``hw.name`` of the device: ``gpu0``, ``gpu1``... in node-wide index order."""
        return f"gpu{self.index}"


@dataclass(frozen=True, slots=True)
class Inventory:
    """Static view of the node: devices (node-wide index order) and software versions.

    ``versions`` holds e.g. ``{"nvidia.driver": "550.54.15", "cuda": "12.4"}``.
    """

    devices: tuple[DeviceInfo, ...] = ()
    versions: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "versions", _frozen_mapping(self.versions))

    @property
    def vendors(self) -> tuple[str, ...]:
        """Vendors present, in first-seen order."""
        return tuple(dict.fromkeys(d.vendor for d in self.devices))

    def by_id(self) -> Mapping[str, DeviceInfo]:
        """Devices keyed by ``id``."""
        return {d.id: d for d in self.devices}

    def physical(self) -> tuple[DeviceInfo, ...]:
        """Devices that are not MIG instances or partitions."""
        return tuple(d for d in self.devices if d.parent_id is None)


def interconnect_domains(devices: tuple[DeviceInfo, ...]) -> list[list[int]]:
    """Connected components of the device interconnect graph, as lists of device indices.

    Two devices are connected by a link that is up between them, or by links that end at the
    same switch (``remote_kind == "switch"``, same ``remote_id``, or any switch when the switch
    has no id: an NVSwitch fabric joins all its GPUs). Devices with no links form no domain.
    """
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    known = {d.index for d in devices}
    switches: dict[str, int] = {}
    for dev in devices:
        for link in dev.links:
            if not link.up:
                continue
            parent.setdefault(dev.index, dev.index)
            if link.remote_kind == "switch":
                key = f"{link.link_type}:{link.remote_id or '*'}"
                if key in switches:
                    union(dev.index, switches[key])
                else:
                    switches[key] = dev.index
            elif link.remote_device_index is not None and link.remote_device_index in known:
                parent.setdefault(link.remote_device_index, link.remote_device_index)
                union(dev.index, link.remote_device_index)
    groups: dict[int, list[int]] = {}
    for idx in sorted(parent):
        groups.setdefault(find(idx), []).append(idx)
    return [g for g in groups.values() if len(g) > 1 or _has_switch(devices, g[0])]


def _has_switch(devices: tuple[DeviceInfo, ...], index: int) -> bool:
    return any(
        link.up and link.remote_kind == "switch"
        for d in devices
        if d.index == index
        for link in d.links
    )


@dataclass(frozen=True, slots=True)
class LinkSample:
    """Per-collection counters of one interconnect link. Byte and error counts are cumulative.

    ``errors`` maps ``error.type`` (``crc``, ``replay``, ``recovery``) to a cumulative count.
    """

    index: int
    link_type: str
    up: bool | None = None
    tx_bytes: int | None = None
    rx_bytes: int | None = None
    errors: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "errors", _frozen_mapping(self.errors))


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """A process using a device (reported only when process metrics are enabled)."""

    pid: int
    memory_used_bytes: int | None = None
    name: str | None = None
    utilization_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class VendorValue:
    """A vendor-only reading, named in the vendor's namespace (``nvidia.*``, ``amd.*``...).

    ``attributes`` are extra point attributes (for example a NeuronCore index).
    """

    metric: str
    value: float
    attributes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attributes", _frozen_mapping(self.attributes))


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """Everything read from one device in one sweep. ``None`` = not supported / not available.

    ``throttle_reasons`` is the set of active reasons (``power``, ``thermal``, ``hw_slowdown``,
    ``sw_thermal``, ``hw_power_brake``, ``sync_boost``, ``apps_clocks``, ``idle``...); an empty
    set means "not throttled", ``None`` "unknown". ``clocks_hz`` maps a :class:`ClockDomain`
    value to Hz; ``temperatures_c`` maps ``hw.sensor_location`` (``gpu``, ``memory``,
    ``hotspot``) to degrees Celsius. ``retired_rows`` maps ``accel.retirement.state``
    (``remapped``, ``pending``, ``failed`` for row remapping; ``retired`` for retired pages)
    to counts. ``engines`` maps an engine name
    (Intel engine group, AMD ``gfx``/``mm``, Neuron ``core0``...) to a 0..1 utilization.
    """

    device_id: str
    utilization_ratio: float | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    memory_bandwidth_utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None
    temperatures_c: Mapping[str, float] = field(default_factory=dict)
    clocks_hz: Mapping[str, float] = field(default_factory=dict)
    throttle_reasons: frozenset[str] | None = None
    ecc_corrected_total: int | None = None
    ecc_uncorrected_total: int | None = None
    pcie_replay_total: int | None = None
    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    retired_rows: Mapping[str, int] = field(default_factory=dict)
    links: tuple[LinkSample, ...] = ()
    engines: Mapping[str, float] = field(default_factory=dict)
    processes: tuple[ProcessSample, ...] | None = None
    vendor: tuple[VendorValue, ...] = ()

    def __post_init__(self) -> None:
        for name in ("temperatures_c", "clocks_hz", "retired_rows", "engines"):
            object.__setattr__(self, name, _frozen_mapping(getattr(self, name)))

    @property
    def memory_utilization_ratio(self) -> float | None:
        """Used / total memory, when both are known and total is positive."""
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes


@dataclass(frozen=True, slots=True)
class DeviceFailure:
    """A device that could not be read in this sweep. ``lost``: it fell off the bus (GPU is
    lost); ``stuck``: a vendor call for it did not return within the sweep deadline."""

    device_id: str
    reason: str
    lost: bool = False
    stuck: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One sweep of every device: one timestamp, the samples, and the devices that failed."""

    timestamp_ns: int
    samples: tuple[DeviceSample, ...] = ()
    failures: tuple[DeviceFailure, ...] = ()
    sweep_seconds: float | None = None

    def by_id(self) -> Mapping[str, DeviceSample]:
        """Samples keyed by device id."""
        return {s.device_id: s for s in self.samples}


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A health event: exported as an OTel log record and reflected in ``hw.status``.

    ``name`` comes from the health catalog (``accel.device.lost``, ``nvidia.xid``...);
    ``state`` is the device state the event implies (``HealthState.OK`` on recovery);
    ``attributes`` carry the check's figures (``nvidia.xid.code``, ``error.count``...).
    """

    name: str
    severity: Severity
    state: HealthState
    message: str
    device_id: str | None = None
    timestamp_ns: int = 0
    attributes: Mapping[str, str | int | float | bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attributes", _frozen_mapping(self.attributes))
