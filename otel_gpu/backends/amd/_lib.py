"""The one module that imports ``amdsmi`` (AMD SMI's Python package, ROCm ``amd-smi-lib``).

``import amdsmi`` loads ``libamd_smi.so`` at import time and raises ``KeyError`` (not
``ImportError``) when the library is missing, so the import is lazy and catches everything.
Every amdsmi call goes through :meth:`AmdSmi.call`: ``AMDSMI_STATUS_NOT_SUPPORTED`` /
``NOT_YET_IMPLEMENTED`` and functions this amdsmi lacks become ``None`` (cached per device and
quantity, logged once); ``AMDSMI_STATUS_NOT_FOUND`` / ``DRIVER_NOT_LOADED`` become
:class:`~otel_gpu.errors.DeviceLost`; anything else :class:`AmdCallError`. ``amdsmi_init`` is
reference-counted here (one ``amdsmi_init`` for the process, one ``amdsmi_shut_down`` when the
last user stops), so a probe, the backend and the event thread can share the library.

Status codes are those of ``amdsmi_status_t`` (``amdsmi.h``); the package's own
``amdsmi_wrapper`` constants win when present.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from otel_gpu.backends._common import UnsupportedCache
from otel_gpu.errors import BackendUnavailable, DeviceLost, OtelGpuError

__all__ = ["NA", "AmdCallError", "AmdSmi", "handle_address", "load", "na"]

_log = logging.getLogger(__name__)
_INIT_LOCK = threading.Lock()
_refcounts: dict[int, int] = {}  # id(amdsmi module) -> users (a test may swap in a fake module)

INSTALL_AMDSMI = (
    "the Python package amdsmi is not installed: pip install 'otel-gpu[amd]' "
    "(or use the amdsmi package shipped with ROCm in /opt/rocm/share/amd_smi)"
)
MISSING_LIBRARY = (
    "libamd_smi.so not found: install ROCm's amd-smi-lib (apt/dnf install amd-smi-lib) and "
    "make it visible (ROCM_PATH=/opt/rocm or LD_LIBRARY_PATH); in a container, mount "
    "/dev/kfd and /dev/dri"
)

# amdsmi_status_t (amdsmi.h)
STATUS = {
    "SUCCESS": 0,
    "INVAL": 1,
    "NOT_SUPPORTED": 2,
    "NOT_YET_IMPLEMENTED": 3,
    "FAIL_LOAD_MODULE": 4,
    "FAIL_LOAD_SYMBOL": 5,
    "DRM_ERROR": 6,
    "API_FAILED": 7,
    "TIMEOUT": 8,
    "RETRY": 9,
    "NO_PERM": 10,
    "INTERRUPT": 11,
    "IO": 12,
    "INIT_ERROR": 18,
    "BUSY": 30,
    "NOT_FOUND": 31,
    "NOT_INIT": 32,
    "DRIVER_NOT_LOADED": 34,
    "NO_DATA": 40,
    "AMDGPU_RESTART_ERR": 54,
}
NA = "N/A"


def na(value: Any) -> bool:
    """True for amdsmi's "not available" marker (``"N/A"``: the field held its max value)."""
    return value is None or (isinstance(value, str) and value.strip().upper() == NA)


class AmdCallError(OtelGpuError):
    """An amdsmi call failed with an error other than not-supported or device-lost."""

    def __init__(self, function: str, code: int | None, message: str) -> None:
        self.function = function
        self.code = code
        super().__init__(f"{function}: {message}")


def load() -> Any:
    """Import amdsmi, or raise :class:`BackendUnavailable` naming what to install."""
    try:
        import amdsmi
    except ImportError as err:
        raise BackendUnavailable("amd", INSTALL_AMDSMI) from err
    except Exception as err:  # KeyError('libamd_smi.so') / OSError: the C library is missing
        raise BackendUnavailable("amd", MISSING_LIBRARY) from err
    return amdsmi


def error_code(err: BaseException) -> int | None:
    """The ``amdsmi_status_t`` carried by an ``AmdSmiLibraryException``."""
    code = getattr(err, "err_code", None)
    if code is None:
        getter = getattr(err, "get_error_code", None)
        code = getter() if callable(getter) else None
    return int(code) if isinstance(code, int) else None


class AmdSmi(UnsupportedCache):
    """A handle on the amdsmi library: init/shutdown and the call chokepoint."""

    def __init__(self) -> None:
        super().__init__()
        self.mod: Any = None
        self._started = False
        self._codes: dict[str, int] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """``amdsmi_init(INIT_AMD_GPUS)`` for the first user. Raises BackendUnavailable."""
        mod = self.mod = self.mod or load()
        self._codes = {
            name: int(getattr(getattr(mod, "amdsmi_wrapper", None), f"AMDSMI_STATUS_{name}", v))
            for name, v in STATUS.items()
        }
        with _INIT_LOCK:
            if self._started:
                return
            if _refcounts.get(id(mod), 0) == 0:
                try:
                    flags = getattr(getattr(mod, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
                    mod.amdsmi_init(flags) if flags is not None else mod.amdsmi_init()
                except Exception as err:
                    raise BackendUnavailable("amd", self._init_reason(err)) from err
            _refcounts[id(mod)] = _refcounts.get(id(mod), 0) + 1
            self._started = True

    def stop(self) -> None:
        """``amdsmi_shut_down`` when the last user stops. Safe to call twice."""
        with _INIT_LOCK:
            if not self._started:
                return
            self._started = False
            left = _refcounts.get(id(self.mod), 1) - 1
            _refcounts[id(self.mod)] = left
            if left <= 0:
                _refcounts.pop(id(self.mod), None)
                try:
                    self.mod.amdsmi_shut_down()
                except Exception as err:
                    _log.debug("amdsmi_shut_down failed: %s", err)

    def _init_reason(self, err: Exception) -> str:
        code = error_code(err)
        if code == self.code("DRIVER_NOT_LOADED"):
            return "the amdgpu kernel driver is not loaded: install ROCm's amdgpu-dkms, modprobe amdgpu"
        if code == self.code("NO_PERM"):
            return (
                "no permission to open /dev/kfd or /dev/dri/renderD*: add the user to the "
                "'render' and 'video' groups"
            )
        if code in (self.code("FAIL_LOAD_MODULE"), self.code("FAIL_LOAD_SYMBOL")):
            return f"{MISSING_LIBRARY} ({err})"
        return f"amdsmi_init failed: {err}"

    # -- calls -------------------------------------------------------------------------------

    def code(self, name: str) -> int:
        """The numeric ``AMDSMI_STATUS_<name>``."""
        return self._codes.get(name, STATUS[name])

    def call(self, function: str, *args: Any, device: str = "", quantity: str = "") -> Any:
        """Call ``amdsmi.<function>(*args)``.

        Returns ``None`` when the quantity is not supported (or the function is missing in this
        amdsmi) and remembers it, so later sweeps skip the call. Raises DeviceLost or
        AmdCallError otherwise.
        """
        mod = self.mod
        quantity = quantity or function
        if not self.supported(device, quantity):
            return None
        wrapper = getattr(mod, function, None)
        if wrapper is None:
            self.unsupported(device, quantity, "not in this amdsmi")
            return None
        try:
            return wrapper(*args)
        except Exception as err:
            code = error_code(err)
            if code in (self.code("NOT_SUPPORTED"), self.code("NOT_YET_IMPLEMENTED")):
                self.unsupported(device, quantity, " ".join(str(err).split()))
                return None
            if code in (self.code("NOT_FOUND"), self.code("DRIVER_NOT_LOADED")):
                raise DeviceLost(
                    device or "amdsmi", f"{function}: {' '.join(str(err).split())}"
                ) from err
            if code is None and not isinstance(err, getattr(mod, "AmdSmiException", ())):
                raise AmdCallError(function, None, f"{type(err).__name__}: {err}") from err
            raise AmdCallError(function, code, " ".join(str(err).split())) from err

    def try_call(self, function: str, *args: Any, device: str = "", quantity: str = "") -> Any:
        """Like :meth:`call`, but an AmdCallError is logged at debug level and gives None."""
        try:
            return self.call(function, *args, device=device, quantity=quantity)
        except AmdCallError as err:
            _log.debug("%s: %s", device, err)
            return None

    def enum(self, enum_name: str, member: str, default: Any = None) -> Any:
        """A member of one of amdsmi's enums (``AmdSmiMemoryType.VRAM``...), or ``default``."""
        return getattr(getattr(self.mod, enum_name, None), member, default)

    def event_reader(self, handle: Any, names: list[str]) -> Any:
        """An ``AmdSmiEventReader`` for ``handle`` and the named notification types."""
        kinds = [
            getattr(self.mod.AmdSmiEvtNotificationType, n)
            for n in names
            if hasattr(self.mod.AmdSmiEvtNotificationType, n)
        ]
        return self.mod.AmdSmiEventReader(handle, kinds)

    def is_no_data(self, err: BaseException) -> bool:
        """An event read that timed out with nothing to report."""
        return error_code(err) in (self.code("NO_DATA"), self.code("TIMEOUT"))


def handle_address(handle: Any) -> int | None:
    """The address behind an amdsmi processor handle (a ctypes ``c_void_p``)."""
    value = getattr(handle, "value", handle)
    return int(value) if isinstance(value, int) else None
