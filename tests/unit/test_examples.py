"""The shipped examples run as documented."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("backend", "code"),
    [("simulated:idle=true", 0), ("simulated:idle=true,faults=ecc@3:0", 2), ("simulated", 2)],
)
def test_slurm_prolog(backend: str, code: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OTEL_GPU_BACKEND"] = backend
    result = subprocess.run(
        ["bash", str(ROOT / "examples/slurm/prolog.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == code, result.stderr
    if code:
        assert "GPU CRITICAL" in result.stderr
