"""The one module that imports ``pyzes`` (Intel's Python bindings for Level Zero Sysman).

``import pyzes`` loads ``libze_loader.so.1`` at import time and raises ``OSError`` when it is
missing, so the import is lazy and catches everything. pyzes functions return a
``ze_result_t`` and fill ctypes structures passed by reference; every call goes through
:meth:`Zes.call`: ``ZE_RESULT_ERROR_UNSUPPORTED_FEATURE`` (and a function this pyzes or loader
lacks) becomes "not supported" (cached per device and quantity, logged once),
``ZE_RESULT_ERROR_DEVICE_LOST`` / ``DEVICE_REQUIRES_RESET`` become
:class:`~otel_gpu.errors.DeviceLost`, anything else :class:`ZesCallError`.

pyzes 0.1.3 has no RAS bindings; the RAS functions (``zesDeviceEnumRasErrorSets``,
``zesRasGetProperties``, ``zesRasGetState``) are bound here through pyzes'
``getFunctionPointerList`` with the structures of ``zes_api.h``.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from otel_gpu.backends._common import UnsupportedCache
from otel_gpu.errors import BackendUnavailable, DeviceLost, OtelGpuError

__all__ = ["RESULT", "RasProperties", "RasState", "Zes", "ZesCallError", "load"]

_log = logging.getLogger(__name__)
_INIT_LOCK = threading.Lock()

INSTALL_PYZES = "the Python package pyzes is not installed: pip install 'otel-gpu[intel]'"
MISSING_LOADER = (
    "the Level Zero loader (libze_loader.so.1) could not be loaded: install level-zero and "
    "Intel's GPU compute runtime (Debian/Ubuntu: libze1 libze-intel-gpu1, or "
    "intel-level-zero-gpu); in a container, pass /dev/dri"
)

# ze_result_t (ze_api.h)
RESULT = {
    "SUCCESS": 0,
    "NOT_READY": 1,
    "ERROR_DEVICE_LOST": 0x70000001,
    "ERROR_DEVICE_REQUIRES_RESET": 0x70000006,
    "ERROR_DEVICE_IN_LOW_POWER_STATE": 0x70000007,
    "ERROR_INSUFFICIENT_PERMISSIONS": 0x70010000,
    "ERROR_NOT_AVAILABLE": 0x70010001,
    "ERROR_DEPENDENCY_UNAVAILABLE": 0x70020000,
    "ERROR_UNINITIALIZED": 0x78000001,
    "ERROR_UNSUPPORTED_VERSION": 0x78000002,
    "ERROR_UNSUPPORTED_FEATURE": 0x78000003,
    "ERROR_INVALID_ARGUMENT": 0x78000004,
    "ERROR_UNSUPPORTED_ENUMERATION": 0x7800000D,
    "ERROR_UNKNOWN": 0x7FFFFFFE,
}
_NAMES = {v: k for k, v in RESULT.items()}
_UNSUPPORTED = (RESULT["ERROR_UNSUPPORTED_FEATURE"], RESULT["ERROR_UNSUPPORTED_ENUMERATION"])
_LOST = (RESULT["ERROR_DEVICE_LOST"], RESULT["ERROR_DEVICE_REQUIRES_RESET"])
ZES_STRUCTURE_TYPE_RAS_PROPERTIES = 0xF
ZES_STRUCTURE_TYPE_RAS_STATE = 0x22
ZES_MAX_RAS_ERROR_CATEGORY_COUNT = 7


class RasProperties(ctypes.Structure):
    """``zes_ras_properties_t`` (zes_api.h)."""

    _fields_ = (
        ("stype", ctypes.c_int32),
        ("pNext", ctypes.c_void_p),
        ("type", ctypes.c_int32),
        ("onSubdevice", ctypes.c_uint8),
        ("subdeviceId", ctypes.c_uint32),
    )


class RasState(ctypes.Structure):
    """``zes_ras_state_t`` (zes_api.h): one counter per ``zes_ras_error_cat_t``."""

    _fields_ = (
        ("stype", ctypes.c_int32),
        ("pNext", ctypes.c_void_p),
        ("category", ctypes.c_uint64 * ZES_MAX_RAS_ERROR_CATEGORY_COUNT),
    )


class _RasHandle(ctypes.c_void_p):
    """``zes_ras_handle_t``."""


def result_name(code: int) -> str:
    """``ZE_RESULT_<name>`` of a code (hex when unknown)."""
    name = _NAMES.get(code)
    return f"ZE_RESULT_{name}" if name else f"ze_result_t 0x{code:08x}"


class ZesCallError(OtelGpuError):
    """A Level Zero Sysman call failed with an error other than unsupported or device-lost."""

    def __init__(self, function: str, code: int) -> None:
        self.function = function
        self.code = code
        super().__init__(f"{function}: {result_name(code)}")


def load() -> Any:
    """Import pyzes, or raise :class:`BackendUnavailable` naming what to install."""
    try:
        import pyzes
    except ImportError as err:
        raise BackendUnavailable("intel", INSTALL_PYZES) from err
    except Exception as err:  # OSError from CDLL('libze_loader.so.1') at import time
        raise BackendUnavailable("intel", f"{MISSING_LOADER} ({err})") from err
    return pyzes


def _init_reason(code: int) -> str:
    if code == RESULT["ERROR_UNINITIALIZED"]:
        return (
            "no Level Zero GPU driver answered zesInit: load Intel's kernel driver (i915 or xe) "
            "and install the compute runtime (libze-intel-gpu1 / intel-level-zero-gpu)"
        )
    if code == RESULT["ERROR_INSUFFICIENT_PERMISSIONS"]:
        return "no permission to open /dev/dri/renderD*: add the user to the 'render' group"
    if code == RESULT["ERROR_UNSUPPORTED_FEATURE"]:
        return "this Level Zero driver has no Sysman support: update the compute runtime"
    return f"zesInit failed: {result_name(code)}"


class Zes(UnsupportedCache):
    """A handle on Level Zero Sysman through pyzes: init and the call chokepoint."""

    def __init__(self) -> None:
        super().__init__()
        self.mod: Any = None
        self._started = False
        self._ras: dict[str, Any] = {}

    def start(self) -> None:
        """``zesInit(0)`` (idempotent in Level Zero). Raises BackendUnavailable."""
        mod = self.mod = self.mod or load()
        with _INIT_LOCK:
            if self._started:
                return
            try:
                rc = int(mod.zesInit(0))
            except Exception as err:
                raise BackendUnavailable("intel", f"zesInit failed: {err}") from err
            if rc != RESULT["SUCCESS"]:
                raise BackendUnavailable("intel", _init_reason(rc))
            self._started = True

    def stop(self) -> None:
        """Level Zero has no Sysman shutdown; forget our handles. Safe to call twice."""
        self._started = False

    # -- calls -------------------------------------------------------------------------------

    def function(self, name: str) -> Any:
        """A pyzes wrapper; the RAS calls (which pyzes 0.1.3 lacks) are always bound here,
        with our ``zes_api.h`` structures, so they do not depend on the pyzes version."""
        if name in _RAS_SIGNATURES:
            return self._ras_function(name)
        return getattr(self.mod, name, None)

    def _ras_function(self, name: str) -> Any:
        if name in self._ras:
            return self._ras[name]
        getter = getattr(self.mod, "getFunctionPointerList", None)
        if getter is None:
            return None
        try:
            fn = getter(name)
        except Exception as err:  # an old loader without the symbol
            _log.debug("%s: %s", name, err)
            return None
        fn.argtypes = _RAS_SIGNATURES[name]
        fn.restype = ctypes.c_int32
        self._ras[name] = fn
        return fn

    def call(self, name: str, *args: Any, device: str = "", quantity: str = "") -> bool | None:
        """Call ``name(*args)``: True on success, None when not supported (remembered).

        Raises DeviceLost or ZesCallError otherwise.
        """
        quantity = quantity or name
        if not self.supported(device, quantity):
            return None
        fn = self.function(name)
        if fn is None:
            self.unsupported(device, quantity, "not in this pyzes / Level Zero loader")
            return None
        rc = int(fn(*args))
        if rc == RESULT["SUCCESS"]:
            return True
        if rc in _UNSUPPORTED:
            self.unsupported(device, quantity, result_name(rc))
            return None
        if rc in _LOST:
            raise DeviceLost(device or "level-zero", f"{name}: {result_name(rc)}")
        raise ZesCallError(name, rc)

    def try_call(self, name: str, *args: Any, device: str = "", quantity: str = "") -> bool | None:
        """Like :meth:`call`, but a ZesCallError is logged at debug level and gives None."""
        try:
            return self.call(name, *args, device=device, quantity=quantity)
        except ZesCallError as err:
            _log.debug("%s: %s", device, err)
            return None

    def enum(
        self, name: str, parent: Any, handle_type: Any, device: str = "", quantity: str = ""
    ) -> list[Any]:
        """The handles of a ``zes*Enum*`` / ``*Get`` function (count, then array protocol)."""
        count = ctypes.c_uint32(0)
        if not self.call(
            name, *_first(parent), ctypes.byref(count), None, device=device, quantity=quantity
        ):
            return []
        if count.value == 0:
            return []
        array = (handle_type * count.value)()
        if not self.call(
            name, *_first(parent), ctypes.byref(count), array, device=device, quantity=quantity
        ):
            return []
        return [
            handle_type(array[i]) if not isinstance(array[i], handle_type) else array[i]
            for i in range(count.value)
        ]

    def struct(self, name: str, stype: str | None = None) -> Any:
        """A new pyzes structure ``name`` with its ``stype`` set."""
        obj = getattr(self.mod, name)()
        if stype is not None:
            obj.stype = int(getattr(self.mod, stype))
        return obj

    def const(self, name: str, default: Any = None) -> Any:
        """A pyzes constant (``ZES_ENGINE_GROUP_COMPUTE_ALL``...), or ``default``."""
        return getattr(self.mod, name, default)

    def ras_handle_type(self) -> Any:
        """``zes_ras_handle_t`` as bound here."""
        return _RasHandle


def _first(parent: Any) -> tuple[Any, ...]:
    """The leading arguments of an enumeration: () for ``zesDriverGet``, (parent,) otherwise."""
    return () if parent is None else (parent,)


_RAS_SIGNATURES: dict[str, list[Any]] = {
    "zesDeviceEnumRasErrorSets": [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.POINTER(_RasHandle),
    ],
    "zesRasGetProperties": [_RasHandle, ctypes.POINTER(RasProperties)],
    "zesRasGetState": [_RasHandle, ctypes.c_uint8, ctypes.POINTER(RasState)],
}
