"""The contracts a backend fulfils. Backends implement them structurally; nothing to subclass.

Lifecycle (DESIGN §3)::

    probe()  -> cheap, never raises: available, or why not
    open()   -> initialises the vendor library (raises BackendUnavailable)
    inventory() -> static devices and topology, read once (backend-local indices)
    sample() -> one sweep of every device: a Snapshot (per-device failures inside it)
    close()  -> releases the vendor library

A backend that can push events as they happen (NVML Xid, amdsmi events) also implements
:class:`EventSource`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from otel_gpu.hal.model import HealthEvent, Inventory, Snapshot

__all__ = ["Backend", "BackendFactory", "EventSink", "EventSource", "Probe"]

EventSink = Callable[[HealthEvent], None]


@dataclass(frozen=True, slots=True)
class Probe:
    """Result of :meth:`Backend.probe`: whether the backend can run here and, if not, why.

    ``reason`` is one line naming what is missing (package, driver, device node) and what to do.
    """

    available: bool
    reason: str = ""
    device_count: int | None = None


@runtime_checkable
class Backend(Protocol):
    """A source of accelerator telemetry for one vendor (or one simulated node).

    Class attributes: ``name`` is the registry name; ``auto`` says whether ``--backend auto``
    probes it; ``fallback_for`` names the backend it replaces when that one is unavailable
    (``nvidia-smi`` falls back for ``nvml``).
    """

    name: ClassVar[str]
    auto: ClassVar[bool]
    fallback_for: ClassVar[str | None]

    def probe(self) -> Probe:
        """Say cheaply whether this backend can run here. Never raises."""
        ...

    def open(self) -> None:
        """Initialise the vendor library. Raises ``BackendUnavailable`` with the reason."""
        ...

    def inventory(self) -> Inventory:
        """Static devices and topology, with backend-local indices starting at 0."""
        ...

    def sample(self) -> Snapshot:
        """One sweep of every device. Devices that fail are listed in ``Snapshot.failures``."""
        ...

    def close(self) -> None:
        """Release the vendor library. Safe to call twice."""
        ...


@runtime_checkable
class EventSource(Protocol):
    """A backend that reports health events as they happen (driver event queues)."""

    def start_events(self, sink: EventSink) -> None:
        """Start delivering events to ``sink`` (from a background thread)."""
        ...

    def stop_events(self) -> None:
        """Stop delivering events and join the background thread."""
        ...


class BackendFactory(Protocol):
    """What the ``otel_gpu.backends`` entry point loads: ``factory(options) -> Backend``.

    ``options`` is the text after ``name:`` in a backend selector (``simulated:8xH100``), or None.
    """

    name: ClassVar[str]
    auto: ClassVar[bool]
    fallback_for: ClassVar[str | None]

    def __call__(self, options: str | None = None) -> Backend: ...
