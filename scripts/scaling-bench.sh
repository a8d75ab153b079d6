#!/usr/bin/env bash
# Data-parallel scaling on one host with 2 GPUs or more: dpml against PyTorch DDP, in one job.
#
#   1. configure the cuda-openmpi preset, build gpt_train, bench_allreduce and (unless --no-tests) the NCCL tests
#   2. ctest -L nccl: communicator collectives (NCCL and comm::Staged), the device parallel
#      runtime, the composed GPT's layouts (dp, tp, pp, ZeRO-1, fp16) and the composed ResNets'
#      data parallelism and synchronised BatchNorm, each against one GPU
#   3. GPT-2 124M (B=16 per GPU, T=1024), composed from the layers and trained by the library's
#      trainer: dpml on 1 GPU and on K (plain data parallel, and ZeRO-1:
#      --use-distributed-optimizer); PyTorch eager on 1 and DDP on K (torchrun); with --compile
#      also torch.compile
#   4. the control for the scaling figure: K lone 1-GPU runs at once, one per GPU, with no
#      communication — what sharing the host costs by itself (power, clocks, CPU)
#   5. bench_allreduce on K ranks: comm::Nccl and the library's gradient buckets (over NCCL; on 2
#      ranks also over comm::CopyEngine) against raw NCCL busbw
#   6. tables: tokens/s, scaling efficiency (K-GPU tokens/s / (K × 1-GPU tokens/s)), exposed
#      communication, device memory per GPU (ZeRO-1's saving); the lone runs at once against the
#      lone run, and each dpml K-GPU run against K × the slowest of them (the host's bound: a
#      data-parallel step goes at its slowest GPU's pace); each dpml run's SM clock and power
#      (nvidia-smi sampled every 200 ms while it ran, the busy samples' median); the all-reduce
#      ratios at ≥ 100 MB
#
# Usage: scripts/scaling-bench.sh [--ranks K] [--steps N] [--warmup N] [--compile] [--no-tests]
# JSON lines land in $RESULTS (default build/cuda-openmpi/scaling-bench), and also in $OUT when set.
# Exit status: non-zero if the build, a test or a benchmark failed (all of them still run).
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=2 steps=20 warmup=5 compile=0 tests=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --compile) compile=1; shift ;;
    --no-tests) tests=0; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "scaling-bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)
if [[ "$gpus" -lt "$ranks" ]]; then
  echo "scaling-bench.sh: $ranks ranks need $ranks GPUs, this host has $gpus" >&2
  exit 2
fi
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"

build=build/cuda-openmpi
results=${RESULTS:-$build/scaling-bench}
source scripts/lib/gpu-build.sh
targets=(gpt_train bench_allreduce)
[[ $tests == 1 ]] && targets+=(nccl_select_device test_nccl test_staged test_device_runtime test_gpt_composed
  test_resnet_composed_dp test_cuda_sync_batch_norm test_tp_layers test_fashion_mnist_gpu)
gpu_build "$build" "$results" "${targets[@]}"

status=0
if [[ $tests == 1 ]]; then
  echo "== ctest -L nccl"
  ctest --test-dir "$build" -L nccl --output-on-failure || status=1
fi

common=(--batch 16 --seq 1024 --steps "$steps" --warmup "$warmup")
# Every GPU's utilisation, SM clock, power, temperature (and the clock-limiting reasons where this
# nvidia-smi knows them) every 200 ms into $results/NAME.gpu.csv while a run lasts.
gpu_fields=index,utilization.gpu,clocks.sm,power.draw,temperature.gpu
nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader >/dev/null 2>&1 && gpu_fields+=,clocks_event_reasons.active
sampler=""
sample_start() {
  nvidia-smi --query-gpu="$gpu_fields" --format=csv,noheader,nounits -lms 200 >"$results/$1.gpu.csv" 2>/dev/null &
  sampler=$!
}
sample_stop() {
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
}
run() {  # run NAME COMMAND...: output to $results/NAME.txt, status kept
  local name=$1
  shift
  echo "== $name: $*"
  sample_start "$name"
  "$@" 2>&1 | tee "$results/$name.txt" || status=1
  sample_stop
}
gpt=$build/bench/gpt_train/gpt_train
run gpt-dpml-1 "$gpt" "${common[@]}"
echo "== gpt-dpml-1-at-once: $ranks lone 1-GPU runs at the same time, one per GPU"
sample_start gpt-dpml-1-at-once
pids=()
for ((i = 0; i < ranks; ++i)); do
  CUDA_VISIBLE_DEVICES=$i "$gpt" "${common[@]}" >"$results/gpt-dpml-1-at-once-gpu$i.txt" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
sample_stop
run gpt-dpml-$ranks scripts/launch.sh -n "$ranks" "$gpt" "${common[@]}"
run gpt-dpml-$ranks-zero1 scripts/launch.sh -n "$ranks" "$gpt" "${common[@]}" --use-distributed-optimizer
modes=(eager)
[[ $compile == 1 ]] && modes+=(compile)
for mode in "${modes[@]}"; do
  run "gpt-torch-$mode-1" python3 bench/reference/torch_gpt.py --mode "$mode" "${common[@]}"
  run "gpt-torch-$mode-$ranks" torch_ranks "$ranks" bench/reference/torch_gpt.py --mode "$mode" "${common[@]}"
done
run allreduce scripts/launch.sh -n "$ranks" "$build/bench/allreduce/bench_allreduce" --min-bytes 1M --max-bytes 1G

echo "== summary"
python3 - "$results" "$ranks" <<'EOF' || status=1
import collections, json, re, statistics, sys, pathlib
d, K = pathlib.Path(sys.argv[1]), int(sys.argv[2])
runs, ar = {}, {}
for p in sorted(d.glob("*.txt")):
    for line in p.read_text().splitlines():
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if j["bench"] == "gpt_train":
            runs[p.stem] = j
        elif j["bench"] == "allreduce":
            ar[(j["dtype"], j["bytes"], j["path"])] = j["busbw_GBps"]
print(f"GPT-2 124M, B=16 per GPU, T=1024, {K} GPUs")
print("| run | GPUs | tokens/s | ms/step | exposed comm ms | memory GiB per GPU | scaling efficiency |")
print("|---|---|---|---|---|---|---|")
at_once = {n: r for n, r in runs.items() if "-at-once-" in n}
for name, r in runs.items():
    if name in at_once:
        continue
    ranks = r.get("ranks", 1)
    base = runs.get(re.sub(r"-\d+(-zero1)?$", "-1", name))  # gpt-dpml-2-zero1 → gpt-dpml-1
    eff = f"{r['tokens_per_s'] / (ranks * base['tokens_per_s']):.3f}" if base and ranks > 1 else ""
    exposed = f"{r['exposed_comm_ms']:.2f}" if "exposed_comm_ms" in r and ranks > 1 else ""
    print(f"| {name} | {ranks} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.2f} | {exposed} | {r['mem_gib']:.2f} | {eff} |")
lone = runs.get("gpt-dpml-1")
if at_once and lone:
    print()
    print("| lone 1-GPU runs at the same time (no communication) | tokens/s | ms/step | / the lone run |")
    print("|---|---|---|---|")
    for name, r in at_once.items():
        print(f"| {name} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.2f} | {r['tokens_per_s'] / lone['tokens_per_s']:.3f} |")
    # A data-parallel step goes at its slowest GPU's pace: K times the slowest lone run is what
    # perfect communication would reach on this host.
    slowest = min(r["tokens_per_s"] for r in at_once.values())
    print()
    print("| run | scaling against K × the slowest GPU running alone |")
    print("|---|---|")
    for name, r in runs.items():
        if name.startswith("gpt-dpml-") and name not in at_once and r.get("ranks", 1) > 1:
            print(f"| {name} | {r['tokens_per_s'] / (r['ranks'] * slowest):.3f} |")
# nvidia-smi samples: index, utilization %, SM MHz, power W, temperature C[, clock-limiting reasons]
clocks = []
for p in sorted(d.glob("*.gpu.csv")):
    per_gpu = {}
    for line in p.read_text().splitlines():
        f = [x.strip() for x in line.split(",")]
        try:
            idx, util, sm, watts, temp = int(f[0]), float(f[1]), float(f[2]), float(f[3]), float(f[4])
        except (ValueError, IndexError):
            continue
        if util >= 50:  # busy: the run's steps, not its start-up
            per_gpu.setdefault(idx, []).append((sm, watts, temp, f[5] if len(f) > 5 else ""))
    for idx, xs in sorted(per_gpu.items()):
        reasons = collections.Counter(x[3] for x in xs if x[3]).most_common(1)
        common = reasons[0][0] if reasons else ""
        median = statistics.median_high
        clocks.append((p.name[:-len(".gpu.csv")], idx, len(xs), median([x[0] for x in xs]), median([x[1] for x in xs]),
                       max(x[2] for x in xs), common))
if clocks:
    print()
    print("| run | GPU | busy samples | SM MHz (median) | power W (median) | temperature C (max) | clock-limiting reasons (most often) |")
    print("|---|---|---|---|---|---|---|")
    for c in clocks:
        print(f"| {c[0]} | {c[1]} | {c[2]} | {c[3]:.0f} | {c[4]:.0f} | {c[5]:.0f} | {c[6]} |")
if ar:
    print()
    print("| all-reduce | size | dpml busbw GB/s | bucketed | copy engines | raw NCCL | dpml / NCCL | bucketed / NCCL | copy engines / NCCL |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (dtype, size, path), bw in sorted(ar.items()):
        if path != "nccl":
            continue
        dp, bk, ce = (ar.get((dtype, size, q), 0) for q in ("dpml", "bucketed", "copy-engine"))
        print(f"| {dtype} | {size / 2**20:.0f} MiB | {dp:.1f} | {bk:.1f} | {ce:.1f} | {bw:.1f} | {dp / bw:.3f} | {bk / bw:.3f} | {ce / bw:.3f} |")
EOF
if [[ -n "${OUT:-}" ]]; then cp "$results"/*.txt "$OUT"/ 2>/dev/null || true; fi
exit $status
