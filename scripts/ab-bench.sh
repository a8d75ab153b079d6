#!/usr/bin/env bash
# A kernel change timed against the code before it, in one job on one GPU machine: the working
# tree ("new") and a copy of it with some files as they were at a base revision ("base").
#
#   on a machine with the repository's history:
#     scripts/ab-bench.sh --prepare REV         the files under include/ that the working tree
#                                               changed or deleted since REV, as they were at REV,
#                                               into ab-base/ (gitignored); benchmarks and tests
#                                               are the working tree's on both sides
#   on the GPU machine (ab-base/ travels with the tree: `run` with carry ["ab-base"]):
#     scripts/ab-bench.sh [--rounds N] [--tests "T ..."] [--kernels REGEX] [--families REGEX]
#
#   1. copy the tree to $TMPDIR/ab-base-tree and lay ab-base/ over it; configure both with the
#      cuda-openmpi preset and build bench_kernels and gpt_train in both (in parallel), and the
#      --tests targets in the working tree
#   2. run the tests (default: test_cuda_kernels test_gpt_composed)
#   3. N rounds (default 2), base then new in each: bench_kernels --iters 50 (the rows whose kernel
#      matches --kernels, default all) and gpt_train --batch 16 --seq 1024 --steps 15 --warmup 3
#      (tokens/s, loss, memory, and the per-family times matching --families, default all — printed
#      only by a gpt_train from before Step 8, whose fused model had a family profiler)
#   4. a table: each kernel's and gpt_train's median over the rounds, base, new and new / base
#
# JSON lines, tagged {"ab": "base"|"new"}, land in $RESULTS (default build/cuda-openmpi/ab-bench)
# as ab.jsonl, with each test's output, and also in $OUT when set.
# Exit status: non-zero if a build, a test or a run failed (the rest still runs).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=2 tests="test_cuda_kernels test_gpt_composed" kernels=. families=.
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prepare)
      [[ $# -ge 2 ]] || { echo "ab-bench.sh: --prepare needs a revision" >&2; exit 2; }
      rev=$2
      git rev-parse --verify --quiet "$rev^{commit}" >/dev/null || { echo "ab-bench.sh: $rev is not a revision" >&2; exit 2; }
      rm -rf ab-base
      git diff --name-only --diff-filter=DM "$rev" -- include | while read -r f; do
        mkdir -p "ab-base/$(dirname "$f")"
        git show "$rev:$f" >"ab-base/$f"
      done
      echo "ab-base/: $(find ab-base -type f 2>/dev/null | wc -l) files as at $rev"
      exit 0 ;;
    --rounds|--tests|--kernels|--families)
      [[ $# -ge 2 ]] || { echo "ab-bench.sh: $1 needs a value" >&2; exit 2; }
      declare "${1#--}=$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "ab-bench.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
[[ -d ab-base ]] || { echo "ab-bench.sh: no ab-base/ here: run scripts/ab-bench.sh --prepare REV first" >&2; exit 2; }

build=build/cuda-openmpi
results=${RESULTS:-$build/ab-bench}
mkdir -p "$results" && results=$(cd "$results" && pwd)
base_tree=${TMPDIR:-/tmp}/ab-base-tree
source scripts/lib/gpu-build.sh
rm -rf "$base_tree" && mkdir -p "$base_tree"
cp -r CMakeLists.txt CMakePresets.json cmake include bench tests examples "$base_tree"/
cp -r ab-base/. "$base_tree"/

status=0
# shellcheck disable=SC2086  # $tests is a list of targets
gpu_build "$build" "$results" bench_kernels gpt_train $tests >"$results/build-new.log" 2>&1 &
new_build=$!
(cd "$base_tree" && gpu_build "$build" "$results/base" bench_kernels gpt_train) >"$results/build-base.log" 2>&1 || {
  echo "ab-bench.sh: the base build failed ($results/build-base.log)"; status=1; }
wait "$new_build" || { echo "ab-bench.sh: the build failed ($results/build-new.log)"; tail -20 "$results/build-new.log"; exit 1; }

for t in $tests; do
  exe=$(find "$build/tests" -name "$t" -type f -perm -u+x | head -1)
  if [[ -z $exe ]]; then echo "ab-bench.sh: no test executable $t" >&2; status=1; continue; fi
  if "$exe" >"$results/$t.txt" 2>&1; then echo "$t: passed"; else echo "$t: FAILED ($results/$t.txt)"; status=1; fi
done

: >"$results/ab.jsonl"
for ((round = 1; round <= rounds; ++round)); do
  for side in base new; do
    dir=$build
    [[ $side == base ]] && dir=$base_tree/$build
    tag="{\"ab\":\"$side\",\"round\":$round,"
    "$dir/bench/kernels/bench_kernels" --iters 50 >"$results/bench_kernels-$side.txt" 2>&1 || status=1
    grep '^{"bench":"kernels"' "$results/bench_kernels-$side.txt" | grep -E "\"kernel\":\"[^\"]*($kernels)" |
      sed "s/^{/$tag/" >>"$results/ab.jsonl" || true
    "$dir/bench/gpt_train/gpt_train" --batch 16 --seq 1024 --steps 15 --warmup 3 >"$results/gpt_train-$side.txt" 2>&1 || status=1
    grep -E '^\{"bench":"gpt_train"' "$results/gpt_train-$side.txt" | sed "s/^{/$tag/" >>"$results/ab.jsonl" || true
    grep -E '^\{"bench":"gpt_train_family"' "$results/gpt_train-$side.txt" | grep -E "\"family\":\"($families)\"" |
      sed "s/^{/$tag/" >>"$results/ab.jsonl" || true
  done
done

python3 - "$results/ab.jsonl" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["bench"] == "kernels": key, value = ("kernel", r["kernel"], "ms"), r["ms"]
    elif r["bench"] == "gpt_train": key, value = ("gpt_train", "tokens/s", ""), r["tokens_per_s"]
    else: key, value = ("family", r["family"], "ms"), r["ms"]
    rows.setdefault(key, {}).setdefault(r["ab"], []).append(value)
print("| what | base | new | new / base |")
print("|---|---:|---:|---:|")
for (kind, name, unit), sides in rows.items():
    if "base" not in sides or "new" not in sides: continue
    b, n = statistics.median(sides["base"]), statistics.median(sides["new"])
    label = f"{kind}: {name}" + (f" ({unit})" if unit else "")
    print(f"| {label} | {b:.4g} | {n:.4g} | {n / b:.3f} |")
EOF
if [[ -n ${OUT:-} ]]; then cp "$results"/ab.jsonl "$results"/*.txt "$OUT"/ 2>/dev/null || true; fi
exit $status
