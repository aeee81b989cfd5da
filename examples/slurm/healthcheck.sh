#!/usr/bin/env bash
# Slurm HealthCheckProgram (slurm.conf: HealthCheckProgram=/usr/local/sbin/otel-gpu-healthcheck,
# HealthCheckInterval=300). Drains on CRITICAL, resumes nothing by itself.
set -u
out=$(otel-gpu health --expect-devices "${OTEL_GPU_EXPECTED_DEVICES:-8}" --format nagios 2>&1)
rc=$?
if [ "$rc" -ge 2 ]; then
  scontrol update nodename="$(hostname -s)" state=drain reason="otel-gpu: ${out:0:200}"
fi
exit 0
