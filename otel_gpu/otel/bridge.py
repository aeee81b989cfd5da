"""The OpenTelemetry bridge: observable instruments fed by one snapshot per collection.

:class:`SnapshotCache` sweeps the backends at most once per collection window: the first
instrument callback of a collection sweeps, every other callback of that collection (and of any
other reader collecting in the same window: OTLP push and Prometheus pull together) reads the
same snapshot. Each sweep also runs the health checks once; their events become OTel log
records through :class:`EventLogger`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry._logs import LoggerProvider, SeverityNumber
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from otel_gpu import __version__
from otel_gpu.hal.manager import DeviceManager
from otel_gpu.hal.model import DeviceInfo, HealthEvent, HealthState, Inventory, Snapshot
from otel_gpu.health.monitor import HealthMonitor
from otel_gpu.otel.metrics import METRICS, Instrument, MetricSpec

__all__ = ["AttributeSource", "EventLogger", "GpuTelemetry", "SnapshotCache", "device_attributes"]

_log = logging.getLogger(__name__)
SCOPE = "otel_gpu"

AttributeSource = Callable[[Inventory, Snapshot], Mapping[str, Mapping[str, str]]]
"""Per-sweep attributes by device id (see :class:`GpuTelemetry`)."""


class SnapshotCache:
    """Serves one snapshot to every callback of a collection; sweeps when it is older than
    ``max_age_s``. ``on_sweep`` hooks (health checks) run once per new snapshot.
    """

    def __init__(
        self,
        sweep: Callable[[], Snapshot],
        max_age_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sweep = sweep
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._taken_at = 0.0
        self.on_sweep: list[Callable[[Snapshot], None]] = []
        self.sweeps = 0

    def get(self) -> Snapshot:
        """The current snapshot, sweeping first if there is none or it is too old."""
        with self._lock:
            now = self._clock()
            if self._snapshot is None or now - self._taken_at >= self.max_age_s:
                self._snapshot = self._sweep()
                self._taken_at = self._clock()  # a slow sweep's data is as fresh as its end
                self.sweeps += 1
                for hook in self.on_sweep:
                    try:
                        hook(self._snapshot)
                    except Exception:
                        _log.warning("snapshot hook %r failed", hook, exc_info=True)
            return self._snapshot

    def invalidate(self) -> None:
        """Forget the current snapshot: the next :meth:`get` sweeps."""
        with self._lock:
            self._snapshot = None


def device_attributes(device: DeviceInfo, minimal: bool = False) -> dict[str, str]:
    """The attributes every point of ``device`` carries (DESIGN §4).

    ``minimal`` keeps only ``hw.id``, ``hw.type`` and ``hw.name``; the rest is on the resource.
    """
    attrs = {"hw.id": device.id, "hw.type": "gpu", "hw.name": device.name}
    if minimal:
        return attrs
    attrs["hw.vendor"] = device.vendor
    attrs["hw.model"] = device.model
    if device.parent_id:
        attrs["hw.parent"] = device.parent_id
    if device.kind != "gpu":
        attrs["accel.kind"] = device.kind
    return attrs


class EventLogger:
    """Turns :class:`HealthEvent` objects into OTel log records (``event_name``, severity,
    ``hw.id``/``hw.name`` and the event's figures)."""

    def __init__(self, logger_provider: LoggerProvider, inventory: Callable[[], Inventory]) -> None:
        self._logger = logger_provider.get_logger(SCOPE, __version__)
        self._inventory = inventory

    def __call__(self, event: HealthEvent) -> None:
        """Emit ``event``. Never raises."""
        try:
            attrs: dict[str, Any] = {"hw.state": event.state.value}
            if event.device_id is not None:
                dev = self._inventory().by_id().get(event.device_id)
                attrs["hw.id"] = event.device_id
                attrs["hw.type"] = "gpu"
                if dev is not None:
                    attrs.update(device_attributes(dev))
            attrs.update(event.attributes)
            self._logger.emit(
                timestamp=event.timestamp_ns or time.time_ns(),
                severity_number=SeverityNumber(int(event.severity)),
                severity_text=event.severity.name,
                body=event.message,
                attributes=attrs,
                event_name=event.name,
            )
        except Exception:
            _log.warning("could not emit health event %s", event.name, exc_info=True)


class GpuTelemetry:
    """Wires a :class:`DeviceManager` into OpenTelemetry providers.

    Registers every metric of the table on ``meter_provider`` (one loop, one shared snapshot
    cache), runs the health checks once per sweep and sends their events, and the backends'
    driver events, to ``logger_provider`` as log records. It never sets global providers.

    ``attributes="minimal"`` trims per-point attributes; ``features`` enables opt-in metrics
    (``{"processes"}``) and asks the backends for the data behind them.

    ``attribute_sources`` add per-device attributes that change at run time (the Kubernetes pod
    or Slurm job that holds a device): each is called once per sweep with the inventory and the
    snapshot and returns ``{device_id: {attribute: value}}``; a device it omits gets none.
    """

    def __init__(
        self,
        manager: DeviceManager,
        meter_provider: MeterProvider,
        logger_provider: LoggerProvider | None = None,
        *,
        interval_s: float = 10.0,
        attributes: str = "full",
        features: frozenset[str] = frozenset(),
        monitor: HealthMonitor | None = None,
        attribute_sources: Sequence[AttributeSource] = (),
    ) -> None:
        self.manager = manager
        self.monitor = monitor or HealthMonitor()
        self.cache = SnapshotCache(manager.sample, max_age_s=max(0.1, interval_s / 2))
        self._meter_provider = meter_provider
        self._logger_provider = logger_provider
        self._minimal = attributes == "minimal"
        self._features = features
        self._static_attrs: dict[str, dict[str, str]] = {}
        self._devices: Mapping[str, DeviceInfo] = {}
        self._attrs: dict[str, dict[str, str]] = {}
        self._sources = list(attribute_sources)
        self._instruments: list[object] = []
        self._started = False

    @property
    def inventory(self) -> Inventory:
        """The node's inventory."""
        return self.manager.inventory

    def start(self) -> None:
        """Open the backends, register the instruments, start health and driver events."""
        if self._started:
            return
        inventory = self.manager.open()
        self._devices = inventory.by_id()
        self._static_attrs = {d.id: device_attributes(d, self._minimal) for d in inventory.devices}
        self._attrs = dict(self._static_attrs)
        for feature in self._features:
            self.manager.enable(feature)
        self.cache.on_sweep.append(self._refresh_attributes)
        if self._logger_provider is not None:
            self.monitor.set_emitter(EventLogger(self._logger_provider, lambda: self.inventory))
        self.cache.on_sweep.append(self._check_health)
        meter = self._meter_provider.get_meter(SCOPE, __version__)
        for spec in METRICS:
            if spec.opt_in is None or spec.opt_in in self._features:
                self._instruments.append(self._register(meter, spec))
        self._instruments.append(
            meter.create_observable_up_down_counter(
                "hw.status",
                callbacks=[self._status],
                unit="1",
                description="1 for the device's current health state, 0 for the others.",
            )
        )
        self.manager.start_events(self.monitor.record_event)
        self._started = True

    def _refresh_attributes(self, snapshot: Snapshot) -> None:
        """Merge the run-time attribute sources into each device's point attributes."""
        if not self._sources:
            return
        merged = {dev_id: dict(attrs) for dev_id, attrs in self._static_attrs.items()}
        for source in self._sources:
            try:
                extra = source(self.inventory, snapshot)
            except Exception:
                _log.warning("attribute source %r failed", source, exc_info=True)
                continue
            for dev_id, attrs in extra.items():
                if dev_id in merged:
                    merged[dev_id].update(attrs)
        self._attrs = merged

    def _check_health(self, snapshot: Snapshot) -> None:
        self.monitor.process(self.inventory, snapshot)

    def shutdown(self) -> None:
        """Stop events and close the backends (the providers belong to the caller; the
        instruments stay registered but report nothing more)."""
        self._started = False
        self.manager.close()

    def _register(self, meter: Meter, spec: MetricSpec) -> object:
        create = {
            Instrument.GAUGE: meter.create_observable_gauge,
            Instrument.COUNTER: meter.create_observable_counter,
            Instrument.UPDOWNCOUNTER: meter.create_observable_up_down_counter,
        }[spec.instrument]
        return create(
            spec.name,
            callbacks=[self._callback(spec)],
            unit=spec.unit,
            description=spec.description,
        )

    def _callback(self, spec: MetricSpec) -> Callable[[CallbackOptions], Iterable[Observation]]:
        failed: set[str] = set()

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if not self._started:
                return []
            snapshot = self.cache.get()
            devices = self._devices
            out: list[Observation] = []
            for sample in snapshot.samples:
                dev = devices.get(sample.device_id)
                if dev is None:
                    continue
                try:
                    base = self._attrs[dev.id]
                    out.extend(
                        Observation(value, {**base, **extra})
                        for value, extra in spec.read(dev, sample)
                    )
                except Exception:  # one bad reading must not drop the other devices
                    if dev.id not in failed:
                        failed.add(dev.id)
                        _log.warning("metric %s failed on %s", spec.name, dev.name, exc_info=True)
            return out

        return observe

    def _status(self, _options: CallbackOptions) -> Iterable[Observation]:
        if not self._started:
            return []
        self.cache.get()
        out: list[Observation] = []
        for dev in self.inventory.devices:
            current = self.monitor.state(dev.id)
            base = self._attrs[dev.id]
            out.extend(
                Observation(1 if state is current else 0, {**base, "hw.state": state.value})
                for state in HealthState
            )
        return out
