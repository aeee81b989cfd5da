"""Parsing of simulated-node specs: ``simulated:<spec>`` on the command line, or a JSON file.

Spec string: comma-separated ``key=value`` items, a preset name, or a JSON file path::

    simulated                                  8x H100 SXM behind NVSwitches (the default)
    simulated:count=4,topology=pcie,model=NVIDIA L40S,memory_gib=48
    simulated:vendor=amd                       8x MI300X, xGMI mesh
    simulated:mig=0:3,faults=lost@3:5;xid79@1:2;ecc@0:1
    simulated:/etc/otel-gpu/node.json          the same keys as a JSON object

Keys: ``count`` (1..1024), ``vendor`` (nvidia, amd, intel, tpu, neuron), ``model``,
``memory_gib``, ``power_limit_w``, ``topology`` (nvswitch, mesh, pcie), ``idle`` (true: no
load, no processes: a node waiting for a job), ``mig``
(``<device>:<instances>``, several joined with ``/``), ``seed``, ``faults``.
Faults are ``<kind>@<device>[:<cycle>]`` joined with ``;`` (JSON: a list); the cycle is the
sweep number (0 = first) at which the fault starts. Kinds: ``lost`` (device lost), ``recover``
(a lost device answers again), ``xid<code>`` (an Xid event), ``ecc`` (one uncorrectable ECC
error), ``ecc-corrected``, ``throttle-thermal``, ``throttle-power``, ``link-down`` (first
interconnect link goes down), ``row-remap-failure``, ``retirement-pending``, ``pcie-degraded``
(link trained below maximum width), ``hot`` (temperature above the slowdown threshold),
``hang`` (reading the device blocks, as a wedged driver call does, on that one sweep).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_gpu.errors import ConfigError

__all__ = ["FAULT_KINDS", "VENDOR_PRESETS", "Fault", "SimSpec", "parse_spec"]

SETTING = "simulated spec"

FAULT_KINDS = (
    "lost",
    "recover",
    "xid",
    "ecc",
    "ecc-corrected",
    "throttle-thermal",
    "throttle-power",
    "link-down",
    "row-remap-failure",
    "retirement-pending",
    "pcie-degraded",
    "hot",
    "hang",
)


@dataclass(frozen=True, slots=True)
class VendorPreset:
    """Defaults for a simulated vendor."""

    model: str
    memory_gib: float
    power_limit_w: float | None
    topology: str
    kind: str = "gpu"
    links: int = 0
    link_type: str = "nvlink"
    cores: int = 0


VENDOR_PRESETS: dict[str, VendorPreset] = {
    "nvidia": VendorPreset("NVIDIA H100 80GB HBM3", 80, 700.0, "nvswitch", links=18),
    "amd": VendorPreset("AMD Instinct MI300X", 192, 750.0, "mesh", links=7, link_type="xgmi"),
    "intel": VendorPreset("Intel Data Center GPU Max 1550", 128, 600.0, "pcie"),
    "tpu": VendorPreset("TPU v5 lite", 16, None, "pcie", kind="tpu"),
    "neuron": VendorPreset("Trainium1", 32, None, "pcie", kind="neuron", cores=2),
}
_TOPOLOGIES = ("nvswitch", "mesh", "pcie")
_MAX_DEVICES = 1024


@dataclass(frozen=True, slots=True)
class Fault:
    """A scripted fault: ``kind`` on device ``device`` from sweep ``cycle`` on."""

    kind: str
    device: int
    cycle: int = 0
    code: int | None = None


@dataclass(frozen=True, slots=True)
class SimSpec:
    """A parsed simulated node."""

    count: int = 8
    vendor: str = "nvidia"
    model: str = ""
    memory_gib: float = 0.0
    power_limit_w: float | None = None
    topology: str = ""
    mig: dict[int, int] = field(default_factory=dict)
    seed: int = 0
    faults: tuple[Fault, ...] = ()
    idle: bool = False

    @property
    def preset(self) -> VendorPreset:
        """The vendor preset behind this spec."""
        return VENDOR_PRESETS[self.vendor]


_FAULT_RE = re.compile(r"^(?P<kind>[a-z-]+?)(?P<code>\d+)?@(?P<dev>\d+)(?::(?P<cycle>\d+))?$")


def _parse_fault(text: str, count: int) -> Fault:
    m = _FAULT_RE.match(text.strip())
    if not m:
        raise ConfigError(
            SETTING, f"malformed fault {text!r}", "<kind>@<device>[:<cycle>], e.g. lost@3:5"
        )
    kind, code = m.group("kind"), m.group("code")
    if kind not in FAULT_KINDS or (code is not None) != (kind == "xid"):
        raise ConfigError(
            SETTING,
            f"unknown fault kind in {text!r}",
            ", ".join(k if k != "xid" else "xid<code>" for k in FAULT_KINDS),
        )
    device = int(m.group("dev"))
    if device >= count:
        raise ConfigError(SETTING, f"fault {text!r} names device {device} of {count}")
    return Fault(kind, device, int(m.group("cycle") or 0), int(code) if code else None)


def _int(key: str, value: Any, lo: int, hi: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(SETTING, f"{key}={value!r} is not an integer", f"{lo}..{hi}") from None
    if not lo <= number <= hi:
        raise ConfigError(SETTING, f"{key}={number} out of range", f"{lo}..{hi}")
    return number


def _float(key: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(SETTING, f"{key}={value!r} is not a number") from None
    if not (0 < number < math.inf):
        raise ConfigError(SETTING, f"{key}={value!r} must be a positive number")
    return number


def _from_mapping(items: dict[str, Any]) -> SimSpec:
    known = {
        "count",
        "vendor",
        "model",
        "memory_gib",
        "power_limit_w",
        "topology",
        "mig",
        "seed",
        "faults",
        "idle",
    }
    unknown = sorted(set(items) - known)
    if unknown:
        raise ConfigError(SETTING, f"unknown key {unknown[0]!r}", ", ".join(sorted(known)))
    vendor = str(items.get("vendor", "nvidia")).strip().lower()
    if vendor not in VENDOR_PRESETS:
        raise ConfigError(SETTING, f"unknown vendor {vendor!r}", ", ".join(VENDOR_PRESETS))
    preset = VENDOR_PRESETS[vendor]
    count = _int("count", items.get("count", 8), 1, _MAX_DEVICES)
    topology = str(items.get("topology", preset.topology)).strip().lower()
    if topology not in _TOPOLOGIES:
        raise ConfigError(SETTING, f"unknown topology {topology!r}", ", ".join(_TOPOLOGIES))
    mig: dict[int, int] = {}
    raw_mig = items.get("mig") or ""
    parts = raw_mig if isinstance(raw_mig, list) else str(raw_mig).split("/")
    for part in parts:
        if not str(part).strip():
            continue
        dev, sep, n = str(part).partition(":")
        if not sep:
            raise ConfigError(SETTING, f"malformed mig {part!r}", "<device>:<instances>, e.g. 0:3")
        index = _int("mig device", dev, 0, count - 1)
        mig[index] = _int("mig instances", n, 1, 7)
    raw_faults = items.get("faults") or []
    fault_texts = raw_faults if isinstance(raw_faults, list) else str(raw_faults).split(";")
    faults = tuple(_parse_fault(str(f), count) for f in fault_texts if str(f).strip())
    power = items.get("power_limit_w")
    return SimSpec(
        count=count,
        vendor=vendor,
        model=str(items.get("model") or preset.model),
        memory_gib=_float("memory_gib", items.get("memory_gib", preset.memory_gib)),
        power_limit_w=_float("power_limit_w", power) if power is not None else preset.power_limit_w,
        topology=topology,
        mig=mig,
        seed=_int("seed", items.get("seed", 0), 0, 2**31),
        faults=faults,
        idle=_bool("idle", items.get("idle", False)),
    )


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ConfigError(SETTING, f"{key}={value!r} is not a boolean", "true, false")


def parse_spec(text: str | None) -> SimSpec:
    """Parse a spec string (or ``None`` for the default 8-GPU node). Raises ConfigError."""
    if text is None or not text.strip():
        return _from_mapping({})
    text = text.strip()
    if text.endswith(".json") or text.startswith(("/", "./", "~")):
        try:
            path = Path(text).expanduser()
        except (RuntimeError, ValueError):  # "~someone" with no such user, a NUL byte
            raise ConfigError(SETTING, f"cannot expand the home directory in {text!r}") from None
        return _from_file(path)
    if text in VENDOR_PRESETS:
        return _from_mapping({"vendor": text})
    items: dict[str, Any] = {}
    # faults use ';' between entries, so a plain ',' split keeps them together.
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                SETTING,
                f"malformed item {part!r}",
                "key=value items separated by ',', a vendor name, or a .json file",
            )
        items[key.strip().lower()] = value.strip()
    return _from_mapping(items)


def _from_file(path: Path) -> SimSpec:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(SETTING, f"spec file {str(path)!r} does not exist") from None
    except json.JSONDecodeError as err:
        raise ConfigError(SETTING, f"spec file {str(path)!r} is not valid JSON: {err}") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:  # ValueError: a NUL in the path
        raise ConfigError(SETTING, f"cannot read spec file {str(path)!r}: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(SETTING, f"spec file {str(path)!r} must hold a JSON object")
    return _from_mapping(data)
