#!/usr/bin/env python3
"""Renders docs/report.md and its PNG figures from raw measurement files (scripts/report.sh calls it).

    scripts/report.py --out docs --cpu-work build/report/cpu --cpu-device "AMD EPYC, 2 cores" \
        --gpu bench/results/h200-2026-11-27-metrics=scripts/gpu-metrics-check.sh ...

CPU: --cpu-work holds runs.jsonl (one line per run: study, name, ranks, wall_s, metrics, command,
written by report.sh) and each run's metrics file (JSON lines of fashion_mnist / train_gpt
--metrics). Seed 000 reads the "strong" and "weak" runs (fashion_mnist), seed 001 the "layouts"
runs (train_gpt). GPU: each --gpu DIR[=COMMAND] is scanned for JSON lines: benchmark records
("bench": gpt_train, resnet_train, resnet50, encoder_train) and training-metrics files (records with "step" and
"tokens_per_s"). Every table and figure names its command or files, the device and the date.
Figures are PNGs at 100 dpi, drawn without a display (Agg). Prints the files it wrote.
"""
import argparse
import datetime
import json
import os
import re
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

DPI = 100


def read_jsonl(path):
    """The JSON objects among a file's lines (lines not starting with '{' are program output)."""
    records = []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return records


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, digits=3):
    """A table cell: '—' for missing, thousands separators for large numbers."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def smooth(values, window):
    """Trailing moving average (the first points average what exists so far)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


class Report:
    """Collects markdown sections and writes figures into OUT/report/."""

    def __init__(self, out):
        self.out = out
        self.fig_dir = os.path.join(out, "report")
        os.makedirs(self.fig_dir, exist_ok=True)
        self.parts = []
        self.written = []

    def add(self, text):
        self.parts.append(text)

    def figure(self, fig, name, caption):
        path = os.path.join(self.fig_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
        plt.close(fig)
        self.written.append(path)
        self.add(f"![{name}](report/{name})\n\n{caption}")

    def write(self):
        for name in os.listdir(self.fig_dir):  # figures of an earlier report that this one lacks
            path = os.path.join(self.fig_dir, name)
            if name.endswith(".png") and path not in self.written:
                os.remove(path)
        path = os.path.join(self.out, "report.md")
        with open(path, "w") as f:
            f.write("\n\n".join(self.parts) + "\n")
        self.written.append(path)
        print("\n".join(self.written))


# ---------------------------------------------------------------------------- CPU part


def load_cpu_runs(work):
    """runs.jsonl's runs, each with its step records, or None when the CPU part was not run."""
    path = os.path.join(work, "runs.jsonl")
    if not os.path.exists(path):
        return None
    runs = read_jsonl(path)
    for run in runs:
        records = read_jsonl(run["metrics"])
        run["steps"] = [r for r in records if "loss" in r and "step" in r]
        run["epochs"] = [r for r in records if "test_accuracy" in r]
        run["gemm"] = next((r for r in records if r.get("example") == "gemm_reduce"), None)
        run["date"] = datetime.date.fromtimestamp(os.path.getmtime(run["metrics"])).isoformat()
    return runs


def load(run):
    """The machine's 1-minute load average before and after a run (other jobs show there)."""
    return f"{run['load'][0]:.1f} → {run['load'][1]:.1f}"


def source_line(runs, device):
    """The runs' commands (each also wrote --metrics FILE), device and date, as a markdown block."""
    commands, seen = [], set()
    for r in runs:
        command = re.sub(r" --metrics \S+", "", r["command"])
        if command not in seen:
            seen.add(command)
            commands.append(command)
    dates = ", ".join(sorted({r["date"] for r in runs}))
    return (f"*Source: {device}, {dates}; each command also wrote `--metrics FILE`:*\n\n```\n"
            + "\n".join(commands) + "\n```")


def loss_figure(report, name, runs, reference, label, caption, window):
    """Loss of each run against the step (smoothed), and each run's raw loss minus the reference's."""
    fig, (ax, dax) = plt.subplots(1, 2, figsize=(10, 3.6))
    ref = {r["step"]: r["loss"] for r in reference["steps"]}
    for run in runs:
        steps = [r["step"] for r in run["steps"]]
        losses = [r["loss"] for r in run["steps"]]
        ax.plot(steps, smooth(losses, window), label=label(run), lw=1.2)
        if run is not reference:
            diff = [(s, l - ref[s]) for s, l in zip(steps, losses) if s in ref]
            dax.plot([d[0] for d in diff], [d[1] for d in diff], label=label(run), lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss ({window}-step mean)" if window > 1 else "training loss")
    ax.legend(fontsize=8)
    dax.axhline(0, color="black", lw=0.5)
    dax.set_xlabel("step")
    dax.set_ylabel(f"loss − {label(reference)} loss (per step)")
    dax.legend(fontsize=8)
    worst = max(max_abs_diff(run, reference) or 0 for run in runs)
    report.figure(fig, name, caption.replace("\n\n", f" The largest per-step |difference| is {worst:.3g} "
                                            "(the metrics files keep 6 significant digits).\n\n", 1))


def max_abs_diff(run, reference):
    ref = {r["step"]: r["loss"] for r in reference["steps"]}
    diffs = [abs(r["loss"] - ref[r["step"]]) for r in run["steps"] if r["step"] in ref]
    return max(diffs) if diffs else None


def cpu_seed000(report, runs, device):
    strong = sorted((r for r in runs if "strong" in r["study"].split(",")), key=lambda r: r["ranks"])
    weak = sorted((r for r in runs if "weak" in r["study"].split(",")), key=lambda r: r["ranks"])
    if not strong:
        return
    report.add("### CPU ranks (fashion_mnist, MLP 784-1024-1024-10, one epoch)")
    for run in strong + weak:
        # The first steps carry start-up costs; the median of the rest is the training rate.
        run["img_s"] = median([r.get("img_per_s") for r in run["steps"][5:]])
    rows = []
    for series, kind in ((strong, "strong"), (weak, "weak")):
        base = series[0]
        for run in series:
            k = run["ranks"] / base["ranks"]
            speedup = run["img_s"] / base["img_s"]
            # Strong: the same work split k ways; weak: k times the work in the same time.
            efficiency = speedup / k
            batch = re.search(r"--global-batch (\d+)", run["command"]).group(1)
            last = run["epochs"][-1] if run["epochs"] else {}
            rows.append([kind, str(run["ranks"]), batch, run["img_s"], f"{speedup:.2f}×", f"{efficiency:.0%}",
                         last.get("elapsed_s"), f"{last['test_accuracy']:.2%}" if last else None, load(run)])
    report.add(table(["scaling", "ranks", "global batch", "img/s (median step)", "speedup vs 1 rank",
                      "efficiency", "epoch + test s", "test accuracy", "load avg before → after"], rows))
    report.add("Speedup is the median per-step training throughput (images/s, first 5 steps left out) "
               "over the 1-rank run's; efficiency is speedup / ranks for both kinds (weak: k ranks do k "
               "times the work per step). The weak runs keep 64 images per rank, so the 2-rank weak "
               "run is the strong one.")
    fig, (ax, eax) = plt.subplots(1, 2, figsize=(10, 3.6))
    for series, kind in ((strong, "strong (global batch 128)"), (weak, "weak (64 per rank)")):
        ranks = [r["ranks"] for r in series]
        speedups = [r["img_s"] / series[0]["img_s"] for r in series]
        ax.plot(ranks, speedups, "o-", label=kind)
        eax.plot(ranks, [s / (k / ranks[0]) for s, k in zip(speedups, ranks)], "o-", label=kind)
    top = max(r["ranks"] for r in strong + weak)
    ax.plot([1, top], [1, top], "k--", lw=0.8, label="ideal")
    ax.set_xlabel("ranks")
    ax.set_ylabel("throughput / 1-rank throughput")
    ax.legend(fontsize=8)
    eax.axhline(1, color="black", ls="--", lw=0.8)
    eax.set_ylim(0, 1.2)
    eax.set_xlabel("ranks")
    eax.set_ylabel("efficiency")
    eax.legend(fontsize=8)
    for a in (ax, eax):
        a.set_xticks(sorted({r["ranks"] for r in strong + weak}))
    report.figure(fig, "cpu-scaling.png",
                  "Speedup (left) and efficiency (right) of data parallelism against the sequential "
                  "run. On 2 cores, 4 and 8 ranks oversubscribe the machine, so beyond 2 ranks the figure "
                  "measures time-sharing, not scaling.\n\n" + source_line(strong + weak, device))
    loss_figure(report, "cpu-loss-strong.png", strong, strong[0], lambda r: f"{r['ranks']} rank(s)",
                "Convergence at a fixed global batch: the loss of every layout over the sequential "
                "one (left, 20-step mean) and its per-step difference from the 1-rank run (right). "
                "Same seed and global batch, augmentation off; differences come from how the batch "
                "and its float sums are split over ranks.\n\n" + source_line(strong, device),
                window=20)


def cpu_seed001(report, runs, device):
    layouts = [r for r in runs if r["study"] == "layouts"]
    if not layouts:
        return
    report.add("### CPU ranks (train_gpt, 4 layers, C 128, 4 heads, T 64, global batch 32)")
    reference = next(r for r in layouts if r["ranks"] == 1)
    rows = []
    for run in layouts:
        steps = run["steps"][3:]  # the first steps carry start-up costs
        run["tok_s"] = median([r.get("tokens_per_s") for r in steps])
        m = re.search(r"--(tp|pp) 2", run["command"])
        run["layout"] = "1 rank" if run["ranks"] == 1 else (f"{m.group(1)} 2" if m else "dp 2")
        peak = max((r.get("peak_memory_gib") or 0 for r in run["steps"]), default=0)
        run["sent"] = [median([r.get(k) for r in steps]) or 0 for k in ("wire_bytes", "tensor_bytes", "pipeline_bytes")]
        rows.append([run["layout"], run["tok_s"], f"{run['tok_s'] / reference['tok_s']:.2f}×", peak, *run["sent"],
                     median([r.get("exposed_comm_s") for r in steps]),
                     median([r.get("pipeline_wait_s") for r in steps]),
                     run["steps"][-1]["loss"], max_abs_diff(run, reference), load(run)])
    report.add(table(["layout", "tokens/s (median step)", "vs 1 rank", "peak memory GiB (rank 0)",
                      "bytes sent / step: gradients (data axis)", "activations (tensor axis)", "pipeline messages",
                      "exposed comm s / step", "pipeline wait s / step",
                      "final loss", "max |Δloss| vs 1 rank", "load avg before → after"], rows))
    report.add("Same model, data, seed and global batch in each layout; every column is rank 0's "
               "metrics file (peak_memory_gib, wire_bytes, tensor_bytes, pipeline_bytes, exposed_comm_s, "
               "pipeline_wait_s). Bytes are what rank 0 sent in a step: the gradient buckets' all-reduce "
               "and the tensor-parallel layers' all-reduces and all-gathers counted as ring algorithms send "
               "them (parallel/wire_bytes.hpp), the pipeline's activations and gradients as sent. "
               "Data parallelism sends the gradients once a step, whatever the batch; tensor parallelism "
               "sends activations, four all-reduces of a micro-batch's (rows, C) per block, so "
               "its traffic grows with the batch and the sequence; the pipeline sends one activation "
               "and one gradient per micro-batch and stage boundary. On a fast link the layout with the "
               "least exposed time wins; the bytes say which wins as links slow down or models grow.")
    fig, (tax, max_, bax) = plt.subplots(1, 3, figsize=(13, 3.4))
    names = [r["layout"] for r in layouts]
    tax.bar(names, [r["tok_s"] for r in layouts], color="tab:blue")
    tax.set_ylabel("tokens/s")
    max_.bar(names, [max((s.get("peak_memory_gib") or 0 for s in r["steps"]), default=0) for r in layouts],
             color="tab:orange")
    max_.set_ylabel("peak memory GiB (rank 0)")
    bottom = [0.0] * len(layouts)
    for i, (what, color) in enumerate((("gradients", "tab:green"), ("activations (tp)", "tab:purple"),
                                       ("pipeline", "tab:brown"))):
        mb = [r["sent"][i] / 1e6 for r in layouts]
        bax.bar(names, mb, bottom=bottom, color=color, label=what)
        bottom = [b + m for b, m in zip(bottom, mb)]
    bax.set_ylabel("MB sent per step (rank 0)")
    bax.legend(fontsize=8)
    report.figure(fig, "cpu-layouts.png",
                  "Throughput (left), rank 0's memory (middle) and the bytes rank 0 sent per step, by "
                  "axis (right), of data, tensor and pipeline parallelism on 2 ranks against 1 rank.\n\n"
                  + source_line(layouts, device))
    loss_figure(report, "cpu-loss-layouts.png", layouts, reference, lambda r: r["layout"],
                "Loss of each layout against the 1-rank run (left) and the per-step difference "
                "(right): the layouts train the same model on the same batches.\n\n"
                + source_line(layouts, device), window=1)


# ---------------------------------------------------------------------------- GPU part


def dir_date(path):
    m = re.search(r"\d{4}-\d{2}-\d{2}", path)
    return m.group(0) if m else datetime.date.fromtimestamp(os.path.getmtime(path)).isoformat()


def load_gpu(specs):
    """Benchmark records (deduplicated), metrics runs and gemm_reduce records of every --gpu DIR[=COMMAND]."""
    bench, metrics, gemm, seen = [], [], [], set()
    for spec in specs:
        directory, _, command = spec.partition("=")
        command = command or f"RESULTS={directory} scripts/*-bench.sh"
        device = None
        for root, _, files in sorted(os.walk(directory)):
            for name in sorted(files):
                if not name.endswith((".txt", ".json", ".jsonl")):
                    continue
                path = os.path.join(root, name)
                records = read_jsonl(path)
                steps = [r for r in records if "step" in r and "tokens_per_s" in r]
                if steps:
                    text = path[: -len(".jsonl")] + ".txt"
                    world = None
                    if os.path.exists(text):
                        m = re.search(r"world (\d+)", open(text, errors="replace").read())
                        world = int(m.group(1)) if m else None
                    metrics.append({"path": path, "steps": steps, "ranks": world, "command": command,
                                    "date": dir_date(directory), "_dir": directory})
                for r in records:
                    if r.get("example") == "gemm_reduce" and r.get("device") == "cuda":
                        gemm.append(dict(r, _path=path, _command=command, _date=dir_date(directory), _dir=directory))
                    if r.get("bench") not in ("gpt_train", "resnet_train", "resnet50", "encoder_train"):
                        continue
                    device = device or r.get("device")
                    rate = r.get("tokens_per_s") or r.get("img_per_s") or r.get("images_per_s") or r.get("samples_per_s")
                    key = (r["bench"], r.get("model"), r.get("impl"), r.get("device"), r.get("ranks"), rate)
                    if key in seen:
                        continue
                    seen.add(key)
                    bench.append(dict(r, ranks=r.get("ranks", 1), _path=path, _command=command,
                                      _date=dir_date(directory), _rate=rate, _dir=directory))
        # Records without a GPU's name (llm.c's, the metrics files, gemm_reduce's) ran on the GPUs of their
        # job: the name a bench record gives, else the one report.sh --gpu-run wrote beside them.
        named = os.path.join(directory, "device.txt")
        if not device and os.path.exists(named):
            device = open(named).read().strip() or None
        device = device or "GPU (device not recorded)"
        for item in bench + metrics:
            if item["_dir"] == directory:
                item.setdefault("device", device)
        for item in gemm:
            if item["_dir"] == directory:
                item["gpu"] = device
    return bench, metrics, gemm


def gpu_source(items, path_key, command_key, date_key, device_of):
    parts = {}
    for it in items:
        parts.setdefault((it[command_key], device_of(it), it[date_key]), []).append(it[path_key])
    return "*Source: " + "; ".join(
        f"`{cmd}` — {dev}, {date} ({', '.join(sorted(set(paths)))})" for (cmd, dev, date), paths in parts.items()) + ".*"


def gpu_seed000(report, metrics):
    if not metrics:
        return
    report.add("### GPUs (train_gpt --device cuda, GPT-2 124M, 16 sequences of 1024 tokens per GPU)")
    metrics = sorted(metrics, key=lambda m: (m["ranks"] or 0, m["path"]))
    base = metrics[0]
    rows = []
    for m in metrics:
        steps = m["steps"][len(m["steps"]) // 4:]  # the last three quarters: warm clocks and caches
        m["tok_s"] = median([s.get("tokens_per_s") for s in steps])
        j = median([s.get("energy_j_per_token") for s in steps])
        k = (m["ranks"] or 1) / (base["ranks"] or 1)
        rows.append([os.path.basename(m["path"]), str(m["ranks"] or "?"), m["tok_s"],
                     f"{m['tok_s'] / base['tok_s'] / k:.1%}", median([s.get("mfu") for s in steps]),
                     median([s.get("gpu_util") for s in steps]), median([s.get("power_w") for s in steps]),
                     1 / j if j else None, max((s.get("peak_memory_gib") or 0) for s in m["steps"]),
                     m["steps"][-1]["loss"]])
    report.add(table(["run", "GPUs", "tokens/s (median step)", "weak-scaling efficiency", "MFU",
                      "GPU util %", "power W (all GPUs)", "tokens per joule", "peak memory GiB (rank 0)",
                      "final loss"], rows))
    report.add("Medians over the last three quarters of the steps. Each GPU takes 16 sequences, so "
               "two GPUs are weak scaling (efficiency: tokens/s over GPUs × the 1-GPU tokens/s). "
               "Power and energy are the run's GPUs together (within 1-3 % of nvidia-smi's over the "
               "same seconds, bench/RESULTS.md); utilisation and memory are rank 0's GPU's.")
    fig, (ax, pax) = plt.subplots(1, 2, figsize=(10, 3.6))
    for m in metrics:
        label = f"{m['ranks'] or '?'} GPU(s)"
        steps = [s["step"] for s in m["steps"]]
        ax.plot(steps, [s["loss"] for s in m["steps"]], label=label, lw=1)
        pax.plot(steps, [s.get("power_w") for s in m["steps"]], label=label, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8)
    pax.set_xlabel("step")
    pax.set_ylabel("power W (the run's GPUs)")
    pax.legend(fontsize=8)
    report.figure(fig, "gpu-metrics.png",
                  "Loss (left) and the GPUs' power (right) of one and two GPUs, as the metrics "
                  "files record them. The 2-GPU run sees twice the data per step (random tokens).\n\n"
                  + gpu_source(metrics, "path", "command", "date", lambda m: m["device"]))


def run_name(r):
    """A bench record's implementation; the fused GPT (removed after 2026-11-27) is marked."""
    return r["impl"] + (" (fused model)" if r.get("model") == "fused" else "")


def job(r):
    """The job's folder under bench/results (a part of scripts/report.sh --gpu-run: job/part)."""
    path = os.path.normpath(r["_dir"])
    parent, name = os.path.split(path)
    return f"{os.path.basename(parent)}/{name}" if re.search(r"\d{4}-\d{2}-\d{2}", os.path.basename(parent)) else name


def job_short(r):
    """The job's name without its device and date (h200x2-2026-11-27-shared-comms: shared-comms)."""
    return re.sub(r"^.*\d{4}-\d{2}-\d{2}-?", "", job(r)) or job(r)


def card(r):
    """The GPU's short name (H100, H200) for a figure's label, else the device as recorded."""
    m = re.search(r"[A-Z]\d{3}", r["device"])
    return m.group(0) if m else r["device"]


def layout_name(r):
    parts = [f"{axis} {r[axis]}" for axis in ("dp", "tp", "pp") if r.get(axis, 1) > 1]
    return " × ".join(parts) or "1 GPU"


def gpu_seed001(report, bench):
    layouts = [r for r in bench if r["bench"] == "gpt_train" and r.get("impl", "").startswith("dpml")
               and "tp" in r and r["ranks"] > 1]
    if not layouts:
        return
    report.add("### GPUs (bench/gpt_train, GPT-2 124M, T 1024, 16 sequences per data-parallel rank)")
    single = [r for r in bench if r["bench"] == "gpt_train" and r.get("impl") in ("dpml", "dpml-composed")
              and r["ranks"] == 1]
    rows = [[run_name(r), layout_name(r), str(r["batch"] * r["dp"]), r["_rate"], r.get("ms_per_step"),
             r.get("mfu"), r.get("mem_gib"), r.get("exposed_comm_ms"), r.get("power_w"),
             *(r.get(k) for k in ("wire_bytes", "tensor_bytes", "pipeline_bytes")), r["device"], job(r)]
            for r in single + layouts]
    report.add(table(["run", "layout", "global batch", "tokens/s", "ms/step", "MFU", "memory GiB (per GPU)",
                      "exposed comm ms", "power W (all GPUs)", "bytes sent / step: gradients", "tensor axis",
                      "pipeline", "device", "job"], rows))
    report.add("dp 2 trains twice the global batch of tp 2 and pp 2 in these runs (16 sequences per "
               "data-parallel rank), so its tokens/s is the weak-scaling figure; tp 2 and pp 2 split "
               "the 1-GPU step's work. Memory per GPU is where model parallelism wins.")
    fig, (tax, max_) = plt.subplots(1, 2, figsize=(10, 4))
    names = [f"{layout_name(r)}: {r['impl']} ({job_short(r)})" for r in single + layouts]
    tax.barh(names, [r["_rate"] for r in single + layouts], color="tab:blue")
    tax.set_xlabel("tokens/s")
    max_.barh(names, [r.get("mem_gib") or 0 for r in single + layouts], color="tab:orange")
    max_.set_xlabel("memory GiB per GPU")
    max_.set_yticklabels([])
    for a in (tax, max_):
        a.tick_params(axis="y", labelsize=7)
        a.invert_yaxis()
    report.figure(fig, "gpu-layouts.png",
                  "Data, tensor and pipeline parallelism of GPT-2 124M on two GPUs beside one GPU: "
                  "throughput (left) and memory per GPU (right).\n\n"
                  + gpu_source(single + layouts, "_path", "_command", "_date", lambda r: r["device"]))


MODELS = {"gpt_train": "GPT-2 124M (tokens/s)", "resnet_train": "ResNet-50 (img/s)", "resnet50": "ResNet-50 (img/s)",
          "bert": "BERT-base, T 512 (seq/s)", "vit": "ViT-B/16, 224 px (img/s)"}


def model_of(r):
    """The model a bench record measured, as MODELS names it (encoder_train records name theirs)."""
    return MODELS[r.get("model") if r["bench"] == "encoder_train" else r["bench"]]


def gpu_seed003(report, bench):
    records = [r for r in bench if r["_rate"] and r.get("tp", 1) == 1 and r.get("pp", 1) == 1]
    if not records:
        return
    rows = []
    for r in records:
        # The 1-GPU run of the same implementation in the same job: the longest impl that prefixes r's.
        one = sorted((o for o in records if model_of(o) == model_of(r) and o["ranks"] == 1
                      and os.path.dirname(o["_path"]) == os.path.dirname(r["_path"])
                      and r["impl"].startswith(o["impl"])), key=lambda o: len(o["impl"]))
        scaling = f"{r['_rate'] / (r['ranks'] * one[-1]['_rate']):.1%}" if r["ranks"] > 1 and one else None
        watts = r.get("power_w")
        rows.append([model_of(r), run_name(r), str(r["ranks"]), r["_rate"], r.get("ms_per_step"),
                     r.get("mfu"), r.get("mem_gib"), scaling, watts, r["_rate"] / watts if watts else None,
                     r["device"], job(r)])
    report.add(table(["model", "run", "GPUs", "throughput", "ms/step", "MFU", "memory GiB", "scaling efficiency",
                      "power W", "per joule", "device", "job (bench/results/…)"], rows))
    report.add("Scaling efficiency: the run's throughput over GPUs × the same implementation's 1-GPU "
               "throughput in the same job (each GPU keeps its batch). Power: the run's GPUs' mean power "
               "while it trained 3 s more after its timed steps, from NVML's energy counters, read alike for "
               "dpml (bench/support/power.cuh) and PyTorch (bench/reference/gpu_power.py); per joule: "
               "throughput ÷ power, in the throughput's unit (tokens, sequences, images). Jobs before "
               "2026-11-29 did not meter power (—).")
    models = sorted({model_of(r) for r in records})
    cols = min(len(models), 2)
    rows_n = (len(models) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(6.5 * cols, 3.8 * rows_n), squeeze=False)
    for ax in axes.flat[len(models):]:
        ax.set_visible(False)
    for ax, model in zip(axes.flat, models):
        rs = [r for r in records if model_of(r) == model]
        ax.barh([f"{r['impl']} ({r['ranks']} × {card(r)}, {job_short(r)})" for r in rs], [r["_rate"] for r in rs],
                color=["tab:blue" if r["impl"].startswith("dpml") else "tab:gray" for r in rs])
        ax.set_xlabel(model)
        ax.tick_params(axis="y", labelsize=7)
        ax.invert_yaxis()
    report.figure(fig, "gpu-models.png",
                  "Training throughput of dpml (blue) beside PyTorch and llm.c (grey); the label names "
                  "the job: PyTorch and llm.c ran in the same job as the dpml runs beside them.\n\n" + gpu_source(records, "_path", "_command", "_date",
                                                              lambda r: r["device"]))
    metered = [r for r in records if r.get("power_w")]
    if not metered:
        return
    models = sorted({model_of(r) for r in metered})
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.2), squeeze=False)
    for ax, model in zip(axes.flat, models):
        rs = [r for r in metered if model_of(r) == model]
        ax.barh([f"{r['impl']} ({r['power_w']:.0f} W)" for r in rs], [r["_rate"] / r["power_w"] for r in rs],
                color=["tab:blue" if r["impl"].startswith("dpml") else "tab:gray" for r in rs])
        ax.set_xlabel(model.replace("/s)", " per joule)"))
        ax.tick_params(axis="y", labelsize=7)
        ax.invert_yaxis()
    report.figure(fig, "gpu-per-joule.png",
                  "Throughput per joule of the runs that metered their GPU's power (label: the mean power), "
                  "dpml (blue) beside PyTorch (grey), each model's runs in one job.\n\n"
                  + gpu_source(metered, "_path", "_command", "_date", lambda r: r["device"]))


def gemm_figure(report, name, records, caption):
    """The slowest rank's GEMM and the combine, stacked, beside one rank's GEMM, per (split, ranks)."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    labels = [f"{g['split']}, {g['ranks']}" for g in records]
    gemm_ms = [g["gemm_ms"] for g in records]
    ax.bar(labels, gemm_ms, color="tab:blue", label="GEMM")
    ax.bar(labels, [g["combine_ms"] for g in records], bottom=gemm_ms, color="tab:orange", label="combine (all-reduce / gather)")
    ax.plot(labels, [g["one_rank_ms"] for g in records], "k_", markersize=22, mew=2, label="one rank, same launch")
    ax.set_xlabel("split, ranks")
    ax.set_ylabel("ms")
    ax.legend(fontsize=8)
    report.figure(fig, name, caption)


def gpu_seed004(report, gemm):
    if not gemm:
        return
    gemm = sorted(gemm, key=lambda g: (g["split"], g["ranks"]))
    g0 = gemm[0]
    report.add(f"### GPUs (examples/gemm_reduce --device cuda, C = A · B with M = N = K = {g0['m']}, float)")
    rows = [[g["split"], str(g["ranks"]), g["comm"], g["one_rank_ms"], g["gemm_ms"], g["combine_ms"], g["total_ms"],
             f"{g['speedup']:.2f}×", g["gflops"], f"{g['max_abs_error']:.1e}", g["gpu"]] for g in gemm]
    report.add(table(["split", "ranks", "combine over", "one rank ms", "GEMM ms (slowest rank)", "combine ms", "total ms",
                      "speedup", "GFLOP/s", "max error vs float64", "device"], rows))
    report.add("Each rank multiplies its part with dpml's GPU GEMM (cuBLASLt, fp32). Ranks with a GPU each "
               "combine over NCCL; ranks sharing one GPU (the seed's setting) over comm::Staged, through "
               "host memory — there the parts' GEMMs queue on the one GPU, so the split cannot beat one "
               "rank, and the combine is host copies and MPI.")
    gemm_figure(report, "gpu-gemm-reduce.png", gemm,
                "C = A · B split over ranks on GPUs: the slowest rank's GEMM and the combine, stacked, beside "
                "one rank's GEMM in the same launch.\n\n" + gpu_source(gemm, "_path", "_command", "_date", lambda g: g["gpu"]))


def cpu_seed004(report, runs, device):
    gemm = sorted((r for r in runs if r["study"] == "gemm" and r["gemm"]), key=lambda r: (r["gemm"]["split"], r["ranks"]))
    if not gemm:
        return
    g0 = gemm[0]["gemm"]
    report.add(f"### CPU ranks (examples/gemm_reduce, C = A · B with M = N = K = {g0['m']}, float)")
    rows = [[r["gemm"]["split"], str(r["ranks"]), r["gemm"]["one_rank_ms"], r["gemm"]["gemm_ms"], r["gemm"]["combine_ms"],
             r["gemm"]["total_ms"], f"{r['gemm']['speedup']:.2f}×", f"{r['gemm']['max_abs_error']:.1e}", load(r)] for r in gemm]
    report.add(table(["split", "ranks", "one rank ms", "GEMM ms (slowest rank)", "combine ms", "total ms", "speedup",
                      "max error vs float64", "load avg before → after"], rows))
    report.add("Each rank multiplies its part with dpml's host GEMM (one BLAS thread): along K it computes a "
               "partial C that an all-reduce sums (M·N elements on the wire per rank), along M a block of "
               "rows that a gather collects (M·N/ranks each). \"one rank\" is rank 0 alone in the same "
               "launch, so it slows when the launch oversubscribes the cores; speedup is one rank's time "
               "over the split's total. Times are medians of 5 repetitions.")
    gemm_figure(report, "cpu-gemm-reduce.png", [dict(r["gemm"], ranks=r["ranks"]) for r in gemm],
                "C = A · B split over ranks: the slowest rank's GEMM and the combine, stacked, beside one "
                "rank's GEMM in the same launch.\n\n" + source_line(gemm, device))


# ---------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs", help="where report.md and report/*.png go")
    ap.add_argument("--cpu-work", required=True, help="the CPU part's raw files (runs.jsonl)")
    ap.add_argument("--cpu-device", required=True, help="the CPU, in words")
    ap.add_argument("--gpu", action="append", default=[], help="DIR[=COMMAND] of GPU bench JSON lines")
    ap.add_argument("--invocation", default="scripts/report.py", help="the command that wrote the report")
    args = ap.parse_args()

    report = Report(args.out)
    runs = load_cpu_runs(args.cpu_work)
    bench, metrics, gemm = load_gpu(args.gpu)
    report.add(f"# dpml: the seeds' studies\n\nWritten by `{args.invocation}` on "
               f"{datetime.date.today().isoformat()} (scripts/report.sh's header says how to regenerate "
               "each part). Raw numbers behind the GPU figures and longer narratives: "
               "[bench/RESULTS.md](../bench/RESULTS.md).")
    if runs is None:
        cpu_note = f"The CPU part was not run (no {args.cpu_work}/runs.jsonl): `scripts/report.sh --cpu`."
    else:
        cpu_note = (f"CPU figures: {args.cpu_device}, shared with other jobs; every rank is a process "
                    "with one BLAS thread, so 4 or 8 ranks oversubscribe a 2-core machine. The load average "
                    "before and after each run is in its table: other jobs took cores too, so the CPU "
                    "throughput figures vary from run to run by 2× or more. They show that the layouts "
                    "run and converge alike, not how dpml scales on a real node.")
    report.add(cpu_note)

    report.add("## Seed 000: data parallelism against the sequential run")
    if runs:
        cpu_seed000(report, runs, args.cpu_device)
    gpu_seed000(report, metrics)
    report.add("## Seed 001: data against layer-wise (pipeline) and tensor parallelism")
    if runs:
        cpu_seed001(report, runs, args.cpu_device)
    gpu_seed001(report, bench)
    report.add("## Seed 003: model throughput on GPUs beside PyTorch")
    gpu_seed003(report, bench)
    report.add("## Seed 004: C = A · B over ranks, its parts summed or gathered")
    if runs:
        cpu_seed004(report, runs, args.cpu_device)
    gpu_seed004(report, gemm)
    missing = ["GPUs beyond 2", "BERT-base and ViT-B/16 on 2 GPUs",
               "power of the tensor- and pipeline-parallel layouts"]
    if not any(s.get("tensor_bytes") for r in runs or [] for s in r["steps"]):
        missing.append("bytes of tensor- and pipeline-parallel traffic")
    if not any(r.get("power_w") for r in bench):
        missing.append("power and samples per joule of the seed 003 models")
    if not gemm:
        missing.append("the seed 004 study on a GPU")
    elif not any(g["comm"] == "nccl" and g["ranks"] > 1 for g in gemm):
        missing.append("seed 004 with a GPU per rank (NCCL)")
    report.add("## Not in this report yet\n\n" + "; ".join(missing) + ".")
    report.write()


if __name__ == "__main__":
    main()
