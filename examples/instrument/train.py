"""A small training-like job, instrumented with the OpenTelemetry API only.

It knows nothing about GPUs: run it under ``opentelemetry-instrument`` and the ``gpu``
plug-in of otel-gpu adds the node's GPU metrics and health events to the same providers,
exporters and Resource as the job's own ``train.*`` metrics (see README.md beside this file).

    python examples/instrument/train.py --steps 20 --step-seconds 0.1
"""

from __future__ import annotations

import argparse
import random
import time

from opentelemetry import metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="training steps to run")
    parser.add_argument("--step-seconds", type=float, default=0.2, help="duration of one step")
    args = parser.parse_args()

    meter = metrics.get_meter("train")
    steps = meter.create_counter("train.steps", unit="{step}", description="Steps done.")
    step_time = meter.create_histogram(
        "train.step.duration", unit="s", description="Wall time of one training step."
    )
    loss_value = 2.5
    meter.create_observable_gauge(
        "train.loss",
        callbacks=[lambda _options: [metrics.Observation(loss_value)]],
        description="Current training loss.",
    )
    rng = random.Random(0)
    for step in range(args.steps):
        started = time.perf_counter()
        time.sleep(args.step_seconds)  # the forward and backward pass
        loss_value = max(0.05, loss_value * 0.97 + rng.uniform(-0.02, 0.02))
        steps.add(1, {"phase": "train"})
        step_time.record(time.perf_counter() - started, {"phase": "train"})
        if step % 10 == 0:
            print(f"step {step}: loss {loss_value:.3f}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
