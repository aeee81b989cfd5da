"""Code the vendor backends share (no vendor imports here).

- :class:`UnsupportedCache`: quantities a device cannot report, asked once and logged once;
- :class:`LostState`: a device that fell off the bus, probed again with exponential backoff;
- :func:`sample_by_sweep`: a Snapshot from a backend's ``sweep(emit)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from otel_gpu.hal.model import DeviceFailure, DeviceSample, Snapshot

__all__ = ["LostState", "UnsupportedCache", "sample_by_sweep"]

_log = logging.getLogger("otel_gpu.backends")

Emit = Callable[[DeviceSample | DeviceFailure], None]


class UnsupportedCache:
    """Remembers ``(device, quantity)`` pairs a driver said it cannot report (NotSupported,
    FunctionNotFound), so later sweeps skip the call; each is logged once at INFO."""

    def __init__(self) -> None:
        self._unsupported: set[tuple[str, str]] = set()

    def supported(self, device: str, quantity: str) -> bool:
        """False once ``quantity`` was found unsupported on ``device``."""
        return (device, quantity) not in self._unsupported

    def unsupported(self, device: str, quantity: str, why: str) -> None:
        """Remember (and log once) that ``quantity`` is not available on ``device``."""
        key = (device, quantity)
        if key not in self._unsupported:
            self._unsupported.add(key)
            _log.info("%s: %s not available (%s); not asked again", device, quantity, why)


@dataclass
class LostState:
    """Whether a device is lost, and when to probe it again (5 s doubling up to 5 min)."""

    reason: str | None = None
    retry_at: float = 0.0
    backoff_s: float = 0.0

    MIN_BACKOFF_S = 5.0
    MAX_BACKOFF_S = 300.0

    @property
    def lost(self) -> bool:
        """True while the device is lost."""
        return self.reason is not None

    def mark(self, label: str, reason: str, now: float) -> None:
        """Record a loss (logged at WARNING the first time) and push the next probe back."""
        if self.reason is None:
            _log.warning("%s is lost: %s", label, reason)
        self.reason = reason
        self.backoff_s = min(self.MAX_BACKOFF_S, max(self.MIN_BACKOFF_S, self.backoff_s * 2))
        self.retry_at = now + self.backoff_s

    def due(self, now: float) -> bool:
        """True when the device may be probed again."""
        return now >= self.retry_at

    def recovered(self, label: str) -> None:
        """The device answers again."""
        _log.warning("%s answers again", label)
        self.reason, self.backoff_s = None, 0.0


def sample_by_sweep(sweep: Callable[[Emit], None]) -> Snapshot:
    """Run ``sweep(emit)`` and gather what it emitted into one :class:`Snapshot`."""
    items: list[DeviceSample | DeviceFailure] = []
    sweep(items.append)
    return Snapshot(
        time.time_ns(),
        tuple(i for i in items if isinstance(i, DeviceSample)),
        tuple(i for i in items if isinstance(i, DeviceFailure)),
    )
