"""``otel-gpu run --once`` on the simulated 8-GPU node with a fake kubelet: the right pod on each
allocated device's points, none on the free devices (OTEL_GPU_ATTRIBUTION=kubernetes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from otel_gpu.backends.simulated import SimulatedBackend
from otel_gpu.testing.fake_kubelet import FakeKubelet

K8S = ("k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid", "k8s.container.name")


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as fake:
        yield fake


def _documents(stdout: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    docs, i = [], 0
    while i < len(stdout):
        if stdout[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(stdout, i)
        docs.append(doc)
    return docs


def _run_once(env: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full_env.update(env)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_gpu",
            "run",
            "--backend",
            "simulated",
            "--once",
            "--exporter",
            "console",
        ],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    metrics: dict[str, list[dict[str, Any]]] = {}
    for doc in _documents(result.stdout):
        for rm in doc.get("resource_metrics", ()):
            for sm in rm["scope_metrics"]:
                for metric in sm["metrics"]:
                    metrics.setdefault(metric["name"], []).extend(metric["data"]["data_points"])
    return metrics


def test_run_once_puts_each_pod_on_its_devices_and_none_on_free_ones(
    kubelet: FakeKubelet,
) -> None:
    ids = [d.id for d in SimulatedBackend(None).inventory().devices]
    kubelet.set_pod("train-0", "ml", {"trainer": [("nvidia.com/gpu", [ids[0], ids[1]])]})
    kubelet.set_pod("infer", "serving", {"server": [("nvidia.com/gpu", [f"{ids[5]}::2"])]})
    kubelet.set_pod("indexed", "batch", {"step": [("nvidia.com/gpu", ["6"])]})
    metrics = _run_once(
        {
            "OTEL_GPU_ATTRIBUTION": "kubernetes",
            "OTEL_GPU_KUBELET_SOCKET": str(kubelet.socket),
        }
    )
    assert kubelet.list_calls >= 1
    expected = {
        ids[0]: {
            "k8s.namespace.name": "ml",
            "k8s.pod.name": "train-0",
            "k8s.container.name": "trainer",
        },
        ids[1]: {
            "k8s.namespace.name": "ml",
            "k8s.pod.name": "train-0",
            "k8s.container.name": "trainer",
        },
        ids[5]: {
            "k8s.namespace.name": "serving",
            "k8s.pod.name": "infer",
            "k8s.container.name": "server",
        },
        ids[6]: {
            "k8s.namespace.name": "batch",
            "k8s.pod.name": "indexed",
            "k8s.container.name": "step",
        },
    }
    for name in ("hw.power", "hw.gpu.utilization", "hw.gpu.memory.usage", "hw.energy"):
        points = metrics[name]
        assert {p["attributes"]["hw.id"] for p in points} == set(ids), name
        for point in points:
            attrs = point["attributes"]
            got = {k: attrs[k] for k in K8S if k in attrs}
            assert got == expected.get(attrs["hw.id"], {}), (name, attrs["hw.name"])
    pods = {p["attributes"]["k8s.pod.name"] for p in metrics["accel.workload.energy"]}
    assert pods == {"train-0", "infer", "indexed"}


def test_run_once_with_a_missing_kubelet_socket_still_exports(tmp_path: Any) -> None:
    metrics = _run_once(
        {
            "OTEL_GPU_ATTRIBUTION": "kubernetes",
            "OTEL_GPU_KUBELET_SOCKET": str(tmp_path / "kubelet.sock"),
        }
    )
    assert len(metrics["hw.power"]) == 8
    assert all(not any(k in p["attributes"] for k in K8S) for p in metrics["hw.power"])


def test_health_names_the_pod_that_holds_a_faulty_device(kubelet: FakeKubelet) -> None:
    ids = [d.id for d in SimulatedBackend(None).inventory().devices]
    kubelet.set_pod("train-0", "ml", {"trainer": [("nvidia.com/gpu", [ids[3]])]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {"OTEL_GPU_ATTRIBUTION": "kubernetes", "OTEL_GPU_KUBELET_SOCKET": str(kubelet.socket)}
    )
    for fmt in ("text", "json"):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "otel_gpu",
                "health",
                "--backend",
                "simulated:faults=ecc@3:0",
                "--format",
                fmt,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        if fmt == "text":
            assert "gpu3 [pod ml/train-0]" in result.stdout
        else:
            finding = json.loads(result.stdout)["findings"][0]
            assert finding["held_by"]["k8s.pod.name"] == "train-0"
