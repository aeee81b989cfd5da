"""Run the ``otel-gpu`` command over vendor fakes: ``python -m otel_gpu.testing.fake_vendor_cli
<scenario>[+<scenario>...] <otel-gpu arguments...>``.

A scenario is a built-in name (``amd-mi300x-8``, ``intel-max-1550``, ``h100-sxm-8-nvswitch``...:
the vendor is found from the name) or ``<vendor>:<name or JSON file>``. Several scenarios
joined by ``+`` install several fakes at once, so a node with two vendors can be run
(``amd-mi300x-8+intel-max-1550``). Each fake sits beneath its vendor library (``amdsmi``,
``pyzes``, pynvml's ``nvmlLib``) with a clock that follows real time, so counters grow and
scripted events fire while the agent runs. For demos, tests and benchmarks on machines
without accelerators.

:data:`FAKES` is the registry: vendor name -> how to install its fake and list its scenarios.
Another vendor's fake joins by adding an entry (``FAKES["tpu"] = FakeVendor(...)``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FAKES", "FakeVendor", "install_all", "main", "resolve"]


@dataclass(frozen=True)
class FakeVendor:
    """A vendor fake: ``install(scenario, timer=...)`` is a context manager that yields the
    fake (with a ``close()``); ``scenarios()`` lists its built-in scenario names."""

    install: Callable[..., contextlib.AbstractContextManager[Any]]
    scenarios: Callable[[], list[str]]


def _amd() -> FakeVendor:
    from otel_gpu.testing import fake_amdsmi

    return FakeVendor(fake_amdsmi.install, fake_amdsmi.builtin_scenarios)


def _intel() -> FakeVendor:
    from otel_gpu.testing import fake_pyzes

    return FakeVendor(fake_pyzes.install, fake_pyzes.builtin_scenarios)


def _nvml() -> FakeVendor:
    from otel_gpu.testing import fake_nvml

    return FakeVendor(fake_nvml.install, fake_nvml.builtin_scenarios)


def _tpu() -> FakeVendor:
    from otel_gpu.testing import fake_tpu_neuron

    return FakeVendor(fake_tpu_neuron.install_tpu, fake_tpu_neuron.tpu_scenarios)


def _neuron() -> FakeVendor:
    from otel_gpu.testing import fake_tpu_neuron

    return FakeVendor(fake_tpu_neuron.install_neuron, fake_tpu_neuron.neuron_scenarios)


FAKES: dict[str, Callable[[], FakeVendor]] = {
    "amd": _amd,
    "intel": _intel,
    "nvml": _nvml,
    "tpu": _tpu,
    "neuron": _neuron,
}
"""Vendor name -> a function returning its :class:`FakeVendor` (imported lazily)."""


def resolve(name: str) -> tuple[str, str]:
    """``(vendor, scenario)`` of one scenario argument. Raises ValueError when unknown."""
    vendor, colon, rest = name.partition(":")
    if colon and vendor in FAKES:
        return vendor, rest
    matches = [v for v, factory in FAKES.items() if name in factory().scenarios()]
    if len(matches) == 1:
        return matches[0], name
    known = ", ".join(sorted(s for factory in FAKES.values() for s in factory().scenarios()))
    if matches:
        raise ValueError(f"scenario {name!r} is ambiguous ({', '.join(matches)}): use vendor:name")
    raise ValueError(f"unknown scenario {name!r} (built in: {known})")


@contextlib.contextmanager
def install_all(spec: str, timer: Callable[[], float] | None = None) -> Any:
    """Install every fake of ``spec`` (``a+b+...``) for the ``with`` block; yields the fakes."""
    with contextlib.ExitStack() as stack:
        fakes = []
        for part in spec.split("+"):
            vendor, scenario = resolve(part.strip())
            fake = stack.enter_context(FAKES[vendor]().install(scenario, timer=timer))
            stack.callback(fake.close)
            fakes.append(fake)
        yield fakes


def main(argv: Sequence[str] | None = None) -> int:
    """Install the fakes of ``argv[0]`` and run ``otel-gpu argv[1:]`` in this process."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)  # noqa: T201
        for vendor, factory in FAKES.items():
            print(f"{vendor}: " + ", ".join(factory().scenarios()))  # noqa: T201
        return 0 if args else 2
    from otel_gpu.cli import main as cli_main
    from otel_gpu.errors import OtelGpuError

    start = time.monotonic()
    try:
        context = install_all(args[0], timer=lambda: time.monotonic() - start)
        context.__enter__()
    except (OtelGpuError, ValueError, OSError) as err:
        print(f"otel-gpu: error: fake scenario {args[0]!r}: {err}", file=sys.stderr)  # noqa: T201
        return 2
    try:
        return cli_main(args[1:])
    finally:
        context.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(main())
