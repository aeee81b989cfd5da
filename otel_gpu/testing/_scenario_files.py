"""Scenario files of the vendor fakes: the built-in ones under ``scenarios/<vendor>/``, or a
JSON file given by path."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Any

__all__ = ["builtin_names", "read_scenario"]


def _directory(vendor: str) -> Any:
    return importlib.resources.files("otel_gpu.testing") / "scenarios" / vendor


def builtin_names(vendor: str) -> list[str]:
    """Names of the scenarios shipped under ``otel_gpu/testing/scenarios/<vendor>``."""
    return sorted(
        p.name.removesuffix(".json")
        for p in _directory(vendor).iterdir()
        if p.name.endswith(".json")
    )


def read_scenario(vendor: str, label: str, name: str, error: type[Exception]) -> dict[str, Any]:
    """The JSON object of scenario ``name`` (a built-in name or a ``.json`` path); ``error``
    (the fake's ScenarioError) when it is unknown or not an object."""
    path = Path(name)
    if path.suffix == ".json" and path.exists():
        text = path.read_text()
    else:
        entry = _directory(vendor) / f"{name}.json"
        if not entry.is_file():
            raise error(
                f"unknown {label} scenario {name!r} (built in: {', '.join(builtin_names(vendor))})"
            )
        text = entry.read_text()
    data = json.loads(text)
    if not isinstance(data, dict):
        raise error(f"{name}: a scenario is a JSON object")
    return data
