"""The ``otel-gpu`` command: ``run``, ``inventory``, ``health``, ``backends``.

Exit codes: 0 success; 1 runtime failure (no driver, backend unavailable); 2 usage or
configuration error. ``health`` uses the Nagios codes: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.
Every error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from otel_gpu import __version__
from otel_gpu.config import Settings, parse_interval
from otel_gpu.errors import BackendUnavailable, ConfigError, OtelGpuError

__all__ = ["EXIT_CONFIG", "EXIT_OK", "EXIT_RUNTIME", "main"]

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_CONFIG = 2
_log = logging.getLogger("otel_gpu")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_CONFIG, f"otel-gpu: error: {message} (see '{self.prog} --help')\n")


def _interval_flag(raw: str) -> float:
    try:
        return parse_interval("--interval", raw)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--backend",
        help="auto (default, from OTEL_GPU_BACKEND), nvml, nvidia-smi, amd, intel, tpu, neuron, "
        "simulated[:<spec>], or a comma-separated list",
    )
    common.add_argument(
        "--devices", help="only these devices: indices and/or ids separated by , (OTEL_GPU_DEVICES)"
    )
    common.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help="verbosity of otel-gpu's own diagnostics (OTEL_GPU_LOG_LEVEL)",
    )
    parser = _Parser(
        prog="otel-gpu",
        description="Accelerator telemetry for OpenTelemetry.",
    )
    parser.add_argument("--version", action="version", version=f"otel-gpu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", parents=[common], help="collect and export (the node agent)")
    run.add_argument(
        "--interval", type=_interval_flag, help="seconds between collections (OTEL_GPU_INTERVAL)"
    )
    run.add_argument("--once", action="store_true", help="one collection, flush, exit")
    run.add_argument(
        "--exporter",
        choices=("otlp", "console", "prometheus", "none"),
        help="shorthand for OTEL_METRICS_EXPORTER and OTEL_LOGS_EXPORTER",
    )
    run.add_argument(
        "--processes",
        action="store_true",
        default=None,
        help="export per-process GPU memory (OTEL_GPU_PROCESSES)",
    )
    run.add_argument(
        "--attributes",
        choices=("full", "minimal"),
        help="per-point attributes (OTEL_GPU_ATTRIBUTES)",
    )

    inv = sub.add_parser("inventory", parents=[common], help="print devices and topology")
    inv.add_argument("--json", action="store_true", help="JSON output")

    health = sub.add_parser(
        "health", parents=[common], help="run the health checks once (Nagios/Slurm exit codes)"
    )
    health.add_argument(
        "--expect-devices",
        type=int,
        metavar="N",
        help="expected device count (OTEL_GPU_EXPECTED_DEVICES)",
    )
    health.add_argument("--format", choices=("text", "json", "nagios"), default="text")
    health.add_argument(
        "--check-busy",
        action="store_true",
        help="fail when processes hold a device or its memory is in use (Slurm prolog/epilog)",
    )
    health.add_argument(
        "--exporter",
        choices=("otlp", "console", "none"),
        help="also send the events as logs (default: none; OTEL_LOGS_EXPORTER when set)",
    )

    backends = sub.add_parser(
        "backends", parents=[common], help="list backends and whether each can run here"
    )
    backends.add_argument("--json", action="store_true", help="JSON output")
    return parser


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("otel-gpu: %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _settings(args: argparse.Namespace) -> Settings:
    settings = Settings.from_env()
    from otel_gpu.hal.manager import DeviceFilter

    devices = DeviceFilter.parse(args.devices, "--devices") if args.devices else None
    return settings.override(
        backend=args.backend,
        devices=devices,
        log_level=args.log_level,
        interval_s=getattr(args, "interval", None),
        processes=getattr(args, "processes", None),
        attributes=getattr(args, "attributes", None),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``otel-gpu`` command; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        settings = _settings(args)
    except ConfigError as err:
        print(f"otel-gpu: error: {err}", file=sys.stderr)
        return EXIT_CONFIG if args.command != "health" else 3
    _setup_logging(settings.log_level)
    from otel_gpu.cli import commands

    handler = {
        "run": commands.run,
        "inventory": commands.inventory,
        "health": commands.health,
        "backends": commands.backends,
    }[args.command]
    try:
        return handler(args, settings)
    except ConfigError as err:
        print(f"otel-gpu: error: {err}", file=sys.stderr)
        return EXIT_CONFIG if args.command != "health" else 3
    except BackendUnavailable as err:
        if args.command == "health":
            print(f"UNKNOWN - {err}", file=sys.stderr)
            return 3
        print(f"otel-gpu: error: {err}", file=sys.stderr)
        return EXIT_RUNTIME
    except OtelGpuError as err:
        print(f"otel-gpu: error: {err}", file=sys.stderr)
        return EXIT_RUNTIME if args.command != "health" else 3
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return EXIT_OK
    except Exception as err:  # last resort: one line, details at debug level
        _log.debug("unexpected error", exc_info=True)
        print(
            f"otel-gpu: error: unexpected {type(err).__name__}: {err} "
            "(rerun with --log-level debug for details)",
            file=sys.stderr,
        )
        return EXIT_RUNTIME if args.command != "health" else 3
