"""The ``gpu`` resource detector: the node's accelerator topology on any application's Resource.

Registered in the ``opentelemetry_resource_detector`` entry-point group, so an application
configured by the SDK (``opentelemetry-instrument``, or ``Resource.create()``) gets the
``accel.*`` topology attributes of DESIGN §5 with::

    OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=gpu

The SDK always runs its ``otel`` detector (``OTEL_RESOURCE_ATTRIBUTES``/``OTEL_SERVICE_NAME``)
last, so values set there win; list ``otel,gpu`` to let the detected topology win instead.

The backends come from ``OTEL_GPU_BACKEND`` (default ``auto``) and the device selection from
``OTEL_GPU_DEVICES`` and ``OTEL_GPU_SCOPE``, as for the metrics, so the parallel arrays describe
the same devices as the series. A node without accelerators, or any failure, gives an empty
Resource and a log line; with ``raise_on_error=True`` the error is raised instead.

The SDK builds Resources more than once per process (one is even built while
``opentelemetry.sdk._logs`` is imported), so a detected topology is kept for the process's
lifetime: the backends are opened once, not once per Resource.
"""

from __future__ import annotations

import logging
import os
import threading

from opentelemetry.sdk.resources import Resource, ResourceDetector

from otel_gpu.config import Settings, sdk_disabled
from otel_gpu.errors import BackendUnavailable
from otel_gpu.hal.manager import DeviceFilter, DeviceManager
from otel_gpu.hal.registry import Registry
from otel_gpu.otel.resource import topology_attributes

__all__ = ["GpuResourceDetector"]

_log = logging.getLogger(__name__)
_cache: dict[tuple[int, Settings, DeviceFilter | None], Resource] = {}
_cache_lock = threading.Lock()


class GpuResourceDetector(ResourceDetector):
    """Detects the accelerator topology of this node (``accel.*`` resource attributes).

    ``settings`` and ``registry`` default to the environment and the installed backends.
    """

    def __init__(
        self,
        raise_on_error: bool = False,
        *,
        settings: Settings | None = None,
        registry: Registry | None = None,
    ) -> None:
        super().__init__(raise_on_error=raise_on_error)
        self._settings = settings
        self._registry = registry

    def detect(self) -> Resource:
        """The topology Resource; empty when there is nothing to report or detection failed."""
        try:
            return self._detect()
        except Exception as err:
            if self.raise_on_error:
                raise
            auto = isinstance(err, BackendUnavailable) and err.backend == "auto"
            # A node without accelerators is normal where the detector is enabled fleet-wide.
            _log.log(
                logging.DEBUG if auto else logging.WARNING,
                "gpu resource detector: no topology: %s",
                err,
                exc_info=_log.isEnabledFor(logging.DEBUG),
            )
            return Resource.get_empty()

    def _detect(self) -> Resource:
        if sdk_disabled():
            return Resource.get_empty()
        settings = self._settings or Settings.from_env(standard=False)
        device_filter = settings.device_filter()
        if self._registry is not None:  # an injected registry is never cached
            return self._open(settings, device_filter)
        key = (os.getpid(), settings, device_filter)
        with _cache_lock:
            if key not in _cache:
                _cache[key] = self._open(settings, device_filter)
            return _cache[key]

    def _open(self, settings: Settings, device_filter: DeviceFilter | None) -> Resource:
        manager = DeviceManager.from_selector(
            settings.backend,
            registry=self._registry,
            device_filter=device_filter,
            setting="OTEL_GPU_BACKEND",
        )
        with manager:
            inventory = manager.inventory
        return Resource(topology_attributes(inventory))
