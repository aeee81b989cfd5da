"""The one module of the TPU backend that imports grpc and the generated protobuf code.

libtpu serves ``RuntimeMetricService`` on ``localhost:8431`` while a workload runs (the service
lives inside the workload's process). Like tpu-info, the client uses gRPC *local* channel
credentials (loopback TCP only) and asks ``GetRuntimeMetric`` by name. Each metric's points
carry the libtpu device id in an ``Attribute`` (``device-id`` as ``int_attr``; newer metrics put
``device_ordinal`` in a key-value list, as an int or a decimal string).

:class:`RuntimeMetricClient` sends every wanted metric at once under one deadline, so a sweep
costs one round trip and never waits longer than ``timeout_s``. :func:`serve_runtime_metrics`
starts a server speaking the same protocol (the fakes in :mod:`otel_gpu.testing`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from typing import Any

from otel_gpu.errors import BackendUnavailable, OtelGpuError

__all__ = [
    "GET_RUNTIME_METRIC",
    "INSTALL_GRPC",
    "Reading",
    "RuntimeMetricClient",
    "RuntimeUnreachable",
    "load",
    "serve_runtime_metrics",
]

_log = logging.getLogger(__name__)

GET_RUNTIME_METRIC = "/tpu.monitoring.runtime.RuntimeMetricService/GetRuntimeMetric"
"""The method path libtpu serves (proto package ``tpu.monitoring.runtime``)."""

INSTALL_GRPC = (
    "the Python packages grpcio and protobuf are not installed: pip install 'otel-gpu[tpu]'"
)

# Status codes that say "the service is not there" rather than "this metric is unknown".
_UNREACHABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"})
_DEVICE_KEYS = frozenset({"device-id", "device_id", "device_ordinal"})

Reading = list[tuple[int, float]]
"""The points of one metric: ``(libtpu device id, value)``, sorted by device id."""


class RuntimeUnreachable(OtelGpuError):
    """The runtime metric service did not answer (no workload runs, or it hangs)."""

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(f"TPU runtime metric service at {address}: {reason}")


def load() -> tuple[Any, Any]:
    """Import grpc and the generated messages, or raise :class:`BackendUnavailable`."""
    try:
        import grpc

        from otel_gpu.backends.tpu._proto import tpu_metric_service_pb2 as pb
    except Exception as err:  # ImportError, or a protobuf runtime too old for the gencode
        raise BackendUnavailable("tpu", INSTALL_GRPC) from err
    return grpc, pb


class RuntimeMetricClient:
    """Reads runtime metrics from libtpu. Not thread-safe (one sweep at a time).

    The channel is dropped after the service stops answering, so that the next attempt
    connects afresh instead of waiting out gRPC's reconnect backoff.
    """

    def __init__(self, address: str, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._grpc, self._pb = load()
        self._channel: Any = None
        self._call: Any = None

    def fetch(self, names: Sequence[str]) -> tuple[dict[str, Reading], dict[str, str]]:
        """Ask for every metric in ``names`` at once.

        Returns the readings by name and, for names the runtime refused (unknown to this libtpu
        version), the gRPC status code. Raises :class:`RuntimeUnreachable` when the service does
        not answer within ``timeout_s``.
        """
        if not names:
            return {}, {}
        call = self._callable()
        pending = {
            name: call.future(self._pb.MetricRequest(metric_name=name), timeout=self.timeout_s)
            for name in names
        }
        readings: dict[str, Reading] = {}
        refused: dict[str, str] = {}
        unreachable: str | None = None
        for name, future in pending.items():
            try:
                response = future.result(timeout=self.timeout_s + 1.0)
            except self._grpc.RpcError as err:
                code = _code_name(err)
                if code in _UNREACHABLE_CODES:
                    unreachable = unreachable or f"{code}: {_details(err)}"
                else:
                    refused[name] = code
                continue
            except self._grpc.FutureTimeoutError:
                future.cancel()
                unreachable = unreachable or "no answer"
                continue
            readings[name] = _points(response, name)
        if unreachable is not None:
            for future in pending.values():
                future.cancel()
            self.close()
            raise RuntimeUnreachable(self.address, unreachable)
        return readings, refused

    def close(self) -> None:
        """Close the channel (a later :meth:`fetch` opens a new one)."""
        channel, self._channel, self._call = self._channel, None, None
        if channel is not None:
            try:
                channel.close()
            except Exception:  # closing must never raise into a sweep
                _log.debug("closing the TPU metrics channel failed", exc_info=True)

    def _callable(self) -> Any:
        if self._call is None:
            grpc, pb = self._grpc, self._pb
            self._channel = grpc.secure_channel(
                self.address,
                grpc.local_channel_credentials(),
                options=[("grpc.enable_retries", 0)],
            )
            self._call = self._channel.unary_unary(
                GET_RUNTIME_METRIC,
                request_serializer=pb.MetricRequest.SerializeToString,
                response_deserializer=pb.MetricResponse.FromString,
            )
        return self._call


def _code_name(err: Any) -> str:
    try:
        return str(err.code().name)
    except Exception:
        return "UNKNOWN"


def _details(err: Any) -> str:
    try:
        return str(err.details())
    except Exception:
        return str(err)


def _points(response: Any, name: str) -> Reading:
    """The ``(device id, value)`` points of one response; unusable points are skipped."""
    out: dict[int, float] = {}
    for metric in response.metric.metrics:
        device = _device_id(metric.attribute)
        value = _value(metric)
        if device is None or value is None:
            _log.debug("%s: skipping a point without device id or numeric value", name)
            continue
        out[device] = value
    return sorted(out.items())


def _device_id(attribute: Any) -> int | None:
    """The libtpu device id in an ``Attribute`` (directly or inside a key-value list)."""
    if attribute.key in _DEVICE_KEYS:
        return _int_attr(attribute.value)
    if attribute.value.WhichOneof("attr") == "kvlist_attr":
        for inner in attribute.value.kvlist_attr.attributes:
            if inner.key in _DEVICE_KEYS:
                return _int_attr(inner.value)
    return None


def _int_attr(value: Any) -> int | None:
    kind = value.WhichOneof("attr")
    if kind == "int_attr":
        return int(value.int_attr)
    if kind == "string_attr" and value.string_attr.isdecimal():
        return int(value.string_attr)
    return None


def _value(metric: Any) -> float | None:
    """A gauge's or counter's number; strings, booleans, distributions and NaN are not."""
    measure = metric.WhichOneof("measure")
    if measure not in ("gauge", "counter"):
        return None
    holder = getattr(metric, measure)
    kind = holder.WhichOneof("value")
    if kind not in ("as_int", "as_double"):
        return None
    number = float(getattr(holder, kind))
    return number if math.isfinite(number) else None


def serve_runtime_metrics(
    lookup: Callable[[str], Mapping[int, float | int] | None],
    host: str = "127.0.0.1",
    port: int = 0,
) -> tuple[Any, int]:
    """Start a server speaking libtpu's ``GetRuntimeMetric`` (local credentials, like libtpu).

    ``lookup(metric_name)`` returns the value by device id, or ``None`` for an unknown metric
    (answered ``NOT_FOUND``). Integers are sent as ``Gauge.as_int``, floats as ``as_double``.
    Returns ``(server, port)``; stop it with ``server.stop(None)``.
    """
    grpc, pb = load()

    def get_runtime_metric(request: Any, context: Any) -> Any:
        values = lookup(request.metric_name)
        if values is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown metric {request.metric_name}")
            return None  # abort() raises; this is for readers and type checkers
        points = []
        for device, value in sorted(values.items()):
            gauge = pb.Gauge(as_int=value) if isinstance(value, int) else pb.Gauge(as_double=value)
            points.append(
                pb.Metric(
                    attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=device)),
                    gauge=gauge,
                )
            )
        return pb.MetricResponse(metric=pb.TPUMetric(name=request.metric_name, metrics=points))

    handler = grpc.method_handlers_generic_handler(
        "tpu.monitoring.runtime.RuntimeMetricService",
        {
            "GetRuntimeMetric": grpc.unary_unary_rpc_method_handler(
                get_runtime_metric,
                request_deserializer=pb.MetricRequest.FromString,
                response_serializer=pb.MetricResponse.SerializeToString,
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    bound = server.add_secure_port(f"{host}:{port}", grpc.local_server_credentials())
    server.start()
    return server, bound
