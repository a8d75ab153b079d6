#!/usr/bin/env python3
"""What the GPU did during a profiled step, from libdpml_cupti_trace's CSV (cupti_trace.cpp):
kernels as they really ran, streams overlapping — unlike Nsight Compute, which serialises them.

    bench/timeline/timeline.py RUN.csv                 # one run: streams, busy time, overlap
    bench/timeline/timeline.py A.csv B.csv [--top 40]  # two runs: each summary, then per-kernel A vs B

Per run: the window (first start to last end), each stream's busy time (the union of its
records) and largest kernels; the compute stream (the stream with the most non-NCCL kernel time):
its busy time, its idle gaps inside the window, the time it ran beside an NCCL kernel, and each
kernel's mean duration alone against beside NCCL (contention shows as the second being longer).
Two runs: the per-kernel table of bench/gpt_train/kernel_diff.py over the in-run durations, and
where B's compute stream idles longer than A's between the same two operations.
"""
import argparse
import bisect
import collections
import csv
import difflib
import gzip
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpt_train"))
from kernel_diff import print_diff, short_name  # noqa: E402


def read(path):
    """[(kind, start_ns, end_ns, stream, geometry, short name, host call end ns or 0)] sorted by
    start (a .csv or .csv.gz)."""
    out = []
    with (gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")) as f:
        for r in csv.DictReader(f):
            name = short_name(r["name"]) if r["kind"] == "kernel" else r["name"]
            out.append((r["kind"], int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]),
                        f'{r["grid"]}x{r["block"]}', name, int(r.get("api_end_ns") or 0)))
    if not out:
        sys.exit(f"timeline: no records in {path} (did the program call cudaProfilerStart/Stop, e.g. --cuda-profile?)")
    return sorted(out, key=lambda r: r[1])


def union(intervals):
    """Merged, sorted [(start, end)] of possibly overlapping intervals."""
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def covered(merged, s, e):
    """ns of [s, e) inside the merged intervals."""
    i = max(0, bisect.bisect_right([m[0] for m in merged], s) - 1)
    total = 0
    while i < len(merged) and merged[i][0] < e:
        total += max(0, min(e, merged[i][1]) - max(s, merged[i][0]))
        i += 1
    return total


def is_nccl(r):
    return "nccl" in r[5].lower()


def compute_stream(records):
    """The stream with the most non-NCCL kernel time."""
    busy = collections.Counter()
    for r in records:
        if r[0] == "kernel" and not is_nccl(r):
            busy[r[3]] += r[2] - r[1]
    return busy.most_common(1)[0][0]


def summarise(path, records, top):
    t0 = min(r[1] for r in records)
    span = max(r[2] for r in records) - t0
    streams = collections.defaultdict(list)
    for r in records:
        streams[r[3]].append(r)
    compute = compute_stream(records)
    print(f"\n## {path}: window {span / 1e6:.3f} ms, {len(records)} records, compute stream {compute}\n")
    print("| stream | records | busy ms | largest (ms) |\n|---|---:|---:|---|")
    for s, rs in sorted(streams.items(), key=lambda kv: -sum(r[2] - r[1] for r in kv[1])):
        busy = sum(e - b for b, e in union((r[1], r[2]) for r in rs))
        names = collections.Counter()
        for r in rs:
            names[r[5]] += r[2] - r[1]
        big = ", ".join(f"{n[:40]} {t / 1e6:.2f}" for n, t in names.most_common(3))
        print(f"| {s}{' (compute)' if s == compute else ''} | {len(rs)} | {busy / 1e6:.3f} | {big} |")
    mine = [r for r in streams[compute] if r[0] == "kernel"]
    busy = union((r[1], r[2]) for r in mine)
    first, last = busy[0][0], busy[-1][1]
    gaps = (last - first) - sum(e - b for b, e in busy)
    nccl = union((r[1], r[2]) for r in records if r[3] != compute and is_nccl(r))
    other = union((r[1], r[2]) for r in records if r[3] != compute and not is_nccl(r))
    beside_nccl = sum(covered(nccl, r[1], r[2]) for r in mine)
    beside_other = sum(covered(other, r[1], r[2]) for r in mine)
    print(f"\ncompute stream: {len(mine)} kernels, {sum(r[2] - r[1] for r in mine) / 1e6:.3f} ms of kernels, "
          f"idle gaps {gaps / 1e6:.3f} ms between its first and last kernel; beside NCCL kernels "
          f"{beside_nccl / 1e6:.3f} ms, beside other streams' work {beside_other / 1e6:.3f} ms")
    # Idle because the host had not launched the next operation yet: the part of each gap before
    # the host's call for the next operation returned.
    ops = sorted((r for r in streams[compute]), key=lambda r: r[1])
    if all(r[6] for r in ops):
        waited = sum(max(0, min(b[1], b[6]) - a[2]) for a, b in zip(ops, ops[1:]) if b[1] > a[2])
        lead = sorted(r[1] - r[6] for r in ops)
        print(f"host: the compute stream waited {waited / 1e6:.3f} ms for the host's launches; an operation started "
              f"a median {lead[len(lead) // 2] / 1e3:.1f} µs after its launch call returned "
              f"(10th percentile {lead[len(lead) // 10] / 1e3:.1f} µs)")
    # Each kernel alone against beside NCCL (at least half its time overlapped).
    alone, shared = collections.defaultdict(list), collections.defaultdict(list)
    for r in mine:
        (shared if 2 * covered(nccl, r[1], r[2]) >= r[2] - r[1] else alone)[(r[5], r[4])].append(r[2] - r[1])
    rows = [(k, alone[k], shared[k]) for k in shared if alone.get(k)]
    rows.sort(key=lambda x: -(sum(x[2]) / len(x[2]) - sum(x[1]) / len(x[1])) * len(x[2]))
    if rows:
        print("\n| kernel beside NCCL | grid x block | alone n | alone µs mean | beside n | beside µs mean |\n"
              "|---|---|---:|---:|---:|---:|")
        for k, a, s in rows[:top // 2]:
            print(f"| {k[0][:60]} | {k[1]} | {len(a)} | {sum(a) / len(a) / 1e3:.1f} | {len(s)} | {sum(s) / len(s) / 1e3:.1f} |")
    table = collections.defaultdict(lambda: [0, 0.0])
    for r in records:
        if r[0] == "kernel" and not is_nccl(r):
            table[(r[5], r[4])][0] += 1
            table[(r[5], r[4])][1] += (r[2] - r[1]) / 1e3
    return table


def list_gaps(records, min_us):
    """The compute stream's idle gaps ≥ min_us and the NCCL kernels, in time order (ms from the
    window's start): where a step waits, and on what."""
    t0 = min(r[1] for r in records)
    kernels = [r for r in records if r[0] == "kernel"]
    compute = compute_stream(records)
    mine = sorted((r for r in kernels if r[3] == compute), key=lambda r: r[1])
    events = []
    for before, after in zip(mine, mine[1:]):
        if after[1] - before[2] >= min_us * 1e3:
            events.append((before[2], f"idle {(after[1] - before[2]) / 1e3:8.1f} µs  after {before[5][-45:]}  before {after[5][-45:]}"))
    for r in kernels:
        if is_nccl(r):
            events.append((r[1], f"NCCL {(r[2] - r[1]) / 1e3:8.1f} µs  {r[5][:40]} (stream {r[3]}, ends {(r[2] - t0) / 1e6:.3f})"))
    print(f"\ncompute stream's gaps ≥ {min_us:g} µs and NCCL kernels (ms from the window's start):")
    for t, what in sorted(events):
        print(f"  {(t - t0) / 1e6:8.3f}  {what}")


def gap_diff(a, b, top):
    """Where B's compute stream idles longer than A's between the same two operations: the two
    streams' operation sequences aligned (difflib), each pair of neighbours present in both
    compared, the differences summed by (before, after) names."""
    def ops(records):
        compute = compute_stream(records)
        return sorted((r for r in records if r[3] == compute), key=lambda r: r[1])
    oa, ob = ops(a), ops(b)
    match = difflib.SequenceMatcher(None, [r[5] for r in oa], [r[5] for r in ob], autojunk=False)
    extra = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for blk in match.get_matching_blocks():
        for k in range(blk.size - 1):
            i, j = blk.a + k, blk.b + k
            key = (oa[i][5], oa[i + 1][5])
            e = extra[key]
            e[0] += 1
            e[1] += (oa[i + 1][1] - oa[i][2]) / 1e3
            e[2] += (ob[j + 1][1] - ob[j][2]) / 1e3
    matched = sum(blk.size for blk in match.get_matching_blocks())
    print(f"\n## idle between the same two operations, B against A ({matched} of {len(oa)} / {len(ob)} operations aligned)\n")
    print("| before | after | n | A µs | B µs | B − A µs |\n|---|---|---:|---:|---:|---:|")
    rows = sorted(extra.items(), key=lambda kv: -(kv[1][2] - kv[1][1]))
    for (x, y), (n, ga, gb) in rows[:top // 2]:
        print(f"| {x[-45:]} | {y[-45:]} | {n} | {ga:.1f} | {gb:.1f} | {gb - ga:+.1f} |")
    ta = sum(v[1] for v in extra.values())
    tb = sum(v[2] for v in extra.values())
    print(f"\nall aligned neighbours: A {ta / 1e3:.3f} ms idle, B {tb / 1e3:.3f} ms, B − A {(tb - ta) / 1e3:+.3f} ms")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="one or two CSVs of libdpml_cupti_trace")
    p.add_argument("--top", type=int, default=40, help="rows of the per-kernel tables (40)")
    p.add_argument("--gaps", type=float, default=0, metavar="US",
                   help="also list the compute stream's idle gaps of at least US µs, and the NCCL kernels, in order")
    args = p.parse_args()
    if len(args.runs) > 2:
        p.error("one or two runs")
    tables, runs = [], []
    for path in args.runs:
        runs.append(read(path))
        tables.append(summarise(path, runs[-1], args.top))
        if args.gaps > 0:
            list_gaps(runs[-1], args.gaps)
    if len(tables) == 2:
        print("\n## per kernel in the run (NCCL excluded): A = first, B = second\n")
        print_diff(tables[0], tables[1], args.top)
        gap_diff(runs[0], runs[1], args.top)


if __name__ == "__main__":
    main()
