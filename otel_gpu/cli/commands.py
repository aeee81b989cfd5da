"""The subcommands behind ``otel-gpu``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any

from otel_gpu.config import Settings
from otel_gpu.errors import ConfigError
from otel_gpu.hal.manager import DeviceManager, probe_all
from otel_gpu.hal.model import DeviceInfo, Inventory, Severity, interconnect_domains
from otel_gpu.hal.registry import Registry
from otel_gpu.health.monitor import HealthMonitor

__all__ = ["backends", "health", "inventory", "run"]

_log = logging.getLogger("otel_gpu.cli")
SHUTDOWN_BUDGET_S = 4.0
NAGIOS = {0: "OK", 1: "WARNING", 2: "CRITICAL", 3: "UNKNOWN"}


def _manager(args: argparse.Namespace, settings: Settings) -> DeviceManager:
    setting = "--backend" if getattr(args, "backend", None) else "OTEL_GPU_BACKEND"
    return DeviceManager.from_selector(
        settings.backend,
        device_filter=settings.devices,
        setting=setting,
        sweep_timeout_s=settings.sweep_timeout_s,
    )


def _sdk_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


# -- run ----------------------------------------------------------------------------------------


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Collect and export until SIGTERM/SIGINT (or once with ``--once``)."""
    if _sdk_disabled():
        _log.warning("OTEL_SDK_DISABLED=true: telemetry is disabled, nothing to do")
        return 0
    from otel_gpu.attribution import Attribution
    from otel_gpu.otel.bridge import GpuTelemetry
    from otel_gpu.otel.metrics import cardinality_limit
    from otel_gpu.otel.providers import build_providers
    from otel_gpu.otel.resource import build_resource

    attribution = Attribution.from_env()
    manager = _manager(args, settings)
    inventory = manager.open()
    try:
        providers = build_providers(
            build_resource(inventory),
            settings.interval_s,
            args.exporter,
            cardinality_limit=cardinality_limit(inventory),
        )
    except BaseException:
        manager.close()
        raise
    telemetry = GpuTelemetry(
        manager,
        providers.meter_provider,
        providers.logger_provider,
        interval_s=settings.interval_s,
        attributes=settings.attributes,
        features=frozenset({"processes"}) if settings.processes else frozenset(),
        monitor=HealthMonitor(settings.health),
        attribute_sources=attribution.attribute_sources,
    )
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        attribution.start(telemetry, providers.meter_provider)
        telemetry.start()
        _log.info(
            "collecting %d devices every %gs; metrics -> %s, logs -> %s",
            len(inventory.devices),
            settings.interval_s,
            ",".join(providers.metric_exporters) or "none",
            ",".join(providers.log_exporters) or "none",
        )
        # The periodic reader collects on its own thread; shutdown collects one last time, so
        # --once is simply "shut down now": one collection, flushed, then exit.
        while not args.once and not stop.wait(0.5):
            pass
        # Sweep (and run the health checks) now, so the events are queued before the metric
        # and log pipelines shut down side by side; the final collection reuses this sweep.
        telemetry.cache.get()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _shutdown(providers, telemetry)
        attribution.close()
    return 0


def _shutdown(providers: Any, telemetry: Any) -> None:
    """Flush and close within the shutdown budget, even if the Collector is unreachable."""
    done = threading.Event()

    def work() -> None:
        try:
            providers.shutdown()
        except Exception:
            _log.warning("flush at shutdown failed", exc_info=True)
        finally:
            done.set()

    threading.Thread(target=work, name="otel-gpu-shutdown", daemon=True).start()
    if not done.wait(SHUTDOWN_BUDGET_S):
        _log.warning("exporters did not flush within %gs; exiting anyway", SHUTDOWN_BUDGET_S)
    telemetry.shutdown()


# -- inventory ----------------------------------------------------------------------------------


def inventory_document(inv: Inventory) -> dict[str, Any]:
    """The inventory as a JSON-ready dict (``otel-gpu inventory --json``)."""
    from otel_gpu.otel.resource import topology_attributes

    def device(d: DeviceInfo) -> dict[str, Any]:
        return {
            "index": d.index,
            "name": d.name,
            "id": d.id,
            "vendor": d.vendor,
            "model": d.model,
            "kind": d.kind,
            "backend": d.backend,
            "parent_id": d.parent_id,
            "serial": d.serial,
            "firmware_version": d.firmware_version,
            "board_part_number": d.board_part_number,
            "pci_bus_id": d.pci_bus_id,
            "numa_node": d.numa_node,
            "cpu_affinity": d.cpu_affinity,
            "memory_total_bytes": d.memory_total_bytes,
            "power_limit_default_w": d.power_limit_default_w,
            "compute_capability": d.compute_capability,
            "mig_mode": d.mig_mode,
            "pcie_max_generation": d.pcie_max_generation,
            "pcie_max_width": d.pcie_max_width,
            "links": [
                {
                    "index": link.index,
                    "type": link.link_type,
                    "up": link.up,
                    "remote_kind": link.remote_kind,
                    "remote_pci_bus_id": link.remote_pci_bus_id,
                    "remote_device_index": link.remote_device_index,
                    "remote_id": link.remote_id,
                }
                for link in d.links
            ],
            "children": [c.id for c in inv.devices if c.parent_id == d.id],
            "extra": dict(d.extra),
        }

    return {
        "versions": dict(inv.versions),
        "devices": [device(d) for d in inv.devices],
        "interconnect_domains": interconnect_domains(inv.devices),
        "resource": topology_attributes(inv),
    }


def inventory(args: argparse.Namespace, settings: Settings) -> int:
    """Print the devices and topology."""
    with _manager(args, settings) as manager:
        inv = manager.inventory
    if args.json:
        print(json.dumps(inventory_document(inv), indent=2))
        return 0
    for key, value in inv.versions.items():
        print(f"{key}: {value}")
    print(f"{len(inv.devices)} devices")
    for d in inv.devices:
        mem = f"{d.memory_total_bytes / 2**30:.0f} GiB" if d.memory_total_bytes else "-"
        parent = f" parent={d.parent_id}" if d.parent_id else ""
        links = sum(1 for link in d.links if link.up)
        print(
            f"  {d.name:<6} {d.id}  {d.model}  {mem}  pci={d.pci_bus_id or '-'} "
            f"numa={'-' if d.numa_node is None else d.numa_node} links={links}{parent}"
        )
    domains = interconnect_domains(inv.devices)
    if domains:
        print(
            "interconnect domains: " + "  ".join("[" + ",".join(map(str, g)) + "]" for g in domains)
        )
    return 0


# -- health -------------------------------------------------------------------------------------


def health(args: argparse.Namespace, settings: Settings) -> int:
    """Run every check once and exit with the Nagios code of the worst finding."""
    thresholds = settings.health
    if args.expect_devices is not None:
        if args.expect_devices < 0:
            raise ConfigError("--expect-devices", f"invalid value {args.expect_devices}", "N >= 0")
        thresholds = dataclasses.replace(thresholds, expected_devices=args.expect_devices)
    if args.check_busy:
        thresholds = dataclasses.replace(thresholds, check_busy=True)
    monitor = HealthMonitor(thresholds)
    providers = None
    if args.exporter not in (None, "none") or (
        args.exporter is None and os.environ.get("OTEL_LOGS_EXPORTER", "none") != "none"
    ):
        providers = _log_providers(args.exporter)
    from otel_gpu.attribution import Attribution

    attribution = Attribution.from_env()
    manager = _manager(args, settings)
    if args.check_busy:
        manager.enable("processes")
    holders: Mapping[str, Mapping[str, str]] = {}
    with manager:
        inv = manager.inventory
        if providers is not None:
            from otel_gpu.otel.bridge import EventLogger

            monitor.set_emitter(EventLogger(providers.logger_provider, lambda: inv))
        manager.start_events(monitor.record_event)
        if attribution.enabled:
            attribution.prepare(manager)
            attribution.refresh()
        snapshot = manager.sample()
        monitor.process(inv, snapshot)
        if attribution.enabled:
            holders = attribution.device_attributes(inv, snapshot)
            attribution.close()
    if providers is not None:
        providers.logger_provider.force_flush(3000)
        providers.logger_provider.shutdown()
    findings = monitor.findings()
    worst = max((f.severity for f in findings), default=Severity.INFO)
    code = 2 if worst >= Severity.ERROR else 1 if worst >= Severity.WARN else 0
    if not inv.devices and thresholds.expected_devices is None:
        code = 3
    _print_health(args.format, code, inv, findings, holders)
    return code


def _log_providers(exporter: str | None) -> Any:
    """Providers for the health events only (metrics go nowhere)."""
    from otel_gpu.otel.providers import build_providers
    from otel_gpu.otel.resource import build_resource

    env = dict(os.environ)
    if exporter is not None:
        env["OTEL_LOGS_EXPORTER"] = exporter
    env["OTEL_METRICS_EXPORTER"] = "none"
    return build_providers(build_resource(Inventory()), 10.0, env=env)


def _holder(attrs: Mapping[str, str]) -> str:
    """Who holds a device, in a few words: ``pod ml/train-0`` or ``job 4242 (alice)``."""
    if "k8s.pod.name" in attrs:
        return f"pod {attrs.get('k8s.namespace.name', '?')}/{attrs['k8s.pod.name']}"
    if "slurm.job.id" in attrs:
        user = attrs.get("slurm.job.user")
        return f"job {attrs['slurm.job.id']}" + (f" ({user})" if user else "")
    return ""


def _print_health(
    fmt: str,
    code: int,
    inv: Inventory,
    findings: list[Any],
    holders: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    holders = holders or {}
    names = {d.id: d.name for d in inv.devices}
    status = NAGIOS[code]
    if fmt == "json":
        doc = {
            "status": status,
            "exit_code": code,
            "devices": len(inv.devices),
            "findings": [
                {
                    "check": f.check,
                    "severity": f.severity.name,
                    "state": f.state.value,
                    "device": names.get(f.device_id or ""),
                    "device_id": f.device_id,
                    "message": f.message,
                    "attributes": f.attributes,
                    "held_by": dict(holders.get(f.device_id or "", {})),
                }
                for f in findings
            ],
        }
        print(json.dumps(doc, indent=2))
        return
    bad = [f for f in findings if f.severity >= Severity.WARN]
    summary = "; ".join(f.message for f in bad) if bad else f"{len(inv.devices)} devices healthy"
    if fmt == "nagios":
        print(f"GPU {status} - {summary} | devices={len(inv.devices)} findings={len(bad)}")
        return
    print(f"{status}: {summary}" if not bad else f"{status}: {len(bad)} finding(s)")
    for f in findings:
        device = names.get(f.device_id or "", "node")
        held = _holder(holders.get(f.device_id or "", {}))
        if held:
            device = f"{device} [{held}]"
        level = (
            "CRITICAL"
            if f.severity >= Severity.ERROR
            else NAGIOS[1]
            if f.severity >= Severity.WARN
            else "INFO"
        )
        print(f"  {level} {device}: {f.check}: {f.message}")


# -- backends -----------------------------------------------------------------------------------


def backends(args: argparse.Namespace, settings: Settings) -> int:
    """List every registered backend and whether it can run here."""
    rows = probe_all(Registry())
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "available": r.probe.available,
                        "reason": r.probe.reason,
                        "devices": r.probe.device_count,
                        "auto": r.auto,
                        "fallback_for": r.fallback_for,
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
        return 0
    width = max((len(r.name) for r in rows), default=8)
    for r in rows:
        mark = "available" if r.probe.available else "unavailable"
        notes = []
        if r.fallback_for:
            notes.append(f"fallback for {r.fallback_for}")
        if not r.auto:
            notes.append("explicit only")
        note = f" [{', '.join(notes)}]" if notes else ""
        print(f"{r.name:<{width}}  {mark:<11}  {r.probe.reason}{note}")
    sys.stdout.flush()
    return 0
