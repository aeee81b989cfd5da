"""Every vendor through the command line, beneath its own library's fake: the same metric names
and attribute keys as NVIDIA wherever the vendor has the data, and mixed nodes report all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from typing import Any

import pytest

from otel_gpu.otel.metrics import METRICS

NVIDIA = "h100-sxm-8-nvswitch"
VENDORS = {
    "amd": "amd-mi300x-8",
    "intel": "intel-max-1550",
    "google": "tpu:tpu-v5e-8",
    "aws": "neuron:neuron-trn1-32xlarge",
}
# Keys a vendor adds on purpose: the kind of accelerator, and the parent of a tile/partition.
VENDOR_ONLY_KEYS = {"accel.kind", "hw.parent"}


def _docs(out: str) -> list[dict[str, Any]]:
    decoder, docs, i = json.JSONDecoder(), [], 0
    while i < len(out):
        if out[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(out, i)
        docs.append(doc)
    return docs


@cache
def run_once(scenario: str) -> tuple[dict[str, set[frozenset[str]]], set[str], dict[str, Any]]:
    """Metric name -> the attribute-key sets of its points; the vendors; the resource."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_gpu.testing.fake_vendor_cli",
            scenario,
            "run",
            "--once",
            "--exporter",
            "console",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    doc = next(d for d in _docs(result.stdout) if "resource_metrics" in d)
    rm = doc["resource_metrics"][0]
    keys: dict[str, set[frozenset[str]]] = {}
    vendors: set[str] = set()
    for sm in rm["scope_metrics"]:
        for metric in sm["metrics"]:
            for point in metric["data"]["data_points"]:
                attrs = point["attributes"]
                keys.setdefault(metric["name"], set()).add(frozenset(attrs) - VENDOR_ONLY_KEYS)
                vendors.add(attrs.get("hw.vendor"))
    return keys, vendors, rm["resource"]["attributes"]


@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_same_names_and_attribute_keys_as_nvidia(vendor: str) -> None:
    nvidia, _, _ = run_once(NVIDIA)
    other, vendors, resource = run_once(VENDORS[vendor])
    assert vendors == {vendor}
    known = {m.name for m in METRICS} | {"hw.status"}
    assert set(other) <= known, set(other) - known
    for name in ("hw.gpu.utilization", "hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.status"):
        assert name in other, f"{vendor} lacks {name}"
    for name, key_sets in other.items():
        if name in nvidia:
            assert key_sets <= nvidia[name], (name, key_sets - nvidia[name])
    assert resource["accel.device.count"] >= 4
    assert resource["accel.vendors"] == [vendor]


def test_a_node_with_three_vendors_reports_them_all() -> None:
    keys, vendors, resource = run_once(f"{NVIDIA}+amd-mi300x-8+intel-max-1550")
    assert vendors == {"nvidia", "amd", "intel"}
    assert sorted(resource["accel.vendors"]) == ["amd", "intel", "nvidia"]
    # Each vendor's interconnect is its own domain: NVSwitch fabric, xGMI mesh.
    assert len(resource["accel.interconnect.domains"]) == 2
    assert "hw.power" in keys
