"""A fake kubelet: the PodResources v1 gRPC API on a real unix socket, with scriptable pods.

For tests and demos of Kubernetes attribution without a cluster::

    with FakeKubelet() as kubelet:
        kubelet.set_pod("train-0", "ml", {"trainer": [("nvidia.com/gpu", ["GPU-…"])]})
        env = {"OTEL_GPU_ATTRIBUTION": "kubernetes", "OTEL_GPU_KUBELET_SOCKET": str(kubelet.socket)}
        ...
        kubelet.remove_pod("train-0", "ml")

``hang=True`` accepts every call and never answers (until :meth:`FakeKubelet.stop`), to test a
client's deadline; ``get=False`` answers ``Get`` with UNIMPLEMENTED, as a kubelet without the
``KubeletPodResourcesGet`` gate does. ``list_calls`` and ``get_calls`` count the calls.

The socket lives in a fresh short directory under the system temp dir (a unix socket path must
stay under about 100 bytes) unless ``socket`` names one.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]

from otel_gpu.attribution import podresources as pb

__all__ = ["FakeKubelet", "FakePod"]

#: ``{container name: [(resource name, [device ids])]}``
Containers = Mapping[str, Sequence[tuple[str, Sequence[str]]]]
_HANG_LIMIT_S = 60.0


class FakePod:
    """One pod: its name, namespace and containers' devices."""

    def __init__(self, name: str, namespace: str, containers: Containers) -> None:
        self.name = name
        self.namespace = namespace
        self.containers = {c: [(r, list(ids)) for r, ids in devs] for c, devs in containers.items()}

    def message(self) -> Any:
        """The pod as a ``v1.PodResources`` message."""
        return pb.PodResources(
            name=self.name,
            namespace=self.namespace,
            containers=[
                pb.ContainerResources(
                    name=container,
                    devices=[
                        pb.ContainerDevices(resource_name=resource, device_ids=ids)
                        for resource, ids in devices
                    ],
                    cpu_ids=[2, 3],
                )
                for container, devices in self.containers.items()
            ],
        )


class FakeKubelet:
    """A PodResources v1 server on a unix socket (see the module docstring)."""

    def __init__(self, socket: Path | None = None, *, hang: bool = False, get: bool = True) -> None:
        self._tmpdir: Path | None = None
        if socket is None:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="otel-gpu-kubelet-"))
            socket = self._tmpdir / "kubelet.sock"
        self.socket = socket
        self.hang = hang
        self.get_enabled = get
        self.list_calls = 0
        self.get_calls = 0
        self._pods: dict[tuple[str, str], FakePod] = {}
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server: Any = None

    # -- scripting ---------------------------------------------------------------------------

    def set_pod(self, name: str, namespace: str, containers: Containers) -> None:
        """Add or replace a pod."""
        with self._lock:
            self._pods[(namespace, name)] = FakePod(name, namespace, containers)

    def remove_pod(self, name: str, namespace: str) -> None:
        """Remove a pod (it went away)."""
        with self._lock:
            self._pods.pop((namespace, name), None)

    def clear(self) -> None:
        """Remove every pod."""
        with self._lock:
            self._pods.clear()

    # -- server ------------------------------------------------------------------------------

    def start(self) -> FakeKubelet:
        """Listen on :attr:`socket`."""
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet")
        )
        handlers = {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list,
                request_deserializer=pb.ListPodResourcesRequest.FromString,
                response_serializer=pb.ListPodResourcesResponse.SerializeToString,
            ),
            "Get": grpc.unary_unary_rpc_method_handler(
                self._get,
                request_deserializer=pb.GetPodResourcesRequest.FromString,
                response_serializer=pb.GetPodResourcesResponse.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(pb.SERVICE, handlers),)
        )
        if server.add_insecure_port(f"unix://{self.socket}") == 0:
            raise RuntimeError(f"cannot listen on {self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Release hung calls, stop the server and remove the socket's temp directory."""
        self._release.set()
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait(5)
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_if_hanging(self) -> None:
        if self.hang:
            self._release.wait(_HANG_LIMIT_S)

    def _list(self, _request: Any, _context: Any) -> Any:
        with self._lock:
            self.list_calls += 1
            pods = [p.message() for p in self._pods.values()]
        self._wait_if_hanging()
        return pb.ListPodResourcesResponse(pod_resources=pods)

    def _get(self, request: Any, context: Any) -> Any:
        with self._lock:
            self.get_calls += 1
            pod = self._pods.get((request.pod_namespace, request.pod_name))
        self._wait_if_hanging()
        if not self.get_enabled:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "PodResources Get is disabled")
        if pod is None:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
            )
            return pb.GetPodResourcesResponse()
        return pb.GetPodResourcesResponse(pod_resources=pod.message())
