"""The README's reference tables are generated from the code's tables and must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_tables_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gen-docs"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_readme_documents_every_env_var_and_metric() -> None:
    from otel_gpu.config import ENV_VARS
    from otel_gpu.otel.metrics import METRICS

    text = (ROOT / "README.md").read_text()
    for var in ENV_VARS:
        assert f"`{var.name}`" in text
    for metric in METRICS:
        assert f"`{metric.name}`" in text
