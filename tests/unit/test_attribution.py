"""Attribution building blocks: settings, device id matching, procfs/cgroup parsing, the Slurm
readers, the energy integrator and the PodResources client against a real gRPC unix socket."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from otel_gpu import attribution
from otel_gpu.attribution.devices import DeviceMatcher, resource_vendor
from otel_gpu.attribution.energy import EnergyIntegrator, WorkloadKey
from otel_gpu.attribution.kubernetes import (
    KubeletPods,
    KubeletUnavailable,
    PodDirectory,
    PodResourcesClient,
)
from otel_gpu.attribution.procfs import ProcReader, cgroup_version, parse_cgroup
from otel_gpu.attribution.settings import AttributionSettings
from otel_gpu.attribution.slurm import JobMap, job_of_process, live_jobs, read_job_map
from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.errors import ConfigError
from otel_gpu.hal.model import Inventory
from otel_gpu.testing.fake_kubelet import FakeKubelet

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "attribution"
TRAIN_UID = "7d9c3f4e-1b2a-4c5d-8e6f-0a1b2c3d4e5f"
TRAIN_CID = "3f1e9c2d" * 8


def inventory(spec: str = "count=8,mig=7:2") -> Inventory:
    return SimulatedBackend(spec).inventory()


# -- public surface -------------------------------------------------------------------------


def test_the_public_api_is_small() -> None:
    assert set(attribution.__all__) == {
        "ENERGY_METRIC",
        "ENV_VARS",
        "MEMORY_METRIC",
        "SOURCES",
        "UTILIZATION_METRIC",
        "Attribution",
        "AttributionSettings",
    }
    assert attribution.ENERGY_METRIC == "accel.workload.energy"
    assert {v.name for v in attribution.ENV_VARS} == {
        "OTEL_GPU_ATTRIBUTION",
        "OTEL_GPU_KUBELET_SOCKET",
        "OTEL_GPU_SLURM_JOB_MAP_DIR",
        "OTEL_GPU_ATTRIBUTION_REFRESH",
        "OTEL_GPU_ATTRIBUTION_MAX_PROCESSES",
        "OTEL_GPU_HOST_ROOT",
    }


# -- settings -------------------------------------------------------------------------------


def test_attribution_is_off_by_default() -> None:
    settings = AttributionSettings.from_env({})
    assert not settings.enabled
    assert settings.kubelet_socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert settings.max_processes == 64
    assert AttributionSettings.from_env({"OTEL_GPU_ATTRIBUTION": "none"}).sources == frozenset()


def test_settings_are_read_from_the_environment() -> None:
    settings = AttributionSettings.from_env(
        {
            "OTEL_GPU_ATTRIBUTION": " Kubernetes, slurm ,process",
            "OTEL_GPU_KUBELET_SOCKET": "/run/k.sock",
            "OTEL_GPU_SLURM_JOB_MAP_DIR": "/run/dcgm-job-map",
            "OTEL_GPU_ATTRIBUTION_REFRESH": "2.5",
            "OTEL_GPU_ATTRIBUTION_MAX_PROCESSES": "8",
            "OTEL_GPU_HOST_ROOT": "/host",
        }
    )
    assert settings.sources == {"kubernetes", "slurm", "process"}
    assert settings.kubelet_socket == Path("/run/k.sock")
    assert settings.slurm_job_map_dir == Path("/run/dcgm-job-map")
    assert settings.refresh_s == 2.5
    assert settings.max_processes == 8
    assert settings.host_root == Path("/host")


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("OTEL_GPU_ATTRIBUTION", "kubernetes,lsf", "kubernetes, slurm, process"),
        ("OTEL_GPU_ATTRIBUTION_REFRESH", "0.01", "seconds >= 0.2"),
        ("OTEL_GPU_ATTRIBUTION_REFRESH", "soon", "seconds >= 0.2"),
        ("OTEL_GPU_ATTRIBUTION_MAX_PROCESSES", "0", "an integer >= 1"),
    ],
)
def test_an_invalid_setting_names_the_variable_and_the_accepted_values(
    name: str, value: str, accepted: str
) -> None:
    with pytest.raises(ConfigError) as err:
        AttributionSettings.from_env({name: value})
    assert err.value.setting == name
    assert accepted in str(err.value)


# -- device ids -----------------------------------------------------------------------------


def test_gpu_mig_and_time_sliced_ids_name_our_devices() -> None:
    inv = inventory()
    ids = [d.id for d in inv.devices]
    m = DeviceMatcher(inv)
    assert m.match(ids[0], "nvidia.com/gpu") == (ids[0],)
    assert m.match(ids[0].lower(), "nvidia.com/gpu") == (ids[0],)
    assert m.match(f"{ids[2]}::3", "nvidia.com/gpu") == (ids[2],)
    assert m.match(ids[9], "nvidia.com/mig-1g.10gb") == (ids[9],)
    assert m.match(f"{ids[9]}::1", "nvidia.com/mig-1g.10gb") == (ids[9],)
    # the old MIG form names the GPU instance of a parent
    assert m.match(f"MIG-{ids[7]}/2/0", "nvidia.com/mig-1g.10gb") == (ids[9],)
    assert m.match("GPU-00000000-0000-0000-0000-000000000000", "nvidia.com/gpu") == ()


def test_indices_and_gke_names_only_for_accelerator_resources() -> None:
    inv = inventory()
    ids = [d.id for d in inv.devices]
    m = DeviceMatcher(inv)
    assert m.match("5", "nvidia.com/gpu") == (ids[5],)
    assert m.match("5", "example.com/nic") == ()
    assert m.match("nvidia3", "nvidia.com/gpu") == (ids[3],)
    assert m.match("nvidia3/vgpu2", "nvidia.com/gpu") == (ids[3],)
    assert m.match("nvidia7/gi1", "nvidia.com/mig-1g.10gb") == (ids[8],)
    assert m.match("42", "nvidia.com/gpu") == ()
    assert m.physical(7) == ids[7]
    # the NVIDIA device plugin's index strategy: "<gpu>:<mig device>"
    assert m.match("7:1", "nvidia.com/mig-1g.10gb") == (ids[9],)
    assert m.match("7:5", "nvidia.com/mig-1g.10gb") == ()
    assert m.match("0:0", "nvidia.com/mig-1g.10gb") == ()


def test_amd_pci_addresses_and_intel_drm_cards(tmp_path: Path) -> None:
    amd = inventory("vendor=amd,count=2")
    m = DeviceMatcher(amd)
    first = amd.devices[0]
    assert first.pci_bus_id is not None
    assert m.match(first.pci_bus_id.upper(), "amd.com/gpu") == (first.id,)
    assert m.match("1", "amd.com/gpu") == (amd.devices[1].id,)
    intel = inventory("vendor=intel,count=2")
    second = intel.devices[1]
    assert second.pci_bus_id is not None
    drm = tmp_path / "sys" / "class" / "drm" / "card1"
    drm.mkdir(parents=True)
    (drm / "device").symlink_to(f"../../../devices/pci0000:00/{second.pci_bus_id}")
    m = DeviceMatcher(intel, tmp_path)
    assert m.match("card1-0", "gpu.intel.com/i915") == (second.id,)
    assert m.match("card1", "gpu.intel.com/xe") == (second.id,)
    assert m.match("card9", "gpu.intel.com/i915") == ()


def test_resource_vendors() -> None:
    assert resource_vendor("nvidia.com/gpu") == "nvidia"
    assert resource_vendor("nvidia.com/mig-1g.10gb") == "nvidia"
    assert resource_vendor("amd.com/gpu") == "amd"
    assert resource_vendor("gpu.intel.com/i915") == "intel"
    assert resource_vendor("cpu") is None


# -- procfs and cgroups ---------------------------------------------------------------------


@pytest.mark.parametrize("tree", ["k8s-cgroupv1", "k8s-cgroupv2"])
def test_a_pod_and_its_container_from_the_cgroup(tree: str) -> None:
    info = ProcReader(FIXTURES / tree).process(4242)
    assert info is not None
    assert info.cgroup.pod_uid == TRAIN_UID
    assert info.cgroup.container_id == TRAIN_CID
    assert info.cgroup.slurm_job_id is None
    assert info.cgroup.version == (1 if tree.endswith("v1") else 2)
    host = ProcReader(FIXTURES / tree).process(4245)
    assert host is not None
    assert host.cgroup.pod_uid is None
    assert ProcReader(FIXTURES / tree).process(9999) is None


def test_cgroup_versions_of_the_trees() -> None:
    assert cgroup_version(FIXTURES / "k8s-cgroupv1") == 1
    assert cgroup_version(FIXTURES / "k8s-cgroupv2") == 2
    assert cgroup_version(FIXTURES / "slurm-cgroupv1") == 1
    assert cgroup_version(FIXTURES / "slurm-cgroupv2") == 2
    assert cgroup_version(FIXTURES / "hpc-job-map") is None


def test_cgroup_paths_seen_through_a_cgroup_namespace_and_docker() -> None:
    nested = parse_cgroup(
        "0::/../../kubepods-besteffort-pod0a1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/"
        f"docker-{'ab' * 32}.scope\n"
    )
    assert nested.pod_uid == "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    assert nested.container_id == "ab" * 32
    assert parse_cgroup("").version == 0
    several = parse_cgroup("5:memory:/slurm_node07/uid_42/job_77/step_3\n")
    assert (several.slurm_job_id, several.slurm_step, several.slurm_uid) == ("77", "3", 42)


def test_slurm_jobs_from_v1_and_v2_cgroups_and_the_environment() -> None:
    v1 = ProcReader(FIXTURES / "slurm-cgroupv1")
    users = {1001: "bob"}.get
    first = v1.process(4242)
    assert first is not None
    assert first.cgroup.slurm_job_id == "1234"
    assert first.cgroup.slurm_uid == 1000
    assert job_of_process(first, users).attributes() == {  # type: ignore[union-attr]
        "slurm.job.id": "1234",
        "slurm.job.user": "alice",
        "slurm.job.partition": "gpu",
        "slurm.job.name": "train-llm",
    }
    # only SLURM_JOB_* variables are ever kept from another process's environment
    assert set(first.environ) <= set(attribution.procfs.ENVIRON_KEYS)
    no_environ = v1.process(4244)
    assert no_environ is not None
    job = job_of_process(no_environ, users)
    assert job is not None
    assert (job.id, job.user, job.partition) == ("1235", "bob", None)
    env_only = v1.process(4245)
    assert env_only is not None
    assert env_only.cgroup.slurm_job_id is None
    job = job_of_process(env_only, users)
    assert job is not None
    assert (job.id, job.user) == ("1236", "erin")
    v2 = ProcReader(FIXTURES / "slurm-cgroupv2").process(4244)
    assert v2 is not None
    assert (v2.cgroup.slurm_job_id, v2.cgroup.slurm_step) == ("5679", "extern")
    job = job_of_process(v2, {1004: "frank"}.get)
    assert job is not None
    assert job.user == "frank"


def test_an_unreadable_environment_is_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    proc = tmp_path / "proc" / "10"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_9/step_0\n")
    (proc / "environ").write_bytes(b"SLURM_JOB_USER=x\0")
    real_open = Path.open

    def deny(self: Path, *args: object, **kwargs: object) -> object:
        if self.name == "environ":
            raise PermissionError(13, "Permission denied")
        return real_open(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", deny)
    reader = ProcReader(tmp_path)
    with caplog.at_level(logging.INFO, logger="otel_gpu.attribution"):
        assert reader.process(10) is not None
        info = reader.process(10)
    assert info is not None
    assert info.environ == {}
    assert info.cgroup.slurm_job_id == "9"
    assert len([r for r in caplog.records if "environ" in r.getMessage()]) == 1


# -- Slurm mapping directory ----------------------------------------------------------------


def test_the_dcgm_exporter_mapping_directory_layout() -> None:
    files = read_job_map(FIXTURES / "hpc-job-map")
    assert sorted(files) == ["0", "1", "5", "6"]
    assert [j.id for j in files["0"]] == ["1234"]
    assert files["5"][0].uid == 1002


def test_live_jobs_come_from_the_cgroup_tree() -> None:
    assert live_jobs(FIXTURES / "slurm-cgroupv1") == {"1234": 1000, "1235": 1001, "1240": 1002}
    assert live_jobs(FIXTURES / "slurm-cgroupv2") == {"5678": None, "5679": None}
    assert live_jobs(FIXTURES / "k8s-cgroupv2") is None


def test_the_job_map_drops_stale_jobs_and_names_users(tmp_path: Path) -> None:
    inv = inventory()
    ids = [d.id for d in inv.devices]
    jobs = JobMap(FIXTURES / "hpc-job-map", FIXTURES / "slurm-cgroupv1", {1002: "erin"}.get)
    jobs.refresh()
    by_device = jobs.jobs(DeviceMatcher(inv))
    assert sorted(by_device) == sorted([ids[0], ids[1], ids[5]])
    assert by_device[ids[5]][0].user == "erin"
    # without a Slurm cgroup tree nothing is known to be stale; UUID-named files work too
    (tmp_path / ids[9]).write_text("77\n")
    (tmp_path / "6").write_text("999\n")
    jobs = JobMap(tmp_path, tmp_path)
    jobs.refresh()
    assert {d: [j.id for j in js] for d, js in jobs.jobs(DeviceMatcher(inv)).items()} == {
        ids[9]: ["77"],
        ids[6]: ["999"],
    }


def test_a_missing_mapping_directory_is_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = JobMap(tmp_path / "absent", tmp_path)
    with caplog.at_level(logging.WARNING):
        jobs.refresh()
        jobs.refresh()
    assert jobs.jobs(DeviceMatcher(inventory())) == {}
    assert len([r for r in caplog.records if "mapping directory" in r.getMessage()]) == 1


# -- energy ---------------------------------------------------------------------------------

A: WorkloadKey = ("k8s", "ns", "a")
B: WorkloadKey = ("k8s", "ns", "b")
ATTRS: dict[WorkloadKey, Mapping[str, str]] = {A: {"k8s.pod.name": "a"}, B: {"k8s.pod.name": "b"}}


def test_energy_goes_to_the_holders_at_the_start_of_each_interval() -> None:
    energy = EnergyIntegrator()
    energy.update({"d0": (1000.0, {})}, ATTRS)
    energy.update({"d0": (1100.0, {A: 1.0})}, ATTRS)  # A appears: nothing credited yet
    assert energy.total(A) == 0.0
    energy.update({"d0": (1300.0, {A: 1.0})}, ATTRS)
    assert energy.total(A) == 200.0
    energy.update({"d0": (1350.0, {})}, ATTRS)  # A gone: its last interval, a final point
    assert energy.points() == ((250.0, {"k8s.pod.name": "a"}),)
    assert energy.total(A) is None
    energy.update({"d0": (1400.0, {})}, ATTRS)
    assert energy.points() == ()


def test_a_shared_device_is_split_by_weight() -> None:
    energy = EnergyIntegrator()
    energy.update({"d0": (0.0, {A: 1.0, B: 1.0}), "d1": (0.0, {A: 3.0, B: 1.0})}, ATTRS)
    energy.update({"d0": (100.0, {A: 1.0, B: 1.0}), "d1": (100.0, {A: 3.0, B: 1.0})}, ATTRS)
    assert energy.total(A) == pytest.approx(50.0 + 75.0)
    assert energy.total(B) == pytest.approx(50.0 + 25.0)


def test_a_counter_reset_or_a_missing_reading_credits_nothing() -> None:
    energy = EnergyIntegrator()
    energy.update({"d0": (500.0, {A: 1.0})}, ATTRS)
    energy.update({"d0": (10.0, {A: 1.0})}, ATTRS)  # driver reloaded
    energy.update({"d0": (None, {A: 1.0})}, ATTRS)
    energy.update({"d0": (20.0, {A: 1.0})}, ATTRS)
    assert energy.total(A) == 0.0
    energy.update({"d0": (30.0, {A: 1.0})}, ATTRS)
    assert energy.total(A) == 10.0


def test_a_workload_keeps_its_first_attributes() -> None:
    energy = EnergyIntegrator()
    energy.update({"d0": (0.0, {A: 1.0})}, {A: {"k8s.pod.name": "a"}})
    energy.update({"d0": (5.0, {A: 1.0})}, {A: {"k8s.pod.name": "a", "k8s.pod.uid": "u"}})
    assert energy.points() == ((5.0, {"k8s.pod.name": "a"}),)


# -- the PodResources client on a real gRPC unix socket -------------------------------------


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as fake:
        yield fake


def test_list_and_get_over_the_unix_socket(kubelet: FakeKubelet) -> None:
    kubelet.set_pod("p", "ns", {"c": [("nvidia.com/gpu", ["GPU-1", "GPU-2::3"])]})
    client = PodResourcesClient(kubelet.socket, timeout_s=2.0)
    try:
        (pod,) = client.list()
        assert (pod.namespace, pod.name) == ("ns", "p")
        assert pod.containers[0].devices == (
            ("nvidia.com/gpu", "GPU-1"),
            ("nvidia.com/gpu", "GPU-2::3"),
        )
        got = client.get("ns", "p")
        assert got == pod
        assert client.get("ns", "absent") is None
        assert (kubelet.list_calls, kubelet.get_calls) == (1, 2)
    finally:
        client.close()


def test_a_kubelet_without_get(kubelet: FakeKubelet) -> None:
    kubelet.get_enabled = False
    kubelet.set_pod("p", "ns", {"c": [("nvidia.com/gpu", ["GPU-1"])]})
    pods = KubeletPods(PodResourcesClient(kubelet.socket, timeout_s=2.0))
    pods.request("ns", "p")
    assert pods.refresh_requested() == 0
    pods.request("ns", "q")  # Get is known to be missing: not asked again
    assert pods.refresh_requested() == 0
    assert kubelet.get_calls == 1
    pods.refresh()
    assert pods.known("ns", "p")
    pods.client.close()


def test_a_missing_socket_fails_fast_with_a_reason(tmp_path: Path) -> None:
    client = PodResourcesClient(tmp_path / "kubelet.sock", timeout_s=5.0)
    with pytest.raises(KubeletUnavailable, match="does not exist"):
        client.list()
    (tmp_path / "file.sock").write_text("")
    with pytest.raises(KubeletUnavailable, match="not a unix socket"):
        PodResourcesClient(tmp_path / "file.sock").list()


def test_a_hanging_kubelet_is_cut_by_the_deadline() -> None:
    with FakeKubelet(hang=True) as kubelet:
        client = PodResourcesClient(kubelet.socket, timeout_s=0.3)
        with pytest.raises(KubeletUnavailable, match=r"did not answer List within 0\.3s"):
            client.list()
        client.close()


def test_a_socket_that_accepts_and_never_speaks_is_cut_by_the_deadline(tmp_path: Path) -> None:
    path = Path(os.path.join("/tmp", f"otel-gpu-blackhole-{os.getpid()}.sock"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen(4)
        client = PodResourcesClient(path, timeout_s=0.3)
        with pytest.raises(KubeletUnavailable):
            client.list()
        client.close()
    finally:
        listener.close()
        path.unlink(missing_ok=True)


def test_a_socket_the_agent_may_not_use(
    kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("otel_gpu.attribution.kubernetes.os.access", lambda *_a, **_k: False)
    with pytest.raises(KubeletUnavailable, match="no permission to use"):
        PodResourcesClient(kubelet.socket).list()
    assert kubelet.list_calls == 0


def test_pod_uids_and_container_names_from_the_kubelet_log_layout() -> None:
    directory = PodDirectory(FIXTURES / "k8s-cgroupv1")
    directory.refresh()
    assert directory.uid("ml", "train-0") == TRAIN_UID
    assert directory.pod(TRAIN_UID) == ("ml", "train-0")
    assert directory.container(TRAIN_CID) == ("ml", "train-0", "trainer")
    assert directory.uid("ml", "absent") is None
    empty = PodDirectory(FIXTURES / "hpc-job-map")
    empty.refresh()
    assert empty.pod(TRAIN_UID) is None
