"""Benchmark subjects, each run in a fresh subprocess by ``benchmarks/run.py``.

``python benchmarks/_worker.py '<task JSON>'`` runs one task and prints one JSON line (the last
line of stdout). A fresh process per task keeps the tools apart: gpustat monkey-patches pynvml
module-wide, and each tool should pay its own imports, caches and garbage.

Every NVIDIA subject reads the same scenario through the same fake NVML, installed beneath
pynvml (``otel_gpu.testing.fake_nvml.install``): pynvml's real ctypes code runs, and
``fake.calls`` counts the NVML calls. The process checks at the end that no real
``libnvidia-ml`` was mapped.

Tasks (``kind``):

``otel-gpu``   otel-gpu's full default metric set through an in-process ``MeterProvider`` and an
               ``InMemoryMetricReader``, then OTLP protobuf encoding (``encode_metrics`` +
               ``SerializeToString``: what the OTLP exporter sends), alternated batch by batch
               with the *floor*: the same data points (same instruments, units, attributes and
               Resource) from bare observable callbacks returning constants, through the same
               SDK and encoder. Backend ``nvml`` (fake NVML) or ``simulated``.
``nvitop``     nvitop-exporter's ``PrometheusExporter.update_device`` for every device plus
               ``prometheus_client.generate_latest`` of its registry.
``gpustat``    ``gpustat.new_query()`` plus its JSON printout (``print_json``).
``memory``     RSS over N collections exported over OTLP/gRPC (``force_flush``) to an endpoint
               given by the parent (a receiver, or a closed port).
``xid``        Xid injection (``fake.inject_xid``) to the log record arriving at an in-process
               OTLP receiver.

Both otel-gpu's reader and the floor's raise the SDK's per-metric cardinality limit (default 2000
attribute sets), which a 64- or 256-GPU NVLink node exceeds: the whole workload is measured, and
the metrics that would overflow by default are reported.

CPU is ``time.process_time()`` (every thread of the process: otel-gpu sweeps on a worker
thread) over a batch of collections; batches are repeated and the parent takes medians. The
garbage collector stays on, as in the agent; ``gc.collect()`` runs between batches, outside the
timed part. Counts of data points follow one rule for every tool: one finite numeric value of
one series per collection; info-only series, NaN and host (non-GPU) metrics are not counted.
"""

from __future__ import annotations

import gc
import importlib.resources
import inspect
import io
import json
import math
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

SDK_DEFAULT_CARDINALITY = 2000  # the SDK's per-metric-stream limit of attribute sets
UNLIMITED = 10_000_000
SLOW_EVERY = 6  # the NVML backend's slow path runs every 6 sweeps: batches are multiples of it
INTERVAL_S = 10.0  # the agent's default interval: the fake's clock advances this much per sweep
EVENT_CALLS = ("nvmlEventSetWait", "nvmlEventSetWait_v2")  # the event thread, not the sweep


# -- scenarios ----------------------------------------------------------------------------------


def h100_scenario(count: int) -> dict[str, Any]:
    """The built-in ``h100-sxm-8-nvswitch`` node (8x H100 SXM, 18 NVLinks each to NVSwitches),
    with ``count`` GPUs: its template, unique PCI addresses, two NUMA halves; no per-GPU
    overrides, so every device costs the same."""
    text = (
        importlib.resources.files("otel_gpu.testing")
        .joinpath("scenarios/nvml/h100-sxm-8-nvswitch.json")
        .read_text(encoding="utf-8")
    )
    data: dict[str, Any] = json.loads(text)
    data.pop("overrides", None)
    data["name"] = f"h100-sxm-{count}-nvswitch"
    data["count"] = count
    half = max(1, count // 2)
    data["per_index"] = {
        "pci_bus_id": [f"{i // 200:08X}:{0x10 + i % 200:02X}:00.0" for i in range(count)],
        "numa_node": [0 if i < half else 1 for i in range(count)],
        "cpu_affinity": ["0-55,112-167" if i < half else "56-111,168-223" for i in range(count)],
    }
    return data


def mig_scenario(gpus: int) -> dict[str, Any]:
    """``gpus`` A100-SXM4-80GB, each split into 7 MIG 1g.10gb instances (8 devices per GPU)."""
    text = (
        importlib.resources.files("otel_gpu.testing")
        .joinpath("scenarios/nvml/a100-mig.json")
        .read_text(encoding="utf-8")
    )
    data: dict[str, Any] = json.loads(text)
    template = dict(data.pop("gpus")[0])
    template.pop("pci_bus_id", None)
    template["mig_devices"] = [
        {
            "profile": "1g.10gb",
            "gpu_instance_id": 7 + j,
            "compute_instance_id": 0,
            "memory_total_mib": 9728,
            "memory_used_mib": 1000 + j,
        }
        for j in range(7)
    ]
    template["processes"] = []
    data["name"] = f"a100-{gpus}x7-mig"
    data["template"] = template
    data["count"] = gpus
    data["per_index"] = {
        "pci_bus_id": [f"{i // 200:08X}:{0x10 + i % 200:02X}:00.0" for i in range(gpus)],
    }
    return data


def scenario_for(task: dict[str, Any]) -> dict[str, Any]:
    if task.get("scenario") == "mig":
        return mig_scenario(task["devices"] // 8)
    return h100_scenario(task["devices"])


# -- measurement helpers ------------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def real_nvml_mapped() -> bool:
    """True when a real NVML library is mapped into this process (it must never be)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return "libnvidia-ml" in f.read()
    except OSError:
        return False


def timed_batch(fn: Callable[[], Any], n: int) -> float:
    """CPU seconds (all threads) per call of ``fn`` over ``n`` calls; GC collected first."""
    gc.collect()
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n


class FakeTimer:
    """Adds up the CPU time spent inside the fake NVML (its Python "driver"), all threads.

    Used only in a separate pass after the timed batches: its own clock reads cost ~1 us a call.
    """

    def __init__(self) -> None:
        from otel_gpu.testing.fake_nvml import FakeNvml

        self.cls = FakeNvml
        self.original = FakeNvml._dispatch
        self.seconds = 0.0
        self._lock = threading.Lock()

    @contextmanager
    def active(self) -> Iterator[FakeTimer]:
        original = self.original
        timer = self

        def dispatch(fake: Any, name: str, impl: Any, args: tuple[Any, ...]) -> Any:
            if name in EVENT_CALLS:
                return original(fake, name, impl, args)
            start = time.thread_time()
            try:
                return original(fake, name, impl, args)
            finally:
                spent = time.thread_time() - start
                with timer._lock:
                    timer.seconds += spent

        self.cls._dispatch = dispatch  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            self.cls._dispatch = original  # type: ignore[method-assign]


def fake_share(fn: Callable[[], Any], n: int) -> float:
    """Fraction of the CPU time of ``n`` calls of ``fn`` spent inside the fake NVML."""
    timer = FakeTimer()
    with timer.active():
        gc.collect()
        start = time.process_time()
        for _ in range(n):
            fn()
        total = time.process_time() - start
    return min(1.0, timer.seconds / total) if total > 0 else 0.0


def sweep_calls(calls: dict[str, int]) -> int:
    return sum(v for k, v in calls.items() if k not in EVENT_CALLS)


def by_function(calls: dict[str, int], sweeps: int) -> dict[str, float]:
    """NVML calls per sweep, by function (event-thread waits left out)."""
    return {k: v / sweeps for k, v in sorted(calls.items()) if k not in EVENT_CALLS}


def missing_lookups(fake: Any, sweeps: int) -> dict[str, float]:
    """Functions a tool looked up that this fake NVML lacks (FunctionNotFound, not a call)."""
    implemented = set(type(fake).implemented_functions())
    return {
        k: v / sweeps
        for k, v in sorted(fake.lookups.items())
        if k not in implemented or k in fake.scenario.missing_functions
    }


def encode(reader: Any) -> bytes:
    """Collect ``reader`` and encode the result as the OTLP exporter does (protobuf bytes)."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    data = reader.get_metrics_data()
    assert data is not None
    request: Any = encode_metrics(data)
    return bytes(request.SerializeToString())


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# -- otel-gpu and its floor ---------------------------------------------------------------------


def _count_points(data: Any) -> tuple[int, int]:
    """(data points, metric names) in a MetricsData."""
    points = names = 0
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                n = sum(1 for p in metric.data.data_points if finite(p.value))
                points += n
                names += 1 if n else 0
    return points, names


def _shape(data: Any) -> list[tuple[str, str, str, str, list[tuple[float, dict[str, Any]]]]]:
    """Every metric of a MetricsData: name, kind, unit, description and its points."""
    from opentelemetry.sdk.metrics.export import Gauge, Sum

    out = []
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if isinstance(metric.data, Gauge):
                    kind = "gauge"
                elif isinstance(metric.data, Sum):
                    kind = "counter" if metric.data.is_monotonic else "updown"
                else:  # pragma: no cover - otel-gpu has no histograms
                    raise TypeError(f"unexpected metric data {type(metric.data).__name__}")
                points = [
                    (float(p.value), dict(p.attributes or {})) for p in metric.data.data_points
                ]
                out.append((metric.name, kind, metric.unit, metric.description, points))
    return out


def make_reader() -> tuple[Any, bool]:
    """An InMemoryMetricReader whose cardinality limit does not cut the measured workload (the
    SDK's default, 2000 attribute sets per metric, folds the rest of a large node's per-link
    series into one ``otel.metric.overflow`` point); False when this SDK has no such setting."""
    from opentelemetry.sdk.metrics import (
        ObservableCounter,
        ObservableGauge,
        ObservableUpDownCounter,
    )
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    limits = {c: UNLIMITED for c in (ObservableCounter, ObservableGauge, ObservableUpDownCounter)}
    try:
        return InMemoryMetricReader(cardinality_limits=limits), True  # type: ignore[arg-type,unused-ignore]
    except TypeError:
        return InMemoryMetricReader(), False


def over_default_limit(shape: list[Any]) -> dict[str, int]:
    """Metrics with more series than the SDK's default cardinality limit: name -> series."""
    return {
        name: len(points)
        for name, _, _, _, points in shape
        if len(points) > SDK_DEFAULT_CARDINALITY
    }


def build_floor(shape: list[Any], resource: Any) -> Callable[[], bytes]:
    """The SDK floor: bare observable callbacks returning the same points as constants, through
    a MeterProvider with the same Resource, an InMemoryMetricReader and the OTLP encoder."""
    from opentelemetry.sdk.metrics import MeterProvider

    reader, _ = make_reader()
    provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
    meter = provider.get_meter("floor")
    register_constants(meter, shape)

    def collect() -> bytes:
        return encode(reader)

    collect.provider = provider  # type: ignore[attr-defined]
    return collect


def register_constants(meter: Any, shape: list[Any]) -> None:
    """Observable instruments of ``shape`` whose callbacks return its points as constants."""
    from opentelemetry.metrics import Observation

    create = {
        "gauge": meter.create_observable_gauge,
        "counter": meter.create_observable_counter,
        "updown": meter.create_observable_up_down_counter,
    }
    for name, kind, unit, description, points in shape:
        constants = [Observation(value, attrs) for value, attrs in points]
        create[kind](
            name,
            callbacks=[_constant(constants)],
            unit=unit,
            description=description,
        )


def _constant(observations: list[Any]) -> Callable[[Any], list[Any]]:
    def callback(_options: Any) -> list[Any]:
        return observations

    return callback


def _manager(backends: list[Any]) -> Any:
    from otel_gpu.hal import DeviceManager

    params = inspect.signature(DeviceManager).parameters
    if "sweep_timeout_s" in params:  # large fake nodes: never let the deadline cut a sweep
        return DeviceManager(backends, sweep_timeout_s=600.0)
    return DeviceManager(backends)


def run_otel_gpu(task: dict[str, Any]) -> dict[str, Any]:
    from opentelemetry.sdk.metrics import MeterProvider

    from otel_gpu.otel import GpuTelemetry, build_resource

    backend_name = task["backend"]
    devices = task["devices"]
    with _subject(backend_name, task) as (backend, fake):
        manager = _manager([backend])
        inventory = manager.open()
        resource = build_resource(inventory)
        reader, unlimited = make_reader()
        provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
        telemetry = GpuTelemetry(
            manager,
            provider,
            None,
            interval_s=INTERVAL_S,
            attributes=task.get("attributes", "full"),
        )
        telemetry.start()

        def collect() -> bytes:
            if fake is not None:
                fake.advance(INTERVAL_S)
            telemetry.cache.invalidate()  # as at a real interval: every collection sweeps
            return encode(reader)

        for _ in range(task["warmup"]):
            collect()
        rss = rss_bytes()  # steady, before the floor's provider exists
        data = reader.get_metrics_data()  # a collection too: its sweep is cached, no new sweep
        points, names = _count_points(data)
        shape = _shape(data)
        floor = build_floor(shape, resource)
        for _ in range(task["warmup"]):
            floor()

        # NVML calls: one batch of SLOW_EVERY sweeps, counted sweep by sweep.
        per_sweep: list[int] = []
        functions: dict[str, float] = {}
        if fake is not None:
            total: dict[str, int] = {}
            for _ in range(SLOW_EVERY):
                fake.reset_calls()
                collect()
                per_sweep.append(sweep_calls(fake.calls))
                for k, v in fake.calls.items():
                    total[k] = total.get(k, 0) + v
            functions = by_function(total, SLOW_EVERY)
        batch = task["batch"]
        cost, floor_cost, ratios = [], [], []
        for _ in range(task["repeats"]):
            a = timed_batch(collect, batch)
            b = timed_batch(floor, batch)
            cost.append(a)
            floor_cost.append(b)
            ratios.append(a / b)
        share = fake_share(collect, batch) if fake is not None else 0.0
        payload = len(collect())
        telemetry.shutdown()
        provider.shutdown()
        floor.provider.shutdown()  # type: ignore[attr-defined]
    result = {
        "devices": devices,
        "inventory_devices": len(inventory.devices),
        "points": points,
        "metrics": names,
        "cpu_s": statistics.median(cost),
        "cpu_all": cost,
        "floor_cpu_s": statistics.median(floor_cost),
        "floor_all": floor_cost,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "fake_share": share,
        "payload_bytes": payload,
        "rss_bytes": rss,
        "cardinality_unlimited": unlimited,
        "over_default_cardinality": over_default_limit(shape),
    }
    if per_sweep:
        result["nvml_calls_per_sweep"] = statistics.fmean(per_sweep)
        result["nvml_calls_hot"] = min(per_sweep)
        result["nvml_calls_slow"] = max(per_sweep)
        result["calls_by_function"] = functions
    return result


@contextmanager
def _subject(backend_name: str, task: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    """The backend to measure, and the fake NVML beneath it (None for the simulated one)."""
    if backend_name == "simulated":
        from otel_gpu.backends.simulated import SimulatedBackend

        yield SimulatedBackend(f"count={task['devices']}"), None
        return
    from otel_gpu.backends.nvml import NvmlBackend
    from otel_gpu.testing.fake_nvml import install

    with install(scenario_for(task)) as fake:
        yield NvmlBackend(), fake


# -- peers --------------------------------------------------------------------------------------


def _peer_result(
    task: dict[str, Any], sweep: Callable[[], Any], fake: Any, count: Callable[[], tuple[int, int]]
) -> dict[str, Any]:
    for _ in range(task["warmup"]):
        sweep()
    fake.reset_calls()
    counted = max(1, task["batch"])
    for _ in range(counted):
        sweep()
    calls = sweep_calls(fake.calls) / counted
    functions = by_function(fake.calls, counted)
    missing = missing_lookups(fake, counted)
    cost = [timed_batch(sweep, task["batch"]) for _ in range(task["repeats"])]
    share = fake_share(sweep, task["batch"])
    points, names = count()
    return {
        "devices": task["devices"],
        "points": points,
        "metrics": names,
        "cpu_s": statistics.median(cost),
        "cpu_all": cost,
        "nvml_calls_per_sweep": calls,
        "calls_by_function": functions,
        "missing_functions_per_sweep": missing,
        "fake_share": share,
        "rss_bytes": rss_bytes(),
    }


def run_nvitop(task: dict[str, Any]) -> dict[str, Any]:
    from otel_gpu.testing.fake_nvml import install

    with install(scenario_for(task)) as fake:
        from nvitop import Device
        from nvitop_exporter import PrometheusExporter
        from prometheus_client import CollectorRegistry, generate_latest

        # As nvitop-exporter's CLI: every physical device and every MIG device.
        physical = Device.from_indices(range(Device.count()))
        devices = list(physical)
        for device in physical:
            devices.extend(device.mig_devices())
        devices.sort(key=lambda d: (d.index,) if isinstance(d.index, int) else d.index)
        registry = CollectorRegistry()
        exporter = PrometheusExporter(devices, hostname="bench", registry=registry)

        def sweep() -> bytes:
            # One scrape interval: what PrometheusExporter.collect() does per loop, without the
            # host (psutil) metrics, plus the exposition a scrape costs.
            fake.advance(INTERVAL_S)
            for device in devices:
                exporter.update_device(device)
            return bytes(generate_latest(registry))

        def count() -> tuple[int, int]:
            points = names = 0
            for family in registry.collect():
                if family.name.startswith("host_") or family.type == "info":
                    continue
                n = sum(1 for s in family.samples if finite(s.value))
                points += n
                names += 1 if n else 0
            return points, names

        result = _peer_result(task, sweep, fake, count)
        result["inventory_devices"] = len(devices)
        result["payload_bytes"] = len(sweep())
    return result


def run_gpustat(task: dict[str, Any]) -> dict[str, Any]:
    from otel_gpu.testing.fake_nvml import install

    with install(scenario_for(task)) as fake:
        import gpustat  # type: ignore[import-untyped,unused-ignore]
        import gpustat.core  # type: ignore[import-untyped,unused-ignore]

        class _NoSleep:  # new_query sleeps 0.1 s per GPU to sample process CPU%: wall, not CPU
            def __getattr__(self, name: str) -> Any:
                return getattr(time, name)

            @staticmethod
            def sleep(_seconds: float) -> None:
                return None

        gpustat.core.time = _NoSleep()
        last: dict[str, Any] = {}

        def sweep() -> str:
            fake.advance(INTERVAL_S)
            stats = gpustat.new_query()
            out = io.StringIO()
            stats.print_json(fp=out)
            text = out.getvalue()
            last["json"] = text
            return text

        def count() -> tuple[int, int]:
            doc = json.loads(last["json"])
            points = 0
            names: set[str] = set()
            for gpu in doc["gpus"]:
                for key, value in gpu.items():
                    if key != "index" and finite(value):
                        points += 1
                        names.add(key)
                for proc in gpu.get("processes") or ():
                    for key, value in proc.items():
                        if key != "pid" and finite(value):
                            points += 1
                            names.add("process." + key)
            return points, len(names)

        result = _peer_result(task, sweep, fake, count)
        result["inventory_devices"] = len(json.loads(last["json"])["gpus"])
        result["payload_bytes"] = len(sweep())
    return result


# -- memory -------------------------------------------------------------------------------------


def run_memory(task: dict[str, Any]) -> dict[str, Any]:
    """RSS over ``task["collections"]`` collections exported over OTLP/gRPC to ``endpoint``."""
    import logging

    from otel_gpu.otel import GpuTelemetry, build_resource
    from otel_gpu.otel.providers import build_providers
    from otel_gpu.testing.fake_nvml import install

    logging.disable(logging.CRITICAL)  # the exporter logs every failed export when it is down
    os.environ.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": task["endpoint"],
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_EXPORTER_OTLP_TIMEOUT": str(task["timeout_s"]),
        }
    )
    from otel_gpu.backends.nvml import NvmlBackend

    n = task["collections"]
    every = task["sample_every"]
    samples: list[tuple[int, int]] = []
    objects: list[tuple[int, int]] = []  # Python objects tracked by the GC: a leak shows here
    control = task.get("subject") == "floor"
    with install(scenario_for(task)) as fake:
        manager = _manager([NvmlBackend()])
        inventory = manager.open()
        resource = build_resource(inventory)
        if control:
            # The SDK alone: otel-gpu's points as constants, through the same providers and
            # exporter (tells the SDK's and exporter's memory from otel-gpu's).
            from opentelemetry.sdk.metrics import MeterProvider

            reader, _ = make_reader()
            probe = MeterProvider(resource=resource, metric_readers=[reader])
            probe_telemetry = GpuTelemetry(manager, probe, None, interval_s=INTERVAL_S)
            probe_telemetry.start()
            shape = _shape(reader.get_metrics_data())
            probe_telemetry.shutdown()
            probe.shutdown()
        providers = build_providers(resource, 3600.0, "otlp")
        if control:
            register_constants(providers.meter_provider.get_meter("floor"), shape)
        else:
            telemetry = GpuTelemetry(
                manager, providers.meter_provider, providers.logger_provider, interval_s=INTERVAL_S
            )
            telemetry.start()
        start = time.monotonic()
        cpu = time.process_time()
        for i in range(n):
            if not control:
                fake.advance(INTERVAL_S)
                telemetry.cache.invalidate()
            providers.meter_provider.force_flush(10_000)
            if (i + 1) % every == 0:
                samples.append((i + 1, rss_bytes()))
                objects.append((i + 1, len(gc.get_objects())))
            if time.monotonic() - start > task["max_s"]:
                break
        elapsed = time.monotonic() - start
        cpu = time.process_time() - cpu
        done = samples[-1][0] if samples else 0
        providers.shutdown()
        if not control:
            telemetry.shutdown()
    warm = [s for s in samples if s[0] > task["warmup"]]
    slope = _slope(warm)
    late = _slope([s for s in samples if s[0] > done // 2])
    objects_slope = _slope([s for s in objects if s[0] > task["warmup"]])
    return {
        "slope_second_half_bytes_per_1000": late * 1000 if late is not None else None,
        "objects": objects,
        "objects_per_1000": objects_slope * 1000 if objects_slope is not None else None,
        "collections": done,
        "samples": samples,
        "steady_rss_bytes": warm[0][1] if warm else None,
        "final_rss_bytes": samples[-1][1] if samples else None,
        "slope_bytes_per_1000": slope * 1000 if slope is not None else None,
        "elapsed_s": elapsed,
        "cpu_per_collection_s": cpu / max(1, done),
    }


def _slope(points: list[tuple[int, int]]) -> float | None:
    """Least-squares slope of y over x."""
    if len(points) < 2:
        return None
    xs = [float(x) for x, _ in points]
    ys = [float(y) for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else None


def _more_xids(seen: int) -> Callable[[Any], bool]:
    def more(rx: Any) -> bool:
        return len(rx.log_records("nvidia.xid")) > seen

    return more


# -- Xid latency --------------------------------------------------------------------------------


def run_xid(task: dict[str, Any]) -> dict[str, Any]:
    """Xid injected into the fake NVML -> OTel log record received over OTLP/gRPC."""
    import logging

    from otel_gpu.backends.nvml import NvmlBackend
    from otel_gpu.otel import GpuTelemetry, build_resource
    from otel_gpu.otel.providers import build_providers
    from otel_gpu.testing.fake_nvml import install
    from otel_gpu.testing.otlp_receiver import OtlpReceiver

    logging.disable(logging.WARNING)
    latencies: list[float] = []
    with OtlpReceiver(http=False) as rx, install(scenario_for(task)) as fake:
        os.environ.update(rx.exporter_env("grpc"))
        manager = _manager([NvmlBackend()])
        inventory = manager.open()
        providers = build_providers(build_resource(inventory), 3600.0, "otlp")
        telemetry = GpuTelemetry(
            manager, providers.meter_provider, providers.logger_provider, interval_s=INTERVAL_S
        )
        telemetry.start()
        time.sleep(0.5)  # the event thread is registered and waiting
        codes = (79, 48, 13, 31, 94, 43, 74, 45)
        # Random gaps: the log pipeline exports on a timer (BatchLogRecordProcessor), so the
        # latency depends on where in its period the Xid lands; fixed gaps would measure one
        # phase only.
        gaps = random.Random(0)
        for i in range(task["repeats"]):
            time.sleep(gaps.uniform(0.0, 0.4))
            seen = len(rx.log_records("nvidia.xid"))
            start = time.perf_counter()
            fake.inject_xid(i % task["devices"], codes[i % len(codes)])
            ok = rx.wait_for(_more_xids(seen), timeout=5.0)
            if ok:
                latencies.append(time.perf_counter() - start)
        providers.shutdown()
        telemetry.shutdown()
    return {
        "repeats": task["repeats"],
        "received": len(latencies),
        "latencies_s": latencies,
        "median_s": statistics.median(latencies) if latencies else None,
        "min_s": min(latencies) if latencies else None,
        "max_s": max(latencies) if latencies else None,
    }


# -- profile ------------------------------------------------------------------------------------


def run_profile(task: dict[str, Any]) -> dict[str, Any]:
    """cProfile of otel-gpu on the fake NVML: whole collections (the main thread: callbacks,
    health checks, SDK, encoding; the sweep itself runs on the manager's worker thread and shows
    as a wait), then the NVML backend's sweeps alone (backend + pynvml + the fake)."""
    import cProfile
    import pstats

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_gpu.otel import GpuTelemetry, build_resource

    report = io.StringIO()
    with _subject("nvml", task) as (backend, fake):
        manager = _manager([backend])
        inventory = manager.open()
        reader = InMemoryMetricReader()
        provider = MeterProvider(
            resource=build_resource(inventory), metric_readers=[reader], shutdown_on_exit=False
        )
        telemetry = GpuTelemetry(manager, provider, None, interval_s=INTERVAL_S)
        telemetry.start()

        def collect() -> bytes:
            fake.advance(INTERVAL_S)
            telemetry.cache.invalidate()
            return encode(reader)

        def sweep() -> Any:
            fake.advance(INTERVAL_S)
            return backend.sample()

        for title, fn in (("collection (main thread)", collect), ("NVML backend sweep", sweep)):
            for _ in range(task["warmup"]):
                fn()
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(task["batch"]):
                fn()
            profile.disable()
            for order in ("tottime", "cumulative"):
                report.write(
                    f"\n===== {title}, {task['devices']} devices, "
                    f"{task['batch']} calls, by {order} =====\n"
                )
                stats = pstats.Stats(profile, stream=report)
                stats.sort_stats(order).print_stats(30)
        telemetry.shutdown()
        provider.shutdown()
    return {"profile": report.getvalue()}


# -- entry point --------------------------------------------------------------------------------

TASKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "otel-gpu": run_otel_gpu,
    "nvitop": run_nvitop,
    "gpustat": run_gpustat,
    "memory": run_memory,
    "xid": run_xid,
    "profile": run_profile,
}


def main() -> int:
    task = json.loads(sys.argv[1])
    result = TASKS[task["kind"]](task)
    result["kind"] = task["kind"]
    result["real_nvml_loaded"] = real_nvml_mapped()
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
