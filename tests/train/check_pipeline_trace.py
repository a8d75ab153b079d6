#!/usr/bin/env python3
"""Checks a pipeline trace (train_gpt --trace-pipeline) against what the schedule implies, then
draws it and a metrics file with scripts/plot-metrics.py.

    check_pipeline_trace.py TRACE.json METRICS.jsonl --stages P --micro-batches M --out DIR

Per rank: one F, one B and one W of every micro-batch, spans in time order without overlap. Across
stages (the ranks share one host, hence one clock): micro-batch i's F on stage s + 1 starts after
its F on stage s ended, and its B on stage s starts after its B on stage s + 1 ended — the data
dependencies a correct executor cannot violate. Then the PNGs plot-metrics.py writes must be PNGs.
"""
import argparse
import json
import os
import subprocess
import sys

EPS = 1e-6  # seconds: the clock's printed resolution


def fail(msg):
    sys.exit("FAIL: " + msg)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("metrics")
    p.add_argument("--stages", type=int, required=True)
    p.add_argument("--micro-batches", type=int, required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    with open(a.trace) as f:
        trace = json.load(f)
    m, ranks = a.micro_batches, trace["ranks"]
    if trace["micro_batches"] != m:
        fail(f"micro_batches {trace['micro_batches']}, expected {m}")
    if sorted(r["stage"] for r in ranks) != list(range(a.stages)):
        fail(f"stages {[r['stage'] for r in ranks]}, expected one rank per stage 0..{a.stages - 1}")
    at = {}  # (stage, kind, micro-batch) -> (start, end)
    for r in ranks:
        spans = r["spans"]
        for (k0, _, s0, e0), (k1, mb1, s1, e1) in zip(spans, spans[1:]):
            if s1 < e0 - EPS:
                fail(f"rank {r['rank']}: {k1}{mb1} starts at {s1} before the previous span ends ({e0})")
        for kind in "FBW":
            got = sorted(mb for k, mb, _, _ in spans if k == kind)
            if got != list(range(m)):
                fail(f"rank {r['rank']} (stage {r['stage']}): {kind} of micro-batches {got}, expected 0..{m - 1}")
        for k, mb, s, e in spans:
            if e < s:
                fail(f"rank {r['rank']}: {k}{mb} ends before it starts")
            if k in "FBW":
                at[(r["stage"], k, mb)] = (s, e)
    for s in range(a.stages - 1):
        for i in range(m):
            if at[(s + 1, "F", i)][0] < at[(s, "F", i)][1] - EPS:
                fail(f"F{i} on stage {s + 1} starts before it ends on stage {s}")
            if at[(s, "B", i)][0] < at[(s + 1, "B", i)][1] - EPS:
                fail(f"B{i} on stage {s} starts before it ends on stage {s + 1}")
    plot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "plot-metrics.py")
    out = subprocess.run([sys.executable, plot, "--out", a.out, "--trace", a.trace, a.metrics], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        fail(f"plot-metrics.py failed:\n{out.stdout}")
    for name in ("pipeline.png", "loss.png", "throughput.png"):
        path = os.path.join(a.out, name)
        with open(path, "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                fail(f"{path} is not a PNG")
    print(f"trace of {len(ranks)} ranks x {m} micro-batches consistent with the schedule; PNGs written to {a.out}")


if __name__ == "__main__":
    main()
