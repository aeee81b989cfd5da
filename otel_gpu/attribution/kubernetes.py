"""Kubernetes: which pod and container holds each device.

:class:`PodResourcesClient` asks the kubelet's PodResources v1 gRPC API (``List``, and ``Get``
where the kubelet serves it) over its unix socket, every call bounded by a short deadline.
:class:`KubeletPods` keeps the last answer for the hot path: it is refreshed on the attribution
thread, never during a collection. A socket that is missing, not permitted or not answering is
one WARNING ("no Kubernetes attribution") and is tried again on every refresh; the last good
answer is kept for :attr:`KubeletPods.stale_after_s`, then dropped.

The PodResources API names pods but not their UIDs. :class:`PodDirectory` reads them from the
kubelet's log layout, ``/var/log/pods/<namespace>_<pod>_<uid>/`` and
``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log``, which also names the
container a process's cgroup points at.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_gpu.errors import OtelGpuError

__all__ = [
    "ContainerAllocation",
    "KubeletPods",
    "KubeletUnavailable",
    "PodAllocation",
    "PodDirectory",
    "PodResourcesClient",
]

_log = logging.getLogger(__name__)
_MAX_GETS_PER_REFRESH = 16
_MAX_PENDING = 256
_CONTAINER_LOG = re.compile(
    r"^(?P<pod>[^_]+)_(?P<namespace>[^_]+)_(?P<container>.+)-(?P<id>[0-9a-f]{64})\.log$"
)


class KubeletUnavailable(OtelGpuError):
    """The kubelet PodResources API cannot be used now; ``reason`` says why, in one line."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class GetUnsupported(KubeletUnavailable):
    """The kubelet does not serve ``Get`` (feature gate ``KubeletPodResourcesGet`` off)."""


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """A container and the devices allocated to it: ``(resource name, device id)`` pairs."""

    name: str
    devices: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """A pod and its containers' devices, as the kubelet reports them."""

    namespace: str
    name: str
    containers: tuple[ContainerAllocation, ...] = ()


def _pod_from_message(pod: Any) -> PodAllocation:
    return PodAllocation(
        namespace=pod.namespace,
        name=pod.name,
        containers=tuple(
            ContainerAllocation(
                c.name,
                tuple((d.resource_name, i) for d in c.devices for i in d.device_ids),
            )
            for c in pod.containers
        ),
    )


class PodResourcesClient:
    """A client of the kubelet PodResources v1 API on a unix socket.

    Every call is bounded by ``timeout_s``. Failures raise :class:`KubeletUnavailable` with a
    one-line reason (socket missing, permission denied, deadline exceeded...).
    """

    def __init__(self, socket: Path, timeout_s: float = 2.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        self._channel: Any = None
        self._list: Any = None
        self._get: Any = None
        self._lock = threading.Lock()

    def _stubs(self) -> tuple[Any, Any]:
        self._check_socket()
        with self._lock:
            if self._channel is None:
                try:
                    import grpc  # type: ignore[import-untyped, unused-ignore]

                    from otel_gpu.attribution import podresources as pb
                except Exception as err:  # grpcio/protobuf missing or broken
                    raise KubeletUnavailable(
                        f"grpcio and protobuf are needed for the kubelet API ({err})"
                    ) from err
                self._channel = grpc.insecure_channel(
                    f"unix://{self.socket}",
                    options=[
                        ("grpc.enable_http_proxy", 0),
                        ("grpc.max_receive_message_length", 64 << 20),
                    ],
                )
                self._list = self._channel.unary_unary(
                    pb.LIST_METHOD,
                    request_serializer=pb.ListPodResourcesRequest.SerializeToString,
                    response_deserializer=pb.ListPodResourcesResponse.FromString,
                )
                self._get = self._channel.unary_unary(
                    pb.GET_METHOD,
                    request_serializer=pb.GetPodResourcesRequest.SerializeToString,
                    response_deserializer=pb.GetPodResourcesResponse.FromString,
                )
            return self._list, self._get

    def _check_socket(self) -> None:
        try:
            mode = os.stat(self.socket).st_mode
        except FileNotFoundError:
            raise KubeletUnavailable(f"kubelet socket {self.socket} does not exist") from None
        except PermissionError:
            raise KubeletUnavailable(f"no permission to reach {self.socket}") from None
        except OSError as err:
            raise KubeletUnavailable(f"cannot reach {self.socket}: {err.strerror}") from err
        if not stat.S_ISSOCK(mode):
            raise KubeletUnavailable(f"{self.socket} is not a unix socket")
        if not os.access(self.socket, os.R_OK | os.W_OK):
            raise KubeletUnavailable(f"no permission to use {self.socket} (run as root)")

    def list(self) -> tuple[PodAllocation, ...]:
        """Every pod on the node with its containers' devices (``List``)."""
        list_call, _ = self._stubs()
        from otel_gpu.attribution import podresources as pb

        response = self._call(list_call, pb.ListPodResourcesRequest(), "List")
        return tuple(_pod_from_message(p) for p in response.pod_resources)

    def get(self, namespace: str, name: str) -> PodAllocation | None:
        """One pod (``Get``); ``None`` when the kubelet does not know it.

        Raises :class:`GetUnsupported` when the kubelet does not serve ``Get``.
        """
        _, get_call = self._stubs()
        from otel_gpu.attribution import podresources as pb

        request = pb.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        try:
            response = self._call(get_call, request, "Get")
        except _NotFound:
            return None
        if not response.HasField("pod_resources"):
            return None
        return _pod_from_message(response.pod_resources)

    def _call(self, stub: Any, request: Any, method: str) -> Any:
        import grpc

        try:
            return stub(request, timeout=self.timeout_s)
        except grpc.RpcError as err:
            code = err.code() if callable(getattr(err, "code", None)) else None
            details = err.details() if callable(getattr(err, "details", None)) else ""
            if code == grpc.StatusCode.UNIMPLEMENTED and method == "Get":
                raise GetUnsupported("the kubelet does not serve PodResources Get") from None
            if code == grpc.StatusCode.NOT_FOUND and method == "Get":
                raise _NotFound from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise KubeletUnavailable(
                    f"the kubelet at {self.socket} did not answer {method} within "
                    f"{self.timeout_s:g}s"
                ) from None
            name = code.name if code is not None else "error"
            raise KubeletUnavailable(
                f"PodResources {method} at {self.socket} failed: {name} {details}".rstrip()
            ) from None

    def close(self) -> None:
        """Close the channel (a later call opens a new one)."""
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()


class _NotFound(Exception):
    pass


class KubeletPods:
    """The pods of the node as of the last :meth:`refresh`, for the hot path.

    :meth:`request` asks for one pod the processes revealed before the next ``List``: the next
    :meth:`refresh_requested` fetches it with ``Get`` when the kubelet serves ``Get``.
    """

    def __init__(
        self,
        client: PodResourcesClient,
        *,
        stale_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._pods: dict[tuple[str, str], PodAllocation] = {}
        self._ok_at: float | None = None
        self._failing = False
        self._get_supported = True
        self._pending: set[tuple[str, str]] = set()
        self._asked: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self.wake = threading.Event()

    @property
    def available(self) -> bool:
        """Whether the last refresh reached the kubelet."""
        return self._ok_at is not None and not self._failing

    def pods(self) -> tuple[PodAllocation, ...]:
        """The pods as of the last good answer (empty once that is too old)."""
        if self._ok_at is None or self._clock() - self._ok_at > self.stale_after_s:
            return ()
        return tuple(self._pods.values())

    def known(self, namespace: str, name: str) -> bool:
        """Whether the last answer listed this pod."""
        return (namespace, name) in self._pods

    def refresh(self) -> None:
        """``List`` every pod; on failure keep the last answer (until it is stale)."""
        try:
            pods = self.client.list()
        except KubeletUnavailable as err:
            self._fail(err)
            return
        self._pods = {(p.namespace, p.name): p for p in pods}
        self._ok_at = self._clock()
        with self._lock:
            self._asked = {k: t for k, t in self._asked.items() if k not in self._pods}
        self._recover()

    def request(self, namespace: str, name: str) -> None:
        """Ask for ``namespace/name`` with ``Get`` before the next ``List`` (at most once per
        ``stale_after_s``); wakes the refresher."""
        if not self._get_supported or not namespace or not name:
            return
        key = (namespace, name)
        now = self._clock()
        with self._lock:
            if key in self._pods or key in self._pending or len(self._pending) >= _MAX_PENDING:
                return
            asked = self._asked.get(key)
            if asked is not None and now - asked < self.stale_after_s:
                return
            self._asked[key] = now
            self._pending.add(key)
        self.wake.set()

    def refresh_requested(self) -> int:
        """``Get`` the requested pods (a few at a time); returns how many were fetched."""
        with self._lock:
            batch = list(self._pending)[:_MAX_GETS_PER_REFRESH]
            self._pending.difference_update(batch)
        fetched = 0
        for namespace, name in batch:
            try:
                pod = self.client.get(namespace, name)
            except GetUnsupported:
                self._get_supported = False
                _log.debug("attribution: kubelet has no PodResources Get; waiting for List")
                with self._lock:
                    self._pending.clear()
                return fetched
            except KubeletUnavailable as err:
                self._fail(err)
                return fetched
            if pod is not None:
                self._pods = {**self._pods, (namespace, name): pod}
                fetched += 1
        return fetched

    def _fail(self, err: KubeletUnavailable) -> None:
        if not self._failing:
            self._failing = True
            _log.warning("attribution: no Kubernetes attribution: %s", err.reason)
        else:
            _log.debug("attribution: kubelet still unavailable: %s", err.reason)

    def _recover(self) -> None:
        if self._failing:
            self._failing = False
            _log.info("attribution: the kubelet PodResources API answers again")


class PodDirectory:
    """Pod UIDs and container names from the kubelet's log directories under ``root``."""

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root
        self._uids: dict[tuple[str, str], str] = {}
        self._pods: dict[str, tuple[str, str]] = {}
        self._containers: dict[str, tuple[str, str, str]] = {}

    def refresh(self) -> None:
        """Read ``var/log/pods`` and ``var/log/containers`` again (missing: empty)."""
        uids: dict[tuple[str, str], str] = {}
        pods: dict[str, tuple[str, str]] = {}
        for name in _listdir(self.root / "var" / "log" / "pods"):
            parts = name.split("_")
            if len(parts) == 3 and all(parts):
                namespace, pod, uid = parts
                uids[(namespace, pod)] = uid
                pods[uid] = (namespace, pod)
        containers: dict[str, tuple[str, str, str]] = {}
        for name in _listdir(self.root / "var" / "log" / "containers"):
            m = _CONTAINER_LOG.match(name)
            if m:
                containers[m.group("id")] = (
                    m.group("namespace"),
                    m.group("pod"),
                    m.group("container"),
                )
        self._uids, self._pods, self._containers = uids, pods, containers

    def uid(self, namespace: str, name: str) -> str | None:
        """The UID of pod ``namespace/name``, if its log directory exists."""
        return self._uids.get((namespace, name))

    def pod(self, uid: str) -> tuple[str, str] | None:
        """``(namespace, name)`` of the pod with ``uid``."""
        return self._pods.get(uid)

    def container(self, container_id: str) -> tuple[str, str, str] | None:
        """``(namespace, pod, container name)`` of a container id."""
        return self._containers.get(container_id)


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
