"""Meter and logger providers built from the standard ``OTEL_*`` variables.

Exporter names (``OTEL_METRICS_EXPORTER``/``OTEL_LOGS_EXPORTER``: otlp, console, prometheus,
none) and the OTLP protocol (``OTEL_EXPORTER_OTLP_[METRICS_|LOGS_]PROTOCOL``: grpc,
http/protobuf) are resolved by the SDK's own configuration code, and each exporter reads its
``OTEL_EXPORTER_OTLP_*`` variables itself, exactly as under ``opentelemetry-instrument``.
An unset ``OTEL_METRICS_EXPORTER`` means ``otlp`` (the specification's default). An unset
``OTEL_LOGS_EXPORTER`` follows the metrics: ``otlp`` with otlp, ``console`` with console, and
``none`` with prometheus alone (Prometheus has no logs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource

from otel_gpu.errors import ConfigError
from otel_gpu.otel.bridge import SCOPE

__all__ = ["EXPORTER_CHOICES", "Providers", "build_providers"]

EXPORTER_CHOICES = ("otlp", "console", "prometheus", "none")
_LOG_SCHEDULE_DELAY_MS = 200  # health events should leave within a second


@dataclass
class Providers:
    """The providers the agent owns, with the names of the exporters behind them."""

    meter_provider: MeterProvider
    logger_provider: LoggerProvider
    metric_exporters: list[str]
    log_exporters: list[str]

    def flush(self, timeout_ms: int = 5000) -> None:
        """Collect and export now: metrics first (their sweep runs the health checks), then logs."""
        self.meter_provider.force_flush(timeout_ms)
        self.logger_provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        """Flush and shut both providers down, side by side: a slow metrics endpoint must not
        use up the time the health events need."""
        import threading

        threads = [
            threading.Thread(target=self.meter_provider.shutdown, daemon=True),
            threading.Thread(target=self.logger_provider.shutdown, daemon=True),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def _exporter_names(signal: str, env: Mapping[str, str]) -> list[str]:
    from opentelemetry.sdk._configuration import _get_exporter_names

    variable = f"OTEL_{signal.upper()}_EXPORTER"
    value = env.get(variable)
    if value is None or not value.strip():
        value = "otlp"
        if signal == "logs":
            metrics = [n.strip() for n in env.get("OTEL_METRICS_EXPORTER", "otlp").split(",")]
            follow = [n for n in metrics if n in ("otlp", "console")]
            value = ",".join(follow) or "none"
    names = [n.strip() for n in value.split(",")]
    group = f"opentelemetry_{signal}_exporter"
    known = sorted({ep.name for ep in entry_points(group=group)} | {"none"})
    for name in names:
        if name not in known:
            raise ConfigError(variable, f"unknown exporter {name!r}", ", ".join(known))
    if names == ["none"]:
        return []
    saved = os.environ.get(variable)
    os.environ[variable] = ",".join(n for n in names if n != "none")
    try:
        return list(_get_exporter_names(signal))  # type: ignore[arg-type]
    except RuntimeError as err:  # e.g. an unsupported OTLP protocol
        protocol_var = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
        if protocol_var not in env:
            protocol_var = "OTEL_EXPORTER_OTLP_PROTOCOL"
        raise ConfigError(protocol_var, str(err), "grpc, http/protobuf") from None
    finally:
        if saved is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved


def _load(group: str, name: str) -> Any:
    return next(iter(entry_points(group=group, name=name))).load()


_COMPRESSION_VARS = (
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
    "OTEL_EXPORTER_OTLP_LOGS_COMPRESSION",
)


def _construct(signal: str, impl: Any) -> Any:
    """Instantiate an exporter (it reads its own ``OTEL_EXPORTER_OTLP_*`` variables).

    ``compression=none`` is valid OTLP configuration that the SDK's gRPC exporter rejects; it
    means "no compression", which is that exporter's default, so the variable is hidden while
    the exporter is built. Any other construction error is a configuration error.
    """
    hidden = {
        var: os.environ.pop(var)
        for var in _COMPRESSION_VARS
        if os.environ.get(var, "").strip().lower() == "none"
    }
    try:
        return impl()
    except Exception as err:
        raise ConfigError(
            f"OTEL_{signal.upper()}_EXPORTER", f"cannot build exporter {impl.__name__}: {err}"
        ) from None
    finally:
        os.environ.update(hidden)


def build_providers(
    resource: Resource,
    interval_s: float,
    exporter: str | None = None,
    env: Mapping[str, str] | None = None,
    extra_readers: list[MetricReader] | None = None,
    *,
    cardinality_limit: int | None = None,
) -> Providers:
    """Providers with the readers and log processors that the environment asks for.

    ``exporter`` (``--exporter``) overrides ``OTEL_METRICS_EXPORTER`` and
    ``OTEL_LOGS_EXPORTER`` together, except that ``prometheus`` leaves the logs to
    ``OTEL_LOGS_EXPORTER`` (unset: none, as Prometheus has no logs). ``cardinality_limit``
    raises the SDK's per-metric series limit for otel-gpu's instruments (a large node has more
    than the default 2000 series of some metrics).
    """
    env = dict(os.environ if env is None else env)
    if exporter is not None:
        if exporter not in EXPORTER_CHOICES:
            raise ConfigError(
                "--exporter", f"unknown exporter {exporter!r}", ", ".join(EXPORTER_CHOICES)
            )
        env["OTEL_METRICS_EXPORTER"] = exporter
        if exporter != "prometheus":
            env["OTEL_LOGS_EXPORTER"] = exporter
    metric_names = _exporter_names("metrics", env)
    log_names = _exporter_names("logs", env)
    readers: list[MetricReader] = list(extra_readers or [])
    interval_ms = interval_s * 1000.0
    for name in metric_names:
        impl = _load("opentelemetry_metrics_exporter", name)
        if isinstance(impl, type) and issubclass(impl, MetricReader):
            readers.append(_construct("metrics", impl))
        elif isinstance(impl, type) and issubclass(impl, MetricExporter):
            readers.append(
                PeriodicExportingMetricReader(
                    _construct("metrics", impl), export_interval_millis=interval_ms
                )
            )
        else:
            raise ConfigError("OTEL_METRICS_EXPORTER", f"{name!r} is not a metric exporter")
    views = []
    if cardinality_limit is not None:
        views.append(
            View(
                instrument_name="*",
                meter_name=SCOPE,
                aggregation_cardinality_limit=cardinality_limit,
            )
        )
    meter_provider = MeterProvider(
        resource=resource, metric_readers=readers, shutdown_on_exit=False, views=views
    )
    logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    for name in log_names:
        impl = _load("opentelemetry_logs_exporter", name)
        if not (isinstance(impl, type) and issubclass(impl, LogRecordExporter)):
            raise ConfigError("OTEL_LOGS_EXPORTER", f"{name!r} is not a log exporter")
        log_exporter = _construct("logs", impl)
        if name == "console":
            logger_provider.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
        else:
            delay = None if env.get("OTEL_BLRP_SCHEDULE_DELAY") else _LOG_SCHEDULE_DELAY_MS
            logger_provider.add_log_record_processor(
                BatchLogRecordProcessor(log_exporter, schedule_delay_millis=delay)
            )
    return Providers(meter_provider, logger_provider, metric_names, log_names)
