"""Attribution through GpuTelemetry and the real SDK: pods from a fake kubelet on a real gRPC
unix socket, Slurm jobs from checked-in /proc and /sys/fs/cgroup trees, per-process series and
the energy of workloads across their start and end."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.attribution import Attribution, AttributionSettings
from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.hal import DeviceManager
from otel_gpu.hal.model import DeviceInfo, DeviceSample, Inventory, ProcessSample, Snapshot
from otel_gpu.hal.protocol import Probe
from otel_gpu.otel import GpuTelemetry
from otel_gpu.testing.fake_kubelet import FakeKubelet

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "attribution"
K8S = ("k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid", "k8s.container.name")
SLURM = ("slurm.job.id", "slurm.job.user", "slurm.job.partition", "slurm.job.name")
TRAIN_UID = "7d9c3f4e-1b2a-4c5d-8e6f-0a1b2c3d4e5f"
USERS = {1000: "alice", 1001: "bob", 1002: "erin", 1003: "carol", 1004: "frank"}.get
SPEC = "count=8,mig=7:2"


class FakeClock:
    """Monotonic seconds the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Node:
    """A GpuTelemetry with attribution, read through an InMemoryMetricReader."""

    telemetry: GpuTelemetry
    attribution: Attribution
    reader: InMemoryMetricReader
    inventory: Inventory = field(init=False)

    def __post_init__(self) -> None:
        self.inventory = self.telemetry.inventory

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self.inventory.devices]

    def collect(self) -> dict[str, list[Any]]:
        """One new sweep and collection: ``{metric: data points}``."""
        self.telemetry.cache.invalidate()
        data = self.reader.get_metrics_data()
        assert data is not None
        out: dict[str, list[Any]] = {}
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    out[metric.name] = list(metric.data.data_points)
        return out

    def device_attrs(
        self, points: dict[str, list[Any]], metric: str = "hw.power"
    ) -> dict[str, dict[str, Any]]:
        """``{hw.id: attributes}`` of a per-device metric."""
        return {p.attributes["hw.id"]: dict(p.attributes) for p in points[metric]}


def make_node(
    settings: AttributionSettings,
    backend: Any = None,
    *,
    background: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> Node:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    attribution = Attribution(settings, users=USERS, clock=clock)
    telemetry = GpuTelemetry(
        DeviceManager([backend or SimulatedBackend(SPEC)]),
        provider,
        attribute_sources=attribution.attribute_sources,
    )
    attribution.start(telemetry, provider, background=background)
    telemetry.start()
    return Node(telemetry, attribution, reader)


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as fake:
        yield fake


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    made: list[Node] = []
    yield made
    for node in made:
        node.attribution.close()
        node.telemetry.shutdown()


def k8s(socket: Path, **kw: Any) -> AttributionSettings:
    return AttributionSettings(
        sources=frozenset({"kubernetes"}), kubelet_socket=socket, kubelet_timeout_s=2.0, **kw
    )


def pick(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: attrs[k] for k in keys if k in attrs}


# -- Kubernetes -----------------------------------------------------------------------------


def test_each_allocated_device_carries_its_pod_and_free_devices_none(
    kubelet: FakeKubelet, nodes: list[Node]
) -> None:
    ids = [d.id for d in SimulatedBackend(SPEC).inventory().devices]
    kubelet.set_pod("train-0", "ml", {"trainer": [("nvidia.com/gpu", [ids[0], ids[1]])]})
    kubelet.set_pod("solo", "ml", {"main": [("nvidia.com/gpu", [f"{ids[3]}::1"])]})
    kubelet.set_pod("infer-a", "serving", {"server": [("nvidia.com/gpu", [f"{ids[2]}::0"])]})
    kubelet.set_pod("infer-b", "serving", {"server": [("nvidia.com/gpu", [f"{ids[2]}::1"])]})
    kubelet.set_pod("by-index", "batch", {"job": [("nvidia.com/gpu", ["5"])]})
    kubelet.set_pod("small", "dev", {"nb": [("nvidia.com/mig-1g.10gb", [ids[9]])]})
    kubelet.set_pod("web", "default", {"nginx": []})  # a pod without devices
    node = make_node(k8s(kubelet.socket, host_root=FIXTURES / "k8s-cgroupv2"))
    nodes.append(node)
    points = node.collect()
    expected = {
        ids[0]: {
            "k8s.namespace.name": "ml",
            "k8s.pod.name": "train-0",
            "k8s.pod.uid": TRAIN_UID,
            "k8s.container.name": "trainer",
        },
        ids[1]: {
            "k8s.namespace.name": "ml",
            "k8s.pod.name": "train-0",
            "k8s.pod.uid": TRAIN_UID,
            "k8s.container.name": "trainer",
        },
        ids[3]: {"k8s.namespace.name": "ml", "k8s.pod.name": "solo", "k8s.container.name": "main"},
        ids[5]: {
            "k8s.namespace.name": "batch",
            "k8s.pod.name": "by-index",
            "k8s.container.name": "job",
        },
        ids[9]: {"k8s.namespace.name": "dev", "k8s.pod.name": "small", "k8s.container.name": "nb"},
    }
    # every per-device metric, MIG instances included; shared (gpu2), free and parent: none
    for metric in (
        "hw.power",
        "hw.gpu.utilization",
        "hw.gpu.memory.usage",
        "hw.energy",
        "hw.status",
    ):
        for p in points[metric]:
            dev = (
                p.attributes.get("hw.parent") if p.attributes["hw.type"] == "temperature" else None
            )
            assert pick(p.attributes, K8S) == expected.get(dev or p.attributes["hw.id"], {}), metric
    memory = node.device_attrs(points, "hw.gpu.memory.usage")
    assert pick(memory[ids[9]], K8S)["k8s.pod.name"] == "small"
    assert not pick(memory[ids[7]], K8S)
    assert not pick(memory[ids[8]], K8S)
    # one energy series per pod, gpu2's two tenants included
    energy = {p.attributes["k8s.pod.name"]: p for p in points["accel.workload.energy"]}
    assert set(energy) == {"train-0", "solo", "infer-a", "infer-b", "by-index", "small"}
    assert dict(energy["train-0"].attributes) == {
        "k8s.namespace.name": "ml",
        "k8s.pod.name": "train-0",
        "k8s.pod.uid": TRAIN_UID,
    }


def test_a_pod_that_appears_and_one_that_goes_away(kubelet: FakeKubelet, nodes: list[Node]) -> None:
    node = make_node(k8s(kubelet.socket))
    nodes.append(node)
    ids = node.ids
    kubelet.set_pod("old", "ml", {"c": [("nvidia.com/gpu", [ids[4]])]})
    assert not pick(node.device_attrs(node.collect())[ids[4]], K8S)  # not refreshed yet
    node.attribution.refresh()
    assert node.device_attrs(node.collect())[ids[4]]["k8s.pod.name"] == "old"
    kubelet.remove_pod("old", "ml")
    kubelet.set_pod("new", "ml", {"c": [("nvidia.com/gpu", [ids[6]])]})
    node.attribution.refresh()
    attrs = node.device_attrs(node.collect())
    assert not pick(attrs[ids[4]], K8S)
    assert attrs[ids[6]]["k8s.pod.name"] == "new"


def test_the_background_refresher_follows_the_kubelet(
    kubelet: FakeKubelet, nodes: list[Node]
) -> None:
    ids = [d.id for d in SimulatedBackend(SPEC).inventory().devices]
    kubelet.set_pod("first", "ml", {"c": [("nvidia.com/gpu", [ids[0]])]})
    node = make_node(k8s(kubelet.socket, refresh_s=0.2), background=True)
    nodes.append(node)
    # start() waited for the first List: the very first collection already has the pod
    assert node.device_attrs(node.collect())[ids[0]]["k8s.pod.name"] == "first"
    kubelet.set_pod("second", "ml", {"c": [("nvidia.com/gpu", [ids[1]])]})
    deadline = time.monotonic() + 10
    while node.device_attrs(node.collect())[ids[1]].get("k8s.pod.name") != "second":
        assert time.monotonic() < deadline, "the refresher never saw the new pod"
        time.sleep(0.05)


def test_a_missing_socket_is_one_warning_and_no_attribution(
    tmp_path: Path, nodes: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        node = make_node(k8s(tmp_path / "kubelet.sock"))
        nodes.append(node)
        node.attribution.refresh()
        points = node.collect()
        node.attribution.refresh()
        node.collect()
    assert len(points["hw.power"]) == 8
    assert all(not pick(p.attributes, K8S) for p in points["hw.power"])
    warnings = [r for r in caplog.records if "no Kubernetes attribution" in r.getMessage()]
    assert len(warnings) == 1
    assert "does not exist" in warnings[0].getMessage()


def test_a_hanging_kubelet_never_holds_up_a_collection(
    nodes: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    with FakeKubelet(hang=True) as kubelet, caplog.at_level(logging.WARNING):
        settings = AttributionSettings(
            sources=frozenset({"kubernetes"}), kubelet_socket=kubelet.socket, kubelet_timeout_s=0.3
        )
        node = make_node(settings, background=True)  # start() waits at most the deadline + 1 s
        nodes.append(node)
        done = threading.Event()
        result: dict[str, Any] = {}

        def collect() -> None:
            result["points"] = node.collect()
            done.set()

        threading.Thread(target=collect, daemon=True).start()
        assert done.wait(10), "a collection waited for the kubelet"
        assert all(not pick(p.attributes, K8S) for p in result["points"]["hw.power"])
        deadline = time.monotonic() + 10
        while not any("did not answer" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_the_last_answer_is_kept_until_stale(kubelet: FakeKubelet, nodes: list[Node]) -> None:
    clock = FakeClock()
    node = make_node(k8s(kubelet.socket, refresh_s=10.0), clock=clock)
    nodes.append(node)
    ids = node.ids
    kubelet.set_pod("p", "ml", {"c": [("nvidia.com/gpu", [ids[2]])]})
    node.attribution.refresh()
    kubelet.stop()  # the kubelet restarts: its socket is gone for a while
    clock.now += 10
    node.attribution.refresh()
    assert node.device_attrs(node.collect())[ids[2]]["k8s.pod.name"] == "p"
    clock.now += 25  # older than 3 refresh intervals: dropped
    node.attribution.refresh()
    assert not pick(node.device_attrs(node.collect())[ids[2]], K8S)


def test_a_pod_seen_in_a_process_is_fetched_with_get_before_the_next_list(
    kubelet: FakeKubelet, nodes: list[Node]
) -> None:
    settings = AttributionSettings(
        sources=frozenset({"kubernetes", "process"}),
        kubelet_socket=kubelet.socket,
        host_root=FIXTURES / "k8s-cgroupv1",
    )
    ids = [d.id for d in SimulatedBackend(SPEC).inventory().devices]
    kubelet.set_pod("train-0", "ml", {"trainer": [("nvidia.com/gpu", [ids[0], ids[1]])]})
    node = make_node(settings)
    nodes.append(node)
    lists = kubelet.list_calls
    # infer-a starts after the last List; its process (pid 4244) shows up on gpu2
    kubelet.set_pod("infer-a", "serving", {"server": [("nvidia.com/gpu", [f"{ids[2]}::0"])]})
    node.collect()
    node.attribution.refresh_requested()
    assert kubelet.get_calls == 1
    assert kubelet.list_calls == lists
    attrs = node.device_attrs(node.collect())
    assert pick(attrs[ids[2]], K8S) == {
        "k8s.namespace.name": "serving",
        "k8s.pod.name": "infer-a",
        "k8s.pod.uid": "c0ffee00-2222-4333-8444-555566667777",
        "k8s.container.name": "server",
    }
    node.attribution.refresh_requested()
    assert kubelet.get_calls == 1  # asked once


# -- processes ------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", ["k8s-cgroupv1", "k8s-cgroupv2"])
def test_per_process_series_carry_their_pod_and_container(tree: str, nodes: list[Node]) -> None:
    settings = AttributionSettings(sources=frozenset({"process"}), host_root=FIXTURES / tree)
    node = make_node(settings)
    nodes.append(node)
    ids = node.ids
    points = node.collect()
    by_pid = {
        p.attributes["process.pid"]: dict(p.attributes)
        for p in points["accel.workload.memory.usage"]
    }
    assert pick(by_pid[4242], K8S) == {
        "k8s.namespace.name": "ml",
        "k8s.pod.name": "train-0",
        "k8s.pod.uid": TRAIN_UID,
        "k8s.container.name": "trainer",
    }
    assert by_pid[4242]["hw.id"] == ids[0]
    assert by_pid[4244]["k8s.pod.name"] == "infer-a"
    assert pick(by_pid[4245], K8S) == {}  # a host daemon
    assert pick(by_pid[4246], K8S) == {"k8s.pod.uid": "deadbeef-0000-4111-8222-333344445555"}
    # without the kubelet, the processes say who holds each device
    attrs = node.device_attrs(points)
    assert attrs[ids[0]]["k8s.pod.name"] == "train-0"
    assert attrs[ids[4]]["k8s.pod.uid"] == "deadbeef-0000-4111-8222-333344445555"
    assert not pick(attrs[ids[3]], K8S)
    assert "accel.workload.utilization" not in points  # the simulated backend has none


class ScriptedBackend:
    """One GPU whose energy counter and processes the test scripts."""

    name: ClassVar[str] = "scripted"
    auto: ClassVar[bool] = False
    fallback_for: ClassVar[str | None] = None

    def __init__(self) -> None:
        self.energy_j: float | None = 0.0
        self.processes: tuple[ProcessSample, ...] = ()
        self.enabled: set[str] = set()

    def probe(self) -> Probe:
        return Probe(True, "scripted")

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def enable(self, feature: str) -> None:
        self.enabled.add(feature)

    def inventory(self) -> Inventory:
        return Inventory(
            (DeviceInfo(index=0, id="GPU-s0", vendor="nvidia", model="S", backend=self.name),)
        )

    def sample(self) -> Snapshot:
        return Snapshot(
            time.time_ns(),
            (
                DeviceSample(
                    "GPU-s0", power_w=100.0, energy_j=self.energy_j, processes=self.processes
                ),
            ),
        )


def slurm_root(tmp_path: Path, jobs: Mapping[int, int]) -> Path:
    """A /proc tree where each pid runs in its Slurm job (cgroup v2)."""
    for pid, job in jobs.items():
        proc = tmp_path / "proc" / str(pid)
        proc.mkdir(parents=True)
        (proc / "cgroup").write_text(
            f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"
        )
    return tmp_path


def test_per_process_series_are_capped_with_one_warning_and_end_with_their_process(
    tmp_path: Path, nodes: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    backend = ScriptedBackend()
    backend.processes = tuple(
        ProcessSample(pid, memory_used_bytes=pid * 1000, utilization_ratio=0.1)
        for pid in range(1, 6)
    )
    settings = AttributionSettings(
        sources=frozenset({"process"}),
        host_root=slurm_root(tmp_path, {4: 40, 5: 50}),
        max_processes=2,
    )
    with caplog.at_level(logging.WARNING):
        node = make_node(settings, backend)
        nodes.append(node)
        first = node.collect()
        node.collect()
    assert backend.enabled == {"processes"}
    memory = {p.attributes["process.pid"]: p for p in first["accel.workload.memory.usage"]}
    assert sorted(memory) == [4, 5]  # the two using the most memory
    assert memory[5].attributes["slurm.job.id"] == "50"
    assert memory[5].value == 5000
    util = {p.attributes["process.pid"]: p.value for p in first["accel.workload.utilization"]}
    assert util == {4: pytest.approx(0.1), 5: pytest.approx(0.1)}
    assert (
        len([r for r in caplog.records if "OTEL_GPU_ATTRIBUTION_MAX_PROCESSES" in r.getMessage()])
        == 1
    )
    backend.processes = (ProcessSample(4, memory_used_bytes=10),)
    later = node.collect()
    assert [p.attributes["process.pid"] for p in later["accel.workload.memory.usage"]] == [4]


# -- Slurm ----------------------------------------------------------------------------------


def test_slurm_jobs_on_the_devices_cgroup_v1_and_the_mapping_directory(nodes: list[Node]) -> None:
    settings = AttributionSettings(
        sources=frozenset({"slurm"}),
        host_root=FIXTURES / "slurm-cgroupv1",
        slurm_job_map_dir=FIXTURES / "hpc-job-map",
    )
    node = make_node(settings)
    nodes.append(node)
    ids = node.ids
    attrs = node.device_attrs(node.collect())
    job_1234 = {
        "slurm.job.id": "1234",
        "slurm.job.user": "alice",
        "slurm.job.partition": "gpu",
        "slurm.job.name": "train-llm",
    }
    assert pick(attrs[ids[0]], SLURM) == job_1234
    assert pick(attrs[ids[1]], SLURM) == job_1234
    assert pick(attrs[ids[2]], SLURM) == {"slurm.job.id": "1235", "slurm.job.user": "bob"}
    assert pick(attrs[ids[3]], SLURM) == {"slurm.job.id": "1236", "slurm.job.user": "erin"}
    assert pick(attrs[ids[5]], SLURM) == {"slurm.job.id": "1240", "slurm.job.user": "erin"}
    for free in (4, 6, 7):  # gpu6's mapping file names a job that has ended
        assert not pick(attrs[ids[free]], SLURM)
    assert not any(k.startswith("k8s.") for a in attrs.values() for k in a)


def test_slurm_jobs_cgroup_v2(nodes: list[Node]) -> None:
    settings = AttributionSettings(
        sources=frozenset({"slurm"}), host_root=FIXTURES / "slurm-cgroupv2"
    )
    node = make_node(settings)
    nodes.append(node)
    ids = node.ids
    points = node.collect()
    attrs = node.device_attrs(points)
    assert pick(attrs[ids[0]], SLURM) == {
        "slurm.job.id": "5678",
        "slurm.job.user": "carol",
        "slurm.job.partition": "h100",
        "slurm.job.name": "eval",
    }
    assert pick(attrs[ids[2]], SLURM) == {"slurm.job.id": "5679", "slurm.job.user": "frank"}
    energy = {
        p.attributes["slurm.job.id"]: dict(p.attributes) for p in points["accel.workload.energy"]
    }
    assert set(energy) == {"5678", "5679"}
    assert energy["5678"]["slurm.job.user"] == "carol"
    assert "accel.workload.memory.usage" not in points  # per-process series need "process"


# -- energy ---------------------------------------------------------------------------------


def test_the_energy_of_a_workload_on_two_devices_matches_the_integral(
    kubelet: FakeKubelet, nodes: list[Node]
) -> None:
    clock = FakeClock()
    node = make_node(k8s(kubelet.socket), SimulatedBackend("count=8", timer=clock))
    nodes.append(node)
    ids = node.ids
    step = 10.0

    def sweep() -> dict[str, list[Any]]:
        clock.now += step
        return node.collect()

    node.collect()  # t = 0: the energy counters' origin; nothing runs
    kubelet.set_pod("train-0", "ml", {"trainer": [("nvidia.com/gpu", [ids[0], ids[1]])]})
    node.attribution.refresh()
    started = sweep()  # t = 10: the pod is first seen
    assert [p.value for p in started["accel.workload.energy"]] == [0.0]
    running = [sweep() for _ in range(5)]  # t = 20 .. 60
    kubelet.remove_pod("train-0", "ml")
    node.attribution.refresh()
    ended = sweep()  # t = 70: seen gone: its last interval, its final point
    after = sweep()  # t = 80: its series has ended

    def energy_of(points: dict[str, list[Any]], device: str) -> float:
        return float(next(p.value for p in points["hw.energy"] if p.attributes["hw.id"] == device))

    def power_of(points: dict[str, list[Any]], device: str) -> float:
        return float(next(p.value for p in points["hw.power"] if p.attributes["hw.id"] == device))

    # the integral of the power each device drew while the pod held it: t = 10 .. 70
    integral = sum(power_of(p, d) * step for p in [*running, ended] for d in ids[:2])
    counters = sum(energy_of(ended, d) - energy_of(started, d) for d in ids[:2])
    (final,) = ended["accel.workload.energy"]
    assert final.value == pytest.approx(integral, rel=0.01)
    assert final.value == pytest.approx(counters, rel=1e-9)
    assert dict(final.attributes) == {"k8s.namespace.name": "ml", "k8s.pod.name": "train-0"}
    assert "accel.workload.energy" not in after  # the series ended after its last point
    rising = [p["accel.workload.energy"][0].value for p in running]
    assert rising == sorted(rising) and rising[0] > 0


def test_a_shared_device_is_split_by_utilization_where_reported(
    tmp_path: Path, nodes: list[Node]
) -> None:
    backend = ScriptedBackend()
    backend.processes = (
        ProcessSample(1, memory_used_bytes=1, utilization_ratio=0.6),
        ProcessSample(2, memory_used_bytes=1, utilization_ratio=0.2),
    )
    settings = AttributionSettings(
        sources=frozenset({"slurm"}), host_root=slurm_root(tmp_path, {1: 11, 2: 22})
    )
    node = make_node(settings, backend)
    nodes.append(node)
    node.collect()
    backend.energy_j = 400.0
    points = node.collect()
    energy = {p.attributes["slurm.job.id"]: p.value for p in points["accel.workload.energy"]}
    assert energy == {"11": pytest.approx(300.0), "22": pytest.approx(100.0)}
    # a process without a utilization reading: the next interval is split evenly
    backend.processes = (
        ProcessSample(1, memory_used_bytes=1, utilization_ratio=None),
        ProcessSample(2, memory_used_bytes=1, utilization_ratio=0.2),
    )
    node.collect()  # credits 400 -> 400: nothing; holders now weigh evenly
    backend.energy_j = 600.0
    energy = {
        p.attributes["slurm.job.id"]: p.value for p in node.collect()["accel.workload.energy"]
    }
    assert energy == {"11": pytest.approx(400.0), "22": pytest.approx(200.0)}


# -- without a GpuTelemetry (otel-gpu health) -----------------------------------------------


def test_one_shot_attribution_for_a_health_check(kubelet: FakeKubelet) -> None:
    manager = DeviceManager([SimulatedBackend(SPEC)])
    inv = manager.open()
    ids = [d.id for d in inv.devices]
    kubelet.set_pod("train-0", "ml", {"trainer": [("nvidia.com/gpu", [ids[1]])]})
    settings = AttributionSettings(
        sources=frozenset({"kubernetes", "slurm"}),
        kubelet_socket=kubelet.socket,
        host_root=FIXTURES / "slurm-cgroupv2",
    )
    attribution = Attribution(settings, users=USERS)
    try:
        attribution.prepare(manager)
        attribution.refresh()
        attrs = attribution.device_attributes(inv, manager.sample())
    finally:
        attribution.close()
        manager.close()
    assert attrs[ids[1]]["k8s.pod.name"] == "train-0"
    assert attrs[ids[1]]["slurm.job.id"] == "5678"
    assert attrs[ids[2]] == {"slurm.job.id": "5679", "slurm.job.user": "frank"}
    assert ids[3] not in attrs


def test_a_kubelet_device_id_that_names_no_device_is_one_warning(
    kubelet: FakeKubelet, nodes: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.set_pod("p", "ml", {"c": [("nvidia.com/gpu", ["GPU-not-here", "GPU-nor-here"])]})
    kubelet.set_pod("nic", "net", {"c": [("example.com/sriov", ["0000:3b:02.1"])]})
    with caplog.at_level(logging.WARNING):
        node = make_node(k8s(kubelet.socket))
        nodes.append(node)
        node.collect()
        node.collect()
    warnings = [r.getMessage() for r in caplog.records if "names no device" in r.getMessage()]
    assert len(warnings) == 1
    assert "GPU-not-here" in warnings[0]


def test_a_failing_attribution_never_costs_the_device_metrics(
    kubelet: FakeKubelet,
    nodes: list[Node],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = make_node(k8s(kubelet.socket))
    nodes.append(node)

    def broken(*_args: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(node.attribution, "_compute", broken)
    with caplog.at_level(logging.WARNING):
        first = node.collect()
        node.collect()
    assert len(first["hw.power"]) == 8
    assert len([r for r in caplog.records if "attribution failed" in r.getMessage()]) == 1


# -- off ------------------------------------------------------------------------------------


def test_attribution_off_adds_nothing(nodes: list[Node]) -> None:
    node = make_node(AttributionSettings())
    nodes.append(node)
    assert node.attribution.attribute_sources == ()
    points = node.collect()
    assert not any(name.startswith("accel.workload.") for name in points)
    assert all(not pick(p.attributes, K8S + SLURM) for p in points["hw.power"])
