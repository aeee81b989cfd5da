"""otel-gpu benchmarks: one command, a markdown table, a PNG.

    python benchmarks/run.py            # full run (~10 min on 2 cores): writes RESULTS.md,
                                        # results.png and results.json beside this file
    python benchmarks/run.py --quick    # smoke run (seconds): prints the table, writes nothing
                                        # unless --out DIR is given

Every NVIDIA subject reads the same scenario (the built-in ``h100-sxm-8-nvswitch`` template at
1, 8, 64 and 256 GPUs, and an A100 MIG node whose MIG instances count as devices) through the
same fake NVML beneath pynvml; each measurement runs in its own subprocess
(``benchmarks/_worker.py``, where the method is described). Peers (nvitop-exporter, gpustat) are
benchmark-only dependencies (``benchmarks/requirements.txt``); without them their rows are
skipped with a note. Timings are measured here and never asserted in tests.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run from a checkout: the otel_gpu beside benchmarks/
    sys.path.insert(0, str(ROOT))
WORKER = HERE / "_worker.py"
DEVICES = (1, 8, 64, 256)
QUICK_DEVICES = (1, 8)
MIG_DEVICES = 64  # 8 A100 x (1 GPU + 7 MIG instances)
TARGET_FLOOR_RATIO = 1.3
TARGET_CALLS = 6.0
FLAT_RSS_BYTES = 1 << 20  # "flat": less than 1 MiB projected growth over 10,000 collections
PEERS = {"nvitop": "nvitop-exporter", "gpustat": "gpustat"}
PEER_MODULES = {
    "nvitop": ("nvitop", "nvitop_exporter", "prometheus_client"),
    "gpustat": ("gpustat",),
}


# -- plan ---------------------------------------------------------------------------------------


def repeats_for(devices: int, quick: bool) -> dict[str, int]:
    """Warm-up collections, collections per timed batch (a multiple of the NVML backend's
    slow-path period, 6, so every batch holds the same share of slow sweeps) and batches."""
    if quick:
        return {"warmup": 2, "batch": 6, "repeats": 3}
    if devices <= 1:
        return {"warmup": 6, "batch": 12, "repeats": 9}
    if devices <= 8:
        return {"warmup": 6, "batch": 6, "repeats": 7}
    if devices <= 64:
        return {"warmup": 3, "batch": 6, "repeats": 5}
    return {"warmup": 2, "batch": 6, "repeats": 3}


def peer_available(kind: str) -> str | None:
    """None when the peer can run here, else why not."""
    missing = [m for m in PEER_MODULES[kind] if importlib.util.find_spec(m) is None]
    if missing:
        return f"not installed ({', '.join(missing)}): pip install -r benchmarks/requirements.txt"
    return None


# -- running workers ----------------------------------------------------------------------------


def run_worker(task: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one task in a fresh interpreter; its last stdout line is the JSON result."""
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in [v for v in env if v.startswith(("OTEL_EXPORTER_OTLP", "OTEL_GPU_"))]:
        del env[var]
    try:
        proc = subprocess.run(
            [sys.executable, str(WORKER), json.dumps(task)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}
    result: dict[str, Any] = json.loads(lines[-1])
    if result.get("real_nvml_loaded"):
        result["error"] = "a real libnvidia-ml was loaded: result discarded"
    return result


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def measure_costs(quick: bool, peers: bool) -> dict[str, Any]:
    devices = QUICK_DEVICES if quick else DEVICES
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    subjects: list[tuple[str, dict[str, Any]]] = []
    plan: dict[str, Any]
    for n in devices:
        plan = repeats_for(n, quick)
        subjects.append(("otel-gpu", {"kind": "otel-gpu", "backend": "nvml", "devices": n, **plan}))
        if quick and n != devices[-1]:
            continue  # the smoke run: the other subjects at its largest size only
        subjects.append(
            (
                "otel-gpu minimal",
                {
                    "kind": "otel-gpu",
                    "backend": "nvml",
                    "devices": n,
                    "attributes": "minimal",
                    **plan,
                },
            )
        )
        subjects.append(
            (
                "otel-gpu simulated",
                {"kind": "otel-gpu", "backend": "simulated", "devices": n, **plan},
            )
        )
        for kind, name in PEERS.items():
            subjects.append((name, {"kind": kind, "devices": n, **plan}))
    if not quick:
        plan = repeats_for(MIG_DEVICES, quick)
        for label, kind in (("otel-gpu", "otel-gpu"), *((PEERS[k], k) for k in PEERS)):
            task: dict[str, Any] = {
                "kind": kind,
                "backend": "nvml",
                "devices": MIG_DEVICES,
                "scenario": "mig",
            }
            subjects.append((label, {**task, **plan}))
    skipped: dict[str, str] = {}
    if peers:
        for kind, name in PEERS.items():
            why = peer_available(kind)
            if why:
                skipped[name] = why
    else:
        skipped.update({name: "skipped (--no-peers)" for name in PEERS.values()})
    for name, why in skipped.items():
        notes.append(f"{name}: {why}")
    for label, task in subjects:
        if label in skipped:
            continue
        scenario = task.get("scenario", "h100")
        progress(f"cost: {label} ({task.get('backend', 'nvml')}, {scenario}) x{task['devices']}")
        budget = 60 + 4 * task["devices"] * (task["repeats"] + 1)
        result = run_worker(task, timeout=budget)
        result.update(
            {
                "label": label,
                "backend": task.get("backend", "nvml"),
                "scenario": scenario,
                "attributes": task.get("attributes", "full"),
            }
        )
        if "error" in result:
            notes.append(f"{label} x{task['devices']} ({scenario}): {result['error']}")
            progress(f"  failed: {result['error']}")
        rows.append(result)
    return {"rows": rows, "notes": notes}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure_memory(quick: bool) -> dict[str, Any]:
    """RSS over N collections exported over OTLP/gRPC: Collector reachable, then down."""
    from otel_gpu.testing.otlp_receiver import OtlpReceiver

    n = 200 if quick else 10_000
    base: dict[str, Any] = {
        "kind": "memory",
        "devices": 1,
        "collections": n,
        "sample_every": 20 if quick else 100,
        "warmup": 100 if quick else 1000,
        "timeout_s": 0.5,
        "max_s": 30 if quick else 240,
    }
    out: dict[str, Any] = {"collections_planned": n}
    with OtlpReceiver(http=False) as rx:
        down = f"http://127.0.0.1:{free_port()}"
        cases = {
            "reachable": (rx.grpc_endpoint, "otel-gpu"),
            "down": (down, "otel-gpu"),
            "down, SDK-only control": (down, "floor"),
        }
        for case, (endpoint, subject) in cases.items():
            progress(f"memory: {n} collections, Collector {case}")
            task = {**base, "endpoint": endpoint, "subject": subject}
            result, received = _run_draining(task, rx, timeout=base["max_s"] + 60)
            result["received_requests"] = received
            out[case] = result
    return out


def _run_draining(task: dict[str, Any], rx: Any, timeout: float) -> tuple[dict[str, Any], int]:
    """Run a worker while emptying the receiver (it stores every request); the result and the
    number of metric requests the receiver accepted."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(task)],
            stdout=out,
            stderr=err,
            text=True,
            env=env,
            cwd=ROOT,
        )
        deadline = time.monotonic() + timeout
        count = 0
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            count += len(rx.metrics_requests)
            rx.clear()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            return {"error": f"timed out after {timeout:.0f}s"}, count
        count += len(rx.metrics_requests)
        rx.clear()
        out.seek(0)
        err.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = err.read().strip().splitlines()[-3:]
            return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}, count
        result: dict[str, Any] = json.loads(lines[-1])
        return result, count


def measure_latency(quick: bool) -> dict[str, Any]:
    from otel_gpu.testing.otlp_receiver import OtlpReceiver

    out: dict[str, Any] = {}
    progress("latency: Xid injection -> exported log record")
    out["xid"] = run_worker(
        {"kind": "xid", "devices": 8, "repeats": 3 if quick else 20}, timeout=120
    )
    runs = 1 if quick else 5
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    script = Path(sys.executable).with_name("otel-gpu")
    agent = [str(script)] if script.exists() else [sys.executable, "-m", "otel_gpu"]
    commands = {
        "import floor": [
            sys.executable,
            "-c",
            "import opentelemetry.sdk.metrics, opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
        ],
        "otel-gpu run --once (simulated)": [
            *agent,
            "run",
            "--once",
            "--backend",
            "simulated",
            "--exporter",
            "otlp",
        ],
        "otel-gpu run --once (fake NVML, h100-sxm-8-nvswitch)": [
            sys.executable,
            "-m",
            "otel_gpu.testing.fake_cli",
            "h100-sxm-8-nvswitch",
            "run",
            "--once",
            "--exporter",
            "otlp",
        ],
    }
    walls: dict[str, Any] = {}
    with OtlpReceiver(http=False) as rx:
        env.update(rx.exporter_env("grpc"))
        for name, command in commands.items():
            progress(f"latency: {name} x{runs}")
            times: list[float] = []
            error = None
            for _ in range(runs):
                start = time.perf_counter()
                proc = subprocess.run(
                    command,
                    env=env,
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                elapsed = time.perf_counter() - start
                if proc.returncode != 0:
                    error = f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
                    break
                times.append(elapsed)
            walls[name] = {
                "command": shlex.join(_short(c) for c in command),
                "runs": times,
                "median_s": statistics.median(times) if times else None,
                "error": error,
            }
        walls["received_metric_requests"] = len(rx.metrics_requests)
    out["once"] = walls
    return out


def _short(arg: str) -> str:
    """Paths shortened for the report: the interpreter as ``python``."""
    if arg == sys.executable:
        return "python"
    if arg.endswith(os.sep + "otel-gpu"):
        return "otel-gpu"
    return arg


# -- machine ------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = int(line.split()[1]) * 1024
    except OSError:
        pass
    versions = {}
    for dist in (
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp-proto-grpc",
        "opentelemetry-exporter-otlp-proto-common",
        "protobuf",
        "grpcio",
        "nvidia-ml-py",
        "nvitop",
        "nvitop-exporter",
        "gpustat",
        "prometheus-client",
        "otel-gpu",
    ):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "memory_bytes": memory,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "os": platform.platform(),
        "versions": versions,
    }


# -- report -------------------------------------------------------------------------------------


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "error" not in r]


def _find(rows: list[dict[str, Any]], label: str, devices: int, scenario: str = "h100") -> Any:
    for r in _ok(rows):
        if r["label"] == label and r["devices"] == devices and r["scenario"] == scenario:
            return r
    return None


def _kib(value: float | None) -> str:
    return "-" if value is None else f"{value / 1024:+.1f} KiB / 1000"


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def cost_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| subject | node | devices | data points | CPU ms / collection | µs / device "
        "| µs / data point | NVML calls / device / sweep (hot, amortized) | in fake NVML "
        "| SDK floor ms | ÷ floor | RSS MiB |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in _ok(rows):
        if r["kind"] != "otel-gpu":
            continue
        n = r["inventory_devices"]
        cpu = r["cpu_s"]
        calls = "-"
        if "nvml_calls_per_sweep" in r:
            calls = f"{r['nvml_calls_hot'] / n:.2f}, {r['nvml_calls_per_sweep'] / n:.2f}"
        node = _node(r)
        out.append(
            f"| {r['label']} | {node} | {n} | {r['points']:,} | {_fmt(cpu * 1e3, 2)} "
            f"| {_fmt(cpu / n * 1e6, 0)} | {_fmt(cpu / r['points'] * 1e6)} | {calls} "
            f"| {_fmt(r['fake_share'] * 100, 0)}% | {_fmt(r['floor_cpu_s'] * 1e3, 2)} "
            f"| **{r['ratio']:.2f}** | {r['rss_bytes'] / 2**20:.0f} |"
        )
    return out


def _node(r: dict[str, Any]) -> str:
    if r["backend"] == "simulated":
        return "simulated H100 (no NVML)"
    if r["scenario"] == "mig":
        return "A100 x8, 7 MIG each"
    return "H100 SXM NVSwitch"


def peer_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| tool | node | devices | metrics | data points / device | CPU µs / device / sweep "
        "| µs / data point | µs / data point excl. fake NVML | NVML calls / sweep "
        "| calls / device | CPU ÷ otel-gpu | calls ÷ otel-gpu | RSS MiB |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    order = ["otel-gpu", *PEERS.values()]
    keys = sorted(
        {(r["scenario"], r["devices"]) for r in _ok(rows)}, key=lambda k: (k[0] != "h100", k[1])
    )
    for scenario, devices in keys:
        ours = _find(rows, "otel-gpu", devices, scenario)
        for label in order:
            r = _find(rows, label, devices, scenario)
            if r is None:
                continue
            n = r["inventory_devices"] if label != "gpustat" else devices
            cpu = r["cpu_s"]
            calls = r.get("nvml_calls_per_sweep")
            cpu_ratio = calls_ratio = "-"
            if ours is not None and label != "otel-gpu":
                cpu_ratio = f"{cpu / ours['cpu_s']:.2f}"
                if calls is not None and ours.get("nvml_calls_per_sweep"):
                    calls_ratio = f"{calls / ours['nvml_calls_per_sweep']:.2f}"
            per_point = cpu / r["points"] * 1e6 if r["points"] else None
            excl = per_point * (1 - r["fake_share"]) if per_point is not None else None
            node = "A100 x8, 7 MIG each" if scenario == "mig" else "H100 SXM NVSwitch"
            out.append(
                f"| {label} | {node} | {devices} | {r['metrics']} | {r['points'] / n:.1f} "
                f"| {_fmt(cpu / n * 1e6, 0)} | {_fmt(per_point)} | {_fmt(excl)} "
                f"| {_fmt(calls, 1)} | {_fmt(calls / n if calls is not None else None, 2)} "
                f"| {cpu_ratio} | {calls_ratio} | {r['rss_bytes'] / 2**20:.0f} |"
            )
    return out


def linearity(
    rows: list[dict[str, Any]], label: str, backend: str = "nvml"
) -> dict[str, Any] | None:
    pts = [
        r
        for r in _ok(rows)
        if r["label"] == label and r["scenario"] == "h100" and r.get("backend", "nvml") == backend
    ]
    pts.sort(key=lambda r: r["devices"])
    if len(pts) < 2:
        return None
    per_device = {r["devices"]: r["cpu_s"] / r["devices"] for r in pts}
    xs = [float(r["devices"]) for r in pts]
    ys = [r["cpu_s"] for r in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    lo, hi = min(per_device), max(per_device)
    return {
        "per_device_s": per_device,
        "slope_s_per_device": slope,
        "intercept_s": intercept,
        "r2": 1 - ss_res / ss_tot if ss_tot else 1.0,
        "largest_over_8": per_device[hi] / per_device[8] if 8 in per_device else None,
        "largest": hi,
        "smallest": lo,
    }


def targets(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = results["costs"]["rows"]
    out: list[tuple[str, str, str]] = []
    r8 = _find(rows, "otel-gpu", 8)
    if r8:
        excl = r8["cpu_s"] * (1 - r8["fake_share"]) / r8["floor_cpu_s"]
        status = "met" if r8["ratio"] <= TARGET_FLOOR_RATIO else "missed"
        out.append(
            (
                f"otel-gpu ÷ SDK floor ≤ {TARGET_FLOOR_RATIO} at 8 devices",
                f"{r8['ratio']:.2f} (median of {len(r8['ratios'])} alternating batches; "
                f"≈{excl:.2f} without the CPU spent inside the fake NVML)",
                status,
            )
        )
        if "nvml_calls_per_sweep" in r8:
            per = r8["nvml_calls_per_sweep"] / r8["inventory_devices"]
            hot = r8["nvml_calls_hot"] / r8["inventory_devices"]
            out.append(
                (
                    f"≤ {TARGET_CALLS:g} NVML calls / device / sweep (H100)",
                    f"{per:.2f} amortized ({hot:.0f} on a hot sweep, "
                    f"{r8['nvml_calls_slow'] / r8['inventory_devices']:.0f} on the slow sweep every 6)",
                    "met" if per <= TARGET_CALLS else "missed",
                )
            )
        peers = [p for p in (_find(rows, name, 8) for name in PEERS.values()) if p]
        if peers:
            ours = r8["cpu_s"] / r8["points"] * 1e6
            best = min(peers, key=lambda p: p["cpu_s"] / p["points"])
            best_pp = best["cpu_s"] / best["points"] * 1e6
            out.append(
                (
                    "CPU per exported data point ≤ the best peer's (8 devices)",
                    f"otel-gpu {ours:.1f} µs vs {best['label']} {best_pp:.1f} µs "
                    f"(SDK floor alone: {r8['floor_cpu_s'] / r8['points'] * 1e6:.1f} µs)",
                    "met" if ours <= best_pp else "missed",
                )
            )
        else:
            out.append(("CPU per exported data point ≤ the best peer's", "peers not run", "n/a"))
    lin = linearity(rows, "otel-gpu")
    if lin and lin["largest_over_8"] is not None:
        per = lin["per_device_s"]
        detail = ", ".join(f"{n}: {v * 1e6:,.0f} µs" for n, v in per.items())
        ok = 0.75 <= lin["largest_over_8"] <= 1.25 and lin["r2"] >= 0.99
        status = "met" if ok else "missed"
        if lin["largest"] < 64:
            status = "n/a (quick run: too few sizes)"
        out.append(
            (
                "cost linear in devices (CPU per device within ±25% of the 8-device figure, R² ≥ 0.99)",
                f"CPU per device {detail}; {lin['largest']} ÷ 8 = {lin['largest_over_8']:.2f}, "
                f"R² of a linear fit {lin['r2']:.4f}",
                status,
            )
        )
    mem = results.get("memory")
    if mem:
        parts, flat = [], True
        for case in ("reachable", "down"):
            m = mem.get(case, {})
            if "error" in m or m.get("slope_bytes_per_1000") is None:
                parts.append(f"{case}: {m.get('error', 'no data')}")
                flat = False
                continue
            growth = m["slope_bytes_per_1000"] * 10
            flat = flat and growth < FLAT_RSS_BYTES
            parts.append(
                f"{case}: {m['slope_bytes_per_1000'] / 1024:+.1f} KiB / 1000 collections "
                f"over {m['collections']:,}"
            )
        control = mem.get("down, SDK-only control", {})
        own = None
        if control.get("slope_bytes_per_1000") is not None:
            parts.append(
                f"SDK-only control, Collector down: "
                f"{control['slope_bytes_per_1000'] / 1024:+.1f} KiB / 1000 collections"
            )
            down = mem.get("down", {}).get("slope_bytes_per_1000")
            if down is not None:
                own = down - control["slope_bytes_per_1000"]
                parts.append(f"otel-gpu beyond the control: {own / 1024:+.1f} KiB / 1000")
        objects = [mem.get(c, {}).get("objects_per_1000") for c in ("reachable", "down")]
        if all(o is not None for o in objects):
            parts.append(
                "Python objects: " + ", ".join(f"{o:+.1f}" for o in objects) + " / 1000 collections"
            )
        if mem.get("collections_planned", 0) < 10_000:
            status = "n/a (quick run: too few collections)"
        elif flat:
            status = "met"
        elif (
            own is not None
            and own * 10 < FLAT_RSS_BYTES
            and all(o is not None and abs(o) < 1000 for o in objects)
        ):
            status = (
                "missed, but not by an otel-gpu leak: Python objects stay flat and the "
                "SDK-only control creeps as much (allocator / C-extension drift)"
            )
        else:
            status = "missed"
        out.append(
            (
                "RSS flat over 10,000 collections (< 1 MiB projected growth)",
                "; ".join(parts),
                status,
            )
        )
    return out


def markdown(results: dict[str, Any], command: str) -> str:
    m = results["machine"]
    v = m["versions"]
    lines = [
        "# otel-gpu benchmarks",
        "",
        f"- Date: {results['date']}",
        f"- Machine: {m['nproc']} CPUs ({m['cpu']}), "
        f"{(m['memory_bytes'] or 0) / 2**30:.0f} GiB, {m['os']}; "
        f"{m['implementation']} {m['python']}",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- Command: `{command}`"
        + (" (quick smoke run: few repeats, not for comparison)" if results["quick"] else ""),
        f"- Wall time of the run: {results['elapsed_s']:.0f} s",
        "",
        "All NVIDIA subjects read the same scenario through the same fake NVML beneath pynvml "
        "(pynvml's own ctypes code runs; `fake.calls` counts the calls): the built-in "
        "`h100-sxm-8-nvswitch` template (H100 SXM, 18 NVLinks to NVSwitches, one process) at "
        "1/8/64/256 GPUs, and 8 A100 with 7 MIG instances each (64 devices: MIG instances "
        "count as devices). Each measurement runs in a fresh subprocess. CPU is "
        "`time.process_time()` (all threads) of a batch of collections, median of the batches; "
        "GC on, `gc.collect()` between batches. The fake's clock advances 10 s per collection.",
        "",
        "## 1-2. Cost per collection, and the SDK floor",
        "",
        "One collection = sweep + every instrument callback + health checks, through a "
        "`MeterProvider` with an `InMemoryMetricReader`, then OTLP protobuf encoding "
        "(`encode_metrics(...).SerializeToString()`, what the OTLP exporter sends). The SDK "
        "floor produces the same data points (same instruments, units, attributes and Resource) "
        "from bare observable callbacks returning constants, through the same SDK and encoder; "
        "otel-gpu and its floor alternate batch by batch in one process and `÷ floor` is the "
        "median of the per-batch ratios. *In fake NVML*: share of the CPU spent inside the fake "
        "NVML's Python code (a stand-in for the driver; measured in a separate pass).",
        "",
        *cost_table(results["costs"]["rows"]),
        "",
        "## 3. Peers on identical fake hardware",
        "",
        "Per sweep: nvitop-exporter = `PrometheusExporter.update_device()` for every device "
        "(GPU and MIG, as its CLI) + `prometheus_client.generate_latest()` of its registry "
        "(its host/psutil metrics are left out); gpustat = `gpustat.new_query()` + "
        "`print_json()` (its 0.1 s per-GPU sleep is skipped: wall time, not CPU); otel-gpu = "
        "one collection as above. Data points are counted the same way for every tool: one "
        "finite numeric value of one series per sweep (info-only series, NaN and host metrics "
        "not counted). gpustat does not report MIG instances; its per-device figures use the "
        "node's device count.",
        "",
        *peer_table(results["costs"]["rows"]),
        "",
    ]
    lines.extend(_calls_section(results["costs"]["rows"]))
    mem = results.get("memory")
    if mem:
        lines += [
            "## 4. Memory",
            "",
            "otel-gpu's default pipeline (`build_providers`: OTLP/gRPC exporter, "
            "`GpuTelemetry`, fake NVML, 1 H100) in its own process, collecting and exporting "
            "back to back (`force_flush`), RSS from `/proc/self/statm` every "
            f"{'20' if results['quick'] else '100'} collections; slope by least squares after "
            "the warm-up. Collector reachable: the in-process OTLP receiver (in the parent "
            "process, emptied every 0.5 s). Collector down: a closed loopback port, "
            "`OTEL_EXPORTER_OTLP_TIMEOUT=0.5` (each export fails at once: the exporter's first "
            "retry back-off, 0.8-1.2 s, is past that deadline). *SDK-only control*: the same "
            "providers and exporter fed otel-gpu's points as constants by bare callbacks (no "
            "otel-gpu code in the loop), to tell the SDK's and exporter's memory from otel-gpu's.",
            "",
            "| Collector | collections | steady RSS after warm-up | final RSS | slope after "
            "warm-up | slope, second half | Python objects / 1000 collections | "
            "CPU ms / collection | requests received |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for case in ("reachable", "down", "down, SDK-only control"):
            r = mem.get(case)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {case} | error: {r['error']} | | | | | | | |")
                continue
            lines.append(
                f"| {case} | {r['collections']:,} | {r['steady_rss_bytes'] / 2**20:.1f} MiB "
                f"| {r['final_rss_bytes'] / 2**20:.1f} MiB "
                f"| {r['slope_bytes_per_1000'] / 1024:+.1f} KiB / 1000 "
                f"| {_kib(r.get('slope_second_half_bytes_per_1000'))} "
                f"| {_fmt(r.get('objects_per_1000'), 1)} "
                f"| {r['cpu_per_collection_s'] * 1e3:.2f} | {r.get('received_requests', 0):,} |"
            )
        lines.append("")
    lat = results.get("latency")
    if lat:
        lines += ["## 5. Latency", ""]
        x = lat.get("xid", {})
        if "error" in x or x.get("median_s") is None:
            lines.append(f"- Xid -> log record: {x.get('error', 'no record received')}")
        else:
            lines.append(
                f"- Xid injected into the fake NVML -> `nvidia.xid` log record received by the "
                f"OTLP receiver (gRPC, default `build_providers` log pipeline, injections at "
                f"random gaps of 0-0.4 s): median **{x['median_s'] * 1e3:.0f} ms**, min "
                f"{x['min_s'] * 1e3:.0f} ms, max {x['max_s'] * 1e3:.0f} ms "
                f"({x['received']}/{x['repeats']} received). The log pipeline's batch "
                "processor exports every 200 ms (`_LOG_SCHEDULE_DELAY_MS`): that timer, not "
                "the event path, sets the latency."
            )
        once = lat.get("once", {})
        floor = once.get("import floor", {}).get("median_s")
        lines += ["", "| command | wall s (median) | ÷ import floor | runs |", "|---|--:|--:|--:|"]
        for r in once.values():
            if not isinstance(r, dict):
                continue
            if r.get("error"):
                lines.append(f"| `{r['command']}` | error: {r['error']} | | |")
                continue
            ratio = f"{r['median_s'] / floor:.1f}" if floor and r["median_s"] else "-"
            lines.append(f"| `{r['command']}` | {r['median_s']:.2f} | {ratio} | {len(r['runs'])} |")
        lines.append("")
    lines += ["## Targets", "", "| target | measured | status |", "|---|---|---|"]
    for target, measured, status in targets(results):
        lines.append(f"| {target} | {measured} | **{status}** |")
    lines.append("")
    notes = results["costs"]["notes"] + results.get("notes", []) + _cardinality_notes(results)
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _cardinality_notes(results: dict[str, Any]) -> list[str]:
    """Rows whose metrics exceed the SDK's default cardinality limit (2000 series)."""
    notes = []
    for r in _ok(results["costs"]["rows"]):
        over = r.get("over_default_cardinality")
        if not over:
            continue
        metrics = ", ".join(f"`{k}` {v:,}" for k, v in over.items())
        notes.append(
            f"{r['label']} ({_node(r)}, {r['devices']} devices): series per metric above the "
            f"OTel SDK's default cardinality limit of 2000 — {metrics}. With the default "
            "readers (as `build_providers` makes them) the SDK keeps 1999 series of such a "
            "metric and folds the rest into one `otel.metric.overflow=true` point: data lost. "
            + (
                "This benchmark raises the limit on both otel-gpu's and the floor's reader so "
                "the whole workload is measured."
                if r.get("cardinality_unlimited")
                else "This SDK has no reader cardinality setting: the figures are for the "
                "truncated output."
            )
        )
    return notes


def _calls_section(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["NVML calls per sweep by function, 8 H100 (÷ 8 for per device):", ""]
    found = False
    for label in ("otel-gpu", *PEERS.values()):
        r = _find(rows, label, 8)
        if r is None or not r.get("calls_by_function"):
            continue
        found = True
        calls = ", ".join(f"{k} {v:g}" for k, v in r["calls_by_function"].items())
        lines.append(f"- {label}: {calls}")
        missing = r.get("missing_functions_per_sweep")
        if missing:
            lines.append(
                "  - also looked up, not in the fake NVML (FunctionNotFound, not counted; one "
                "more call each with a real driver): "
                + ", ".join(f"{k} {v:g}" for k, v in missing.items())
            )
    return [*lines, ""] if found else []


def plot(results: dict[str, Any], path: Path) -> str | None:
    """Cost vs devices (log-log) and CPU per data point; None, or why no plot was made."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "results.png not written: matplotlib is not installed"
    rows = [r for r in _ok(results["costs"]["rows"]) if r["scenario"] == "h100"]
    series: dict[str, list[tuple[int, float, float]]] = {}
    for r in rows:
        name = (
            r["label"]
            if r["kind"] != "otel-gpu" or r["backend"] == "nvml"
            else "otel-gpu (simulated backend)"
        )
        if r["kind"] == "otel-gpu" and r["backend"] == "nvml" and r["attributes"] == "full":
            name = "otel-gpu (fake NVML)"
            series.setdefault("SDK floor (same points)", []).append(
                (r["devices"], r["floor_cpu_s"], r["floor_cpu_s"] / r["points"])
            )
        elif r["attributes"] == "minimal":
            name = "otel-gpu minimal attributes (fake NVML)"
        series.setdefault(name, []).append((r["devices"], r["cpu_s"], r["cpu_s"] / r["points"]))
    style = {
        "otel-gpu (fake NVML)": ("tab:blue", "o", "-"),
        "otel-gpu minimal attributes (fake NVML)": ("tab:cyan", "o", ":"),
        "otel-gpu (simulated backend)": ("tab:purple", "s", "--"),
        "SDK floor (same points)": ("black", "x", "--"),
        "nvitop-exporter": ("tab:orange", "^", "-"),
        "gpustat": ("tab:green", "v", "-"),
    }
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    for name, pts in series.items():
        pts.sort()
        color, marker, line = style.get(name, ("gray", ".", "-"))
        xs = [p[0] for p in pts]
        left.plot(xs, [p[1] * 1e3 for p in pts], line, color=color, marker=marker, label=name)
        right.plot(xs, [p[2] * 1e6 for p in pts], line, color=color, marker=marker, label=name)
    left.set(xscale="log", yscale="log", xlabel="devices", ylabel="CPU ms per collection / sweep")
    left.set_title("Cost per collection (incl. encoding/exposition)")
    right.set(xscale="log", xlabel="devices", ylabel="CPU µs per exported data point")
    right.set_title("CPU per exported data point")
    right.set_ylim(bottom=0)
    for ax in (left, right):
        ax.set_xticks(DEVICES if not results["quick"] else QUICK_DEVICES)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    m = results["machine"]
    fig.suptitle(
        f"otel-gpu vs SDK floor and peers on the same fake NVML (H100 SXM node) — "
        f"{m['nproc']} CPUs, Python {m['python']}, {results['date'][:10]}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# -- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: seconds, few repeats")
    parser.add_argument(
        "--out",
        type=Path,
        help="where RESULTS.md, results.png and results.json go "
        "(default: benchmarks/ for a full run, nowhere for --quick)",
    )
    parser.add_argument("--no-peers", action="store_true", help="skip nvitop-exporter and gpustat")
    parser.add_argument("--no-memory", action="store_true", help="skip the RSS runs")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency runs")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS_JSON",
        help="only re-render RESULTS.md and results.png beside RESULTS_JSON (no measuring)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile otel-gpu at 8 devices (collection, and the NVML sweep alone) into "
        "profile.txt beside the results",
    )
    args = parser.parse_args(argv)
    command = "python benchmarks/run.py" + (" --quick" if args.quick else "")
    extra = [a for a in (argv if argv is not None else sys.argv[1:]) if a not in ("--quick",)]
    if extra:
        command += " " + shlex.join(extra)
    if args.render is not None:
        saved = json.loads(args.render.read_text(encoding="utf-8"))
        why = plot(saved, args.render.parent / "results.png")
        if why:
            saved["notes"].append(why)
        text = markdown(saved, saved.get("command", "python benchmarks/run.py"))
        (args.render.parent / "RESULTS.md").write_text(text + "\n", encoding="utf-8")
        print(text)
        return 0
    out_dir = args.out if args.out is not None else (None if args.quick else HERE)
    started = time.monotonic()
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "command": command,
        "machine": machine(),
        "notes": [],
    }
    results["costs"] = measure_costs(args.quick, peers=not args.no_peers)
    if not args.no_memory:
        results["memory"] = measure_memory(args.quick)
    if not args.no_latency:
        results["latency"] = measure_latency(args.quick)
    profile = None
    if args.profile:
        progress("profile: otel-gpu, 8 devices")
        prof = run_worker(
            {"kind": "profile", "devices": 8, "warmup": 6, "batch": 6 if args.quick else 24},
            timeout=300,
        )
        profile = prof.get("profile") or f"profile failed: {prof.get('error')}\n"
    results["elapsed_s"] = time.monotonic() - started
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        if profile is not None:
            (out_dir / "profile.txt").write_text(profile, encoding="utf-8")
        why = plot(results, out_dir / "results.png")
        if why:
            results["notes"].append(why)
    text = markdown(results, command)
    print(text)
    if out_dir is not None:
        (out_dir / "RESULTS.md").write_text(text + "\n", encoding="utf-8")
        (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        progress(f"wrote {out_dir / 'RESULTS.md'}, results.png, results.json")
    failed = [r for r in results["costs"]["rows"] if "error" in r and r["kind"] == "otel-gpu"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
