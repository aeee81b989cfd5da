"""The deployment examples: Kubernetes manifests, the systemd unit, the examples index.

Kubernetes: every document of ``examples/kubernetes/*.yaml`` is validated against the strict
JSON schemas that ``kubernetes-validate`` generates from the official Kubernetes OpenAPI
(``additionalProperties: false`` everywhere, so an unknown or misspelt key fails, as do wrong
types and missing required fields), for the oldest Kubernetes each manifest supports and the
newest the package knows. Without the package the schema tests skip, or fail with
``OTEL_GPU_REQUIRE_E2E=1``. Beyond the schema: the pods meet the "restricted" Pod Security
Standard, the agent ConfigMap is ``collector/configs/agent.yaml`` verbatim, otel-gpu's
environment passes otel-gpu's own configuration checks, the Collector's environment passes
``otelcol-gpu validate``, and the image tags match the versions of this repository.

systemd: ``systemd-analyze verify`` (when installed) and a directive check; the environment
file passes otel-gpu's configuration checks.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

import otel_gpu
from otel_gpu.config import ENV_VARS, STANDARD_VARS, Settings
from tests.conftest import missing_part

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
KUBERNETES = EXAMPLES / "kubernetes"
SYSTEMD = EXAMPLES / "systemd"

#: Every manifest, with the oldest Kubernetes minor it supports (native sidecars: 1.29;
#: resource.k8s.io/v1 for DRA: 1.34). Each is also validated against the newest schema.
MANIFESTS = {
    "daemonset.yaml": "1.29",
    "sidecar.yaml": "1.29",
    "sidecar-dra.yaml": "1.34",
}
#: Containers that run otel-gpu or the Collector (by image), held to the strictest rules.
OTEL_GPU_IMAGE = "ghcr.io/otel-gpu/otel-gpu"
COLLECTOR_IMAGE = "ghcr.io/otel-gpu/otelcol-gpu"
POD_KINDS = {"Pod", "DaemonSet", "Deployment", "StatefulSet", "Job", "CronJob"}
_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def kubernetes_validate() -> ModuleType:
    """The ``kubernetes_validate`` module (skip, or fail in CI, without it)."""
    try:
        import kubernetes_validate
    except ImportError:
        missing_part(
            "kubernetes-validate is not installed (pip install kubernetes-validate; "
            "it ships the Kubernetes JSON schemas)"
        )
        raise
    return kubernetes_validate


def documents(name: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of ``examples/kubernetes/<name>``."""
    with (KUBERNETES / name).open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def all_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """(file name, document) of every manifest."""
    for name in MANIFESTS:
        for doc in documents(name):
            yield name, doc


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(``file/kind/name``, pod spec) of every workload."""
    for name, doc in all_documents():
        if doc["kind"] not in POD_KINDS:
            continue
        spec = doc["spec"]
        if doc["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if doc["kind"] != "Pod":
            spec = spec["template"]["spec"]
        yield f"{name}/{doc['kind']}/{doc['metadata']['name']}", spec


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Init (sidecar) and regular containers of a pod spec."""
    return [*spec.get("initContainers", []), *spec["containers"]]


def config_maps() -> dict[tuple[str, str], dict[str, str]]:
    """(namespace, name) -> data of every ConfigMap in the manifests."""
    return {
        (doc["metadata"].get("namespace", "default"), doc["metadata"]["name"]): doc["data"]
        for _, doc in all_documents()
        if doc["kind"] == "ConfigMap"
    }


def container_env(container: dict[str, Any], namespace: str) -> dict[str, str]:
    """The environment the kubelet would give ``container``: ``envFrom`` ConfigMaps, then
    ``env`` with ``$(VAR)`` references expanded; downward-API values become placeholders.

    Fails on a reference to a variable not defined before it (the kubelet would pass the
    ``$(VAR)`` text through unchanged)."""
    env: dict[str, str] = {}
    maps = config_maps()
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        env.update(maps[(namespace, ref)])
    for var in container.get("env", []):
        if "valueFrom" in var:
            field = var["valueFrom"]["fieldRef"]["fieldPath"]
            env[var["name"]] = f"placeholder-{field.rsplit('.', 1)[-1].lower()}"
            continue
        value = str(var.get("value", ""))
        for ref in _REFERENCE.findall(value):
            assert ref in env, f"{container['name']}: {var['name']} uses $({ref}) before it is set"
        env[var["name"]] = _REFERENCE.sub(lambda m: env[m.group(1)], value)
    return env


def namespace_of(where: str) -> str:
    """The namespace of the workload ``file/kind/name``."""
    file, kind, name = where.split("/")
    doc = next(d for d in documents(file) if d["kind"] == kind and d["metadata"]["name"] == name)
    return str(doc["metadata"].get("namespace", "default"))


# -- schema --------------------------------------------------------------------------------------


def test_every_manifest_is_checked() -> None:
    assert {p.name for p in KUBERNETES.glob("*.y*ml")} == set(MANIFESTS)


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_manifest_matches_the_kubernetes_schema(name: str) -> None:
    kv = kubernetes_validate()
    versions = sorted({MANIFESTS[name], kv.utils.major_minor(kv.utils.latest_version())})
    docs = documents(name)
    assert docs
    for doc in docs:
        for version in versions:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as e:
                path = "/".join(str(p) for p in e.absolute_path)
                pytest.fail(
                    f"{name}: {doc['kind']} {doc['metadata'].get('name')} (Kubernetes "
                    f"{version}) at {path or '/'}: {e.message}"
                )
            except kv.SchemaNotFoundError as e:
                pytest.fail(f"{name}: {e.message}")


def test_the_schemas_reject_unknown_keys_and_wrong_types() -> None:
    kv = kubernetes_validate()
    _, daemonset = next((n, d) for n, d in all_documents() if d["kind"] == "DaemonSet")
    kv.validate(daemonset, "1.29", strict=True)
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    for key, value in (("readOnlyRootFS", True), ("runAsUser", "nobody")):
        broken = {**container, "securityContext": {**container["securityContext"], key: value}}
        template = {**daemonset["spec"]["template"]}
        template["spec"] = {**template["spec"], "containers": [broken]}
        doc = {**daemonset, "spec": {**daemonset["spec"], "template": template}}
        with pytest.raises(kv.ValidationError):
            kv.validate(doc, "1.29", strict=True)


# -- what the schema cannot say --------------------------------------------------------------------


def test_pods_meet_the_restricted_pod_security_standard() -> None:
    specs = list(pod_specs())
    assert len(specs) >= 3
    for where, spec in specs:
        pod_sc = spec.get("securityContext", {})
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(key), (where, key)
        assert spec.get("automountServiceAccountToken") is False, where
        for volume in spec.get("volumes", []):
            assert "hostPath" not in volume, (where, volume["name"])
        for c in containers(spec):
            sc = c.get("securityContext", {})
            label = f"{where}/{c['name']}"
            assert sc.get("allowPrivilegeEscalation") is False, label
            assert not sc.get("privileged"), label
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], label
            assert not sc.get("capabilities", {}).get("add"), label
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, label
            assert sc.get("runAsUser", pod_sc.get("runAsUser", 1)) != 0, label
            seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
            assert seccomp.get("type") in ("RuntimeDefault", "Localhost"), label
            assert all("hostPort" not in p for p in c.get("ports", [])), label
            resources = c.get("resources", {})
            assert resources.get("requests", {}).get("memory"), label
            assert resources.get("limits", {}).get("memory"), label
            if c["image"].startswith((OTEL_GPU_IMAGE, COLLECTOR_IMAGE)):
                assert sc.get("readOnlyRootFilesystem") is True, label


def test_otel_gpu_runs_in_every_workload_without_a_gpu_request() -> None:
    """The agent must not take GPUs from the workloads: it sees them through the runtime
    (NVIDIA_VISIBLE_DEVICES) or a shared DRA claim, never an nvidia.com/gpu request."""
    for where, spec in pod_specs():
        agents = [c for c in containers(spec) if c["image"].startswith(OTEL_GPU_IMAGE)]
        assert len(agents) == 1, where
        agent = agents[0]
        resources = agent.get("resources", {})
        for kind in ("requests", "limits"):
            assert not any(k.startswith("nvidia.com/") for k in resources.get(kind, {})), where
        names = {e["name"] for e in agent.get("env", [])}
        via_runtime = "NVIDIA_VISIBLE_DEVICES" in names and spec.get("runtimeClassName")
        via_claim = resources.get("claims")
        assert via_runtime or via_claim, where
        if via_claim:  # shares the trainer's claim
            others = [c for c in containers(spec) if c is not agent]
            assert any(c.get("resources", {}).get("claims") == via_claim for c in others), where
        if agent in spec.get("initContainers", []):
            assert agent.get("restartPolicy") == "Always", f"{where}: a native sidecar"


def test_sidecar_hand_off_reports_only_the_trainers_gpus(tmp_path: Path) -> None:
    """sidecar.yaml's two shell scripts, run as written (the volume path moved to a temp dir,
    nvidia-smi faked to list two GPUs of the simulated node): the sidecar waits for the list,
    then otel-gpu sees only those two devices."""
    job = next(d for d in documents("sidecar.yaml") if d["kind"] == "Job")
    spec = job["spec"]["template"]["spec"]
    sidecar, trainer = spec["initContainers"][0], spec["containers"][0]
    shared = tmp_path / "run"
    shared.mkdir()
    ids = ["GPU-dd7827bc-ce2e-51bb-b664-b02780e50e5b", "GPU-97644c72-b8f9-5023-afd0-fb5de0173e31"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {
        # What NVML lists inside the trainer's container: the two GPUs it was given.
        "nvidia-smi": "printf '%s\\n' " + " ".join(ids),
        "opentelemetry-instrument": 'echo "instrumented: $*"',
        # `otel-gpu run` would run until stopped: show the inventory it would report instead.
        "otel-gpu": f'exec "{Path(sys.executable).parent / "otel-gpu"}" inventory --json '
        "--backend simulated",
    }
    for name, body in fakes.items():
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def command(container: dict[str, Any]) -> list[str]:
        args = [a.replace("/run/otel-gpu", str(shared)) for a in container["args"]]
        return [*container["command"], *args]

    # The native sidecar starts first and waits for the trainer's list.
    with subprocess.Popen(
        command(sidecar), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as waiting:
        time.sleep(0.5)
        assert waiting.poll() is None, waiting.communicate()
        started = subprocess.run(
            command(trainer), env=env, capture_output=True, text=True, timeout=30, check=False
        )
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip() == "instrumented: python train.py"
        out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, err
    assert (shared / "devices").read_text().strip() == ",".join(ids)
    inventory = json.loads(out)
    assert [d["id"] for d in inventory["devices"]] == ids
    assert [d["name"] for d in inventory["devices"]] == ["gpu2", "gpu5"]


def test_agent_configmap_is_the_collector_agent_config() -> None:
    agent = config_maps()[("otel-gpu", "otelcol-gpu-agent")]["agent.yaml"]
    assert agent == (ROOT / "collector/configs/agent.yaml").read_text(encoding="utf-8")


def test_otel_gpu_environment_passes_otel_gpu_checks() -> None:
    known = {v.name for v in (*ENV_VARS, *STANDARD_VARS)} | {"OTEL_RESOURCE_ATTRIBUTES"}
    seen = 0
    for where, spec in pod_specs():
        for c in containers(spec):
            if not c["image"].startswith(OTEL_GPU_IMAGE):
                continue
            seen += 1
            env = container_env(c, namespace_of(where))
            unknown = {k for k in env if k.startswith("OTEL_") and k not in known}
            assert not unknown, (where, sorted(unknown))
            if "OTEL_GPU_DEVICES" not in env and "OTEL_GPU_DEVICES" in " ".join(c.get("args", [])):
                env["OTEL_GPU_DEVICES"] = "GPU-0a1b2c3d,GPU-4e5f6a7b"  # the hand-off file
            settings = Settings.from_env(env)  # raises ConfigError on a bad value
            assert settings.interval_s >= 1.0, where
            assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://"), where
            assert "host.name=" in env["OTEL_RESOURCE_ATTRIBUTES"], where  # not the pod name
            assert "placeholder-nodename" in env["OTEL_RESOURCE_ATTRIBUTES"], where
    assert seen == len(list(pod_specs()))


def test_image_tags_match_this_repository() -> None:
    builder = yaml.safe_load((ROOT / "collector/builder-config.yaml").read_text(encoding="utf-8"))
    expected = {
        OTEL_GPU_IMAGE: otel_gpu.__version__,
        COLLECTOR_IMAGE: str(builder["dist"]["version"]),
    }
    for where, spec in pod_specs():
        for c in containers(spec):
            image, _, tag = c["image"].rpartition(":")
            if image in expected:
                assert tag == expected[image], (where, c["image"])


@pytest.mark.e2e
def test_collector_container_environment_validates(tmp_path: Path) -> None:
    from tests.e2e.collector_util import require_collector, run_collector_command

    binary = require_collector()
    config = tmp_path / "agent.yaml"
    config.write_text(config_maps()[("otel-gpu", "otelcol-gpu-agent")]["agent.yaml"])
    checked = 0
    for where, spec in pod_specs():
        for c in containers(spec):
            if not c["image"].startswith(COLLECTOR_IMAGE):
                continue
            mount = next(m for m in c["volumeMounts"] if m["name"] == "otelcol-config")
            assert c["args"] == [f"--config={mount['mountPath']}/agent.yaml"], where
            env = container_env(c, namespace_of(where))
            result = run_collector_command(binary, "validate", f"--config={config}", env=env)
            assert result.returncode == 0, (where, result.stderr)
            checked += 1
    assert checked == 1


# -- systemd -------------------------------------------------------------------------------------

#: Directives the unit may use, by section: systemd.unit(5), systemd.service(5), systemd.exec(5),
#: systemd.kill(5) and systemd.resource-control(5) of systemd 247 (Debian 11) and later, so the
#: unit loads on every supported distribution. A misspelt or misplaced directive is only a
#: warning for systemd (it ignores the line, silently dropping the hardening).
SYSTEMD_DIRECTIVES = {
    "Unit": {
        "Description",
        "Documentation",
        "Wants",
        "After",
        "StartLimitIntervalSec",
        "StartLimitBurst",
    },
    "Service": {
        "Type",
        "ExecStart",
        "EnvironmentFile",
        "Environment",
        "KillSignal",
        "TimeoutStopSec",
        "Restart",
        "RestartSec",
        "RestartPreventExitStatus",
        "DynamicUser",
        "SupplementaryGroups",
        "CapabilityBoundingSet",
        "AmbientCapabilities",
        "NoNewPrivileges",
        "DevicePolicy",
        "DeviceAllow",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateMounts",
        "UMask",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "RestrictNamespaces",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "LockPersonality",
        "RemoveIPC",
        "RestrictAddressFamilies",
        "SystemCallArchitectures",
        "SystemCallFilter",
        "SystemCallErrorNumber",
        "MemoryHigh",
        "MemoryMax",
        "TasksMax",
        "CPUQuota",
        "Nice",
    },
    "Install": {"WantedBy"},
}


def unit_directives(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Section -> (key, value) pairs of a unit file, in order (keys may repeat)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path.name}: {line!r} before any section"
        assert "=" in line, f"{path.name}: not a directive: {line!r}"
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def test_systemd_unit_names_only_known_directives() -> None:
    unit = unit_directives(SYSTEMD / "otel-gpu.service")
    assert set(unit) == set(SYSTEMD_DIRECTIVES)
    for section, pairs in unit.items():
        unknown = {k for k, _ in pairs} - SYSTEMD_DIRECTIVES[section]
        assert not unknown, (section, sorted(unknown))
    service = dict(unit["Service"])  # last value of each key
    assert service["ExecStart"].endswith("otel-gpu run")
    assert service["DynamicUser"] == "yes"
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert service["ProtectHome"] == "yes"
    assert service["PrivateTmp"] == "yes"
    assert service["CapabilityBoundingSet"] == ""
    assert service["DevicePolicy"] == "closed"
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"  # configuration errors do not loop
    assert int(service["TimeoutStopSec"]) >= 6  # otel-gpu exits within 5 s of SIGTERM
    assert service["MemoryMax"]
    assert set(service["RestrictAddressFamilies"].split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    devices = [v for k, v in unit["Service"] if k == "DeviceAllow"]
    assert "char-nvidia* rw" in devices
    assert service["EnvironmentFile"] == "-/etc/otel-gpu/otel-gpu.env"


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if not found:
        missing_part("systemd-analyze is not installed (apt-get install systemd)")
    assert found is not None
    return found


def _installable_unit(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this environment's otel-gpu (verify checks it)."""
    text = (SYSTEMD / "otel-gpu.service").read_text(encoding="utf-8")
    otel_gpu_bin = Path(sys.executable).parent / "otel-gpu"
    assert otel_gpu_bin.exists(), otel_gpu_bin
    unit = tmp_path / "otel-gpu.service"
    unit.write_text(text.replace("/opt/otel-gpu/venv/bin/otel-gpu", str(otel_gpu_bin)))
    return unit


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = _systemd_analyze()
    unit = _installable_unit(tmp_path)
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    # verify exits 0 on unknown keys too (systemd ignores them): any output is a finding.
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", result.stdout
    assert result.stderr.strip() == "", result.stderr


def test_systemd_security_exposure(tmp_path: Path) -> None:
    analyze = _systemd_analyze()
    unit = _installable_unit(tmp_path)
    result = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("systemd-analyze without --offline (systemd < 250)")
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 2.5, result.stdout  # systemd's "OK" band starts below 4


def test_systemd_environment_file_passes_otel_gpu_checks() -> None:
    env: dict[str, str] = {}
    for raw in (SYSTEMD / "otel-gpu.env").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep, line
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), name
        env[name] = value
    known = {v.name for v in (*ENV_VARS, *STANDARD_VARS)} | {"OTEL_RESOURCE_ATTRIBUTES"}
    assert set(env) <= known, sorted(set(env) - known)
    Settings.from_env(env)


# -- the index -----------------------------------------------------------------------------------


def test_examples_index_links_every_example() -> None:
    index = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    links = set(re.findall(r"\]\(([^)#]+)\)", index))
    for target in links:
        if "://" not in target:
            assert (EXAMPLES / target).exists(), target
    for folder in EXAMPLES.iterdir():
        if folder.is_dir():
            assert any(link.strip("/").split("/")[0] == folder.name for link in links), folder
