"""The attribution engine: who holds each device, per sweep, from cached sources.

Slow sources (the kubelet, the pod log directory, the Slurm mapping directory and cgroup tree)
are read by :meth:`Attribution.refresh` on the ``otel-gpu-attribution`` thread. Each sweep
(once per collection, under the snapshot cache's lock) only joins what they last said with
the processes of the snapshot (whose ``/proc`` entries are read once per pid) and computes,
once per snapshot: the attributes of every device's points, the per-process series and the
per-workload energy.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from otel_gpu.attribution.devices import DeviceMatcher, resource_vendor
from otel_gpu.attribution.energy import DESCRIPTION as ENERGY_DESCRIPTION
from otel_gpu.attribution.energy import METRIC as ENERGY_METRIC
from otel_gpu.attribution.energy import EnergyIntegrator, WorkloadKey
from otel_gpu.attribution.kubernetes import KubeletPods, PodDirectory, PodResourcesClient
from otel_gpu.attribution.procfs import ProcessCache, ProcessInfo, ProcReader
from otel_gpu.attribution.settings import AttributionSettings
from otel_gpu.attribution.slurm import JobInfo, JobMap, job_of_process, merge_jobs, user_name
from otel_gpu.hal.model import DeviceSample, Inventory, ProcessSample, Snapshot

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

    from otel_gpu.hal.manager import DeviceManager
    from otel_gpu.otel.bridge import GpuTelemetry

__all__ = ["MEMORY_METRIC", "UTILIZATION_METRIC", "Attribution"]

_log = logging.getLogger("otel_gpu.attribution")

MEMORY_METRIC = "accel.workload.memory.usage"
UTILIZATION_METRIC = "accel.workload.utilization"
_FIRST_REFRESH_SLACK_S = 1.0
_STOP_JOIN_S = 1.0  # a daemon thread: never hold up the agent's 5 s shutdown

Attrs = dict[str, str]
ProcessPoint = tuple[float, Mapping[str, str | int]]


@dataclass(slots=True)
class _Holder:
    """A workload holding a device in this sweep."""

    key: WorkloadKey
    attributes: Attrs
    containers: set[str] = field(default_factory=set)

    @property
    def kind(self) -> str:
        return "slurm" if self.key[0] == "slurm" else "k8s"

    def point_attributes(self) -> Attrs:
        attrs = dict(self.attributes)
        if len(self.containers) == 1:
            attrs["k8s.container.name"] = next(iter(self.containers))
        return attrs


@dataclass(frozen=True, slots=True)
class _Owner:
    """What a process belongs to: its pod (key and attributes) and its Slurm job."""

    pod_key: WorkloadKey | None = None
    pod: Attrs | None = None
    container: str | None = None
    job: JobInfo | None = None


class Attribution:
    """Kubernetes pod, Slurm job and process attribution for a :class:`GpuTelemetry`.

    Build it from the settings, pass :attr:`attribute_sources` to ``GpuTelemetry`` and call
    :meth:`start` before (or after) ``GpuTelemetry.start()``; :meth:`close` at shutdown. With
    attribution off (no source in ``OTEL_GPU_ATTRIBUTION``) every method does nothing.

    ``client`` replaces the kubelet client and ``users`` the uid -> user name lookup (tests).
    """

    def __init__(
        self,
        settings: AttributionSettings,
        *,
        client: PodResourcesClient | None = None,
        users: Callable[[int], str | None] = user_name,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        sources = settings.sources
        root = settings.host_root
        self._clock = clock
        self._kubelet: KubeletPods | None = None
        if "kubernetes" in sources:
            self._kubelet = KubeletPods(
                client or PodResourcesClient(settings.kubelet_socket, settings.kubelet_timeout_s),
                stale_after_s=3 * settings.refresh_s,
                clock=clock,
            )
        self._directory = PodDirectory(root) if sources & {"kubernetes", "process"} else None
        self._jobs = JobMap(settings.slurm_job_map_dir, root, users) if "slurm" in sources else None
        self._want_processes = bool(sources & {"slurm", "process"})
        self._processes = ProcessCache(ProcReader(root)) if self._want_processes else None
        self._users = functools.lru_cache(maxsize=1024)(users)
        self._energy = EnergyIntegrator()
        self._matcher: DeviceMatcher | None = None
        self._last: Snapshot | None = None
        self._device_attrs: Mapping[str, Mapping[str, str]] = {}
        self._process_points: tuple[ProcessPoint, ...] = ()
        self._utilization_points: tuple[ProcessPoint, ...] = ()
        self._capped_warned = False
        self._lock = threading.Lock()
        self._telemetry: GpuTelemetry | None = None
        self._unmatched_warned = False
        self._failed_warned = False
        self._instruments: list[object] = []
        self._stop = threading.Event()
        self._wake = self._kubelet.wake if self._kubelet is not None else threading.Event()
        self._first_refresh = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Attribution:
        """Build from the ``OTEL_GPU_ATTRIBUTION*`` variables (raises ``ConfigError``)."""
        return cls(AttributionSettings.from_env(env))

    @property
    def enabled(self) -> bool:
        """Whether any attribution source is on."""
        return self.settings.enabled

    @property
    def attribute_sources(
        self,
    ) -> tuple[Callable[[Inventory, Snapshot], Mapping[str, Mapping[str, str]]], ...]:
        """For ``GpuTelemetry(attribute_sources=...)``: empty when attribution is off."""
        return (self.device_attributes,) if self.enabled else ()

    # -- lifecycle ---------------------------------------------------------------------------

    def prepare(self, manager: DeviceManager) -> None:
        """Ask ``manager``'s backends for what attribution needs (the processes on each device,
        for ``slurm`` and ``process``); :meth:`start` does it. Call it before sampling when using
        :meth:`device_attributes` without a ``GpuTelemetry`` (``otel-gpu health``)."""
        if self._want_processes:
            manager.enable("processes")

    def start(
        self, telemetry: GpuTelemetry, meter_provider: MeterProvider, *, background: bool = True
    ) -> None:
        """Hook into ``telemetry`` (a :class:`~otel_gpu.otel.GpuTelemetry`): ask the backends
        for processes when needed, run once per sweep, register ``accel.workload.*`` on
        ``meter_provider`` (the same meter scope as the device metrics) and start refreshing.

        With ``background`` the first refresh is awaited (at most the kubelet deadline plus a
        second), so that the first collection already sees the pods; without it, the caller
        drives :meth:`refresh` (tests).
        """
        if not self.enabled or self._telemetry is not None:
            return
        self._telemetry = telemetry
        self.prepare(telemetry.manager)
        telemetry.cache.on_sweep.append(self._on_sweep)
        self._register(meter_provider)
        if not background:
            self.refresh()
            return
        self._thread = threading.Thread(target=self._run, name="otel-gpu-attribution", daemon=True)
        self._thread.start()
        self._first_refresh.wait(self.settings.kubelet_timeout_s + _FIRST_REFRESH_SLACK_S)

    def close(self) -> None:
        """Stop the refresher (waiting at most a second for it) and close the kubelet channel."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(_STOP_JOIN_S)
        if self._kubelet is not None:
            self._kubelet.client.close()

    def refresh(self) -> None:
        """Read the slow sources again (the refresher does this every ``refresh_s``)."""
        for name, step in (
            ("kubelet", self._kubelet.refresh if self._kubelet else None),
            ("pod log directory", self._directory.refresh if self._directory else None),
            ("Slurm job map", self._jobs.refresh if self._jobs else None),
        ):
            if step is None:
                continue
            try:
                step()
            except Exception:  # a source must never stop the others or the thread
                _log.warning("attribution: refreshing the %s failed", name, exc_info=True)

    def refresh_requested(self) -> None:
        """Fetch, with the kubelet's ``Get``, the pods that processes revealed since the last
        ``List`` (the refresher does this when woken)."""
        if self._kubelet is not None:
            try:
                self._kubelet.refresh_requested()
            except Exception:
                _log.warning("attribution: kubelet Get failed", exc_info=True)

    def _run(self) -> None:
        next_full = 0.0
        while not self._stop.is_set():
            if self._clock() >= next_full:
                self.refresh()
                next_full = self._clock() + self.settings.refresh_s
                self._first_refresh.set()
            else:
                self.refresh_requested()
            self._wake.wait(max(0.0, next_full - self._clock()))
            self._wake.clear()

    # -- per sweep ---------------------------------------------------------------------------

    def device_attributes(
        self, inventory: Inventory, snapshot: Snapshot
    ) -> Mapping[str, Mapping[str, str]]:
        """The attribute source: ``{device id: {k8s.*/slurm.* attribute: value}}`` for this
        snapshot (a device held by one pod, or one job, gets it; a shared or free one none)."""
        self._ensure(inventory, snapshot)
        return self._device_attrs

    def _on_sweep(self, snapshot: Snapshot) -> None:
        if self._telemetry is not None:
            self._ensure(self._telemetry.inventory, snapshot)

    def _ensure(self, inventory: Inventory, snapshot: Snapshot) -> None:
        with self._lock:
            if snapshot is self._last:
                return
            self._last = snapshot
            try:
                self._compute(inventory, snapshot)
            except Exception:  # attribution must never cost the device metrics
                _log.log(
                    logging.DEBUG if self._failed_warned else logging.WARNING,
                    "attribution failed for this sweep; the device metrics go on without it",
                    exc_info=True,
                )
                self._failed_warned = True
                self._device_attrs = {}
                self._process_points = self._utilization_points = ()

    def _compute(self, inventory: Inventory, snapshot: Snapshot) -> None:
        matcher = self._matcher
        if matcher is None or matcher.inventory is not inventory:
            matcher = self._matcher = DeviceMatcher(inventory, self.settings.host_root)
        holders: dict[str, dict[WorkloadKey, _Holder]] = {}
        kube_devices = self._kubelet_holders(matcher, holders)
        owners = self._owners(snapshot)
        mapped = self._jobs.jobs(matcher) if self._jobs is not None else {}
        jobs = merge_jobs(
            [o.job for o in owners.values() if o.job is not None]
            + [job for device_jobs in mapped.values() for job in device_jobs]
        )
        for device_id, device_jobs in mapped.items():
            for job in device_jobs:
                self._hold(holders, device_id, ("slurm", job.id), jobs[job.id].attributes())
        sources = self.settings.sources
        for sample in snapshot.samples:
            for proc in sample.processes or ():
                owner = owners.get(proc.pid)
                if owner is None:
                    continue
                if owner.job is not None:
                    job = jobs[owner.job.id]
                    self._hold(holders, sample.device_id, ("slurm", job.id), job.attributes())
                if "process" in sources and owner.pod_key is not None and owner.pod is not None:
                    shared = holders.get(sample.device_id, {})
                    if sample.device_id in kube_devices and owner.pod_key not in shared:
                        continue  # the kubelet says who holds it; an unnamed pod adds nothing
                    held = self._hold(holders, sample.device_id, owner.pod_key, owner.pod)
                    if owner.container:
                        held.containers.add(owner.container)
        self._device_attrs = self._points_attributes(holders)
        self._integrate(inventory, snapshot, holders, owners)
        if "process" in sources:
            self._process_series(inventory, snapshot, owners, jobs)

    def _kubelet_holders(
        self, matcher: DeviceMatcher, holders: dict[str, dict[WorkloadKey, _Holder]]
    ) -> set[str]:
        if self._kubelet is None:
            return set()
        devices: set[str] = set()
        for pod in self._kubelet.pods():
            attrs = {"k8s.namespace.name": pod.namespace, "k8s.pod.name": pod.name}
            uid = self._directory.uid(pod.namespace, pod.name) if self._directory else None
            if uid:
                attrs["k8s.pod.uid"] = uid
            key = ("k8s", pod.namespace, pod.name)
            for container in pod.containers:
                for resource, device_id in container.devices:
                    matched = matcher.match(device_id, resource)
                    if not matched and resource_vendor(resource) is not None:
                        self._unmatched(resource, device_id)
                    for dev in matched:
                        self._hold(holders, dev, key, attrs).containers.add(container.name)
                        devices.add(dev)
        return devices

    def _unmatched(self, resource: str, device_id: str) -> None:
        level = logging.DEBUG if self._unmatched_warned else logging.WARNING
        self._unmatched_warned = True
        _log.log(
            level,
            "attribution: the kubelet allocates %s %r, which names no device reported here",
            resource,
            device_id,
        )

    @staticmethod
    def _hold(
        holders: dict[str, dict[WorkloadKey, _Holder]],
        device_id: str,
        key: WorkloadKey,
        attributes: Mapping[str, str],
    ) -> _Holder:
        on_device = holders.setdefault(device_id, {})
        held = on_device.get(key)
        if held is None:
            held = on_device[key] = _Holder(key, dict(attributes))
        return held

    def _owners(self, snapshot: Snapshot) -> dict[int, _Owner]:
        """Who each process on the devices belongs to (``/proc`` read once per pid)."""
        if self._processes is None:
            return {}
        pids = {p.pid for s in snapshot.samples for p in s.processes or ()}
        owners: dict[int, _Owner] = {}
        for pid in pids:
            info = self._processes.get(pid)
            if info is not None:
                owners[pid] = self._owner(info)
        self._processes.prune(pids)
        return owners

    def _owner(self, info: ProcessInfo) -> _Owner:
        job = job_of_process(info, self._users)
        uid = info.cgroup.pod_uid
        if uid is None:
            return _Owner(job=job)
        named = self._directory.pod(uid) if self._directory else None
        container = None
        if info.cgroup.container_id and self._directory is not None:
            found = self._directory.container(info.cgroup.container_id)
            if found is not None:
                named = named or (found[0], found[1])
                container = found[2]
        if named is None:
            return _Owner(("k8s-uid", uid), {"k8s.pod.uid": uid}, None, job)
        namespace, name = named
        if self._kubelet is not None and not self._kubelet.known(namespace, name):
            self._kubelet.request(namespace, name)
        attrs = {"k8s.namespace.name": namespace, "k8s.pod.name": name, "k8s.pod.uid": uid}
        return _Owner(("k8s", namespace, name), attrs, container, job)

    @staticmethod
    def _points_attributes(
        holders: Mapping[str, Mapping[WorkloadKey, _Holder]],
    ) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for device_id, on_device in holders.items():
            attrs: dict[str, str] = {}
            for kind in ("k8s", "slurm"):
                of_kind = [h for h in on_device.values() if h.kind == kind]
                if len(of_kind) == 1:
                    attrs.update(of_kind[0].point_attributes())
            if attrs:
                out[device_id] = attrs
        return out

    def _integrate(
        self,
        inventory: Inventory,
        snapshot: Snapshot,
        holders: Mapping[str, Mapping[WorkloadKey, _Holder]],
        owners: Mapping[int, _Owner],
    ) -> None:
        samples = snapshot.by_id()
        children: dict[str, list[str]] = {}
        for dev in inventory.devices:
            if dev.parent_id is not None:
                children.setdefault(dev.parent_id, []).append(dev.id)
        readings: dict[str, tuple[float | None, Mapping[WorkloadKey, float]]] = {}
        attributes: dict[WorkloadKey, Mapping[str, str]] = {}
        for dev in inventory.devices:
            if dev.parent_id is not None:
                continue
            keys: dict[WorkloadKey, _Holder] = {}
            for device_id in (dev.id, *children.get(dev.id, ())):
                keys.update(holders.get(device_id, {}))
            for key, held in keys.items():
                attributes.setdefault(key, held.attributes)
            sample = samples.get(dev.id)
            weights = _weights(keys, sample, owners)
            readings[dev.id] = (sample.energy_j if sample is not None else None, weights)
        self._energy.update(readings, attributes)

    def _process_series(
        self,
        inventory: Inventory,
        snapshot: Snapshot,
        owners: Mapping[int, _Owner],
        jobs: Mapping[str, JobInfo],
    ) -> None:
        devices = inventory.by_id()
        cap = self.settings.max_processes
        memory: list[ProcessPoint] = []
        utilization: list[ProcessPoint] = []
        for sample in snapshot.samples:
            dev = devices.get(sample.device_id)
            if dev is None or not sample.processes:
                continue
            procs = sorted(sample.processes, key=lambda p: (-(p.memory_used_bytes or 0), p.pid))
            if len(procs) > cap:
                if not self._capped_warned:
                    self._capped_warned = True
                    _log.warning(
                        "attribution: %s has %d processes; only the %d using the most memory get "
                        "their own series (OTEL_GPU_ATTRIBUTION_MAX_PROCESSES)",
                        dev.name,
                        len(procs),
                        cap,
                    )
                procs = procs[:cap]
            base: dict[str, str | int] = {"hw.id": dev.id, "hw.type": "gpu", "hw.name": dev.name}
            for proc in procs:
                attrs = {
                    **base,
                    "process.pid": proc.pid,
                    **_owner_attributes(owners.get(proc.pid), jobs),
                }
                if proc.memory_used_bytes is not None:
                    memory.append((float(proc.memory_used_bytes), attrs))
                if proc.utilization_ratio is not None:
                    utilization.append((float(proc.utilization_ratio), attrs))
        self._process_points = tuple(memory)
        self._utilization_points = tuple(utilization)

    # -- instruments -------------------------------------------------------------------------

    def _register(self, meter_provider: MeterProvider) -> None:
        from otel_gpu.otel.workload import register

        self._instruments = register(
            meter_provider,
            energy=(ENERGY_METRIC, ENERGY_DESCRIPTION, self._energy_points),
            processes=(
                (MEMORY_METRIC, self._memory_points),
                (UTILIZATION_METRIC, self._util_points),
            )
            if "process" in self.settings.sources
            else None,
        )

    def _sync(self) -> None:
        telemetry = self._telemetry
        if telemetry is not None:
            try:
                telemetry.cache.get()
            except Exception:
                _log.debug("attribution: sweep failed", exc_info=True)

    def _energy_points(self) -> Iterable[tuple[float, Mapping[str, str | int]]]:
        self._sync()
        return self._energy.points()

    def _memory_points(self) -> Iterable[ProcessPoint]:
        self._sync()
        return self._process_points

    def _util_points(self) -> Iterable[ProcessPoint]:
        self._sync()
        return self._utilization_points


def _weights(
    holders: Mapping[WorkloadKey, _Holder],
    sample: DeviceSample | None,
    owners: Mapping[int, _Owner],
) -> dict[WorkloadKey, float]:
    """Each holder's share of a device: its processes' utilization when every process on the
    device reports one and every holder has a process there, else 1 each (an even split)."""
    even = dict.fromkeys(holders, 1.0)
    if len(holders) < 2 or sample is None or not sample.processes:
        return even
    procs: tuple[ProcessSample, ...] = sample.processes
    if any(p.utilization_ratio is None for p in procs):
        return even
    weights = dict.fromkeys(holders, 0.0)
    seen: set[WorkloadKey] = set()
    for proc in procs:
        owner = owners.get(proc.pid)
        if owner is None:
            continue
        for key in (owner.pod_key, ("slurm", owner.job.id) if owner.job else None):
            if key is not None and key in weights:
                weights[key] += proc.utilization_ratio or 0.0
                seen.add(key)
    if seen != set(holders) or sum(weights.values()) <= 0:
        return even
    return weights


def _owner_attributes(owner: _Owner | None, jobs: Mapping[str, JobInfo]) -> dict[str, str]:
    if owner is None:
        return {}
    attrs: dict[str, str] = {}
    if owner.pod is not None:
        attrs.update(owner.pod)
        if owner.container:
            attrs["k8s.container.name"] = owner.container
    if owner.job is not None:
        attrs.update(jobs.get(owner.job.id, owner.job).attributes())
    return attrs
