"""The manager: selects and opens backends, merges their devices, sweeps, isolates faults.

``auto`` probes every installed backend that takes part in auto selection and opens each one
that is available, so a node with NVIDIA and AMD devices reports both. A fallback backend
(``nvidia-smi`` for ``nvml``) is used by ``auto`` only when its primary is unavailable, and that
downgrade is logged at WARNING with the primary's reason. An explicitly named backend that is
unavailable fails with its probe's reason; it never falls back.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

from otel_gpu.errors import BackendUnavailable, ConfigError, OtelGpuError
from otel_gpu.hal.model import DeviceFailure, DeviceInfo, DeviceSample, Inventory, Snapshot
from otel_gpu.hal.protocol import Backend, EventSink, EventSource, Probe
from otel_gpu.hal.registry import Registry, parse_selectors

__all__ = ["BackendStatus", "DeviceFilter", "DeviceManager", "probe_all", "select_auto"]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class BackendStatus:
    """One row of ``otel-gpu backends``: a registered backend and its probe result."""

    name: str
    probe: Probe
    auto: bool
    fallback_for: str | None


def probe_all(registry: Registry) -> list[BackendStatus]:
    """Probe every registered backend (and list plug-ins that failed to import)."""
    rows: list[BackendStatus] = []
    for name in registry.names():
        factory = registry.factory(name)
        try:
            probe = factory(None).probe()
        except Exception as err:  # probe() must not raise; a buggy plug-in still gets a row
            probe = Probe(False, f"probe failed: {type(err).__name__}: {err}")
        rows.append(
            BackendStatus(name, probe, getattr(factory, "auto", True), _fallback_for(factory))
        )
    for name, error in registry.load_errors().items():
        rows.append(
            BackendStatus(name, Probe(False, f"plug-in failed to load: {error}"), False, None)
        )
    return rows


def _fallback_for(factory: object) -> str | None:
    value = getattr(factory, "fallback_for", None)
    return value if isinstance(value, str) else None


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceFilter:
    """Which devices to report (``OTEL_GPU_DEVICES``): node-wide indices and/or device ids.

    A MIG instance or partition is kept when its parent is selected.
    """

    indices: frozenset[int] = frozenset()
    ids: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, value: str | None, setting: str = "OTEL_GPU_DEVICES") -> DeviceFilter | None:
        """Parse ``"0,1,GPU-8f3c..."``; ``None``, empty or ``all`` means every device."""
        if value is None or value.strip().lower() in ("", "all"):
            return None
        indices: set[int] = set()
        ids: set[str] = set()
        for part in value.split(","):
            item = part.strip()
            if not item:
                raise ConfigError(setting, f"empty element in {value!r}", "indices or ids, by ,")
            if item.isdecimal():
                indices.add(int(item))
            elif item.startswith("-") and item[1:].isdecimal():
                raise ConfigError(setting, f"negative index {item!r}", "device indices >= 0 or ids")
            else:
                ids.add(item)
        return cls(frozenset(indices), frozenset(ids))

    def keeps(self, device: DeviceInfo, parents: dict[str, DeviceInfo]) -> bool:
        """Whether ``device`` is selected (directly or through its parent)."""
        if device.index in self.indices or device.id in self.ids:
            return True
        parent = parents.get(device.parent_id or "")
        return parent is not None and (parent.index in self.indices or parent.id in self.ids)


class DeviceManager:
    """Owns the open backends of a node and produces one merged :class:`Snapshot` per sweep.

    Construct with :meth:`from_selector` (what the CLI does) or directly with backend objects.
    ``timer`` returns wall-clock nanoseconds for snapshot timestamps.
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        device_filter: DeviceFilter | None = None,
        timer: Callable[[], int] = time.time_ns,
        sweep_timeout_s: float = 5.0,
    ) -> None:
        self._backends = list(backends)
        self.sweep_timeout_s = sweep_timeout_s
        self._workers: list[_SweepWorker] = []
        self._owned: dict[int, list[str]] = {}
        self._filter = device_filter
        self._timer = timer
        self._inventory: Inventory | None = None
        self._offsets: dict[int, int] = {}
        self._kept: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._opened: list[Backend] = []
        self.sweeps = 0

    @classmethod
    def from_selector(
        cls,
        value: str,
        registry: Registry | None = None,
        device_filter: DeviceFilter | None = None,
        setting: str = "--backend",
        sweep_timeout_s: float = 5.0,
    ) -> DeviceManager:
        """Build a manager from a ``--backend`` value (``auto``, ``nvml,amd``, ``simulated:...``).

        Raises :class:`ConfigError` for unknown names and :class:`BackendUnavailable` when an
        explicitly named backend cannot run here, or when ``auto`` finds no device at all.
        """
        registry = registry or Registry()
        selectors = parse_selectors(value, setting)
        names = [s.name for s in selectors]
        if "auto" in names:
            if len(selectors) > 1:
                raise ConfigError(setting, "'auto' cannot be combined with other backends")
            return cls(select_auto(registry), device_filter, sweep_timeout_s=sweep_timeout_s)
        backends: list[Backend] = []
        for selector in selectors:
            backend = registry.create(selector)
            probe = _safe_probe(backend)
            if not probe.available:
                raise BackendUnavailable(str(selector), probe.reason)
            backends.append(backend)
        return cls(backends, device_filter, sweep_timeout_s=sweep_timeout_s)

    @property
    def backends(self) -> list[Backend]:
        """The backends this manager drives (opened ones after :meth:`open`)."""
        return list(self._opened or self._backends)

    def open(self) -> Inventory:
        """Open every backend and read the merged inventory (node-wide indices)."""
        with self._lock:
            if self._inventory is not None:
                return self._inventory
            for backend in self._backends:
                try:
                    backend.open()
                except BackendUnavailable:
                    self._close_opened()
                    raise
                except Exception as err:
                    self._close_opened()
                    raise BackendUnavailable(backend.name, f"failed to open: {err}") from err
                self._opened.append(backend)
            self._inventory = self._merge_inventories()
            self._workers = [_SweepWorker(b) for b in self._opened]
            return self._inventory

    @property
    def inventory(self) -> Inventory:
        """The merged inventory (opens the backends on first use)."""
        return self._inventory if self._inventory is not None else self.open()

    def _merge_inventories(self) -> Inventory:
        devices: list[DeviceInfo] = []
        versions: dict[str, str] = {}
        self._owned = {}
        for backend in self._opened:
            offset = len(devices)
            inv = backend.inventory()
            versions.update(inv.versions)
            for dev in inv.devices:
                devices.append(_renumber(dev, offset))
            self._owned[id(backend)] = [d.id for d in inv.devices]
        if self._filter is not None:
            parents = {d.id: d for d in devices}
            devices = [d for d in devices if self._filter.keeps(d, parents)]
        self._kept = frozenset(d.id for d in devices)
        return Inventory(tuple(devices), versions)

    def sample(self) -> Snapshot:
        """One sweep of every backend, merged, within ``sweep_timeout_s``.

        Each backend sweeps on its own worker thread. A backend that raises marks its devices
        failed; one stuck in a vendor call past the deadline (a blocking C call cannot be
        interrupted) gives the devices it had finished and marks the rest failed, and is not
        asked again until the stuck call returns. The other backends are not held up.
        """
        if self._inventory is None:
            self.open()
        started = time.perf_counter()
        deadline = time.monotonic() + self.sweep_timeout_s
        started_now = {id(w): w.start_sweep() for w in self._workers}
        samples: list[DeviceSample] = []
        failures: list[DeviceFailure] = []
        for worker in self._workers:
            name = worker.backend.name
            # A worker still stuck from an earlier sweep is not waited for again.
            done = started_now[id(worker)] and worker.wait(max(0.0, deadline - time.monotonic()))
            if done and worker.error is None and worker.result is not None:
                samples.extend(s for s in worker.result.samples if s.device_id in self._kept)
                failures.extend(f for f in worker.result.failures if f.device_id in self._kept)
                continue
            if done:
                err = worker.error
                reason = f"{name} sweep failed: {type(err).__name__}: {err}"
                _log.warning("%s", reason, exc_info=not isinstance(err, OtelGpuError))
                partial: list[DeviceSample | DeviceFailure] = []
            else:
                reason = (
                    f"{name} sweep stuck in a vendor call for {worker.stuck_for():.1f}s "
                    f"(deadline {self.sweep_timeout_s:g}s)"
                )
                _log.warning("%s", reason)
                partial = worker.partial() if started_now[id(worker)] else []
            finished = set()
            for item in partial:
                if item.device_id not in self._kept:
                    continue
                finished.add(item.device_id)
                (samples if isinstance(item, DeviceSample) else failures).append(item)  # type: ignore[arg-type]
            failures.extend(
                DeviceFailure(dev_id, reason, stuck=not done)
                for dev_id in self._owned.get(id(worker.backend), ())
                if dev_id in self._kept and dev_id not in finished
            )
        self.sweeps += 1
        return Snapshot(
            timestamp_ns=self._timer(),
            samples=tuple(samples),
            failures=tuple(failures),
            sweep_seconds=time.perf_counter() - started,
        )

    def enable(self, feature: str) -> None:
        """Ask every backend that supports it to collect an opt-in ``feature`` (``processes``)."""
        for backend in self._backends:
            enable = getattr(backend, "enable", None)
            if callable(enable):
                enable(feature)

    def start_events(self, sink: EventSink) -> None:
        """Start the event sources of every backend that has one."""
        for backend in self._opened:
            if isinstance(backend, EventSource):
                try:
                    backend.start_events(sink)
                except Exception as err:  # events are a bonus; metrics go on without them
                    _log.warning("%s: driver events unavailable: %s", backend.name, err)

    def close(self) -> None:
        """Stop events and close every opened backend. Safe to call twice."""
        with self._lock:
            self._close_opened()

    def _close_opened(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._workers = []
        for backend in reversed(self._opened):
            try:
                if isinstance(backend, EventSource):
                    backend.stop_events()
                backend.close()
            except Exception:
                _log.warning("closing backend %s failed", backend.name, exc_info=True)
        self._opened.clear()

    def __enter__(self) -> DeviceManager:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _SweepWorker:
    """A daemon thread that runs one backend's sweeps, so that a vendor call that never returns
    holds up only that backend (and never the interpreter's exit).

    A backend with a ``sweep(emit)`` method reports each device as it finishes; what was
    finished before a deadline still goes out.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.result: Snapshot | None = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._go = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._busy_since: float | None = None
        self._partial: list[DeviceSample | DeviceFailure] = []
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name=f"otel-gpu-sweep-{backend.name}", daemon=True
        )
        self._thread.start()

    def start_sweep(self) -> bool:
        """Start a sweep; False when the previous one is still running (stuck)."""
        with self._lock:
            if self._busy_since is not None:
                return False
            self._busy_since = time.monotonic()
            self._partial = []
            self.result, self.error = None, None
            self._done.clear()
            self._go.set()
            return True

    def wait(self, timeout: float) -> bool:
        """True when the sweep finished within ``timeout`` seconds."""
        return self._done.wait(timeout)

    def stuck_for(self) -> float:
        """Seconds the current sweep has been running."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def partial(self) -> list[DeviceSample | DeviceFailure]:
        """What the running sweep has finished so far."""
        with self._lock:
            return list(self._partial)

    def _emit(self, item: DeviceSample | DeviceFailure) -> None:
        with self._lock:
            self._partial.append(item)

    def _run(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._stopping:
                return
            result: Snapshot | None = None
            error: BaseException | None = None
            try:
                sweep = getattr(self.backend, "sweep", None)
                if callable(sweep):
                    sweep(self._emit)
                    items = self.partial()
                    result = Snapshot(
                        time.time_ns(),
                        tuple(i for i in items if isinstance(i, DeviceSample)),
                        tuple(i for i in items if isinstance(i, DeviceFailure)),
                    )
                else:
                    result = self.backend.sample()
            except Exception as err:
                error = err
            with self._lock:
                self.result, self.error = result, error
                self._busy_since = None
                self._done.set()

    def stop(self) -> None:
        """Let the thread end (at once if idle; a stuck call keeps it until it returns)."""
        self._stopping = True
        self._go.set()


def _renumber(dev: DeviceInfo, offset: int) -> DeviceInfo:
    links = tuple(
        dataclasses.replace(
            link,
            remote_device_index=None
            if link.remote_device_index is None
            else link.remote_device_index + offset,
        )
        for link in dev.links
    )
    return dataclasses.replace(
        dev,
        index=dev.index + offset,
        local_index=dev.index if dev.local_index is None else dev.local_index,
        links=links,
    )


def _safe_probe(backend: Backend) -> Probe:
    try:
        return backend.probe()
    except Exception as err:
        return Probe(False, f"probe failed: {type(err).__name__}: {err}")


def select_auto(registry: Registry) -> list[Backend]:
    """Every available auto backend; fallbacks only where their primary is unavailable."""
    chosen: list[Backend] = []
    unavailable: dict[str, str] = {}
    fallbacks: list[Backend] = []
    for name in registry.names():
        factory = registry.factory(name)
        if not getattr(factory, "auto", False):
            continue
        backend = factory(None)
        if _fallback_for(factory) is not None:
            fallbacks.append(backend)
            continue
        probe = _safe_probe(backend)
        if probe.available:
            chosen.append(backend)
        else:
            unavailable[name] = probe.reason
            _log.debug("auto: backend %s unavailable: %s", name, probe.reason)
    for backend in fallbacks:
        primary = _fallback_for(type(backend)) or ""
        if primary not in unavailable:
            continue
        probe = _safe_probe(backend)
        if probe.available:
            _log.warning(
                "falling back from %s to %s: %s (topology and some metrics are not available "
                "through %s; fix the %s error to get them)",
                primary,
                backend.name,
                unavailable[primary],
                backend.name,
                primary,
            )
            chosen.append(backend)
    if not chosen:
        details = "; ".join(f"{n}: {r}" for n, r in unavailable.items()) or "no backend installed"
        raise BackendUnavailable(
            "auto",
            f"no accelerator found ({details}). Use --backend simulated for a demo node",
        )
    return chosen
