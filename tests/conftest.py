"""Shared fixtures: fake backends for HAL tests, built on the real protocol."""

from __future__ import annotations

import os
from typing import ClassVar

import pytest

from otel_gpu.hal.model import DeviceFailure, DeviceInfo, DeviceSample, Inventory, Snapshot
from otel_gpu.hal.protocol import Probe

REQUIRE_E2E = os.environ.get("OTEL_GPU_REQUIRE_E2E") == "1"


def missing_part(message: str) -> None:
    """Skip locally, fail in CI (OTEL_GPU_REQUIRE_E2E=1), when a real part is missing."""
    if REQUIRE_E2E:
        pytest.fail(f"{message} (OTEL_GPU_REQUIRE_E2E=1)")
    pytest.skip(message)


class FakeBackend:
    """A minimal backend with N devices; ``broken`` makes sample() raise."""

    name: ClassVar[str] = "fake"
    auto: ClassVar[bool] = True
    fallback_for: ClassVar[str | None] = None

    def __init__(
        self,
        options: str | None = None,
        *,
        devices: int = 2,
        available: bool = True,
        vendor: str = "acme",
        lost: tuple[int, ...] = (),
    ) -> None:
        self.count = int(options) if options else devices
        self.available = available
        self.vendor = vendor
        self.lost = lost
        self.broken = False
        self.opened = self.closed = False
        self.sweeps = 0

    def probe(self) -> Probe:
        return Probe(self.available, "" if self.available else f"{self.name} driver missing")

    def open(self) -> None:
        self.opened = True

    def inventory(self) -> Inventory:
        return Inventory(
            tuple(
                DeviceInfo(
                    index=i,
                    id=f"{self.vendor}-{i}",
                    vendor=self.vendor,
                    model="X1",
                    backend=self.name,
                )
                for i in range(self.count)
            ),
            {f"{self.vendor}.driver": "1.0"},
        )

    def sample(self) -> Snapshot:
        self.sweeps += 1
        if self.broken:
            raise RuntimeError("driver wedged")
        return Snapshot(
            1,
            tuple(
                DeviceSample(f"{self.vendor}-{i}", utilization_ratio=0.5, power_w=100.0 + i)
                for i in range(self.count)
                if i not in self.lost
            ),
            tuple(DeviceFailure(f"{self.vendor}-{i}", "gone", lost=True) for i in self.lost),
        )

    def close(self) -> None:
        self.closed = True
