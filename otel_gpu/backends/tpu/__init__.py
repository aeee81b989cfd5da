"""The Google Cloud TPU backend: chips from sysfs, runtime metrics from libtpu.

Chips are found without any TPU library: PCI functions of vendor ``0x1ae0`` whose device id is a
TPU generation (v2 ... v7x, tpu-info's table), with their NUMA node, CPU list, PCIe link and
``/dev/accel*`` or ``/dev/vfio/*`` node (:mod:`._sysfs`). So the devices are listed whether or
not a workload runs.

Runtime metrics come from the metric service that libtpu serves on ``localhost:8431`` while a
workload runs (tpu-info's protocol, :mod:`._grpc`); one sweep asks for all of them at once under
a short deadline (0.5 s):

=============================================  =================================================
libtpu metric                                  sample field
=============================================  =================================================
``tpu.runtime.hbm.memory.usage.bytes``         ``memory_used_bytes`` (summed over a chip's cores)
``tpu.runtime.hbm.memory.total.bytes``         ``memory_total_bytes``
``tpu.runtime.tensorcore.dutycycle.percent``   ``utilization_ratio`` (/100; mean over the cores;
                                               per TensorCore in ``engines`` on 2-core chips)
``tpu.runtime.hbm.utilization.percent``        ``memory_bandwidth_utilization_ratio`` (/100)
=============================================  =================================================

When no workload runs the service is not there: the chips are still sampled (PCIe link) and the
runtime fields are ``None`` (absent, not zero, not a failure), with a debug log; the service is
tried again after ``retry_s``. A metric this libtpu does not know is left out and not asked for
again until the service restarts. A chip whose PCI device disappears is reported lost.

Settings (read here, documented in the config table): ``OTEL_GPU_TPU_METRICS_ADDR`` (default
``localhost:8431``) and ``OTEL_GPU_HOST_ROOT`` (default ``/``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from otel_gpu.backends.tpu._grpc import Reading, RuntimeMetricClient, RuntimeUnreachable, load
from otel_gpu.backends.tpu._sysfs import TpuChip, discover, pcie_link
from otel_gpu.errors import BackendUnavailable
from otel_gpu.hal.model import DeviceFailure, DeviceInfo, DeviceSample, Inventory, Snapshot
from otel_gpu.hal.protocol import Probe

__all__ = [
    "ADDR_ENV",
    "DEFAULT_ADDR",
    "DUTY_CYCLE",
    "HBM_BANDWIDTH",
    "HBM_TOTAL",
    "HBM_USAGE",
    "ROOT_ENV",
    "TpuBackend",
]

_log = logging.getLogger(__name__)

ADDR_ENV = "OTEL_GPU_TPU_METRICS_ADDR"
ROOT_ENV = "OTEL_GPU_HOST_ROOT"
DEFAULT_ADDR = "localhost:8431"

HBM_USAGE = "tpu.runtime.hbm.memory.usage.bytes"
HBM_TOTAL = "tpu.runtime.hbm.memory.total.bytes"
DUTY_CYCLE = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_BANDWIDTH = "tpu.runtime.hbm.utilization.percent"
_WANTED = (HBM_USAGE, HBM_TOTAL, DUTY_CYCLE, HBM_BANDWIDTH)


def _setting(name: str, default: str) -> str:
    """An ``OTEL_GPU_*`` value from the environment; empty means the default."""
    return os.environ.get(name, "").strip() or default


@dataclass
class _Runtime:
    """Runtime readings per chip (position in the chip list)."""

    used: list[float | None] = field(default_factory=list)
    total: list[float | None] = field(default_factory=list)
    busy: list[float | None] = field(default_factory=list)
    bandwidth: list[float | None] = field(default_factory=list)
    cores: list[list[float]] = field(default_factory=list)


class TpuBackend:
    """Google TPU chips. ``root`` is where ``sys/`` and ``dev/`` are read (tests);
    ``metrics_addr`` is libtpu's metric service (``host:port``, loopback only);
    ``timeout_s`` bounds one sweep's RPCs; ``retry_s`` spaces attempts while the service is
    down; ``clock`` is monotonic seconds."""

    name: ClassVar[str] = "tpu"
    auto: ClassVar[bool] = True
    fallback_for: ClassVar[str | None] = None

    def __init__(
        self,
        options: str | None = None,
        *,
        root: Path | None = None,
        metrics_addr: str | None = None,
        timeout_s: float = 0.5,
        retry_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if options:
            raise BackendUnavailable("tpu", f"the tpu backend takes no options (got {options!r})")
        self.root = root if root is not None else Path(_setting(ROOT_ENV, "/"))
        self.metrics_addr = metrics_addr or _setting(ADDR_ENV, DEFAULT_ADDR)
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._clock = clock
        self._lock = threading.Lock()
        self._chips: list[TpuChip] = []
        self._inventory: Inventory | None = None
        self._client: RuntimeMetricClient | None = None
        self._reachable: bool | None = None
        self._retry_at = 0.0
        self._refused: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    def probe(self) -> Probe:
        """Look for TPU chips in sysfs and for grpcio. Never raises."""
        try:
            chips = discover(self.root)
        except Exception as err:  # discover() reads defensively; this is belt and braces
            return Probe(False, f"TPU discovery failed: {type(err).__name__}: {err}")
        if not chips:
            return Probe(False, self._none_found(), 0)
        try:
            load()
        except BackendUnavailable as err:
            return Probe(False, f"{len(chips)} TPU chip(s) found, but {err.reason}", len(chips))
        models = ", ".join(sorted({c.type.model for c in chips}))
        return Probe(True, f"{len(chips)} TPU chip(s) ({models})", len(chips))

    def open(self) -> None:
        """Find the chips and prepare the runtime metric client (no connection yet)."""
        with self._lock:
            if self._inventory is not None:
                return
            chips = discover(self.root)
            if not chips:
                raise BackendUnavailable("tpu", self._none_found())
            self._client = RuntimeMetricClient(self.metrics_addr, self.timeout_s)
            self._chips = chips
            self._inventory = Inventory(tuple(self._info(i, c) for i, c in enumerate(chips)))

    def inventory(self) -> Inventory:
        """The chips found at open."""
        if self._inventory is None:
            self.open()
        assert self._inventory is not None
        return self._inventory

    def close(self) -> None:
        """Close the gRPC channel. Safe to call twice."""
        with self._lock:
            if self._client is not None:
                self._client.close()

    def _none_found(self) -> str:
        return (
            "no Google TPU found: no PCI device of vendor 0x1ae0 with a TPU device id under "
            f"{self.root / 'sys/bus/pci/devices'}"
        )

    def _info(self, index: int, chip: TpuChip) -> DeviceInfo:
        extra = {"tpu.generation": chip.type.generation}
        if chip.device_path:
            extra["tpu.device_path"] = chip.device_path
        return DeviceInfo(
            index=index,
            id=f"tpu-{chip.pci_bus_id}",
            vendor="google",
            model=chip.type.model,
            backend=self.name,
            kind="tpu",
            local_index=index,
            pci_bus_id=chip.pci_bus_id,
            numa_node=chip.numa_node,
            cpu_affinity=chip.cpu_affinity,
            memory_total_bytes=chip.type.hbm_bytes,
            pcie_max_generation=chip.pcie_max_generation,
            pcie_max_width=chip.pcie_max_width,
            extra=extra,
        )

    # -- sweep -------------------------------------------------------------------------------

    def sample(self) -> Snapshot:
        """One sweep: the PCIe link of every chip and, when a workload runs, its runtime metrics."""
        started = time.perf_counter()
        inventory = self.inventory()
        with self._lock:
            runtime = self._runtime()
        samples: list[DeviceSample] = []
        failures: list[DeviceFailure] = []
        for i, (info, chip) in enumerate(zip(inventory.devices, self._chips, strict=True)):
            link = pcie_link(self.root, chip.pci_bus_id)
            if link is None:
                failures.append(
                    DeviceFailure(info.id, f"PCI device {chip.pci_bus_id} is gone", lost=True)
                )
                continue
            samples.append(_sample(info.id, i, link, runtime))
        return Snapshot(
            timestamp_ns=time.time_ns(),
            samples=tuple(samples),
            failures=tuple(failures),
            sweep_seconds=time.perf_counter() - started,
        )

    def _runtime(self) -> _Runtime | None:
        """The runtime readings by chip, or None when the service does not answer."""
        client = self._client
        now = self._clock()
        if client is None or now < self._retry_at:
            return None
        wanted = [name for name in _WANTED if name not in self._refused]
        try:
            readings, refused = client.fetch(wanted)
        except RuntimeUnreachable as err:
            if self._reachable is not False:
                _log.debug("%s; TPU runtime metrics absent until a workload serves them", err)
            self._reachable = False
            self._retry_at = now + self.retry_s
            self._refused.clear()  # the next workload may run another libtpu
            return None
        if self._reachable is not True:
            _log.debug("TPU runtime metric service at %s answers", self.metrics_addr)
        self._reachable = True
        for name, code in refused.items():
            _log.info("libtpu does not serve %s (%s): not asked again", name, code)
            self._refused.add(name)
        chips = len(self._chips)
        used, _ = _per_chip(readings.get(HBM_USAGE), chips, HBM_USAGE, total=True)
        total, _ = _per_chip(readings.get(HBM_TOTAL), chips, HBM_TOTAL, total=True)
        busy, cores = _per_chip(readings.get(DUTY_CYCLE), chips, DUTY_CYCLE)
        bandwidth, _ = _per_chip(readings.get(HBM_BANDWIDTH), chips, HBM_BANDWIDTH)
        return _Runtime(used, total, busy, bandwidth, cores)


def _per_chip(
    points: Reading | None, chips: int, name: str, total: bool = False
) -> tuple[list[float | None], list[list[float]]]:
    """Spread one metric's points over the chips: per chip (sum or mean) and per core.

    libtpu numbers devices per TensorCore on chips with two of them (v2, v3, v7x) and per chip
    otherwise; some metrics are per chip even there. ``n`` points for ``chips`` chips are
    ``n // chips`` consecutive cores per chip. Points that fit neither way are dropped.
    """
    if not points:
        return [None] * chips, [[] for _ in range(chips)]
    groups: list[list[float]] = [[] for _ in range(chips)]
    if len(points) % chips == 0:
        per = len(points) // chips
        for position, (_, value) in enumerate(points):
            groups[position // per].append(value)
    elif all(0 <= device < chips for device, _ in points):
        for device, value in points:
            groups[device].append(value)
    else:
        _log.debug("%s: %d points do not map onto %d chips", name, len(points), chips)
        return [None] * chips, [[] for _ in range(chips)]
    merged = [(sum(g) if total else sum(g) / len(g)) if g else None for g in groups]
    return merged, groups


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else min(1.0, max(0.0, percent / 100.0))


def _sample(
    device_id: str, i: int, link: tuple[int | None, int | None], runtime: _Runtime | None
) -> DeviceSample:
    generation, width = link
    if runtime is None:
        return DeviceSample(device_id=device_id, pcie_generation=generation, pcie_width=width)
    used, total = runtime.used[i], runtime.total[i]
    cores: Sequence[float] = runtime.cores[i]
    engines = (
        {f"core{c}": r for c, value in enumerate(cores) if (r := _ratio(value)) is not None}
        if len(cores) > 1
        else {}
    )
    return DeviceSample(
        device_id=device_id,
        utilization_ratio=_ratio(runtime.busy[i]),
        memory_bandwidth_utilization_ratio=_ratio(runtime.bandwidth[i]),
        memory_used_bytes=None if used is None else int(used),
        memory_total_bytes=None if total is None else int(total),
        pcie_generation=generation,
        pcie_width=width,
        engines=engines,
    )
