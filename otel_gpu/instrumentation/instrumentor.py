""":class:`GpuInstrumentor`: otel-gpu inside an application's own OpenTelemetry SDK.

It never sets or replaces a global provider: it registers the instruments of
:class:`~otel_gpu.otel.GpuTelemetry` on the providers it is given, by default the global ones
that ``opentelemetry-instrument`` configured, so GPU series share the application's Resource,
readers and exporters (OTLP, Prometheus, console: whatever ``OTEL_METRICS_EXPORTER`` says).

Starting opens the vendor libraries, which can hang on a broken driver; it runs on a daemon
thread and the application waits for it at most ``start_timeout_s`` (default 5 s). Nothing in
here ever raises into the application: a failure is one log line and GPU telemetry stays off.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Collection
from typing import Any

from opentelemetry import _logs, metrics
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from otel_gpu.attribution import Attribution
from otel_gpu.config import Settings, sdk_disabled
from otel_gpu.errors import BackendUnavailable
from otel_gpu.hal.manager import DeviceManager
from otel_gpu.hal.model import DeviceSample, Inventory, Snapshot
from otel_gpu.health.monitor import HealthMonitor
from otel_gpu.otel.bridge import SCOPE, GpuTelemetry
from otel_gpu.otel.metrics import SDK_DEFAULT_CARDINALITY, cardinality_limit
from otel_gpu.scope import own_pids

__all__ = ["GpuInstrumentor"]

_log = logging.getLogger(__name__)
DEFAULT_START_TIMEOUT_S = 5.0


class GpuInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Adds GPU metrics and health log records to the application's providers.

    ``instrument()`` accepts, all optional: ``meter_provider`` and ``logger_provider`` (default:
    the global ones), ``settings`` (default: :meth:`Settings.from_env`, ``OTEL_GPU_*``),
    ``manager`` (a :class:`DeviceManager` to use instead of building one from the settings) and
    ``start_timeout_s``. ``OTEL_SDK_DISABLED=true`` makes it do nothing.
    """

    _telemetry: GpuTelemetry | None = None
    _attribution: Attribution | None = None
    _starter: threading.Thread | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        """None: the simulated backend needs no vendor library (the ``instruments-any`` extra
        lists the vendor libraries for ``opentelemetry-instrument``)."""
        return ()

    @property
    def telemetry(self) -> GpuTelemetry | None:
        """The running :class:`GpuTelemetry` (``None`` when not instrumented or it failed)."""
        return self._telemetry

    def _instrument(self, **kwargs: Any) -> None:
        try:
            self._setup(**kwargs)
        except Exception as err:  # telemetry never breaks the application
            _report(err)
            self._close()

    def _uninstrument(self, **kwargs: Any) -> None:
        try:
            self._close()
        except Exception as err:
            _report(err)

    def _setup(
        self,
        *,
        meter_provider: metrics.MeterProvider | None = None,
        logger_provider: _logs.LoggerProvider | None = None,
        settings: Settings | None = None,
        manager: DeviceManager | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        **_unused: Any,
    ) -> None:
        if sdk_disabled():
            _log.debug("otel-gpu: OTEL_SDK_DISABLED=true, GPU telemetry is off")
            return
        settings = settings or Settings.from_env(standard=False)
        meter_provider = meter_provider or metrics.get_meter_provider()
        logger_provider = logger_provider or _logs.get_logger_provider()
        done = threading.Event()

        def start() -> None:
            try:
                attribution = self._attribution = Attribution.from_env()
                telemetry = GpuTelemetry(
                    manager or _build_manager(settings),
                    meter_provider,
                    logger_provider,
                    interval_s=settings.interval_s,
                    attributes=settings.attributes,
                    features=frozenset({"processes"}) if settings.processes else frozenset(),
                    monitor=HealthMonitor(settings.health),
                    attribute_sources=attribution.attribute_sources,
                )
                self._telemetry = telemetry
                attribution.start(telemetry, meter_provider)
                telemetry.start()
                _log.info(
                    "otel-gpu: reporting %d devices (%s scope)",
                    len(telemetry.inventory.devices),
                    settings.scope,
                )
                _warn_cardinality(telemetry.inventory)
            except Exception as err:
                _report(err)
                self._close(join=False)
            finally:
                done.set()

        self._starter = threading.Thread(target=start, name="otel-gpu-start", daemon=True)
        self._starter.start()
        if not done.wait(start_timeout_s):
            _log.warning(
                "otel-gpu: the GPU backends are still starting after %gs; GPU metrics follow "
                "when they are ready",
                start_timeout_s,
            )

    def _close(self, join: bool = True) -> None:
        starter, self._starter = self._starter, None
        if join and starter is not None and starter is not threading.current_thread():
            starter.join(DEFAULT_START_TIMEOUT_S)
        telemetry, self._telemetry = self._telemetry, None
        if telemetry is not None:
            telemetry.shutdown()
        attribution, self._attribution = self._attribution, None
        if attribution is not None:
            attribution.close()


class _OwnProcessesManager(DeviceManager):
    """A manager whose per-process samples keep only this process and its descendants."""

    def sample(self) -> Snapshot:
        """One sweep, with ``processes`` narrowed to :func:`~otel_gpu.scope.own_pids`."""
        snapshot = super().sample()
        pids = own_pids()
        return dataclasses.replace(
            snapshot, samples=tuple(_only(sample, pids) for sample in snapshot.samples)
        )


def _only(sample: DeviceSample, pids: frozenset[int]) -> DeviceSample:
    if not sample.processes:
        return sample
    return dataclasses.replace(
        sample, processes=tuple(p for p in sample.processes if p.pid in pids)
    )


def _build_manager(settings: Settings) -> DeviceManager:
    factory = (
        _OwnProcessesManager
        if settings.scope == "process" and settings.processes
        else DeviceManager
    )
    return factory.from_selector(
        settings.backend,
        device_filter=settings.device_filter(),
        setting="OTEL_GPU_BACKEND",
        sweep_timeout_s=settings.sweep_timeout_s,
    )


def _warn_cardinality(inventory: Inventory) -> None:
    """The application's MeterProvider keeps the SDK's default series limit (2000 per metric):
    say so when this node has more series of a metric than that (``otel-gpu run`` raises it)."""
    needed = cardinality_limit(inventory, processes_per_device=0)
    if needed > SDK_DEFAULT_CARDINALITY:
        _log.warning(
            "otel-gpu: this node has up to %d series of some metrics (NVLink links x devices), "
            "above the SDK's default limit of %d: add View(meter_name=%r, "
            "aggregation_cardinality_limit=%d) to your MeterProvider, or excess series are "
            "folded into an overflow point",
            needed // 2,
            SDK_DEFAULT_CARDINALITY,
            SCOPE,
            needed,
        )


def _report(err: Exception) -> None:
    """One line: INFO for a node without accelerators, WARNING for anything else."""
    quiet = isinstance(err, BackendUnavailable) and err.backend == "auto"
    _log.log(
        logging.INFO if quiet else logging.WARNING,
        "otel-gpu: GPU telemetry is off: %s",
        err,
        exc_info=_log.isEnabledFor(logging.DEBUG),
    )
