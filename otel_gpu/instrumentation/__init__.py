"""The ``opentelemetry-instrument`` plug-in: GPU metrics and health logs inside an application.

``opentelemetry-instrument python train.py`` finds :class:`GpuInstrumentor` through the
``opentelemetry_instrumentor`` entry point (name ``gpu``; turn it off with
``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=gpu``) and registers otel-gpu's instruments on the
meter and logger providers the SDK configured for the application. Library use::

    from otel_gpu.instrumentation import GpuInstrumentor

    GpuInstrumentor().instrument(meter_provider=meter_provider, logger_provider=logger_provider)
"""

from otel_gpu.instrumentation.instrumentor import GpuInstrumentor

__all__ = ["GpuInstrumentor"]
