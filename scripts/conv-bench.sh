#!/usr/bin/env bash
# ResNet-50's convolutions: dpml's Conv2d passes (bench_conv) against cuDNN through PyTorch
# (bench/reference/torch_conv.py), one GPU, then one table joined by shape and pass.
#
#   1. configure BUILD_DIR with the cuda-openmpi preset and build bench_conv
#   2. BUILD_DIR/bench/conv/bench_conv, then python3 bench/reference/torch_conv.py
#   3. a table: shape, pass, count, dpml's policy and TFLOP/s (its fastest policy with --policy all),
#      cuDNN's TFLOP/s, dpml / cuDNN; then the network's convolution time per training step,
#      Σ count × (fwd + dgrad + wgrad), for each and the ratio
#
# Usage: scripts/conv-bench.sh [BUILD_DIR] [--batch N] [--iters N] [--warmup N] [--policy default|all]
# BUILD_DIR defaults to build/cuda-openmpi. The options go to both programs (--policy to bench_conv only).
# Outputs (dpml.txt, cudnn.txt: full outputs) land in $RESULTS (default BUILD_DIR/conv-bench), and
# also in $OUT when set. Exit status: non-zero if the build or either benchmark failed (both still run).
set -euo pipefail
cd "$(dirname "$0")/.."

build=build/cuda-openmpi
if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
common=() policy=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --batch|--iters|--warmup) [[ $# -ge 2 ]] || { echo "conv-bench.sh: $1 needs a value" >&2; exit 2; }
                              common+=("$1" "$2"); shift 2 ;;
    --policy) [[ $# -ge 2 ]] || { echo "conv-bench.sh: --policy needs a value" >&2; exit 2; }
              policy=(--policy "$2"); shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "conv-bench.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done

results=${RESULTS:-$build/conv-bench}
source scripts/lib/gpu-build.sh
gpu_build "$build" "$results" bench_conv

status=0
echo "== dpml bench_conv ${common[*]} ${policy[*]}"
"$build/bench/conv/bench_conv" "${common[@]}" "${policy[@]}" | tee "$results/dpml.txt" || status=1
echo "== cuDNN bench/reference/torch_conv.py ${common[*]}"
python3 bench/reference/torch_conv.py "${common[@]}" | tee "$results/cudnn.txt" || status=1

echo "== summary"
python3 - "$results/dpml.txt" "$results/cudnn.txt" <<'EOF' || status=1
import json, sys

def records(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.startswith("{")]
    except OSError:
        return []

dpml, cudnn = records(sys.argv[1]), records(sys.argv[2])
if not dpml or not cudnn:
    sys.exit("conv-bench.sh: a benchmark printed no results (see above)")
shapes, counts = [], {}
for r in cudnn + dpml:  # cuDNN's order is the table's (the same as bench_conv's)
    if r["shape"] not in counts:
        shapes.append(r["shape"])
        counts[r["shape"]] = r["count"]
best, default = {}, {}  # (shape, pass) → record: dpml's fastest policy, and its default policy
for r in dpml:
    key = (r["shape"], r["pass"])
    if key not in best or r["ms"] < best[key]["ms"]:
        best[key] = r
    if r["default"]:
        default[key] = r
ref = {(r["shape"], r["pass"]): r for r in cudnn}
several = len({r["policy"] for r in dpml}) > 1

print("| shape | pass | count | dpml policy | dpml TFLOP/s | cuDNN TFLOP/s | dpml / cuDNN |")
print("|---|---|---|---|---|---|---|")
for s in shapes:
    for p in ("fwd", "dgrad", "wgrad"):
        d, c = best.get((s, p)), ref.get((s, p))
        if d is None and c is None:
            continue  # the stem's dgrad
        ratio = f"{c['ms'] / d['ms']:.2f}" if d and c else "-"
        ours = f"{d['policy']} | {d['tflops']:.1f}" if d else "- | -"
        theirs = f"{c['tflops']:.1f}" if c else "-"
        print(f"| {s} | {p} | {counts[s]} | {ours} | {theirs} | {ratio} |")

both = set(ref) & set(best)  # totals over what both sides measured
missing = sorted(set(ref) ^ set(best))
if missing:
    print(f"\nwarning: {len(missing)} (shape, pass) measured on one side only, left out of the totals: "
          f"{missing[:4]}…", file=sys.stderr)

def step_ms(recs, passes=("fwd", "dgrad", "wgrad")):  # Σ count × ms over the (shape, pass) records
    return sum(counts[s] * r["ms"] for (s, p), r in recs.items() if p in passes and (s, p) in both)
t_cudnn = step_ms(ref)
print("\nResNet-50 convolutions per training step (Σ count × (fwd + dgrad + wgrad), stem without dgrad; "
      f"batch {cudnn[0]['batch']}):")
print("| impl | fwd ms | dgrad ms | wgrad ms | ms per step | dpml / cuDNN (speed) |")
print("|---|---|---|---|---|---|")
rows = [("cuDNN", ref), ("dpml DefaultConvPolicy", default)]
rows += [("dpml best policy per shape and pass", best)] if several else []
for name, recs in rows:
    t = step_ms(recs)
    split = " | ".join(f"{step_ms(recs, (p,)):.2f}" for p in ("fwd", "dgrad", "wgrad"))
    print(f"| {name} | {split} | {t:.2f} | {t_cudnn / t:.2f} |")
EOF
if [[ -n "${OUT:-}" ]]; then cp "$results"/*.txt "$OUT"/ 2>/dev/null || true; fi
exit $status
