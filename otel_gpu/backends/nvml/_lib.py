"""The one module that imports pynvml (package ``nvidia-ml-py``).

Every NVML call goes through :meth:`Nvml.call`: ``NotSupported``/``FunctionNotFound`` become
``None`` (cached per device and quantity, logged once), ``GpuIsLost`` becomes
:class:`~otel_gpu.errors.DeviceLost`, anything else :class:`NvmlCallError`. Initialisation is
lazy, locked and reference-counted, so the backend, a probe and the event thread can share it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from otel_gpu.backends._common import UnsupportedCache
from otel_gpu.errors import BackendUnavailable, DeviceLost, OtelGpuError

__all__ = ["Nvml", "NvmlCallError", "load"]

_log = logging.getLogger(__name__)
_INIT_LOCK = threading.Lock()
_refcount = 0

INSTALL_PYNVML = "the Python package nvidia-ml-py is not installed: pip install 'otel-gpu[nvidia]'"


class NvmlCallError(OtelGpuError):
    """An NVML call failed with an error other than not-supported or GPU-lost."""

    def __init__(self, function: str, code: int, message: str) -> None:
        self.function = function
        self.code = code
        super().__init__(f"{function}: {message}")


def load() -> Any:
    """Import pynvml, or raise :class:`BackendUnavailable` naming the package to install."""
    try:
        import pynvml
    except Exception as err:  # ImportError, or a broken install
        raise BackendUnavailable("nvml", INSTALL_PYNVML) from err
    return pynvml


def _init_reason(mod: Any, err: Exception) -> str:
    """A one-line reason for an nvmlInit failure, naming what to install or fix."""
    code = getattr(err, "value", None)
    if code == mod.NVML_ERROR_LIBRARY_NOT_FOUND:
        return (
            "NVML library libnvidia-ml.so.1 not found: install the NVIDIA driver "
            "(in a container, run it with the NVIDIA Container Toolkit, e.g. --gpus all)"
        )
    if code == mod.NVML_ERROR_DRIVER_NOT_LOADED:
        return "the NVIDIA kernel driver is not loaded: install or load it (modprobe nvidia)"
    if code == mod.NVML_ERROR_NO_PERMISSION:
        return "no permission to open /dev/nvidia*: grant the user access to the GPU device nodes"
    if code == mod.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return (
            "NVIDIA driver/library version mismatch: reboot or reload the driver after an upgrade"
        )
    return f"nvmlInit failed: {err}"


class Nvml(UnsupportedCache):
    """A handle on the NVML library: init/shutdown and the call chokepoint."""

    def __init__(self) -> None:
        super().__init__()
        self.mod: Any = None
        self._started = False

    def start(self) -> None:
        """nvmlInit (reference-counted). Raises BackendUnavailable with the reason."""
        global _refcount
        mod = self.mod = self.mod or load()
        with _INIT_LOCK:
            if self._started:
                return
            try:
                mod.nvmlInit()
            except mod.NVMLError as err:
                raise BackendUnavailable("nvml", _init_reason(mod, err)) from err
            except OSError as err:
                raise BackendUnavailable("nvml", f"cannot load libnvidia-ml.so.1: {err}") from err
            _refcount += 1
            self._started = True

    def stop(self) -> None:
        """nvmlShutdown for this handle's init. Safe to call twice."""
        global _refcount
        with _INIT_LOCK:
            if not self._started:
                return
            self._started = False
            _refcount -= 1
            try:
                self.mod.nvmlShutdown()
            except Exception as err:
                _log.debug("nvmlShutdown failed: %s", err)

    def call(self, function: str, *args: Any, device: str = "", quantity: str = "") -> Any:
        """Call ``pynvml.<function>(*args)``.

        Returns ``None`` when the quantity is not supported (or the function is missing in this
        driver) and remembers it, so the next sweep skips the call. Raises DeviceLost or
        NvmlCallError otherwise.
        """
        mod = self.mod
        quantity = quantity or function
        if not self.supported(device, quantity):
            return None
        wrapper = getattr(mod, function, None)
        if wrapper is None:  # an older nvidia-ml-py without this wrapper
            self.unsupported(device, quantity, "not in this nvidia-ml-py")
            return None
        try:
            return wrapper(*args)
        except mod.NVMLError as err:
            code = err.value
            if code in (mod.NVML_ERROR_NOT_SUPPORTED, mod.NVML_ERROR_FUNCTION_NOT_FOUND):
                self.unsupported(device, quantity, str(err))
                return None
            if code == mod.NVML_ERROR_GPU_IS_LOST:
                raise DeviceLost(device, str(err)) from err
            raise NvmlCallError(function, code, str(err)) from err

    def try_call(self, function: str, *args: Any, device: str = "", quantity: str = "") -> Any:
        """Like :meth:`call` but any NvmlCallError is logged at debug level and gives None."""
        try:
            return self.call(function, *args, device=device, quantity=quantity)
        except NvmlCallError as err:
            _log.debug("%s: %s", device, err)
            return None

    def const(self, name: str, default: Any = None) -> Any:
        """A pynvml constant (``NVML_FI_DEV_POWER_INSTANT``...), or ``default`` if absent."""
        return getattr(self.mod, name, default)

    def error_code(self, err: BaseException) -> int | None:
        """The NVML return code carried by ``err`` (or its cause)."""
        cause = err.__cause__ if not isinstance(err, self.mod.NVMLError) else err
        return getattr(cause, "value", None)
