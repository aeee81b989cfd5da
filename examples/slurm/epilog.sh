#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/otel-gpu.sh). Runs after the job.
# Catches what the job left behind (Xid, ECC, lost GPU, stray processes) and, when an OTLP
# endpoint is configured, also sends the findings as log records (--exporter otlp).
set -u
out=$(otel-gpu health --check-busy --format nagios --exporter "${OTEL_GPU_EPILOG_EXPORTER:-none}" 2>&1)
rc=$?
logger -t otel-gpu-epilog "job ${SLURM_JOB_ID:-?}: $out"
if [ "$rc" -ge 2 ]; then
  # Drain the node with the reason, so an operator sees it in `sinfo -R`.
  scontrol update nodename="$(hostname -s)" state=drain reason="otel-gpu: ${out:0:200}"
fi
exit 0
