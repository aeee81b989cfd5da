"""Workload attribution: which Kubernetes pod, Slurm job and process uses each device, and the
energy each workload spent (opt-in: ``OTEL_GPU_ATTRIBUTION=kubernetes,slurm,process``).

Wiring, around a :class:`~otel_gpu.otel.GpuTelemetry`::

    attribution = Attribution.from_env()        # OTEL_GPU_ATTRIBUTION*, raises ConfigError
    telemetry = GpuTelemetry(manager, meter_provider, ...,
                             attribute_sources=attribution.attribute_sources)
    attribution.start(telemetry, meter_provider)
    telemetry.start()
    ...
    attribution.close()

- ``kubernetes``: the kubelet PodResources API (:mod:`.kubernetes`) puts ``k8s.namespace.name``,
  ``k8s.pod.name``, ``k8s.pod.uid`` and ``k8s.container.name`` on the points of the device a
  pod holds (GPU and MIG UUIDs, time-sliced ``GPU-…::N`` replicas, indices, PCI addresses and
  DRM cards: :mod:`.devices`);
- ``slurm``: ``slurm.job.id``, ``slurm.job.user``, ``slurm.job.partition``, ``slurm.job.name``
  from the processes' cgroups and environment and a dcgm-exporter style mapping directory
  (:mod:`.slurm`);
- ``process``: per-process series ``accel.workload.memory.usage`` and
  ``accel.workload.utilization``, attributed through ``/proc/<pid>/cgroup`` (:mod:`.procfs`),
  at most ``OTEL_GPU_ATTRIBUTION_MAX_PROCESSES`` per device.

Any source adds ``accel.workload.energy`` (J) per pod or job (:mod:`.energy`). A device held by
several pods or jobs (time-slicing, MPS) carries none of them on its own points: its share is
in the energy and per-process series. Slow sources are read on a background thread; the
collection only reads what they last said. A missing socket, directory or permission is one
warning and no attribution from that source, never a failure of the device metrics.
"""

from otel_gpu.attribution._core import MEMORY_METRIC, UTILIZATION_METRIC, Attribution
from otel_gpu.attribution.energy import METRIC as ENERGY_METRIC
from otel_gpu.attribution.settings import ENV_VARS, SOURCES, AttributionSettings

__all__ = [
    "ENERGY_METRIC",
    "ENV_VARS",
    "MEMORY_METRIC",
    "SOURCES",
    "UTILIZATION_METRIC",
    "Attribution",
    "AttributionSettings",
]
