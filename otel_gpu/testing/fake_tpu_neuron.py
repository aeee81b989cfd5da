"""Fakes for the ``tpu`` and ``neuron`` backends: the real backends run against them.

TPU: :class:`FakeTpuRuntime` is libtpu's runtime metric service (the real protocol, gRPC with
local credentials) on ``127.0.0.1:<free port>``, answering from a table; the chips come from the
checked-in sysfs tree :data:`TPU_V5E_8` (a v5litepod-8 host). Neuron: :class:`FakeNeuronTools`
writes executable ``neuron-monitor`` and ``neuron-ls`` scripts that replay the recorded output of
:data:`TRN1_32XLARGE` (16 Trainium devices x 2 NeuronCores), optionally with a malformed line
and crashes; ``dev/`` and ``sys/`` come from the same fixture.

Each fake gives the ``env`` that points the ``otel-gpu`` command at it::

    with FakeTpuRuntime.from_fixture() as tpu:
        subprocess.run(["otel-gpu", "inventory", "--json", "--backend", "tpu"],
                       env={**os.environ, **tpu_env(tpu)})

    tools = FakeNeuronTools(tmp_path)
    subprocess.run(["otel-gpu", "run", "--once", "--backend", "neuron"],
                   env={**os.environ, **tools.env})
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "FIXTURES",
    "TPU_V5E_8",
    "TRN1_32XLARGE",
    "FakeNeuronTools",
    "FakeTpuRuntime",
    "install_neuron",
    "install_tpu",
    "neuron_scenarios",
    "start_fake_tpu",
    "tpu_env",
    "tpu_scenarios",
]

FIXTURES = Path(__file__).parent / "fixtures"
TPU_V5E_8 = FIXTURES / "tpu-v5e-8"
"""sysfs/dev tree of a TPU v5e host with 8 chips, and ``runtime-metrics.json``."""
TRN1_32XLARGE = FIXTURES / "neuron-trn1-32xlarge"
"""neuron-ls JSON, neuron-monitor reports and dev/sys tree of a trn1.32xlarge."""

UNREACHABLE_ADDR = "127.0.0.1:1"
"""An address where no runtime metric service answers (connection refused)."""

Values = Mapping[str, Sequence[float | int]]


class FakeTpuRuntime:
    """libtpu's ``RuntimeMetricService`` answering ``values[metric][device id]``.

    Metrics missing from ``values`` are answered ``NOT_FOUND`` (unknown to this libtpu).
    :meth:`set` changes the table while it runs; :meth:`stop` ends it like a finished
    workload, and :meth:`start` brings it back on the same port.
    """

    def __init__(self, values: Values, port: int = 0) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, list[float | int]] = {k: list(v) for k, v in values.items()}
        self.port = port
        self.requests: list[str] = []
        self._server: Any = None

    @classmethod
    def from_fixture(cls, root: Path = TPU_V5E_8) -> FakeTpuRuntime:
        """A service answering the fixture's ``runtime-metrics.json``."""
        doc = json.loads((root / "runtime-metrics.json").read_text())
        return cls({k: v for k, v in doc.items() if not k.startswith("_")})

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>`` (after :meth:`start`)."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeTpuRuntime:
        """Serve (on a free port the first time, on the same port afterwards)."""
        from otel_gpu.backends.tpu._grpc import serve_runtime_metrics

        if self._server is None:
            self._server, self.port = serve_runtime_metrics(self._lookup, port=self.port)
        return self

    def stop(self) -> None:
        """Stop serving at once (in-flight calls are cancelled)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(None).wait(5.0)

    def set(self, metric: str, values: Sequence[float | int] | None) -> None:
        """Change (or, with None, remove) one metric's values by device id."""
        with self._lock:
            if values is None:
                self._values.pop(metric, None)
            else:
                self._values[metric] = list(values)

    def _lookup(self, metric: str) -> dict[int, float | int] | None:
        with self._lock:
            self.requests.append(metric)
            values = self._values.get(metric)
            return None if values is None else dict(enumerate(values))

    def close(self) -> None:
        """Same as :meth:`stop`."""
        self.stop()

    def __enter__(self) -> FakeTpuRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tpu_env(runtime: FakeTpuRuntime | None, root: Path = TPU_V5E_8) -> dict[str, str]:
    """The environment that points the ``tpu`` backend at ``root`` and ``runtime`` (None: at an
    address where nothing answers, as on a host where no workload runs)."""
    return {
        "OTEL_GPU_HOST_ROOT": str(root),
        "OTEL_GPU_TPU_METRICS_ADDR": runtime.address if runtime else UNREACHABLE_ADDR,
        "OTEL_GPU_BACKEND": "tpu",
    }


def start_fake_tpu(root: Path = TPU_V5E_8) -> tuple[FakeTpuRuntime, str, dict[str, str]]:
    """Start the fixture's runtime service: ``(fake, backend selector, env)``. Stop it after."""
    runtime = FakeTpuRuntime.from_fixture(root).start()
    return runtime, "tpu", tpu_env(runtime, root)


_MONITOR = '''#!{python}
"""Fake neuron-monitor (otel-gpu tests): replays recorded reports, one JSON per line."""
import json, os, re, sys, time

REPORTS = {reports!r}
STATE = {state!r}
CRASH_AFTER = {crash_after!r}  # run n exits with code 1 after CRASH_AFTER[n] reports
MALFORMED_AFTER = {malformed_after!r}  # first run: a broken line after this many reports
LIFETIME_S = {lifetime_s!r}


def save(state):
    with open(STATE, "w") as out:
        json.dump(state, out)


def period_of(args):
    if "-c" not in args and "--config-file" not in args:
        return 5.0
    flag = "-c" if "-c" in args else "--config-file"
    with open(args[args.index(flag) + 1]) as conf:
        text = str(json.load(conf).get("period", "5s"))
    m = re.fullmatch(r"([0-9.]+)(ms|s)", text)
    if not m:
        raise ValueError("bad period " + text)
    return float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)


def main():
    try:
        period = period_of(sys.argv[1:])
    except Exception as err:
        print("neuron-monitor: invalid configuration: %s" % err, file=sys.stderr)
        return 2
    with open(REPORTS) as src:
        lines = [line.strip() for line in src if line.strip()]
    try:
        with open(STATE) as src:
            state = json.load(src)
    except (OSError, ValueError):
        state = {{"runs": 0, "next": 0}}
    run = state["runs"]
    state["runs"] = run + 1
    save(state)
    crash = CRASH_AFTER[run] if run < len(CRASH_AFTER) else None
    index, emitted, parent = state["next"], 0, os.getppid()
    deadline = time.monotonic() + LIFETIME_S
    while time.monotonic() < deadline and os.getppid() == parent:
        if crash is not None and emitted >= crash:
            state["next"] = index
            save(state)
            return 1
        if run == 0 and emitted == MALFORMED_AFTER:
            sys.stdout.write('{{"neuron_runtime_data": [{{"pid": 1, "report": trunc\\n')
        sys.stdout.write(lines[min(index, len(lines) - 1)] + "\\n")
        sys.stdout.flush()
        index += 1
        emitted += 1
        time.sleep(period)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(0)
'''

_NEURON_LS = '''#!{python}
"""Fake neuron-ls (otel-gpu tests): prints recorded --json-output."""
import sys

if "--json-output" not in sys.argv[1:] and "-j" not in sys.argv[1:]:
    print("fake neuron-ls: only --json-output is recorded", file=sys.stderr)
    sys.exit(2)
with open({source!r}) as src:
    sys.stdout.write(src.read())
'''


class FakeNeuronTools:
    """Executable fake ``neuron-monitor`` (and ``neuron-ls``) in ``directory``.

    The monitor replays ``reports.jsonl`` of ``fixture`` at the period of its ``-c`` config,
    first report at once; after the last recorded report it repeats that one. Run ``n`` of the
    monitor exits with code 1 after ``crash_after[n]`` reports (a restart resumes where the
    crashed run stopped); the first run writes a malformed line after ``malformed_after``
    reports. Every process ends when its parent does, or after ``lifetime_s``.
    """

    def __init__(
        self,
        directory: Path,
        *,
        fixture: Path = TRN1_32XLARGE,
        crash_after: Sequence[int | None] = (),
        malformed_after: int | None = None,
        with_neuron_ls: bool = True,
        lifetime_s: float = 300.0,
    ) -> None:
        self.directory = Path(directory)
        self.fixture = fixture
        self.directory.mkdir(parents=True, exist_ok=True)
        self.state = self.directory / "neuron-monitor.state.json"
        self.monitor = self.directory / "neuron-monitor"
        self.neuron_ls = self.directory / "neuron-ls"
        _write_executable(
            self.monitor,
            _MONITOR.format(
                python=sys.executable,
                reports=str(fixture / "reports.jsonl"),
                state=str(self.state),
                crash_after=list(crash_after),
                malformed_after=malformed_after,
                lifetime_s=lifetime_s,
            ),
        )
        if with_neuron_ls:
            _write_executable(
                self.neuron_ls,
                _NEURON_LS.format(python=sys.executable, source=str(fixture / "neuron-ls.json")),
            )

    @property
    def runs(self) -> int:
        """How many times the fake monitor has been started."""
        try:
            return int(json.loads(self.state.read_text())["runs"])
        except (OSError, ValueError, KeyError):
            return 0

    @property
    def env(self) -> dict[str, str]:
        """The environment that points the ``neuron`` backend at these fakes."""
        return {
            "OTEL_GPU_NEURON_MONITOR": str(self.monitor),
            "OTEL_GPU_HOST_ROOT": str(self.fixture),
            "OTEL_GPU_BACKEND": "neuron",
            "PATH": f"{self.directory}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    @property
    def selector(self) -> str:
        """The backend selector (``--backend``) for these fakes."""
        return "neuron"

    def close(self) -> None:
        """Nothing to release: the monitor processes belong to the backend that started them."""


def _write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


# -- installers in the shape of fake_vendor_cli.FAKES -------------------------------------------


def tpu_scenarios() -> list[str]:
    """Built-in TPU scenarios (fixture directories)."""
    return sorted(p.name for p in FIXTURES.glob("tpu-*") if p.is_dir())


def neuron_scenarios() -> list[str]:
    """Built-in Neuron scenarios (fixture directories)."""
    return sorted(p.name for p in FIXTURES.glob("neuron-*") if p.is_dir())


@contextlib.contextmanager
def install_tpu(
    scenario: str = "tpu-v5e-8", timer: Callable[[], float] | None = None
) -> Iterator[FakeTpuRuntime]:
    """Serve the scenario's runtime metrics and point this process's ``tpu`` backend at the
    scenario (``OTEL_GPU_HOST_ROOT``, ``OTEL_GPU_TPU_METRICS_ADDR``) for the ``with`` block.
    ``timer`` is accepted for :mod:`otel_gpu.testing.fake_vendor_cli` and not used."""
    root = _scenario(scenario, tpu_scenarios())
    runtime = FakeTpuRuntime.from_fixture(root).start()
    try:
        env = tpu_env(runtime, root)
        env.pop("OTEL_GPU_BACKEND")
        with _environ(env):
            yield runtime
    finally:
        runtime.stop()


@contextlib.contextmanager
def install_neuron(
    scenario: str = "neuron-trn1-32xlarge", timer: Callable[[], float] | None = None
) -> Iterator[FakeNeuronTools]:
    """Write the fake tools to a temporary directory and point this process's ``neuron``
    backend at them and at the scenario's ``dev``/``sys`` for the ``with`` block."""
    root = _scenario(scenario, neuron_scenarios())
    with tempfile.TemporaryDirectory(prefix="otel-gpu-fake-neuron-") as directory:
        tools = FakeNeuronTools(Path(directory), fixture=root)
        env = tools.env
        env.pop("OTEL_GPU_BACKEND")
        with _environ(env):
            yield tools


def _scenario(name: str, known: list[str]) -> Path:
    path = Path(name)
    if path.is_dir():
        return path
    if name not in known:
        raise ValueError(f"unknown scenario {name!r} (built in: {', '.join(known)})")
    return FIXTURES / name


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
