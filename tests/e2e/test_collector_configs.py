"""The Collector side (collector/): the otel-gpu Collector distribution and its ready configs.

- every ``collector/configs/*.yaml`` passes ``otelcol-gpu validate``, with its environment
  variables unset and set to dummy values, and documents each variable it reads;
- the distribution has the components the configs and the docs rely on;
- ``test-file.yaml`` (the sink of the end-to-end tests) receives OTLP/HTTP and writes JSON lines;
- ``agent.yaml`` forwards to a gateway and enriches the resource without overwriting it.

Needs the binary from ``scripts/build-collector`` (skips without it, fails with
``OTEL_GPU_REQUIRE_E2E=1``). Loopback only, every wait bounded.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.collector_util import (
    CONFIG_DIR,
    REPO_ROOT,
    TEST_FILE_CONFIG,
    attributes,
    env_vars_of,
    file_collector,
    free_port,
    log_records,
    metric_names,
    metric_resources,
    parse_components,
    post_otlp_json,
    require_collector,
    run_collector_command,
    running_collector,
)

pytestmark = pytest.mark.e2e

CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))

#: A plausible value for every variable the configs read ("dummy": nothing is contacted).
DUMMY_ENV = {
    "OTLP_GRPC_ENDPOINT": "127.0.0.1:14317",
    "OTLP_HTTP_ENDPOINT": "127.0.0.1:14318",
    "HEALTH_ENDPOINT": "127.0.0.1:23133",
    "OUTPUT_DIR": "/tmp/otel-gpu-validate",
    "OTELCOL_LOG_LEVEL": "debug",
    "OTELCOL_TELEMETRY_HOST": "127.0.0.1",
    "OTELCOL_TELEMETRY_PORT": "18888",
    "MEMORY_LIMIT_MIB": "256",
    "MEMORY_SPIKE_LIMIT_MIB": "64",
    "MEMORY_LIMIT_PERCENTAGE": "75",
    "MEMORY_SPIKE_LIMIT_PERCENTAGE": "15",
    "GATEWAY_ENDPOINT": "gateway.invalid:4317",
    "GATEWAY_INSECURE": "true",
    "GATEWAY_CA_FILE": "/etc/ssl/certs/ca-certificates.crt",
    "GATEWAY_HEADERS": '{x-api-key: "dummy"}',
    "HOST_NAME": "node-0001",
    "K8S_NODE_NAME": "node-0001",
    "K8S_CLUSTER_NAME": "gpu-cluster",
    "DEPLOYMENT_ENVIRONMENT": "test",
    "GATEWAY_METRICS_EXPORTERS": "[otlp_grpc/backend, otlp_http/backend, prometheus_remote_write]",
    "GATEWAY_LOGS_EXPORTERS": "[otlp_grpc/backend, debug]",
    "GATEWAY_TRACES_EXPORTERS": "[otlp_http/backend]",
    "BACKEND_OTLP_GRPC_ENDPOINT": "backend.invalid:4317",
    "BACKEND_OTLP_GRPC_INSECURE": "true",
    "BACKEND_OTLP_HTTP_ENDPOINT": "https://backend.invalid:4318",
    "BACKEND_OTLP_HEADERS": '{authorization: "Bearer dummy"}',
    "DEBUG_VERBOSITY": "detailed",
    "DD_AGENT_HOST": "dd-agent.invalid",
    "DD_OTLP_GRPC_PORT": "4317",
    "DD_OTLP_INSECURE": "true",
    "HONEYCOMB_API_KEY": "dummy-key",
    "HONEYCOMB_API_ENDPOINT": "api.honeycomb.invalid:443",
    "HONEYCOMB_METRICS_DATASET": "gpu-metrics",
    "PROMETHEUS_EXPORTERS": "[prometheus, prometheus_remote_write]",
    "PROMETHEUS_EXPORTER_ENDPOINT": "127.0.0.1:18889",
    "PROMETHEUS_REMOTE_WRITE_URL": "http://prometheus.invalid:9090/api/v1/write",
    "PROMETHEUS_REMOTE_WRITE_HEADERS": "{X-Scope-OrgID: gpu}",
    "SCRAPE_TARGET": "127.0.0.1:9464",
    "SCRAPE_INTERVAL": "15s",
    "SCRAPE_JOB": "otel-gpu",
}

#: What the distribution must contain (collector/builder-config.yaml).
EXPECTED_COMPONENTS = {
    "receivers": {"otlp", "prometheus"},
    "processors": {"batch", "memory_limiter", "resource", "transform"},
    "exporters": {
        "debug",
        "otlp_grpc",  # deprecated alias "otlp"
        "otlp_http",  # deprecated alias "otlphttp"
        "file",
        "prometheus",
        "prometheus_remote_write",  # deprecated alias "prometheusremotewrite"
    },
    "extensions": {"health_check"},
}


@pytest.fixture(scope="module")
def collector_bin() -> Path:
    return require_collector()


def validate(binary: Path, config: Path, env: dict[str, str] | None, drop: set[str]) -> str:
    """Run ``validate`` with ``drop`` removed from the environment and ``env`` added; assert 0."""
    base = {k: v for k, v in os.environ.items() if k not in drop}
    proc = subprocess.run(
        [str(binary), "validate", f"--config={config}"],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, f"{config.name}: exit {proc.returncode}\n{proc.stderr}"
    return proc.stderr


def test_configs_present() -> None:
    names = {c.name for c in CONFIGS}
    assert names >= {
        "agent.yaml",
        "gateway.yaml",
        "datadog.yaml",
        "honeycomb.yaml",
        "prometheus.yaml",
        "scrape.yaml",
        "test-file.yaml",
    }


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_validate_with_env_unset(collector_bin: Path, config: Path) -> None:
    validate(collector_bin, config, None, drop=env_vars_of(config))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_validate_with_dummy_env(collector_bin: Path, config: Path) -> None:
    used = env_vars_of(config)
    missing = used - DUMMY_ENV.keys()
    assert not missing, f"give {sorted(missing)} a dummy value in DUMMY_ENV"
    validate(collector_bin, config, {k: DUMMY_ENV[k] for k in used}, drop=used)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_config_documents_its_env_vars(config: Path) -> None:
    """Each variable a config reads is named in its comments (the header says what it does)."""
    comments = "\n".join(
        line for line in config.read_text().splitlines() if line.lstrip().startswith("#")
    )
    undocumented = {v for v in env_vars_of(config) if not re.search(rf"\b{v}\b", comments)}
    assert not undocumented, f"{config.name}: document {sorted(undocumented)} in its comments"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_config_has_no_literal_secret(config: Path) -> None:
    """Credentials only ever come from the environment."""
    secretish = re.compile(
        r"^\s*[\w.-]*(key|token|password|secret|team|authorization)\s*:\s*(.+)$", re.IGNORECASE
    )
    for line in config.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = secretish.match(line)
        if m and m.group(2).strip():
            assert m.group(2).strip().startswith("${env:"), f"{config.name}: {line.strip()}"


def test_components(collector_bin: Path) -> None:
    proc = run_collector_command(collector_bin, "components")
    assert proc.returncode == 0, proc.stderr
    have = parse_components(proc.stdout)
    for kind, names in EXPECTED_COMPONENTS.items():
        assert names <= have.get(kind, set()), f"{kind}: missing {sorted(names - have[kind])}"
    # one release throughout: every component module at the same contrib/core version
    versions = set(re.findall(r"module: \S+ (v\d+\.\d+\.\d+)", proc.stdout))
    minors = {v.rsplit(".", 1)[0] for v in versions if v.startswith("v0.")}
    assert len(minors) == 1, versions


# -- running: test-file.yaml, the sink of the end-to-end tests --------------------------------


def gauge_request(name: str, value: float, resource: dict[str, str]) -> dict[str, object]:
    """One OTLP/JSON ExportMetricsServiceRequest with a single gauge point."""
    now = str(time.time_ns())
    return {
        "resourceMetrics": [
            {
                "resource": {
                    "attributes": [
                        {"key": k, "value": {"stringValue": v}} for k, v in resource.items()
                    ]
                },
                "scopeMetrics": [
                    {
                        "scope": {"name": "collector-e2e"},
                        "metrics": [
                            {
                                "name": name,
                                "unit": "1",
                                "gauge": {
                                    "dataPoints": [
                                        {
                                            "asDouble": value,
                                            "timeUnixNano": now,
                                            "attributes": [
                                                {"key": "hw.id", "value": {"stringValue": "GPU-0"}}
                                            ],
                                        }
                                    ]
                                },
                            }
                        ],
                    }
                ],
            }
        ]
    }


def log_request(event_name: str, resource: dict[str, str]) -> dict[str, object]:
    """One OTLP/JSON ExportLogsServiceRequest with a single event record."""
    return {
        "resourceLogs": [
            {
                "resource": {
                    "attributes": [
                        {"key": k, "value": {"stringValue": v}} for k, v in resource.items()
                    ]
                },
                "scopeLogs": [
                    {
                        "scope": {"name": "collector-e2e"},
                        "logRecords": [
                            {
                                "timeUnixNano": str(time.time_ns()),
                                "severityNumber": 17,
                                "eventName": event_name,
                                "body": {"stringValue": "test event"},
                            }
                        ],
                    }
                ],
            }
        ]
    }


def test_file_collector_runs_and_writes_json_lines(collector_bin: Path, tmp_path: Path) -> None:
    with file_collector(tmp_path) as col:
        assert col.healthy()
        assert col.config == TEST_FILE_CONFIG
        resource = {"service.name": "otel-gpu", "host.name": "node-a"}
        assert (
            post_otlp_json(
                col.http_endpoint or "",
                "metrics",
                gauge_request("hw.gpu.utilization", 0.25, resource),
            )
            == 200
        )
        assert (
            post_otlp_json(
                col.http_endpoint or "", "logs", log_request("accel.device.lost", resource)
            )
            == 200
        )
        metrics = col.wait_for_metrics(lambda reqs: "hw.gpu.utilization" in metric_names(reqs))
        logs = col.wait_for_logs(lambda reqs: bool(log_records(reqs)))
    assert col.returncode == 0, col.log()
    assert "hw.gpu.utilization" in metric_names(metrics), col.log()
    assert metric_resources(metrics)[0]["host.name"] == "node-a"
    records = log_records(logs)
    assert records, col.log()
    assert records[0]["eventName"] == "accel.device.lost"


def test_agent_forwards_and_enriches(collector_bin: Path, tmp_path: Path) -> None:
    """agent.yaml -> (OTLP/gRPC) -> test-file.yaml: data arrives, the resource gains the
    env-provided attributes, and what the sender set (host.name) is not overwritten."""
    with file_collector(tmp_path, name="gateway") as gateway:
        agent_env = {
            "OTLP_GRPC_ENDPOINT": "{free}",
            "OTLP_HTTP_ENDPOINT": "{free}",
            "OTELCOL_TELEMETRY_HOST": "127.0.0.1",
            "OTELCOL_TELEMETRY_PORT": str(free_port()),  # a port alone, not host:port
            "GATEWAY_ENDPOINT": gateway.grpc_endpoint or "",
            "GATEWAY_INSECURE": "true",
            "HOST_NAME": "from-agent-env",
            "K8S_CLUSTER_NAME": "gpu-cluster",
            # empty: must not be set
            "DEPLOYMENT_ENVIRONMENT": "",
            "K8S_NODE_NAME": "",
        }
        with running_collector(
            CONFIG_DIR / "agent.yaml", agent_env, tmp_path, name="agent"
        ) as agent:
            sent = {"service.name": "otel-gpu", "host.name": "gpu-node-7"}
            bare = {"service.name": "otel-gpu"}
            for res in (sent, bare):
                status = post_otlp_json(
                    agent.http_endpoint or "", "metrics", gauge_request("hw.power", 300.0, res)
                )
                assert status == 200, agent.log()
            metrics = gateway.wait_for_metrics(lambda reqs: len(metric_resources(reqs)) >= 2)
            agent_log = agent.log()
    resources = metric_resources(metrics)
    assert len(resources) >= 2, agent_log + gateway.log()
    hosts = {r.get("host.name") for r in resources}
    assert hosts == {"gpu-node-7", "from-agent-env"}, resources
    for r in resources:
        assert r["k8s.cluster.name"] == "gpu-cluster"
        assert "deployment.environment.name" not in r
        assert "k8s.node.name" not in r


def test_attributes_helper() -> None:
    kvs = [
        {"key": "s", "value": {"stringValue": "x"}},
        {"key": "i", "value": {"intValue": "7"}},
        {"key": "a", "value": {"arrayValue": {"values": [{"stringValue": "0"}]}}},
    ]
    assert attributes(kvs) == {"s": "x", "i": 7, "a": ["0"]}


def test_build_script_help() -> None:
    script = REPO_ROOT / "scripts" / "build-collector"
    assert script.stat().st_mode & 0o111, "scripts/build-collector must be executable"
    proc = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "--force" in proc.stdout
