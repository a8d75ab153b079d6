#!/usr/bin/env python3
"""Per-kernel GPU time of one training step, two runs side by side (e.g. gpt_train with the GELU
recomputed and saved: bench/gpt_train/kernel-diff.sh runs both), from Nsight Compute's raw CSV of a step that `gpt_train --cuda-profile`
brackets with cudaProfilerStart/Stop:

    ncu --profile-from-start off --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum -o a gpt_train --cuda-profile --recompute-granularity selective ...
    ncu -i a.ncu-rep --csv --page raw --metrics gpu__time_duration.sum > a.csv
    bench/gpt_train/kernel_diff.py a.csv b.csv

Kernels are grouped by name (template arguments and parameter list dropped) and by launch
geometry (grid × block), so that the same kernel at two shapes (e.g. the LM head's GEMM and a
block's) stays two rows. Printed: the rows whose time differs most, then both totals. ncu runs
the kernels one after another, so the totals are the kernels' own time, without overlap or the
host's gaps (compare them with the step time the bench prints).
"""
import argparse
import collections
import csv
import re
import sys


def short_name(name):
    """'void ns::kernel<T, 4>(args)' -> 'ns::kernel'."""
    name = re.sub(r"^void ", "", name.strip())
    depth, out = 0, []
    for ch in name:  # drop <...> and (...) with nesting
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip()


def read(path):
    """{(kernel, geometry): [count, total µs]} of one ncu raw CSV."""
    rows = collections.defaultdict(lambda: [0, 0.0])
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not quoted
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
    to_us = 1e-3  # ncu's default unit for durations
    for r in csv.DictReader(lines):
        t = r.get("gpu__time_duration.sum", "").replace(",", "")
        try:
            value = float(t)
        except ValueError:  # the units row
            to_us = scale.get(t, to_us)
            continue
        key = (short_name(r["Kernel Name"]), f'{r.get("Grid Size", "")}x{r.get("Block Size", "")}')
        rows[key][0] += 1
        rows[key][1] += value * to_us
    return rows


def print_diff(a, b, top=40):
    """Markdown tables of two {(kernel, geometry): [count, µs]}: the rows that differ most, the
    totals, then the kernels by name with their shapes merged. Shared with bench/timeline."""
    keys = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, [0, 0])[1] - a.get(k, [0, 0])[1]))
    print(f"| kernel | grid x block | A n | A µs | B n | B µs | B − A µs |\n|---|---|---:|---:|---:|---:|---:|")
    for k in keys[:top]:
        na, ta = a.get(k, [0, 0.0])
        nb, tb = b.get(k, [0, 0.0])
        print(f"| {k[0][:70]} | {k[1]} | {na} | {ta:.1f} | {nb} | {tb:.1f} | {tb - ta:+.1f} |")
    sa = sum(v[1] for v in a.values())
    sb = sum(v[1] for v in b.values())
    ca = sum(v[0] for v in a.values())
    cb = sum(v[0] for v in b.values())
    print(f"\ntotal: A {ca} kernels {sa / 1e3:.3f} ms, B {cb} kernels {sb / 1e3:.3f} ms, B − A {(sb - sa) / 1e3:+.3f} ms")
    # By family name only (geometry merged): where B launches more or different kernels.
    fa, fb = collections.Counter(), collections.Counter()
    for (n, _), v in a.items():
        fa[n] += v[1]
    for (n, _), v in b.items():
        fb[n] += v[1]
    print("\n| kernel (all shapes) | A µs | B µs | B − A µs |\n|---|---:|---:|---:|")
    for n in sorted(set(fa) | set(fb), key=lambda n: -abs(fb[n] - fa[n]))[: top // 2]:
        print(f"| {n[:70]} | {fa[n]:.1f} | {fb[n]:.1f} | {fb[n] - fa[n]:+.1f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="ncu raw CSV of run A")
    p.add_argument("b", help="ncu raw CSV of run B")
    p.add_argument("--top", type=int, default=40, help="rows to print (40)")
    args = p.parse_args()
    a, b = read(args.a), read(args.b)
    if not a or not b:
        sys.exit(f"kernel_diff: no kernels in {args.a if not a else args.b} (was the step bracketed by --cuda-profile?)")
    print_diff(a, b, args.top)


if __name__ == "__main__":
    main()
