"""``benchmarks/run.py --quick`` runs end to end and prints its table.

A smoke test only: timings are measured in ``benchmarks/``, never asserted here. The peers
(nvitop-exporter, gpustat) and matplotlib are benchmark-only dependencies; without them the
quick run skips their rows with a note, so this test runs everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "run.py"


def test_quick_benchmark_prints_a_table_and_exits_0(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST_"))}
    proc = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "# otel-gpu benchmarks" in out
    assert "| subject | node | devices | data points | CPU ms / collection" in out
    rows = [line for line in out.splitlines() if line.startswith("| otel-gpu |")]
    assert len(rows) >= 2, out  # otel-gpu at 1 and 8 devices, in the cost and peer tables
    assert "## Targets" in out
    assert "Command: `python benchmarks/run.py --quick" in out
    assert (tmp_path / "RESULTS.md").read_text(encoding="utf-8").startswith("# otel-gpu")
    assert (tmp_path / "results.json").exists()
