#!/usr/bin/env bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/prolog.d/otel-gpu.sh, PrologFlags=Alloc).
# Runs as root on each node before a job starts. A non-zero exit drains the node, so only
# CRITICAL findings (exit 2) and an unusable agent (exit 3) stop the job; WARNING (exit 1) is
# logged and the job goes on.
set -u
EXPECTED=${OTEL_GPU_EXPECTED_DEVICES:-8}
# --check-busy: the GPUs must be free (no leftover processes or memory from the last job).
out=$(otel-gpu health --expect-devices "$EXPECTED" --check-busy --format nagios 2>&1)
rc=$?
logger -t otel-gpu-prolog "job ${SLURM_JOB_ID:-?}: $out"
case $rc in
  0|1) exit 0 ;;
  *)   echo "otel-gpu prolog: $out" >&2
       exit "$rc" ;;
esac
