"""The Grafana dashboard ``examples/grafana/otel-gpu.json`` against a real Prometheus.

A simulated node with faults (ECC error on gpu0, NVLink link down on gpu1, thermal throttling on
gpu2, so the error panels have data) runs ``otel-gpu run --exporter prometheus``; a real
Prometheus server (Debian package ``prometheus``) scrapes it every second. Every panel query of
the dashboard, with Grafana's variables substituted, must parse and return series, and every
template variable must have values.

The dashboard's structure (ids, layout, data source variable) is checked without Prometheus.
Skips when Prometheus is not installed, fails instead with ``OTEL_GPU_REQUIRE_E2E=1``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import missing_part

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "examples" / "grafana" / "otel-gpu.json"
FAULTS = "simulated:faults=ecc@0:0;link-down@1:0;throttle-thermal@2:0"

#: Grafana's built-in and template variables -> what the test puts in their place. The rate
#: window must hold >= 2 scrapes (Prometheus scrapes every second here).
VARIABLES = {
    "__rate_interval": "10s",
    "__interval": "5s",
    "__range": "30s",
    "host": ".*",  # the "All" value of the multi-value variables (their allValue)
    "hw_name": ".*",
}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<match>.+),\s*)?(?P<label>\w+)\)$")

START_TIMEOUT_S = 60.0
SCRAPES_TIMEOUT_S = 30.0
#: Scrapes of one series needed before rate()/increase() over VARIABLES["__rate_interval"] work.
MIN_SCRAPES = 4

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only


# -- the dashboard -----------------------------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    """The dashboard JSON model."""
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return doc


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows and the panels inside collapsed rows included."""
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel."""

    panel: str
    ref_id: str
    expr: str

    @property
    def id(self) -> str:
        return f"{self.panel}/{self.ref_id}"


def queries(dashboard: dict[str, Any]) -> list[Query]:
    """The ``expr`` of every target of every panel."""
    return [
        Query(panel["title"], target.get("refId", "?"), target["expr"])
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
        if "expr" in target
    ]


def substitute(expr: str) -> str:
    """``expr`` with Grafana's variables replaced as :data:`VARIABLES` says."""

    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name not in VARIABLES:
            raise AssertionError(f"unknown variable ${name} in {expr!r}")
        return VARIABLES[name]

    return _VARIABLE.sub(value, expr)


DASHBOARD_QUERIES = queries(load_dashboard())


# -- structure (no Prometheus needed) ----------------------------------------------------------


def test_dashboard_model() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"]
    assert dashboard["id"] is None  # importable into any Grafana
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("host", "hw_name"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        assert variables[name]["includeAll"] is True
        assert variables[name]["allValue"] == ".*"

    panels = all_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles)), "panel titles are unique"
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert rows == [
        "Fleet overview",
        "Per node",
        "Per device",
        "Interconnect (NVLink, xGMI)",
        "Errors and health",
    ]
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        area = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] in ("row", "text"):
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_query_follows_the_variables() -> None:
    assert len(DASHBOARD_QUERIES) >= 30
    for query in DASHBOARD_QUERIES:
        assert 'host_name=~"$host"' in query.expr, query.id
        assert 'hw_name=~"$hw_name"' in query.expr, query.id
        assert "$" not in substitute(query.expr), query.id


# -- a real Prometheus scraping otel-gpu -------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(errors="replace")
    except OSError as err:
        return 0, str(err)


def _wait(what: str, check: Callable[[], Any], procs: list[subprocess.Popen[bytes]]) -> Any:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        for proc in procs:
            if proc.poll() is not None:
                pytest.fail(f"{what}: {proc.args!r} exited with {proc.returncode}")
        time.sleep(0.2)
    pytest.fail(f"timed out after {START_TIMEOUT_S:.0f} s waiting for {what}")


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


@dataclass
class Stack:
    """otel-gpu and the Prometheus server scraping it."""

    prometheus: str  # base URL
    agent: subprocess.Popen[bytes]
    agent_log: Path

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET ``/api/v1/<path>``; the decoded JSON (``status`` "success" or "error")."""
        status, body = _get(f"{self.prometheus}/api/v1/{path}?{urllib.parse.urlencode(params)}")
        assert status in (200, 400, 422), (status, body)
        doc: dict[str, Any] = json.loads(body)
        return doc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = shutil.which(os.environ.get("OTEL_GPU_PROMETHEUS_BIN") or "prometheus")
    if not binary:
        missing_part(
            "the Prometheus server is not installed (apt-get install prometheus, "
            "or set OTEL_GPU_PROMETHEUS_BIN)"
        )
        raise AssertionError("unreachable")
    workdir = tmp_path_factory.mktemp("grafana")
    target_port, web_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTEL_EXPORTER_PROMETHEUS_PORT=str(target_port),
    )
    agent_log = workdir / "agent.log"
    with agent_log.open("wb") as log:
        agent = subprocess.Popen(
            [
                *(sys.executable, "-m", "otel_gpu", "run", "--backend", FAULTS),
                *("--exporter", "prometheus", "--interval", "1"),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    procs = [agent]
    try:
        _wait(
            "otel-gpu's /metrics",
            lambda: "hw_power_watts{" in _get(f"http://127.0.0.1:{target_port}/metrics")[1],
            procs,
        )
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: otel-gpu\n"
            "    static_configs:\n"
            f"      - targets: ['127.0.0.1:{target_port}']\n",
            encoding="utf-8",
        )
        with (workdir / "prometheus.log").open("wb") as log:
            prometheus = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{web_port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        procs.append(prometheus)
        base = f"http://127.0.0.1:{web_port}"
        _wait("Prometheus readiness", lambda: _get(f"{base}/-/ready")[0] == 200, procs)
        result = Stack(base, agent, agent_log)

        def scraped() -> bool:
            doc = result.api("query", query='count_over_time(hw_power_watts{hw_name="gpu0"}[10s])')
            rows = doc["data"]["result"]
            return bool(rows) and float(rows[0]["value"][1]) >= MIN_SCRAPES

        _wait(f"{MIN_SCRAPES} scrapes in Prometheus", scraped, procs)
        yield result
    finally:
        codes = [_stop(p) for p in reversed(procs)]
    assert codes[-1] == 0, agent_log.read_text(errors="replace")  # otel-gpu: SIGTERM -> exit 0


@pytest.mark.e2e
@pytest.mark.parametrize("query", DASHBOARD_QUERIES, ids=lambda q: q.id)
def test_panel_query_returns_series(stack: Stack, query: Query) -> None:
    expr = substitute(query.expr)
    doc = stack.api("query", query=expr)
    assert doc["status"] == "success", (expr, doc.get("error"))
    assert doc["data"]["resultType"] == "vector", expr
    assert doc["data"]["result"], f"no series for {expr}"


@pytest.mark.e2e
def test_template_variables_have_values(stack: Stack) -> None:
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    values: dict[str, list[str]] = {}
    for name in ("host", "hw_name"):
        match = _LABEL_VALUES.match(variables[name]["query"]["query"])
        assert match, variables[name]["query"]
        params = {"match[]": match["match"]} if match["match"] else {}
        doc = stack.api(f"label/{match['label']}/values", **params)
        assert doc["status"] == "success", doc
        values[name] = doc["data"]
    assert values["host"] == [socket.gethostname()]
    assert sorted(values["hw_name"]) == [f"gpu{i}" for i in range(8)]


@pytest.mark.e2e
def test_error_panels_show_the_faults(stack: Stack) -> None:
    """The panels an on-call engineer looks at name the faulty devices."""
    by_title = {q.panel: substitute(q.expr) for q in DASHBOARD_QUERIES}

    def rows(title: str) -> list[dict[str, Any]]:
        doc = stack.api("query", query=by_title[title])
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    not_ok = {(r["metric"]["hw_name"], r["metric"]["hw_state"]) for r in rows("Devices not OK")}
    assert not_ok == {("gpu0", "failed"), ("gpu1", "degraded"), ("gpu2", "degraded")}
    assert float(rows("Unhealthy devices")[0]["value"][1]) == 3
    ecc = {
        (r["metric"]["hw_name"], r["metric"]["error_type"])
        for r in rows("ECC errors since driver load")
    }
    assert ecc == {("gpu0", "uncorrected")}
    assert {r["metric"]["hw_name"] for r in rows("Links down")} == {"gpu1"}
    throttled = {
        (r["metric"]["hw_name"], r["metric"]["accel_throttle_reason"]) for r in rows("Throttling")
    }
    assert ("gpu2", "thermal") in throttled
    assert all(r["metric"].get("host_name") == socket.gethostname() for r in rows("Links down"))
