"""Backend registry: the ``otel_gpu.backends`` entry-point group, loaded tolerantly.

A plug-in whose import fails is skipped with a debug log (and its error kept, so
``otel-gpu backends`` can show it); it never breaks the other backends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import cast

from otel_gpu.errors import ConfigError, UnknownBackend
from otel_gpu.hal.protocol import Backend, BackendFactory

__all__ = ["ENTRY_POINT_GROUP", "Registry", "Selector", "parse_selectors"]

ENTRY_POINT_GROUP = "otel_gpu.backends"
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Selector:
    """One element of a ``--backend`` value: a name and optional options (``simulated:8xH100``)."""

    name: str
    options: str | None = None

    def __str__(self) -> str:
        return self.name if self.options is None else f"{self.name}:{self.options}"


def parse_selectors(value: str, setting: str = "--backend") -> list[Selector]:
    """Parse ``auto``, ``nvml``, ``nvml,amd`` or ``simulated:<spec>`` into selectors.

    Commas separate backends, except inside a ``simulated:`` spec, which takes the rest of the
    value. Raises :class:`ConfigError` on an empty value or element.
    """
    text = value.strip()
    if not text:
        raise ConfigError(setting, "empty backend name", "auto, a backend name, or a list")
    selectors: list[Selector] = []
    rest = text
    while rest:
        head, sep, tail = rest.partition(",")
        name, colon, opts = head.partition(":")
        name = name.strip()
        if not name:
            raise ConfigError(setting, f"empty element in {value!r}", "names separated by ,")
        if colon and name == "simulated":  # a simulated spec may itself contain commas
            opts = rest.partition(":")[2]
            selectors.append(Selector(name, opts.strip() or None))
            break
        selectors.append(Selector(name, (opts.strip() or None) if colon else None))
        rest = tail.strip()
        if sep and not rest:
            raise ConfigError(setting, f"empty element in {value!r}", "names separated by ,")
    return selectors


class Registry:
    """The installed backends, loaded once from the entry-point group.

    ``extra`` adds factories directly (tests, embedding applications) and wins over entry points.
    """

    def __init__(self, extra: dict[str, BackendFactory] | None = None) -> None:
        self._factories: dict[str, BackendFactory] = {}
        self._errors: dict[str, str] = {}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in self._factories:
                continue
            try:
                self._factories[ep.name] = cast(BackendFactory, ep.load())
            except Exception as err:  # a broken plug-in must not break the others
                self._errors[ep.name] = f"{type(err).__name__}: {err}"
                _log.debug("skipping backend plug-in %r: %s", ep.name, err, exc_info=True)
        self._factories.update(extra or {})

    def names(self) -> list[str]:
        """Names of the backends that loaded, in registration order."""
        return list(self._factories)

    def load_errors(self) -> dict[str, str]:
        """Plug-ins that failed to import, with the error."""
        return dict(self._errors)

    def factory(self, name: str) -> BackendFactory:
        """The factory registered under ``name``; :class:`UnknownBackend` if there is none."""
        try:
            return self._factories[name]
        except KeyError:
            if name in self._errors:
                raise ConfigError(
                    "backend", f"backend {name!r} failed to load: {self._errors[name]}"
                ) from None
            raise UnknownBackend(name, self.names()) from None

    def create(self, selector: Selector) -> Backend:
        """Instantiate the backend named by ``selector``."""
        return self.factory(selector.name)(selector.options)
