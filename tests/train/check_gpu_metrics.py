#!/usr/bin/env python3
"""A GPU run's own metrics, step by step: train_gpt --device cuda with --metrics, --log-interval 1
and --profile-steps (cudaProfilerStart/Stop with no profiler attached) on as many GPUs as ranks.

Checks that every JSON line carries what a GPU run must report — MFU in (0, 1), memory now and at
most (peak >= now > 0), the GPUs' power (W, above 20 W a GPU: an idle H100 draws ~70 W; below
1500 W a GPU), the step's energy > 0 and energy_j_per_token equal to energy_j / the step's tokens,
rank 0's utilisation in [0, 100] — that no line says power is unavailable, and that each progress
line shows mfu%, memory and W. Exit 77 (skipped) where fewer GPUs than GPUS are visible (nvidia-smi -L, within CUDA_VISIBLE_DEVICES).

    check_gpu_metrics.py WORKDIR GPUS GLOBAL_BATCH SEQ LAUNCH...

LAUNCH is the command up to and including train_gpt with its model flags; this adds --data-path
(a text file it writes), --metrics, --log-interval 1, --profile-steps 3:5 and the step count.
"""
import json
import math
import os
import subprocess
import sys


def fail(message):
    raise SystemExit(f"check_gpu_metrics: {message}")


def visible_gpus():
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    listed = sum(1 for line in p.stdout.splitlines() if line.startswith("GPU ")) if p.returncode == 0 else 0
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")  # nvidia-smi lists every GPU; CUDA sees only these
    return listed if mask is None else min(listed, len([d for d in mask.split(",") if d.strip()]))


def main():
    if len(sys.argv) < 6:
        fail(__doc__)
    workdir, gpus, batch, seq, launch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
    if visible_gpus() < gpus:
        print(f"fewer than {gpus} GPU(s) visible (nvidia-smi -L): skipped")
        sys.exit(77)
    os.makedirs(workdir, exist_ok=True)
    text = os.path.join(workdir, "text.txt")
    with open(text, "w") as f:
        f.write("It was the best of times, it was the worst of times.\n" * 2000)  # 10 % validation: >= 32 windows of 65
    jsonl = os.path.join(workdir, "metrics.jsonl")
    steps = 12
    argv = [*launch, "--data-path", text, "--metrics", jsonl, "--log-interval", "1", "--profile-steps", "3:5",
            "--train-iters", str(steps), "--sample-tokens", "0"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        fail(f"{' '.join(argv)} exited {out.returncode}:\n{log}")
    if "not reported" in log:
        fail(f"the run says power is unavailable on GPUs of its own:\n{log}")
    with open(jsonl) as f:
        records = [json.loads(line) for line in f]
    if [r["step"] for r in records] != list(range(1, steps + 1)):
        fail(f"expected one record per step 1..{steps}, got steps {[r.get('step') for r in records]}")
    tokens = batch * seq
    for r in records:
        def value(name):
            v = r.get(name)
            if v is None or not math.isfinite(v):
                fail(f"step {r['step']}: {name} is {v} in {r}")
            return v
        checks = [
            (0 < value("mfu") < 1, "mfu in (0, 1)"),
            (0 < value("memory_gib") <= value("peak_memory_gib"), "0 < memory_gib <= peak_memory_gib"),
            (20 * gpus < value("power_w") < 1500 * gpus, f"power_w within (20, 1500) W × {gpus} GPU(s)"),
            (value("energy_j") > 0, "energy_j > 0"),
            (math.isclose(value("energy_j_per_token"), r["energy_j"] / tokens, rel_tol=1e-4), "energy_j_per_token = energy_j / tokens"),
            (0 <= value("gpu_util") <= 100, "gpu_util in [0, 100]"),
        ]
        for ok, what in checks:
            if not ok:
                fail(f"step {r['step']}: expected {what}: {r}")
    progress = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    if len(progress) != steps or not all("mfu% " in p and "mem GiB " in p and " W " in p for p in progress):
        fail(f"expected {steps} progress lines each with mfu%, mem GiB and W:\n{out.stdout}")
    mean_w = sum(r["power_w"] for r in records) / len(records)
    print(f"check_gpu_metrics: {steps} steps on {gpus} GPU(s): every record has MFU, memory, power "
          f"(mean {mean_w:.0f} W), energy and utilisation; --profile-steps 3:5 ran")


if __name__ == "__main__":
    main()
