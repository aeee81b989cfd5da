"""An in-process OTLP receiver for tests: what a Collector would receive from otel-gpu.

`OtlpReceiver` listens on loopback with both OTLP transports at once, on free ports:

- gRPC (``opentelemetry.proto.collector.{metrics,logs}.v1`` ``Export`` services);
- HTTP/protobuf (``POST /v1/metrics`` and ``POST /v1/logs``, ``application/x-protobuf`` bodies,
  ``Content-Encoding: gzip`` or ``deflate`` accepted).

Every accepted request is decoded with the official protobuf classes
(``ExportMetricsServiceRequest``, ``ExportLogsServiceRequest``) and kept in arrival order. The
receiver can also answer with an error status (e.g. ``UNAVAILABLE``) to play a failing Collector.

    with OtlpReceiver() as rx:
        env = rx.exporter_env("grpc")             # OTEL_EXPORTER_OTLP_* for a child process
        ...                                       # run the exporter
        assert rx.wait_for(lambda r: r.log_records(), timeout=5)
        for point in rx.points("hw.power"):
            print(point.attributes["hw.name"], point.value)

The flattening helpers (`iter_metrics`, `iter_points`, `iter_log_records`, `attributes`,
`any_value`) turn the nested OTLP messages into rows with plain-dict attributes; they also work
on requests obtained elsewhere.

Needs ``grpcio`` and ``opentelemetry-proto`` (the ``test`` extra). Loopback only.
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Literal, NamedTuple

import grpc  # type: ignore[import-untyped, unused-ignore]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped, unused-ignore]
from google.rpc import status_pb2  # type: ignore[import-untyped, unused-ignore]
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "HTTP_STATUS",
    "ExportLogsServiceRequest",
    "ExportMetricsServiceRequest",
    "LogRecordRow",
    "MetricRow",
    "OtlpReceiver",
    "PointRow",
    "Received",
    "any_value",
    "attributes",
    "iter_log_records",
    "iter_metrics",
    "iter_points",
]

ExportMetricsServiceRequest = metrics_service_pb2.ExportMetricsServiceRequest
ExportLogsServiceRequest = logs_service_pb2.ExportLogsServiceRequest

Signal = Literal["metrics", "logs"]
Transport = Literal["grpc", "http"]
#: A decoded ``AnyValue``: scalars, lists and dicts of them; ``None`` for an empty value.
Value = str | bool | int | float | bytes | list[Any] | dict[str, Any] | None

#: The HTTP status answered for a gRPC status code (the ``google.rpc.Code`` mapping). OTLP/HTTP
#: exporters retry 429, 502, 503 and 504.
HTTP_STATUS: dict[Any, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
_HTTP_PATHS: dict[str, Signal] = {"/v1/metrics": "metrics", "/v1/logs": "logs"}
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


# -- flattening -----------------------------------------------------------------------------


def any_value(value: AnyValue) -> Value:
    """The Python value of an OTLP ``AnyValue`` (arrays become lists, kvlists dicts)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    result: Value = getattr(value, kind)
    return result


def attributes(key_values: Iterable[KeyValue]) -> dict[str, Value]:
    """OTLP ``KeyValue`` attributes as a plain dict."""
    return {kv.key: any_value(kv.value) for kv in key_values}


class MetricRow(NamedTuple):
    """One metric of an export, with its resource attributes and instrumentation scope."""

    resource: dict[str, Value]
    scope: InstrumentationScope
    metric: Metric

    @property
    def kind(self) -> str:
        """The decoded data kind: ``gauge``, ``sum``, ``histogram``, ``exponential_histogram``
        or ``summary``."""
        return _kind(self.metric)


class PointRow(NamedTuple):
    """One data point, flattened: its metric, kind, attributes and value.

    ``value`` is the number of a gauge or sum point (``as_int`` or ``as_double``), the count
    of a histogram or summary point. ``point`` is the data point message itself.
    """

    resource: dict[str, Value]
    scope: InstrumentationScope
    metric: Metric
    kind: str
    attributes: dict[str, Value]
    value: float | int | None
    point: Any

    @property
    def name(self) -> str:
        """The metric name."""
        return self.metric.name


class LogRecordRow(NamedTuple):
    """One log record with its resource attributes, scope and attributes as a dict."""

    resource: dict[str, Value]
    scope: InstrumentationScope
    record: LogRecord
    attributes: dict[str, Value]

    @property
    def event_name(self) -> str:
        """The record's ``event_name`` (empty when it is not an event)."""
        return self.record.event_name

    @property
    def severity_number(self) -> int:
        """The record's ``SeverityNumber`` as an int (17 = ERROR, 21 = FATAL)."""
        return int(self.record.severity_number)

    @property
    def body(self) -> Value:
        """The record's body as a Python value."""
        return any_value(self.record.body)


def _kind(metric: Metric) -> str:
    return metric.WhichOneof("data") or ""


def iter_metrics(requests: Iterable[ExportMetricsServiceRequest]) -> Iterator[MetricRow]:
    """Every metric of ``requests``, in order, with its resource attributes and scope."""
    for request in requests:
        for rm in request.resource_metrics:
            resource = attributes(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    yield MetricRow(resource, sm.scope, metric)


def iter_points(
    requests: Iterable[ExportMetricsServiceRequest], name: str | None = None
) -> Iterator[PointRow]:
    """Every data point of ``requests`` (only metric ``name``'s when given)."""
    for row in iter_metrics(requests):
        if name is not None and row.metric.name != name:
            continue
        kind = row.kind
        if not kind:
            continue
        for point in getattr(row.metric, kind).data_points:
            yield PointRow(
                row.resource,
                row.scope,
                row.metric,
                kind,
                attributes(point.attributes),
                _point_value(kind, point),
                point,
            )


def _point_value(kind: str, point: Any) -> float | int | None:
    if kind in ("gauge", "sum"):
        which = point.WhichOneof("value")
        if which is None:
            return None
        number: float | int = getattr(point, which)
        return number
    count = getattr(point, "count", None)
    return None if count is None else int(count)


def iter_log_records(requests: Iterable[ExportLogsServiceRequest]) -> Iterator[LogRecordRow]:
    """Every log record of ``requests``, in order."""
    for request in requests:
        for rl in request.resource_logs:
            resource = attributes(rl.resource.attributes)
            for sl in rl.scope_logs:
                for record in sl.log_records:
                    yield LogRecordRow(resource, sl.scope, record, attributes(record.attributes))


# -- the receiver ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """One request that reached the receiver, accepted or not.

    ``message`` is the decoded request (also for a refused one), ``None`` when the body could
    not be decoded. ``status`` is the ``grpc.StatusCode`` answered. ``metadata`` holds the gRPC
    metadata or the HTTP headers, names in lower case; ``compression`` the HTTP
    ``Content-Encoding`` (gRPC decompresses below the servicer: always ``""`` there).
    """

    signal: Signal
    transport: Transport
    metadata: dict[str, str]
    message: ExportMetricsServiceRequest | ExportLogsServiceRequest | None
    status: Any = grpc.StatusCode.OK
    compression: str = ""
    received_at: float = field(default_factory=time.time)

    @property
    def accepted(self) -> bool:
        """True when the request was answered with OK and stored."""
        return self.status is grpc.StatusCode.OK and self.message is not None


class _Failure:
    """A scripted error answer: ``code`` for the next ``remaining`` requests (None: all)."""

    def __init__(self, code: Any, remaining: int | None, signals: frozenset[str]) -> None:
        self.code = code
        self.remaining = remaining
        self.signals = signals


class OtlpReceiver:
    """An OTLP gRPC + HTTP/protobuf receiver on 127.0.0.1 that stores what it is sent.

    Use it as a context manager (or call :meth:`start` and :meth:`stop`). The ports are free
    ports chosen by the OS at start; :attr:`grpc_endpoint` and :attr:`http_endpoint` are the
    values for ``OTEL_EXPORTER_OTLP_ENDPOINT``. Requests stay readable after :meth:`stop`.

    ``grpc=False`` or ``http=False`` leaves that transport out. ``max_message_bytes`` bounds
    a request on both transports (a Collector's gRPC receiver defaults to 4 MiB: pass
    ``4 << 20`` to mirror it). Thread-safe: the servers store from their own threads; every
    accessor returns a copy.
    """

    HOST: ClassVar[str] = "127.0.0.1"

    def __init__(
        self,
        *,
        grpc: bool = True,
        http: bool = True,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._want_grpc = grpc
        self._want_http = http
        self.max_message_bytes = max_message_bytes
        self._cond = threading.Condition(threading.RLock())
        self._received: list[Received] = []
        self._version = 0
        self._failure: _Failure | None = None
        self._grpc_server: Any = None
        self._http_server: _HttpServer | None = None
        self._http_thread: threading.Thread | None = None
        self._grpc_port: int | None = None
        self._http_port: int | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> OtlpReceiver:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Bind free loopback ports and start serving. Idempotent."""
        if self._want_grpc and self._grpc_server is None:
            self._start_grpc()
        if self._want_http and self._http_server is None:
            self._start_http()

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop both servers (in-flight requests get ``grace_s``). Idempotent."""
        if self._grpc_server is not None:
            self._grpc_server.stop(grace_s).wait(grace_s + 1.0)
            self._grpc_server = None
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
            self._http_server.close_connections()
            self._http_server = None
        if self._http_thread is not None:
            self._http_thread.join(grace_s + 1.0)
            self._http_thread = None

    def _start_grpc(self) -> None:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="otlp-grpc"),
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", self.max_message_bytes),
            ],
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _MetricsServicer(self), server
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _LogsServicer(self), server
        )
        port = server.add_insecure_port(f"{self.HOST}:0")
        if not port:
            raise OSError(f"could not bind a gRPC port on {self.HOST}")
        server.start()
        self._grpc_server = server
        self._grpc_port = int(port)

    def _start_http(self) -> None:
        server = _HttpServer(self)
        self._http_server = server
        self._http_port = int(server.server_address[1])
        self._http_thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="otlp-http",
            daemon=True,
        )
        self._http_thread.start()

    # -- endpoints ----------------------------------------------------------------------------

    @property
    def grpc_port(self) -> int:
        """The gRPC port (after :meth:`start`)."""
        if self._grpc_port is None:
            raise RuntimeError("the gRPC receiver is not started")
        return self._grpc_port

    @property
    def http_port(self) -> int:
        """The HTTP port (after :meth:`start`)."""
        if self._http_port is None:
            raise RuntimeError("the HTTP receiver is not started")
        return self._http_port

    @property
    def grpc_endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the gRPC server (insecure)."""
        return f"http://{self.HOST}:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the HTTP server; exporters append ``/v1/<signal>``."""
        return f"http://{self.HOST}:{self.http_port}"

    def endpoint(self, protocol: str) -> str:
        """The endpoint for an ``OTEL_EXPORTER_OTLP_PROTOCOL`` value."""
        if protocol == "grpc":
            return self.grpc_endpoint
        if protocol == "http/protobuf":
            return self.http_endpoint
        raise ValueError(f"unsupported OTLP protocol {protocol!r}: grpc, http/protobuf")

    def exporter_env(self, protocol: str) -> dict[str, str]:
        """The ``OTEL_EXPORTER_OTLP_*`` variables that point an SDK exporter here."""
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint(protocol),
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        }
        if protocol == "grpc":
            env["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
        return env

    # -- failure injection --------------------------------------------------------------------

    def fail_with(
        self,
        code: Any = "UNAVAILABLE",
        times: int | None = None,
        signals: Iterable[Signal] = ("metrics", "logs"),
    ) -> None:
        """Answer the next ``times`` requests (all, when ``None``) of ``signals`` with ``code``:
        a ``grpc.StatusCode`` or its name (``"UNAVAILABLE"``, ``"RESOURCE_EXHAUSTED"``...).
        HTTP answers the matching status of :data:`HTTP_STATUS` (503, 429...).

        Refused requests are recorded in :attr:`received` but not in the accepted lists.
        """
        if isinstance(code, str):
            try:
                code = grpc.StatusCode[code.strip().upper()]
            except KeyError:
                raise ValueError(f"unknown gRPC status {code!r}") from None
        if code not in HTTP_STATUS or code is grpc.StatusCode.OK:
            raise ValueError(f"not an error status: {code!r}")
        if times is not None and times < 1:
            raise ValueError("times must be >= 1 or None")
        with self._cond:
            self._failure = _Failure(code, times, frozenset(signals))

    def succeed(self) -> None:
        """Accept every request again (undo :meth:`fail_with`)."""
        with self._cond:
            self._failure = None

    def _next_status(self, signal: Signal) -> Any:
        with self._cond:
            failure = self._failure
            if failure is None or signal not in failure.signals:
                return grpc.StatusCode.OK
            if failure.remaining is not None:
                failure.remaining -= 1
                if failure.remaining <= 0:
                    self._failure = None
            return failure.code

    # -- storage and access -------------------------------------------------------------------

    def _record(self, received: Received) -> None:
        with self._cond:
            self._received.append(received)
            self._version += 1
            self._cond.notify_all()

    @property
    def received(self) -> list[Received]:
        """Every export request that arrived, accepted or refused, in order (HTTP requests
        to an unknown path or with another Content-Type are answered 404/415, not recorded)."""
        with self._cond:
            return list(self._received)

    @property
    def metrics_requests(self) -> list[ExportMetricsServiceRequest]:
        """The accepted metric export requests, in order."""
        with self._cond:
            return [
                r.message
                for r in self._received
                if r.accepted and isinstance(r.message, ExportMetricsServiceRequest)
            ]

    @property
    def log_requests(self) -> list[ExportLogsServiceRequest]:
        """The accepted log export requests, in order."""
        with self._cond:
            return [
                r.message
                for r in self._received
                if r.accepted and isinstance(r.message, ExportLogsServiceRequest)
            ]

    @property
    def refused(self) -> int:
        """How many requests were answered with an error."""
        with self._cond:
            return sum(1 for r in self._received if not r.accepted)

    def clear(self) -> None:
        """Forget every stored request."""
        with self._cond:
            self._received.clear()
            self._version += 1
            self._cond.notify_all()

    def metrics(self) -> list[MetricRow]:
        """Every accepted metric, flattened (see :func:`iter_metrics`)."""
        return list(iter_metrics(self.metrics_requests))

    def metric_names(self) -> set[str]:
        """The names of the accepted metrics."""
        return {row.metric.name for row in self.metrics()}

    def points(self, name: str | None = None) -> list[PointRow]:
        """Every accepted data point (of metric ``name`` when given), flattened."""
        return list(iter_points(self.metrics_requests, name))

    def log_records(self, event_name: str | None = None) -> list[LogRecordRow]:
        """Every accepted log record (with that ``event_name`` when given), flattened."""
        rows = iter_log_records(self.log_requests)
        return [r for r in rows if event_name is None or r.event_name == event_name]

    def resources(self) -> list[dict[str, Value]]:
        """The resource attributes of every accepted resource-metrics and resource-logs."""
        out = [
            attributes(rm.resource.attributes)
            for req in self.metrics_requests
            for rm in req.resource_metrics
        ]
        out.extend(
            attributes(rl.resource.attributes)
            for req in self.log_requests
            for rl in req.resource_logs
        )
        return out

    def wait_for(
        self,
        predicate: Callable[[OtlpReceiver], object],
        timeout: float = 5.0,
    ) -> bool:
        """Wait until ``predicate(self)`` is truthy; False after ``timeout`` seconds.

        The predicate runs now and after every new request, without the receiver's lock
        held, so it may call any accessor: ``rx.wait_for(lambda r: r.log_records())``.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                seen = self._version
            if predicate(self):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._wait_change(seen, remaining)

    def _wait_change(self, seen: int, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen, timeout)


# -- gRPC -----------------------------------------------------------------------------------


def _grpc_metadata(context: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        out[str(key).lower()] = value if isinstance(value, str) else repr(value)
    return out


def _grpc_export(
    receiver: OtlpReceiver,
    signal: Signal,
    request: ExportMetricsServiceRequest | ExportLogsServiceRequest,
    context: Any,
) -> None:
    """Record ``request``; abort the call when a failure is scripted."""
    status = receiver._next_status(signal)
    metadata = _grpc_metadata(context)
    receiver._record(Received(signal, "grpc", metadata, request, status))
    if status is not grpc.StatusCode.OK:
        context.abort(status, f"otlp receiver: scripted {status.name}")


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(
        self, request: ExportMetricsServiceRequest, context: Any
    ) -> metrics_service_pb2.ExportMetricsServiceResponse:
        _grpc_export(self._receiver, "metrics", request, context)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class _LogsServicer(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(
        self, request: ExportLogsServiceRequest, context: Any
    ) -> logs_service_pb2.ExportLogsServiceResponse:
        _grpc_export(self._receiver, "logs", request, context)
        return logs_service_pb2.ExportLogsServiceResponse()


# -- HTTP -----------------------------------------------------------------------------------


class _TooLarge(ValueError):
    """A request body over the receiver's ``max_message_bytes``."""


class _HttpServer(ThreadingHTTPServer):
    """A threading HTTP server on a free loopback port that knows its receiver and closes
    its kept-alive connections when stopped."""

    daemon_threads = True

    def __init__(self, receiver: OtlpReceiver) -> None:
        super().__init__((receiver.HOST, 0), _HttpHandler)
        self.receiver = receiver
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def track(self, connection: socket.socket, active: bool) -> None:
        """Remember (or forget) an open client connection."""
        with self._connections_lock:
            if active:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_connections(self) -> None:
        """Shut down every client connection still open (keep-alive)."""
        with self._connections_lock:
            connections = list(self._connections)
            self._connections.clear()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _HttpHandler(BaseHTTPRequestHandler):
    """``POST /v1/metrics`` and ``POST /v1/logs`` with protobuf bodies."""

    server: _HttpServer

    protocol_version = "HTTP/1.1"
    server_version = "otel-gpu-otlp-receiver"

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        self.server.track(self.connection, False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read the stored requests, not an access log."""

    def do_POST(self) -> None:
        receiver = self.server.receiver
        signal = _HTTP_PATHS.get(self.path.split("?", 1)[0])
        if signal is None:
            self._drain()
            self._reply(HTTPStatus.NOT_FOUND, _status_body(5, f"no OTLP route {self.path}"))
            return
        content_type = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/x-protobuf":
            self._drain()
            self._reply(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                _status_body(3, f"unsupported Content-Type {content_type!r}"),
            )
            return
        encoding = self.headers.get("Content-Encoding", "").strip().lower()
        metadata = {k.lower(): v for k, v in self.headers.items()}
        try:
            body = _decompress(self._read_body(), encoding)
            if len(body) > receiver.max_message_bytes:
                raise _TooLarge(f"decompressed body over {receiver.max_message_bytes} bytes")
            message: ExportMetricsServiceRequest | ExportLogsServiceRequest = (
                ExportMetricsServiceRequest() if signal == "metrics" else ExportLogsServiceRequest()
            )
            message.ParseFromString(body)
        except _TooLarge as err:
            self.close_connection = True
            receiver._record(
                Received(
                    signal, "http", metadata, None, grpc.StatusCode.RESOURCE_EXHAUSTED, encoding
                )
            )
            self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, _status_body(8, str(err)))
            return
        except (OSError, EOFError, ValueError, zlib.error, DecodeError) as err:
            receiver._record(
                Received(signal, "http", metadata, None, grpc.StatusCode.INVALID_ARGUMENT, encoding)
            )
            self._reply(HTTPStatus.BAD_REQUEST, _status_body(3, f"undecodable body: {err}"))
            return
        status = receiver._next_status(signal)
        receiver._record(Received(signal, "http", metadata, message, status, encoding))
        if status is not grpc.StatusCode.OK:
            code = int(status.value[0])
            self._reply(HTTP_STATUS[status], _status_body(code, f"scripted {status.name}"))
            return
        response = (
            metrics_service_pb2.ExportMetricsServiceResponse()
            if signal == "metrics"
            else logs_service_pb2.ExportLogsServiceResponse()
        )
        self._reply(HTTPStatus.OK, response.SerializeToString())

    def _read_body(self) -> bytes:
        limit = self.server.receiver.max_message_bytes
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            total = 0
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                total += size
                if total > limit:
                    raise _TooLarge(f"body over {limit} bytes")
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > limit:
            raise _TooLarge(f"body over {limit} bytes")
        return self.rfile.read(length) if length > 0 else b""

    def _drain(self) -> None:
        try:
            self._read_body()
        except (OSError, ValueError):
            self.close_connection = True

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _decompress(body: bytes, encoding: str) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


def _status_body(code: int, message: str) -> bytes:
    """A ``google.rpc.Status`` body, as OTLP/HTTP error responses carry."""
    body: bytes = status_pb2.Status(code=code, message=message).SerializeToString()
    return body
