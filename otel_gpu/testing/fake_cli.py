"""Run the ``otel-gpu`` command over the fake NVML: ``python -m otel_gpu.testing.fake_cli
<scenario> <otel-gpu arguments...>``.

The fake is installed beneath pynvml (so the real NVML backend and pynvml's own code run) with
a clock that follows real time, so scripted events (``after_s``) fire while the agent runs.
For demos, tests and benchmarks on machines without a GPU.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Install scenario ``argv[0]`` and run ``otel-gpu argv[1:]`` in this process."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        from otel_gpu.testing.fake_nvml import builtin_scenarios

        print(__doc__)
        print("scenarios: " + ", ".join(builtin_scenarios()))
        return 0 if args else 2
    from otel_gpu.cli import main as cli_main
    from otel_gpu.errors import OtelGpuError
    from otel_gpu.testing.fake_nvml import install

    start = time.monotonic()
    try:
        context = install(args[0], timer=lambda: time.monotonic() - start)
        fake = context.__enter__()
    except (OtelGpuError, ValueError, OSError) as err:
        print(f"otel-gpu: error: fake NVML scenario {args[0]!r}: {err}", file=sys.stderr)
        return 2
    try:
        return cli_main(args[1:])
    finally:
        fake.close()
        context.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(main())
