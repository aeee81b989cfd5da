"""The otel-gpu exception tree.

Every error raised by otel-gpu on purpose derives from :class:`OtelGpuError`::

    OtelGpuError
    ├── ConfigError            bad CLI flag, env var, spec or file (exit code 2)
    ├── BackendUnavailable     vendor library or driver missing (names what to install)
    ├── UnknownBackend         a backend name that no plug-in registers
    ├── DeviceLost             one device stopped answering; the others go on
    └── NotSupported           a quantity the device or driver cannot report

Vendor errors are chained (``raise ... from err``) so the original message is kept.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "ConfigError",
    "DeviceLost",
    "NotSupported",
    "OtelGpuError",
    "UnknownBackend",
]


class OtelGpuError(Exception):
    """Root of every error otel-gpu raises deliberately."""


class ConfigError(OtelGpuError):
    """Invalid configuration: a CLI flag, an ``OTEL_GPU_*``/``OTEL_*`` value, a spec or a file.

    ``setting`` names the flag or variable; ``accepted`` says what would be valid.
    """

    def __init__(self, setting: str, message: str, accepted: str | None = None) -> None:
        self.setting = setting
        self.accepted = accepted
        text = f"{setting}: {message}"
        if accepted:
            text += f" (accepted: {accepted})"
        super().__init__(text)


class UnknownBackend(ConfigError):
    """A backend name that no installed plug-in provides."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__("backend", f"unknown backend {name!r}", ", ".join(["auto", *known]))


class BackendUnavailable(OtelGpuError):
    """A backend cannot run here: its vendor library or driver is missing or failed to start.

    ``backend`` is the backend name, ``reason`` a one-line explanation naming what to install.
    """

    def __init__(self, backend: str, reason: str) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(f"backend {backend!r} is unavailable: {reason}")


class DeviceLost(OtelGpuError):
    """One device stopped answering (fell off the bus, driver reset). Other devices go on."""

    def __init__(self, device_id: str, reason: str) -> None:
        self.device_id = device_id
        self.reason = reason
        super().__init__(f"device {device_id} lost: {reason}")


class NotSupported(OtelGpuError):
    """The device or driver cannot report ``quantity``; reported as absent, never as 0 or NaN."""

    def __init__(self, quantity: str, device_id: str | None = None) -> None:
        self.quantity = quantity
        self.device_id = device_id
        where = f" on {device_id}" if device_id else ""
        super().__init__(f"{quantity} not supported{where}")
