"""Fixtures for the end-to-end tests: an in-process OTLP receiver on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from otel_gpu.testing.otlp_receiver import OtlpReceiver


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """A started :class:`OtlpReceiver` (gRPC and HTTP on free 127.0.0.1 ports), stopped after."""
    with OtlpReceiver() as rx:
        yield rx
