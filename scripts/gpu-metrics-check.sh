#!/usr/bin/env bash
# Do a GPU run's metrics tell the truth? One job on a GPU machine (~4 minutes after the build):
#
#   1. builds train_gpt, gpt_train, bench_allreduce and dpml-info (cuda-openmpi preset)
#   2. train_gpt --device cuda trains GPT-2 124M (L 12, C 768, H 12, T 1024, 16 sequences per GPU,
#      random GPT-2 tokens) with --metrics and --tensorboard on one GPU and on every GPU (data
#      parallel), while nvidia-smi samples each GPU's power every 100 ms in the same job
#   3. bench/gpt_train (composed model, the same shapes and GPUs): its tokens/s
#   4. dpml-info --probe on every GPU, and bench_allreduce at the probe's largest size
#   5. a table: train_gpt's power_w against nvidia-smi's over the same seconds (both the middle
#      half of the training loop, the run's GPUs only; the ratio should be within 5 %), its median
#      tokens/s and MFU against gpt_train's, peak memory, J/token; dpml-info's NCCL busbw against
#      bench_allreduce's raw NCCL (within 10 %)
#
# Usage: scripts/gpu-metrics-check.sh [--iters N] [--dir DIR]
# Everything lands in DIR (default $TMPDIR/dpml-metrics-check): metrics files, TensorBoard runs,
# nvidia-smi samples, the programs' output.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/gpu-build.sh

iters=400 dir=${TMPDIR:-/tmp}/dpml-metrics-check
while [[ $# -gt 0 ]]; do
  case "$1" in
    --iters) iters=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-metrics-check.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

build=build/cuda-openmpi
rm -rf "$dir" && mkdir -p "$dir"
gpu_build "$build" "$dir" train_gpt gpt_train bench_allreduce dpml-info
gpus=$(nvidia-smi --list-gpus | wc -l)
echo "$gpus" >"$dir/gpus.count"
python3 scripts/lib/random_shard.py "$dir/random_000000.bin=8000000"

train() {  # train RANKS NAME: train_gpt with nvidia-smi sampling beside it
  local ranks=$1 name=$2
  nvidia-smi --query-gpu=timestamp,index,power.draw,utilization.gpu --format=csv,noheader,nounits -lms 100 >"$dir/$name.smi.csv" &
  local smi=$!
  scripts/launch.sh -n "$ranks" "$build/examples/train_gpt/train_gpt" --device cuda --data-path "$dir/random_*.bin" \
    --vocab-size 50257 --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch 16 \
    --global-batch $((16 * ranks)) --train-iters "$iters" --lr 6e-4 --min-lr 6e-5 --lr-warmup-iters 10 --eval-interval 100000 \
    --log-interval 100 --sample-tokens 0 --metrics "$dir/$name.jsonl" --tensorboard "$dir/tb-$name" | tee "$dir/$name.txt"
  date +%s.%N >"$dir/$name.end"
  kill "$smi"; wait "$smi" 2>/dev/null || true
}
bench() {  # bench RANKS NAME
  scripts/launch.sh -n "$1" "$build/bench/gpt_train/gpt_train" --batch 16 --micro-batch 16 --steps 50 --warmup 5 \
    | tee "$dir/$2-bench.txt"
}

echo "== 1 GPU"
train 1 gpu1
bench 1 gpu1
if ((gpus >= 2)); then
  echo "== $gpus GPUs"
  train "$gpus" gpus
  bench "$gpus" gpus
  echo "== dpml-info --probe on $gpus GPUs"
  scripts/launch.sh -n "$gpus" "$build/tools/dpml-info/dpml-info" --probe --sizes 16M,256M | tee "$dir/dpml-info.txt"
  scripts/launch.sh -n "$gpus" "$build/bench/allreduce/bench_allreduce" --min-bytes 16M --max-bytes 256M --factor 16 \
    | tee "$dir/bench_allreduce.txt"
fi

python3 - "$dir" <<'PY'
import datetime, glob, json, os, re, statistics, sys, time
d = sys.argv[1]

def smi_mean_watts(name, gpus, t0, t1):  # sum over the run's GPUs (0 .. gpus-1) of each one's mean power in [t0, t1]
    per_gpu = {}
    for line in open(f"{d}/{name}.smi.csv"):
        f = [x.strip() for x in line.split(",")]
        try:
            stamp = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f")  # local time
            t = time.mktime(stamp.timetuple()) + stamp.microsecond * 1e-6
            w = float(f[2])
        except (ValueError, IndexError):
            continue
        if t0 <= t <= t1 and int(f[1]) < gpus:
            per_gpu.setdefault(f[1], []).append(w)
    return sum(statistics.mean(v) for v in per_gpu.values()), sum(len(v) for v in per_gpu.values())

rows = []
for name, gpus in (("gpu1", 1), ("gpus", int(open(f"{d}/gpus.count").read()))):
    if not os.path.exists(f"{d}/{name}.jsonl"):
        continue
    recs = [json.loads(l) for l in open(f"{d}/{name}.jsonl")]
    end = float(open(f"{d}/{name}.end").read())
    loop = recs[-1]["elapsed_s"]
    lo, hi = loop * 0.25, loop * 0.75  # the middle half of the loop, in the loop's seconds
    mid = [r for r in recs if lo <= r["elapsed_s"] <= hi]
    ours = statistics.mean(r["power_w"] for r in mid)
    smi, samples = smi_mean_watts(name, gpus, end - loop + lo, end - loop + hi)
    bench = [json.loads(l) for l in open(f"{d}/{name}-bench.txt") if l.startswith('{"bench":"gpt_train"')][0]
    tps = statistics.median(r["tokens_per_s"] for r in mid)
    mfu = statistics.median(r["mfu"] for r in mid)
    # train_gpt's MFU is against the datasheet peak (train/flops.hpp), gpt_train's against a GEMM
    # it measures: put gpt_train's model TFLOP/s over the datasheet peak too.
    datasheet = bench["model_tflops"] / bench["tokens_per_s"] * tps / mfu
    rows.append((name, len(mid), ours, smi, samples, tps, bench["tokens_per_s"],
                 mfu, bench["model_tflops"] / datasheet, recs[-1]["peak_memory_gib"],
                 statistics.median(r["energy_j_per_token"] for r in mid), statistics.median(r["gpu_util"] for r in mid)))

print("\n| run | steps | power_w (ours) | nvidia-smi W (samples) | ratio | tok/s train_gpt | tok/s gpt_train | ratio | MFU train_gpt / gpt_train (datasheet peak) | peak GiB | J/token | util % |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n, k, ours, smi, s, tps, btps, mfu, bmfu, mem, jpt, util in rows:
    print(f"| {n} | {k} | {ours:.1f} | {smi:.1f} ({s}) | {ours / smi:.3f} | {tps:,.0f} | {btps:,.0f} | {tps / btps:.3f} | "
          f"{mfu:.3f} / {bmfu:.3f} | {mem:.2f} | {jpt * 1e3:.3f} mJ | {util:.0f} |")

if os.path.exists(f"{d}/dpml-info.txt"):
    info = open(f"{d}/dpml-info.txt").read()
    head = re.search(r"^NCCL .*all-reduce", info, re.M)
    nccl = info[head.start():] if head else ""
    probe = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^\s+(\d+) bytes .*busbw\s+([\d.]+) GB/s", nccl, re.M)}
    raw = {}
    for l in open(f"{d}/bench_allreduce.txt"):
        if l.startswith('{"bench":"allreduce"'):
            r = json.loads(l)
            if r["path"] == "nccl" and r["dtype"] == "fp32":
                raw[r["bytes"]] = r["busbw_GBps"]
    print("\n| all-reduce bytes | dpml-info NCCL busbw GB/s | bench_allreduce raw NCCL busbw GB/s | ratio |")
    print("|---:|---:|---:|---:|")
    for b in sorted(probe):
        if b in raw:
            print(f"| {b} | {probe[b]:.1f} | {raw[b]:.1f} | {probe[b] / raw[b]:.3f} |")
    links = [l for l in info.splitlines() if "NVLink" in l or "NVSwitch" in l]
    print("\ndpml-info topology lines:", *links[:6], sep="\n  ")
PY
