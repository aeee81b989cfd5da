#!/bin/sh
# The training job of this folder under opentelemetry-instrument, on the simulated 8-GPU node,
# printing what would be exported to the console. Needs: pip install otel-gpu opentelemetry-distro
set -eu
cd "$(dirname "$0")"
export OTEL_SERVICE_NAME=train-job
export OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=gpu
export OTEL_TRACES_EXPORTER=none
export OTEL_METRICS_EXPORTER=console
export OTEL_LOGS_EXPORTER=console
export OTEL_METRIC_EXPORT_INTERVAL=1000
export OTEL_GPU_BACKEND="simulated:faults=xid79@3:1"   # an Xid 79 on gpu3: a health log record
exec opentelemetry-instrument python train.py --steps 20 --step-seconds 0.2
