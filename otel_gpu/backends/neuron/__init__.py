"""The AWS Neuron backend (Inferentia, Trainium): ``neuron-monitor`` reports, ``neuron-ls`` topology.

At open, ``neuron-ls --json-output`` gives the devices once: index, PCI address, NUMA node, CPU
affinity, NeuronCore ids and the NeuronLink peers (``LinkInfo(link_type="neuronlink")``, so the
connected devices form an interconnect domain). Without neuron-ls, the device count and cores per
device come from ``neuron_hardware_info`` of the first report (or the ``/dev/neuron*`` nodes).
A device's id is its serial number from the driver's sysfs, else its PCI address.

``neuron-monitor`` runs as a child process with a generated config (``period_s``, every
application, the groups read here); a reader thread keeps its latest report, so a sweep never
waits (:mod:`._monitor`). Each sweep maps the latest report (:mod:`._report`):

- ``neuroncore_counters.neuroncores_in_use.<core>.neuroncore_utilization`` (percent) ->
  ``engines["core<n>"]`` (0..1, n device-local) and their mean, ``utilization_ratio``;
- ``memory_used.neuron_runtime_used_bytes.usage_breakdown.neuroncore_memory_usage.<core>.*``
  summed per device over every application -> ``memory_used_bytes``, with
  ``memory_total_bytes`` from neuron-ls (``memory_size``) or ``neuron_device_memory_size``;
- ``system_data.neuron_hw_counters.neuron_devices[]`` ``mem_ecc_*`` + ``sram_ecc_*`` ->
  ``ecc_corrected_total`` / ``ecc_uncorrected_total``.

The ECC figures of a report are the events of its period; the backend adds them up, so the
totals count from the moment the agent started watching. Cores no application uses are idle
(0.0), and devices none uses hold 0 bytes. If neuron-monitor dies, it is restarted with
exponential backoff; until it reports again every device is a (non-lost) ``DeviceFailure``.

Settings (read here, documented in the config table): ``OTEL_GPU_NEURON_MONITOR`` (default
``neuron-monitor`` on ``PATH``, then in ``/opt/aws/neuron/bin``; neuron-ls is looked up beside
it first) and ``OTEL_GPU_HOST_ROOT`` (default ``/``, for ``/dev/neuron*`` and the driver's sysfs).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from otel_gpu.backends.neuron._monitor import MonitorProcess, MonitorState
from otel_gpu.backends.neuron._report import (
    CoreMap,
    DeviceUsage,
    HardwareInfo,
    LsDevice,
    ecc_deltas,
    hardware_info,
    model_name,
    parse_neuron_ls,
    usage,
)
from otel_gpu.errors import BackendUnavailable
from otel_gpu.hal.model import (
    DeviceFailure,
    DeviceInfo,
    DeviceSample,
    Inventory,
    LinkInfo,
    Snapshot,
)
from otel_gpu.hal.protocol import Probe

__all__ = ["INSTALL_TOOLS", "MONITOR_ENV", "ROOT_ENV", "TOOLS_DIR", "NeuronBackend"]

_log = logging.getLogger(__name__)

MONITOR_ENV = "OTEL_GPU_NEURON_MONITOR"
ROOT_ENV = "OTEL_GPU_HOST_ROOT"
TOOLS_DIR = "/opt/aws/neuron/bin"
INSTALL_TOOLS = (
    "install the aws-neuronx-tools package (it provides neuron-monitor and neuron-ls in "
    f"{TOOLS_DIR}), or set {MONITOR_ENV} to the neuron-monitor executable"
)
_SYSFS_DEVICES = "sys/devices/virtual/neuron_device"


def _setting(name: str, default: str) -> str:
    """An ``OTEL_GPU_*`` value from the environment; empty means the default."""
    return os.environ.get(name, "").strip() or default


def find_tool(name: str, beside: str | None = None) -> str | None:
    """An executable: ``name`` itself when it is a path, else beside ``beside``, on ``PATH``,
    or in ``/opt/aws/neuron/bin``."""
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    candidates = [os.path.join(os.path.dirname(beside), name)] if beside else []
    found = shutil.which(name)
    if found:
        candidates.append(found)
    candidates.append(os.path.join(TOOLS_DIR, name))
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


class NeuronBackend:
    """AWS Neuron devices through neuron-monitor. ``monitor``/``neuron_ls`` name the tools
    (path or name); ``root`` is where ``dev/`` and ``sys/`` are read; ``period_s`` is
    neuron-monitor's period; ``startup_wait_s`` bounds the wait for its first report at open;
    a report older than ``stale_after_s`` fails the sweep; ``clock`` is monotonic seconds."""

    name: ClassVar[str] = "neuron"
    auto: ClassVar[bool] = True
    fallback_for: ClassVar[str | None] = None

    def __init__(
        self,
        options: str | None = None,
        *,
        monitor: str | None = None,
        neuron_ls: str | None = None,
        root: Path | None = None,
        period_s: float = 1.0,
        startup_wait_s: float = 5.0,
        stale_after_s: float | None = None,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if options:
            raise BackendUnavailable(
                "neuron", f"the neuron backend takes no options (got {options!r})"
            )
        self.monitor_command = monitor or _setting(MONITOR_ENV, "neuron-monitor")
        self.neuron_ls_command = neuron_ls or "neuron-ls"
        self.root = root if root is not None else Path(_setting(ROOT_ENV, "/"))
        self.period_s = period_s
        self.startup_wait_s = startup_wait_s
        self.stale_after_s = stale_after_s if stale_after_s is not None else max(5.0, 5 * period_s)
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._clock = clock
        self._lock = threading.Lock()  # ECC totals and the monitor handle
        self._open_lock = threading.Lock()  # one open at a time (it waits for the reader)
        self._inventory: Inventory | None = None
        self._indices: list[int] = []  # neuron device index of each DeviceInfo, in order
        self._cores = CoreMap({}, {})
        self._monitor: MonitorProcess | None = None
        self._config: str | None = None
        self._ecc: dict[int, tuple[int, int]] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def probe(self) -> Probe:
        """neuron-monitor present and ``/dev/neuron*`` nodes there. Never raises."""
        try:
            tool = find_tool(self.monitor_command)
            if tool is None:
                return Probe(False, f"neuron-monitor not found: {INSTALL_TOOLS}")
            nodes = self._device_nodes()
        except Exception as err:
            return Probe(False, f"Neuron probe failed: {type(err).__name__}: {err}")
        if not nodes:
            return Probe(
                False,
                f"no Neuron device: no {self.root / 'dev'}/neuron* node (install and load the "
                "Neuron driver, package aws-neuronx-dkms)",
                0,
            )
        return Probe(True, f"{len(nodes)} Neuron device(s); {tool}", len(nodes))

    def open(self) -> None:
        """Read the topology, start neuron-monitor and wait (bounded) for its first report."""
        with self._open_lock:
            if self._inventory is None:
                self._open()

    def _open(self) -> None:
        tool = find_tool(self.monitor_command)
        if tool is None:
            raise BackendUnavailable("neuron", f"neuron-monitor not found: {INSTALL_TOOLS}")
        listed = self._neuron_ls(tool)
        monitor = self._start_monitor(tool)
        monitor.first_report.wait(self.startup_wait_s)
        first = monitor.state().report
        hardware = hardware_info(first) if first is not None else None
        try:
            inventory = self._build_inventory(listed, hardware)
        except BaseException:
            self._stop_monitor(monitor)
            raise
        with self._lock:
            self._monitor = monitor
            self._inventory = inventory

    def inventory(self) -> Inventory:
        """The devices and topology read at open."""
        if self._inventory is None:
            self.open()
        assert self._inventory is not None
        return self._inventory

    def close(self) -> None:
        """Stop neuron-monitor. Safe to call twice."""
        with self._lock:
            monitor, self._monitor = self._monitor, None
        if monitor is not None:
            self._stop_monitor(monitor)

    @property
    def monitor(self) -> MonitorProcess | None:
        """The neuron-monitor supervisor (after open)."""
        return self._monitor

    # -- open helpers ------------------------------------------------------------------------

    def _device_nodes(self) -> list[Path]:
        try:
            return sorted(p for p in (self.root / "dev").glob("neuron*") if p.name[6:].isdecimal())
        except OSError:
            return []

    def _neuron_ls(self, monitor: str) -> list[LsDevice] | None:
        """The devices by ``neuron-ls --json-output``, or None (logged) when it cannot tell."""
        tool = find_tool(self.neuron_ls_command, beside=monitor)
        if tool is None:
            _log.info("neuron-ls not found: Neuron topology (PCI, NUMA, NeuronLink) unavailable")
            return None
        try:
            done = subprocess.run(
                [tool, "--json-output"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=10.0,
                check=False,
            )
            if done.returncode != 0:
                raise ValueError(f"exit code {done.returncode}: {done.stderr.strip()[:200]}")
            return parse_neuron_ls(json.loads(done.stdout))
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            _log.info("neuron-ls --json-output failed (%s): Neuron topology unavailable", err)
            return None

    def _start_monitor(self, tool: str) -> MonitorProcess:
        config = {
            "period": f"{self.period_s:g}s",
            "neuron_runtimes": [
                {
                    "tag_filter": ".*",
                    "metrics": [{"type": "neuroncore_counters"}, {"type": "memory_used"}],
                }
            ],
            "system_metrics": [{"type": "neuron_hw_counters"}],
        }
        fd, path = tempfile.mkstemp(prefix="otel-gpu-neuron-monitor-", suffix=".json")
        with os.fdopen(fd, "w") as out:
            json.dump(config, out)
        self._config = path
        monitor = MonitorProcess(
            [tool, "-c", path],
            on_report=self._count_ecc,
            clock=self._clock,
            backoff_initial_s=self.backoff_initial_s,
            backoff_max_s=self.backoff_max_s,
        )
        monitor.start()
        return monitor

    def _stop_monitor(self, monitor: MonitorProcess) -> None:
        monitor.stop()
        config, self._config = self._config, None
        if config is not None:
            with contextlib.suppress(OSError):
                os.unlink(config)

    def _build_inventory(
        self, listed: list[LsDevice] | None, hardware: HardwareInfo | None
    ) -> Inventory:
        hw = hardware or HardwareInfo()
        if not listed:
            count = hw.device_count or len(self._device_nodes())
            if not count:
                raise BackendUnavailable(
                    "neuron",
                    "no Neuron device found: neuron-ls gave no devices, neuron-monitor no report "
                    "and there is no /dev/neuron* node",
                )
            per_device = hw.cores_per_device or 1
            listed = [
                LsDevice(i, None, None, None, (), per_device, hw.memory_bytes, ())
                for i in range(count)
            ]
        model = model_name(hw.device_type) or self._sysfs_model(listed[0].index) or "Neuron device"
        position = {d.index: i for i, d in enumerate(listed)}
        bdfs = {d.index: d.bdf for d in listed}
        devices: list[DeviceInfo] = []
        layout: dict[int, tuple[int, ...]] = {}
        for i, dev in enumerate(listed):
            per_device = dev.core_count or hw.cores_per_device or 1
            layout[dev.index] = dev.core_ids or tuple(
                range(dev.index * per_device, (dev.index + 1) * per_device)
            )
            links = tuple(
                LinkInfo(
                    index=k,
                    link_type="neuronlink",
                    up=True,
                    remote_kind="gpu",
                    remote_pci_bus_id=bdfs.get(peer),
                    remote_device_index=position.get(peer),
                )
                for k, peer in enumerate(dev.connected_to)
            )
            devices.append(
                DeviceInfo(
                    index=i,
                    id=self._device_id(dev),
                    vendor="aws",
                    model=model,
                    backend=self.name,
                    kind="neuron",
                    local_index=dev.index,
                    serial=self._serial(dev.index),
                    pci_bus_id=dev.bdf,
                    numa_node=dev.numa_node,
                    cpu_affinity=dev.cpu_affinity,
                    memory_total_bytes=dev.memory_bytes or hw.memory_bytes,
                    links=links,
                    extra={
                        "neuron.device_index": str(dev.index),
                        "neuron.core_ids": ",".join(map(str, layout[dev.index])),
                    },
                )
            )
        self._indices = [d.index for d in listed]
        self._cores = CoreMap.build(layout)
        versions = {}
        driver = _read(self.root / "sys/module/neuron/version")
        if driver:
            versions["neuron.driver"] = driver
        return Inventory(tuple(devices), versions)

    def _serial(self, index: int) -> str | None:
        return _read(self.root / _SYSFS_DEVICES / f"neuron{index}/info/serial_number")

    def _sysfs_model(self, index: int) -> str | None:
        base = self.root / _SYSFS_DEVICES / f"neuron{index}/info/architecture"
        return _read(base / "device_name") or _read(base / "device_type")

    def _device_id(self, dev: LsDevice) -> str:
        serial = self._serial(dev.index)
        if serial:
            return f"neuron-{serial}"
        return f"neuron-{dev.bdf}" if dev.bdf else f"neuron{dev.index}"

    # -- reports -----------------------------------------------------------------------------

    def _count_ecc(self, report: Mapping[str, Any]) -> None:
        """Add one report's ECC events to the totals (called once per report, reader thread)."""
        deltas = ecc_deltas(report)
        if not deltas:
            return
        with self._lock:
            for index, (corrected, uncorrected) in deltas.items():
                c, u = self._ecc.get(index, (0, 0))
                self._ecc[index] = (c + corrected, u + uncorrected)

    def sample(self) -> Snapshot:
        """One sweep from the latest report; every device fails while there is none."""
        started = time.perf_counter()
        inventory = self.inventory()
        monitor = self._monitor
        state = monitor.state() if monitor is not None else None
        reason = self._unusable(state)
        samples: list[DeviceSample] = []
        failures: list[DeviceFailure] = []
        if reason is not None or state is None or state.report is None:
            failures = [
                DeviceFailure(d.id, reason or "neuron backend is closed") for d in inventory.devices
            ]
        else:
            per_device = usage(state.report, self._cores)
            with self._lock:
                ecc = dict(self._ecc)
            for info, index in zip(inventory.devices, self._indices, strict=True):
                count = self._cores.cores_per_device.get(index, 0)
                samples.append(_sample(info, count, per_device.get(index), ecc.get(index)))
        return Snapshot(
            timestamp_ns=time.time_ns(),
            samples=tuple(samples),
            failures=tuple(failures),
            sweep_seconds=time.perf_counter() - started,
        )

    def _unusable(self, state: MonitorState | None) -> str | None:
        """Why the latest report cannot feed this sweep, or None when it can."""
        if state is None:
            return "neuron backend is closed"
        if state.report is None:
            if state.reason is None:
                return "waiting for the first neuron-monitor report"
            wait = max(0.0, (state.restart_at or 0.0) - self._clock())
            return f"{state.reason}; restarting it in {wait:.1f} s" if wait else state.reason
        age = self._clock() - state.received_at
        if age > self.stale_after_s:
            return f"no report from neuron-monitor for {age:.0f} s"
        return None


def _sample(
    info: DeviceInfo, cores: int, use: DeviceUsage | None, ecc: tuple[int, int] | None
) -> DeviceSample:
    engines: dict[str, float] = {}
    utilization = used = None
    if use is not None:
        engines = {f"core{c}": ratio for c, ratio in sorted(use.cores.items())}
        if cores and len(use.cores) == cores:
            utilization = sum(use.cores.values()) / cores
        used = use.memory_used_bytes
    return DeviceSample(
        device_id=info.id,
        utilization_ratio=utilization,
        memory_used_bytes=used,
        memory_total_bytes=info.memory_total_bytes if used is not None else None,
        ecc_corrected_total=ecc[0] if ecc is not None else None,
        ecc_uncorrected_total=ecc[1] if ecc is not None else None,
        engines=engines,
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip() or None
    except OSError:
        return None
