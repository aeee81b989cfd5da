"""A fake ``nvidia-smi`` executable for tests of the nvidia-smi fallback backend.

:func:`write_fake` writes an executable ``nvidia-smi`` script into a directory. It answers
``--query-gpu=<fields> --format=csv,noheader,nounits`` from a table of GPUs (the values
nvidia-smi prints, ``[N/A]`` and ``[Not Supported]`` included), in the order the fields are
asked; ``--list-gpus`` lists them. ``mode`` scripts failures: ``"fail"`` answers as a
broken driver does (exit 9, "NVIDIA-SMI has failed..."), ``"hang"`` never answers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_GPUS", "write_fake"]

DEFAULT_GPUS: list[dict[str, str]] = [
    {
        "index": str(i),
        "uuid": f"GPU-00000000-0000-0000-0000-00000000000{i}",
        "name": "NVIDIA A100-SXM4-40GB",
        "pci.bus_id": f"00000000:{0x07 + i * 8:02X}:00.0",
        "serial": f"132032100{i}",
        "vbios_version": "92.00.45.00.03",
        "driver_version": "535.161.08",
        "memory.total": "40960",
        "memory.used": str(1000 + i * 100),
        "power.default_limit": "400.00",
        "pcie.link.gen.max": "4",
        "pcie.link.width.max": "16",
        "utilization.gpu": str(10 * (i + 1)),
        "utilization.memory": str(5 * (i + 1)),
        "power.draw": f"{60.5 + i:.2f}",
        "enforced.power.limit": "400.00",
        "temperature.gpu": str(30 + i),
        "temperature.memory": "[N/A]" if i else "40",
        "clocks.gr": "1410",
        "clocks.sm": "1410",
        "clocks.mem": "1215",
        "ecc.errors.corrected.volatile.total": "0",
        "ecc.errors.uncorrected.volatile.total": "[Not Supported]" if i == 1 else "0",
        "pcie.link.gen.current": "4",
        "pcie.link.width.current": "16",
        "clocks_event_reasons.sw_power_cap": "Active" if i == 1 else "Not Active",
        "clocks_event_reasons.hw_slowdown": "Not Active",
        "clocks_event_reasons.sw_thermal_slowdown": "Not Active",
        "clocks_event_reasons.hw_thermal_slowdown": "Not Active",
        "clocks_event_reasons.hw_power_brake_slowdown": "Not Active",
    }
    for i in range(2)
]

_SCRIPT = """#!{python}
import json, sys, time
gpus = json.loads({gpus!r})
mode = {mode!r}
args = sys.argv[1:]
if mode == "hang":
    time.sleep(3600)
if mode == "fail":
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
          "Make sure that the latest NVIDIA driver is installed and running.")
    sys.exit(9)
if "-L" in args or "--list-gpus" in args:
    for g in gpus:
        print(f"GPU {{g['index']}}: {{g['name']}} (UUID: {{g['uuid']}})")
    sys.exit(0)
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
if query is None or "--format=csv,noheader,nounits" not in args:
    print("fake nvidia-smi: unsupported arguments", args, file=sys.stderr)
    sys.exit(2)
for g in gpus:
    fields = query.split(",")
    unknown = [f for f in fields if f not in g]
    if unknown:
        print(f'Field "{{unknown[0]}}" is not a valid field to query.', file=sys.stderr)
        sys.exit(2)
    print(", ".join(g[f] for f in fields))
"""


def write_fake(directory: Path, gpus: list[dict[str, Any]] | None = None, mode: str = "ok") -> Path:
    """Write an executable ``nvidia-smi`` into ``directory`` and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    table = json.dumps(DEFAULT_GPUS if gpus is None else gpus)
    path.write_text(_SCRIPT.format(python=sys.executable, gpus=table, mode=mode))
    path.chmod(0o755)
    return path
