"""Code the vendor backends share (no vendor imports here).

- :class:`UnsupportedCache`: quantities a device cannot report, asked once and logged once;
- :class:`LostState`: a device that fell off the bus, probed again with exponential backoff;
- :func:`sample_by_sweep`: a Snapshot from a backend's ``sweep(emit)``;
- :class:`LibraryBackend`: the lifecycle of a backend over a vendor library handle.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from otel_gpu.errors import BackendUnavailable, DeviceLost
from otel_gpu.hal.model import DeviceFailure, DeviceInfo, DeviceSample, Inventory, Snapshot

__all__ = ["LibraryBackend", "LostState", "UnsupportedCache", "VendorLibrary", "sample_by_sweep"]

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


class VendorLibrary(Protocol):
    """A vendor library handle: initialised by ``start`` (raising BackendUnavailable), released
    by ``stop`` (safe twice)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Unit(Protocol):
    """What a backend reads as one piece in a sweep: a GPU (with its MIG instances or
    partitions), or a card (with its tiles)."""

    info: DeviceInfo
    lost: LostState
    slow: dict[str, Any]


class LibraryBackend(ABC):
    """The lifecycle shared by backends over a vendor library (NVML, amdsmi, Level Zero):
    ``open`` starts the library and reads the inventory once (releasing the library if that
    fails), ``sample`` gathers one ``sweep``, ``close`` stops driver events and the library.

    ``sweep`` reads each unit in turn (:meth:`_units`, :meth:`_read_unit`) and hands what it
    read to ``emit`` at once; a unit that raises ``DeviceLost`` is marked lost and probed again
    with backoff (:meth:`_retry_lost`), one that raises :attr:`call_error` fails this sweep
    only. Slow reads happen every ``slow_every`` sweeps (and on a unit's first).
    """

    _inventory: Inventory | None = None
    collect_processes: bool = False
    call_error: ClassVar[type[Exception]] = Exception
    slow_every: int = 6
    _sweep: int = 0
    _clock: Callable[[], float]
    _sweep_lock = threading.Lock()
    name: ClassVar[str]

    def __init__(
        self,
        options: str | None = None,
        *,
        sysfs_root: Path = Path("/"),
        slow_every: int = 6,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``sysfs_root`` is where ``sys/bus/pci`` is read (tests); ``slow_every`` sets how many
        sweeps pass between slow-path reads; ``clock`` is monotonic seconds (backoff)."""
        if options:
            raise BackendUnavailable(
                self.name, f"the {self.name} backend takes no options (got {options!r})"
            )
        self._root = sysfs_root
        self.slow_every = max(1, slow_every)
        self._clock = clock
        self._sweep = 0

    @property
    @abstractmethod
    def library(self) -> VendorLibrary:
        """The vendor library handle."""

    @abstractmethod
    def _read_inventory(self) -> Inventory:
        """Read the static inventory (the library is started)."""

    @abstractmethod
    def _units(self) -> Sequence[Any]:
        """The units to read, in order (each a :class:`Unit`)."""

    @abstractmethod
    def _read_unit(self, unit: Any, slow: bool) -> list[DeviceSample]:
        """Read one unit: its sample and its children's. Raises DeviceLost or call_error."""

    @abstractmethod
    def _unit_failures(self, unit: Any, reason: str, lost: bool) -> list[DeviceFailure]:
        """Failures for a unit and its children."""

    @abstractmethod
    def _retry_lost(self, unit: Any, now: float) -> bool:
        """Probe a lost unit whose backoff has passed; True when it answers again."""

    def _mark_lost(self, unit: Any, reason: str, now: float) -> None:
        unit.lost.mark(f"{unit.info.name} ({unit.info.id})", reason, now)

    def sweep(self, emit: Emit) -> None:
        """One sweep, handing each device to ``emit`` as soon as it is read (so a later device
        whose call hangs does not hold back the ones already read)."""
        self.inventory()
        with self._sweep_lock:
            slow = self._sweep % self.slow_every == 0
            self._sweep += 1
        now = self._clock()
        for unit in self._units():
            broken = getattr(unit, "broken_reason", None)
            if broken is not None:  # unreadable since open (not lost): keeps failing
                failures = self._unit_failures(unit, broken, lost=False)
            elif unit.lost.lost and not self._retry_lost(unit, now):
                failures = self._unit_failures(unit, unit.lost.reason or "lost", lost=True)
            else:
                try:
                    samples = self._read_unit(unit, slow or not unit.slow)
                except DeviceLost as err:
                    self._mark_lost(unit, err.reason, now)
                    failures = self._unit_failures(unit, err.reason, lost=True)
                except self.call_error as err:
                    failures = self._unit_failures(unit, str(err), lost=False)
                else:
                    for sample in samples:
                        emit(sample)
                    continue
            for failure in failures:
                emit(failure)

    def open(self) -> None:
        """Start the vendor library and read the static inventory."""
        self.library.start()
        try:
            self._inventory = self._read_inventory()
        except BaseException:
            self.library.stop()
            raise

    def close(self) -> None:
        """Stop driver events (if any) and release the vendor library. Safe to call twice."""
        stop_events = getattr(self, "stop_events", None)
        if callable(stop_events):
            stop_events()
        self.library.stop()

    def inventory(self) -> Inventory:
        """The static inventory read at open (opening first if needed)."""
        if self._inventory is None:
            self.open()
        assert self._inventory is not None
        return self._inventory

    def enable(self, feature: str) -> None:
        """Turn on an opt-in collection (``processes``)."""
        if feature == "processes":
            self.collect_processes = True

    def sample(self) -> Snapshot:
        """One sweep of every device."""
        return sample_by_sweep(self.sweep)
