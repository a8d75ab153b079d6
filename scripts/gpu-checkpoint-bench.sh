#!/usr/bin/env bash
# What checkpointing costs GPT-2 124M training on one GPU (train_gpt --device cuda), in one job on
# a GPU machine (~3 minutes):
#
#   1. configure the cuda-openmpi preset, build train_gpt
#   2. one llm.c token shard of random GPT-2 tokens (V = 50257; the content does not matter here)
#   3. train_gpt --device cuda, GPT-2 124M (L 12, C 768, H 12, T 1024, B 16), --train-iters N:
#      once without checkpoints, once with --save every --interval steps (asynchronous: the
#      device state is copied to the host, staged, and written by a background thread)
#   4. a table: the time a save blocks training (device → host copy, staging, commit), the time
#      from a save to its commit, the checkpoint's size, and the wall time of the training loop
#      with and without saves (their difference per save: the training time lost to one save)
#
# Usage: scripts/gpu-checkpoint-bench.sh [--iters N] [--interval K] [--dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

iters=200 interval=50 dir=${TMPDIR:-/tmp}/dpml-checkpoint-bench
while [[ $# -gt 0 ]]; do
  case "$1" in
    --iters) iters=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-checkpoint-bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

build=build/cuda-openmpi
cmake --preset cuda-openmpi >/dev/null
cmake --build "$build" --target train_gpt -j "$(nproc)"
rm -rf "$dir" && mkdir -p "$dir"
# 4M tokens: B·T·iters/2 at the defaults, so the run wraps an epoch at most twice
python3 scripts/lib/random_shard.py "$dir/random_000000.bin=4000000"
model=(--device cuda --data-path "$dir/random_*.bin" --vocab-size 50257 --num-layers 12 --hidden-size 768
       --num-attention-heads 12 --seq-length 1024 --micro-batch 16 --global-batch 16 --train-iters "$iters"
       --lr 6e-4 --min-lr 6e-5 --lr-warmup-iters 10 --eval-interval 100000 --log-interval 50 --sample-tokens 0)
run="$build/examples/train_gpt/train_gpt"
echo "== without checkpoints"
"$run" "${model[@]}" --metrics "$dir/plain.jsonl" | tee "$dir/plain.txt"
echo "== with --save every $interval steps"
"$run" "${model[@]}" --metrics "$dir/saving.jsonl" --save "$dir/ckpt" --save-interval "$interval" --keep 2 | tee "$dir/saving.txt"
du -sb "$dir/ckpt"/step-* | tee "$dir/sizes.txt"

python3 - "$dir" "$iters" <<'PY'
import json, pathlib, re, sys
d, iters = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def last(f):
    rows = [json.loads(l) for l in open(d / f)]
    return rows[-1]["elapsed_s"], sorted(r["tokens_per_s"] for r in rows)[len(rows) // 2]
plain, plain_tps = last("plain.jsonl")
saving, saving_tps = last("saving.jsonl")
m = re.search(r"checkpoints: (\d+) saved .*blocked ([\d.]+) ms per save \(device to host ([\d.]+) ms\), ([\d.]+) ms from save to commit; the last committed ([\d.]+) ms after training",
              open(d / "saving.txt").read())
saves, blocked, copy, total, after = int(m[1]), float(m[2]), float(m[3]), float(m[4]), float(m[5])
size = int(open(d / "sizes.txt").read().split()[0])
result = {"iters": iters, "saves": saves, "checkpoint_bytes": size, "blocked_ms_per_save": blocked,
          "device_to_host_ms": copy, "save_to_commit_ms": total, "last_commit_after_training_ms": after,
          "loop_s_plain": plain, "loop_s_saving": saving, "lost_ms_per_save": 1e3 * (saving - plain) / saves,
          "median_tok_s_plain": plain_tps, "median_tok_s_saving": saving_tps}
print(json.dumps(result))
print(f"| saves | checkpoint | blocked/save | of which device→host | save→commit | loop plain | loop saving | lost/save |")
print(f"| {saves} | {size / 2**30:.2f} GiB | {blocked:.0f} ms | {copy:.0f} ms | {total:.0f} ms "
      f"| {plain:.2f} s | {saving:.2f} s | {result['lost_ms_per_save']:.0f} ms |")
PY
