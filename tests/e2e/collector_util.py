"""Helpers for end-to-end tests against the real otel-gpu Collector distribution.

The binary is built by ``scripts/build-collector`` into ``collector/_build/otelcol-gpu``
(or named by ``OTEL_GPU_COLLECTOR_BIN``). When it is missing, :func:`require_collector` skips
the test locally and fails it when ``OTEL_GPU_REQUIRE_E2E=1`` (as ``.ci/run`` sets).

Typical use (otel-gpu -> Collector -> JSON-lines files)::

    from tests.e2e.collector_util import file_collector

    def test_something(tmp_path):
        with file_collector(tmp_path) as col:
            run_otel_gpu(OTEL_EXPORTER_OTLP_ENDPOINT=col.grpc_url, ...)
            metrics = col.wait_for_metrics(lambda reqs: any_name_in(reqs, "hw.power"))

Everything listens on 127.0.0.1 free ports; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
COLLECTOR_DIR = REPO_ROOT / "collector"
CONFIG_DIR = COLLECTOR_DIR / "configs"
TEST_FILE_CONFIG = CONFIG_DIR / "test-file.yaml"
DEFAULT_BINARY = COLLECTOR_DIR / "_build" / "otelcol-gpu"
BINARY_ENV = "OTEL_GPU_COLLECTOR_BIN"
REQUIRE_ENV = "OTEL_GPU_REQUIRE_E2E"

#: Bounded waits (seconds).
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 60.0
DATA_TIMEOUT_S = 15.0

_PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "no_proxy"}
#: urllib without any proxy from the environment: everything here is loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# -- the binary -------------------------------------------------------------------------------


def find_collector() -> Path | None:
    """``$OTEL_GPU_COLLECTOR_BIN`` if set, else ``collector/_build/otelcol-gpu``; None if absent."""
    named = os.environ.get(BINARY_ENV)
    path = Path(named) if named else DEFAULT_BINARY
    if path.is_file() and os.access(path, os.X_OK):
        return path
    return None


def require_collector() -> Path:
    """The Collector binary, or skip (locally) / fail (``OTEL_GPU_REQUIRE_E2E=1``) the test."""
    path = find_collector()
    if path is not None:
        return path
    where = os.environ.get(BINARY_ENV) or str(DEFAULT_BINARY)
    message = (
        f"otel-gpu Collector binary not found at {where}: run scripts/build-collector "
        f"(or set {BINARY_ENV})"
    )
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_ENV}=1)")
    pytest.skip(message)


def run_collector_command(
    binary: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``otelcol-gpu <args>`` (e.g. ``validate --config=...``, ``components``), bounded."""
    return subprocess.run(
        [str(binary), *args],
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
        cwd=REPO_ROOT,
    )


def parse_components(text: str) -> dict[str, set[str]]:
    """Kind (``receivers``, ``processors``, ``exporters``, ``extensions``, ``connectors``) ->
    component names, from the YAML that ``otelcol-gpu components`` prints.

    Kept to the fixed shape of that output so tests need no YAML library."""
    out: dict[str, set[str]] = {}
    section: str | None = None
    for line in text.splitlines():
        top = re.match(r"^([a-z_]+):", line)
        if top:
            section = top.group(1)
            out.setdefault(section, set())
            continue
        item = re.match(r"^\s*- name: (\S+)\s*$", line)
        if item and section is not None:
            out[section].add(item.group(1))
    return out


# -- ports and environment --------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS may reuse it later: start soon)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_endpoint() -> str:
    """``127.0.0.1:<free port>``."""
    return f"127.0.0.1:{free_port()}"


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent environment without proxy settings (loopback must not go via a proxy), plus
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARS}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    if extra:
        env.update(extra)
    return env


def env_vars_of(config: Path) -> set[str]:
    """Names of the ``${env:NAME}`` / ``${env:NAME:-default}`` variables a config reads
    (outside comments)."""
    code = "\n".join(
        line for line in config.read_text().splitlines() if not line.lstrip().startswith("#")
    )
    return set(re.findall(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)", code))


# -- HTTP --------------------------------------------------------------------------------------


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET ``url`` without proxies: (status, body); status 0 when nothing answered."""
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def post_otlp_json(http_endpoint: str, signal_name: str, body: Mapping[str, Any]) -> int:
    """POST an OTLP/JSON request to ``http://<http_endpoint>/v1/<signal_name>``: HTTP status."""
    req = urllib.request.Request(
        f"http://{http_endpoint}/v1/{signal_name}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with _OPENER.open(req, timeout=5.0) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


# -- a running Collector -----------------------------------------------------------------------


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` passes
    (returns the last falsy value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of ``path`` (a line still being written is ignored)."""
    if not path.exists():
        return []
    out: list[dict[str, Any]] = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line:
            continue
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


@dataclass
class Collector:
    """A Collector process started by :func:`start_collector`."""

    binary: Path
    config: Path
    env: dict[str, str]
    health_endpoint: str
    log_path: Path
    proc: subprocess.Popen[bytes]
    #: For configs with an OTLP receiver set from OTLP_GRPC_ENDPOINT / OTLP_HTTP_ENDPOINT.
    grpc_endpoint: str | None = None
    http_endpoint: str | None = None
    #: For test-file.yaml: where metrics.json / logs.json / traces.json appear.
    output_dir: Path | None = None
    returncode: int | None = field(default=None, init=False)

    # endpoints in the forms the OTel SDK env vars expect
    @property
    def grpc_url(self) -> str:
        """``http://127.0.0.1:<port>`` for OTEL_EXPORTER_OTLP_ENDPOINT with protocol grpc."""
        assert self.grpc_endpoint, "config has no OTLP/gRPC receiver"
        return f"http://{self.grpc_endpoint}"

    @property
    def http_url(self) -> str:
        """``http://127.0.0.1:<port>`` for OTEL_EXPORTER_OTLP_ENDPOINT with http/protobuf."""
        assert self.http_endpoint, "config has no OTLP/HTTP receiver"
        return f"http://{self.http_endpoint}"

    def log(self) -> str:
        """Everything the Collector wrote to stdout/stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def healthy(self) -> bool:
        """health_check answers 200."""
        status, _ = http_get(f"http://{self.health_endpoint}/", timeout=1.0)
        return status == 200

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> None:
        """Block until health_check says ready; raise with the log if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"collector exited with {self.proc.returncode} before it was healthy:\n"
                    f"{self.log()}"
                )
            if self.healthy():
                return
            time.sleep(0.05)
        raise TimeoutError(f"collector not healthy after {timeout:.0f} s:\n{self.log()}")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait (bounded), SIGKILL if needed; the exit code (negative: signal)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        self.returncode = self.proc.returncode
        return self.proc.returncode

    # test-file.yaml outputs
    def output(self, name: str) -> list[dict[str, Any]]:
        """The OTLP/JSON requests written so far to ``<OUTPUT_DIR>/<name>`` (e.g. metrics.json)."""
        assert self.output_dir is not None, "not a test-file.yaml collector"
        return read_json_lines(self.output_dir / name)

    def metrics(self) -> list[dict[str, Any]]:
        """``{"resourceMetrics": [...]}`` requests received so far."""
        return self.output("metrics.json")

    def logs(self) -> list[dict[str, Any]]:
        """``{"resourceLogs": [...]}`` requests received so far."""
        return self.output("logs.json")

    def traces(self) -> list[dict[str, Any]]:
        """``{"resourceSpans": [...]}`` requests received so far."""
        return self.output("traces.json")

    def wait_for_metrics(
        self,
        predicate: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = DATA_TIMEOUT_S,
    ) -> list[dict[str, Any]]:
        """Poll metrics.json until ``predicate(requests)``; return the requests (maybe short)."""
        got: list[dict[str, Any]] = []

        def check() -> bool:
            nonlocal got
            got = self.metrics()
            return predicate(got)

        wait_for(check, timeout)
        return got

    def wait_for_logs(
        self,
        predicate: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = DATA_TIMEOUT_S,
    ) -> list[dict[str, Any]]:
        """Poll logs.json until ``predicate(requests)``; return the requests (maybe short)."""
        got: list[dict[str, Any]] = []

        def check() -> bool:
            nonlocal got
            got = self.logs()
            return predicate(got)

        wait_for(check, timeout)
        return got


def start_collector(
    config: Path,
    env: Mapping[str, str],
    *,
    health_endpoint: str,
    log_path: Path,
    binary: Path | None = None,
    wait: bool = True,
    timeout: float = START_TIMEOUT_S,
) -> Collector:
    """Start ``otelcol-gpu --config=<config>`` with ``env`` on top of a proxy-free environment
    (``HEALTH_ENDPOINT`` is set to ``health_endpoint``) and, by default, wait until healthy.

    The caller owns the process: call :meth:`Collector.stop` (or use :func:`running_collector`).
    """
    binary = binary or require_collector()
    full_env = clean_env({**env, "HEALTH_ENDPOINT": health_endpoint})
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [str(binary), f"--config={config}"],
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=log_path.parent,
        )
    col = Collector(
        binary=binary,
        config=config,
        env=dict(env),
        health_endpoint=health_endpoint,
        log_path=log_path,
        proc=proc,
        grpc_endpoint=env.get("OTLP_GRPC_ENDPOINT"),
        http_endpoint=env.get("OTLP_HTTP_ENDPOINT"),
        output_dir=Path(env["OUTPUT_DIR"]) if "OUTPUT_DIR" in env else None,
    )
    if wait:
        try:
            col.wait_healthy(timeout)
        except BaseException:
            col.stop()
            raise
    return col


@contextlib.contextmanager
def running_collector(
    config: Path,
    env: Mapping[str, str],
    workdir: Path,
    *,
    name: str = "collector",
    attempts: int = 3,
) -> Iterator[Collector]:
    """A healthy Collector for the ``with`` block, stopped after it.

    ``env`` values may contain the placeholder ``{free}``, replaced by a fresh
    ``127.0.0.1:<port>`` on each attempt (a port taken between probing and binding makes the
    Collector exit; it is then started again, up to ``attempts`` times).
    """
    last: BaseException | None = None
    for attempt in range(attempts):
        concrete = {k: (free_endpoint() if v == "{free}" else v) for k, v in env.items()}
        try:
            col = start_collector(
                config,
                concrete,
                health_endpoint=free_endpoint(),
                log_path=workdir / f"{name}-{attempt}.log",
            )
        except RuntimeError as e:  # exited early: most likely a port race
            last = e
            continue
        try:
            yield col
        finally:
            col.stop()
        return
    raise RuntimeError(f"could not start {config.name} in {attempts} attempts") from last


@contextlib.contextmanager
def file_collector(
    workdir: Path, *, name: str = "collector", extra_env: Mapping[str, str] | None = None
) -> Iterator[Collector]:
    """A Collector running ``collector/configs/test-file.yaml`` on free loopback ports, writing
    what it receives to ``<workdir>/<name>-out/{metrics,logs,traces}.json`` as OTLP/JSON lines.

    Endpoints: ``col.grpc_endpoint`` / ``col.http_endpoint`` (``host:port``) and
    ``col.grpc_url`` / ``col.http_url`` (``http://host:port`` for OTEL_EXPORTER_OTLP_ENDPOINT).
    """
    env = {
        "OTLP_GRPC_ENDPOINT": "{free}",
        "OTLP_HTTP_ENDPOINT": "{free}",
        "OUTPUT_DIR": str(workdir / f"{name}-out"),
        **(extra_env or {}),
    }
    with running_collector(TEST_FILE_CONFIG, env, workdir, name=name) as col:
        yield col


# -- reading OTLP/JSON ------------------------------------------------------------------------


def attributes(kvs: list[dict[str, Any]] | None) -> dict[str, Any]:
    """OTLP/JSON ``[{"key": k, "value": {"stringValue": v}}]`` -> ``{k: v}`` (scalars, arrays)."""

    def value(v: dict[str, Any]) -> Any:
        if "arrayValue" in v:
            return [value(x) for x in v["arrayValue"].get("values", [])]
        for kind in ("stringValue", "boolValue", "doubleValue"):
            if kind in v:
                return v[kind]
        if "intValue" in v:
            return int(v["intValue"])  # JSON encodes int64 as a string
        return None

    return {kv["key"]: value(kv.get("value", {})) for kv in kvs or []}


def metric_names(requests: list[dict[str, Any]]) -> set[str]:
    """Every metric name in metrics.json requests."""
    return {
        m["name"]
        for req in requests
        for rm in req.get("resourceMetrics", [])
        for sm in rm.get("scopeMetrics", [])
        for m in sm.get("metrics", [])
    }


def metric_resources(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The resource attributes of every ResourceMetrics in metrics.json requests."""
    return [
        attributes(rm.get("resource", {}).get("attributes"))
        for req in requests
        for rm in req.get("resourceMetrics", [])
    ]


def log_records(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every log record in logs.json requests (OTLP/JSON dicts, ``eventName``, ``body``...)."""
    return [
        rec
        for req in requests
        for rl in req.get("resourceLogs", [])
        for sl in rl.get("scopeLogs", [])
        for rec in sl.get("logRecords", [])
    ]
