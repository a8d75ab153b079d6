#!/usr/bin/env python3
"""Pictures of training runs: dpml's metrics files (JSON lines, --metrics) and pipeline traces
(--trace-pipeline) as PNGs.

    scripts/plot-metrics.py --out plots run-a.jsonl run-b.jsonl     # runs overlaid
    scripts/plot-metrics.py --out plots --trace trace.json          # a Gantt chart of one step

Metrics files give, where their records carry the fields: loss.png (training loss, and the
validation loss as markers, one colour per run), throughput.png (tokens/s or img/s), and mfu.png,
memory.png, power.png for the fields of those names (mfu, memory_gib / peak_memory_gib, power_w,
energy_j_per_token). A run is labelled by its file name, or by --label (one per file, in order).
The trace gives pipeline.png: one row per rank (its stage, tensor and data coordinates), a bar per
forward (F), input-gradient backward (B), weight-gradient backward (W) and wait, each F/B/W
labelled with its micro-batch. Needs matplotlib (scripts/install-deps.sh installs it); draws
without a display (Agg). Prints the files it wrote.
"""
import argparse
import json
import os
import sys

import matplotlib
import matplotlib.patches

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def read_metrics(path):
    """Records of a JSON-lines metrics file; a malformed line is an error naming the file and line."""
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"plot-metrics: {path}:{n}: not a JSON object ({e})")
    if not records:
        sys.exit(f"plot-metrics: {path} holds no records")
    return records


def series(records, key):
    """(steps, values) of the records that carry a number under `key`."""
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and "step" in r]
    return [p[0] for p in pts], [p[1] for p in pts]


# One figure per group: (file, title, y label, candidate keys; the first a run carries is drawn).
FIGURES = [
    ("throughput.png", "Throughput", "per second", ["tokens_per_s", "img_per_s", "samples_per_s"]),
    ("mfu.png", "Model FLOPs utilisation", "MFU", ["mfu"]),
    ("memory.png", "Device memory", "GiB", ["memory_gib", "peak_memory_gib"]),
    ("power.png", "GPU power", "W", ["power_w"]),
    ("energy.png", "Energy per token", "J/token", ["energy_j_per_token"]),
]


def plot_metrics(runs, out):
    written = []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = False
    for i, (label, records) in enumerate(runs):
        colour = f"C{i}"
        x, y = series(records, "loss")
        if x:
            ax.plot(x, y, color=colour, lw=1.2, label=f"{label} train")
            drawn = True
        x, y = series(records, "val_loss")
        if x:  # a validation loss repeats between evaluations: mark where it changes
            keep = [j for j in range(len(y)) if j == 0 or y[j] != y[j - 1]]
            ax.plot([x[j] for j in keep], [y[j] for j in keep], "o--", color=colour, ms=4, lw=0.8, label=f"{label} validation")
    if drawn:
        ax.set(title="Loss", xlabel="step", ylabel="loss (nats per target)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        written.append(save(fig, out, "loss.png"))
    plt.close(fig)
    for name, title, ylabel, keys in FIGURES:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        drawn = False
        for i, (label, records) in enumerate(runs):
            for key in keys:
                x, y = series(records, key)
                if x:
                    ax.plot(x, y, color=f"C{i}", lw=1.2, label=f"{label} ({key})")
                    drawn = True
                    break
        if drawn:
            ax.set(title=title, xlabel="step", ylabel=ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            written.append(save(fig, out, name))
        plt.close(fig)
    return written


COLOURS = {"F": "#4C72B0", "B": "#55A868", "W": "#DD8452", "w": "#D0D0D0"}
NAMES = {"F": "forward", "B": "backward (input)", "W": "backward (weights)", "w": "wait"}


def plot_trace(path, out):
    with open(path) as f:
        trace = json.load(f)
    ranks = trace.get("ranks")
    if not ranks:
        sys.exit(f"plot-metrics: {path} has no ranks (not a --trace-pipeline file?)")
    ranks = sorted(ranks, key=lambda r: (r["data"], r["tensor"], r["stage"]))
    end = max((s[3] for r in ranks for s in r["spans"]), default=0.0)
    ms = 1e3
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(ranks) + 1.6))
    for row, r in enumerate(ranks):
        for kind, mb, t0, t1 in r["spans"]:
            ax.barh(row, (t1 - t0) * ms, left=t0 * ms, height=0.7 if kind != "w" else 0.3, color=COLOURS.get(kind, "k"),
                    edgecolor="white" if kind != "w" else "none", lw=0.5)
            if kind != "w" and (t1 - t0) > 0.025 * end:
                ax.text((t0 + t1) / 2 * ms, row, f"{kind}{mb}", ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r['rank']}: stage {r['stage']}, tp {r['tensor']}, dp {r['data']}" for r in ranks], fontsize=8)
    ax.invert_yaxis()
    hosts = {r.get("host") for r in ranks}
    note = "" if len(hosts) <= 1 else " — ranks on several hosts: their clocks are not aligned"
    ax.set(xlabel="ms from the step's first action (host times; on GPUs the launches)",
           title=f"Pipeline step {trace.get('step')}: {trace.get('schedule')}, {trace.get('micro_batches')} micro-batches{note}")
    ax.legend(handles=[matplotlib.patches.Patch(color=c, label=NAMES[k]) for k, c in COLOURS.items()], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
    written = save(fig, out, "pipeline.png")
    plt.close(fig)
    return [written]


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("metrics", nargs="*", help="metrics files (JSON lines, train_gpt/fashion_mnist --metrics)")
    p.add_argument("--label", action="append", default=[], help="a run's name, one per metrics file in order")
    p.add_argument("--trace", help="a pipeline trace (train_gpt --trace-pipeline)")
    p.add_argument("--out", default=".", help="directory for the PNGs (created)")
    a = p.parse_args()
    if not a.metrics and not a.trace:
        p.error("give metrics files, --trace, or both")
    if a.label and len(a.label) != len(a.metrics):
        p.error(f"{len(a.label)} --label for {len(a.metrics)} metrics files")
    os.makedirs(a.out, exist_ok=True)
    labels = a.label or [os.path.splitext(os.path.basename(m))[0] for m in a.metrics]
    written = plot_metrics([(l, read_metrics(m)) for l, m in zip(labels, a.metrics)], a.out) if a.metrics else []
    if a.trace:
        written += plot_trace(a.trace, a.out)
    for w in written:
        print(w)


if __name__ == "__main__":
    main()
