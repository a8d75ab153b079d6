#!/usr/bin/env bash
# The seeds' studies as one report: docs/report.md with PNG figures under docs/report/.
#
#   scripts/report.sh [--cpu] [--gpu RESULTS_DIR]... [--out DIR]      (any machine)
#   scripts/report.sh --gpu-run [--parts "..."] [--out DIR]           (a GPU machine)
#
# * CPU part (--cpu; the default when neither --cpu nor --gpu is given): builds fashion_mnist and
#   train_gpt with the "cpu" preset unless DPML_BUILD_DIR names a build that has them, then runs
#   short measurements on this machine's cores (OPENBLAS_NUM_THREADS=1, scripts/launch.sh -n K,
#   each run ≤ ~60 s on 2 cores, ~2-5 minutes in all), every run with --metrics:
#     seed 000: fashion_mnist --model mlp (one epoch, no augmentation) on 1, 2, 4 and 8 ranks with a
#               fixed global batch of 128 (strong scaling) and 64 images per rank (weak scaling)
#     seed 001: train_gpt (4 layers, C 128, 4 heads, T 64, global batch 32) on 1 rank and on 2
#               ranks as dp 2, tp 2 and pp 2 (the bytes each axis sent: the metrics' wire_bytes,
#               tensor_bytes, pipeline_bytes)
#     seed 004: gemm_reduce (C = A · B, 1024³) on 1, 2 and 4 ranks, K split (partial products
#               summed) and M split (row blocks gathered)
#   The raw files (metrics JSON lines, programs' output, runs.jsonl: one line per run with its
#   command) land in $DPML_REPORT_WORK (default build/report/cpu).
# * GPU part (--gpu RESULTS_DIR, repeatable; RESULTS_DIR=COMMAND names the command that wrote it):
#   no GPU run here; it renders the JSON lines the GPU bench scripts wrote into RESULTS_DIR. When
#   --gpu is not given, the GPU section renders the raw files committed in bench/results (each
#   figure and table names its files). To regenerate those on a GPU machine (each script's header
#   says what it runs; its JSON lines land in $RESULTS or its --dir):
#     RESULTS=out/gpt   scripts/gpu-bench.sh              # GPT-2 124M, 1 GPU: dpml, PyTorch, llm.c
#     RESULTS=out/rn    scripts/resnet-bench.sh           # ResNet-50, 1 GPU (and dp 2 with 2 GPUs)
#     RESULTS=out/scale scripts/scaling-bench.sh --ranks 2 # GPT-2 124M data parallel vs DDP
#     RESULTS=out/enc   scripts/encoder-bench.sh          # BERT-base and ViT-B/16, 1 GPU: dpml, PyTorch
#     scripts/gpu-metrics-check.sh --dir out/metrics      # train_gpt metrics: power, memory, loss
#   then: scripts/report.sh --gpu out/gpt --gpu out/rn --gpu out/scale --gpu out/metrics
# * GPU run (--gpu-run, on a GPU machine: the one command there): runs the GPU studies, each part
#   into $DPML_REPORT_GPU_WORK/PART (default build/report/gpu; the part's command in command.txt,
#   the GPU's name in device.txt), then renders every part found there, the CPU section from
#   $DPML_REPORT_WORK as above. Every dpml and PyTorch run also meters its GPUs' power (power_w,
#   per joule). --parts picks some (default all). Each part's script builds the targets it needs;
#   on one H200 (16 cores), after a build of every target (7.5 minutes), gpt, resnet, encoder and
#   gemm ran in ~9 minutes, and metrics takes ~4 more (its header):
#     gpt      scripts/gpu-bench.sh                   GPT-2 124M: dpml, PyTorch eager and compiled, llm.c
#     resnet   scripts/resnet-bench.sh --compile      ResNet-50: dpml, PyTorch (dp 2 beside DDP on 2 GPUs)
#     encoder  scripts/encoder-bench.sh --modes compile   BERT-base and ViT-B/16 beside torch.compile
#     metrics  scripts/gpu-metrics-check.sh           train_gpt on 1 and all GPUs: power, memory, loss
#     scaling  scripts/scaling-bench.sh --no-tests    GPT-2 data parallel beside DDP (2 GPUs or more)
#     layouts  bench/gpt_train on 1 GPU, then on 2 as dp 2, tp 2 and pp 2 (zb-h1, 4 micro-batches):
#              seed 001 on GPUs, with each axis' bytes and the GPUs' power (2 GPUs or more)
#     gemm     gemm_reduce --device cuda, 4096³, on 1 and 2 ranks (sharing one GPU over comm::Staged,
#              or one GPU each over NCCL), K and M splits
# * --out DIR: where report.md and report/*.png go (default docs).
# With --gpu but without --cpu the CPU section is rendered from the raw files of an earlier CPU
# part in $DPML_REPORT_WORK when they are there, and says it was not run otherwise.
# Needs python3 with matplotlib (scripts/install-deps.sh installs it) and MPI for the CPU part.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit "${1:-0}"
}

invocation="scripts/report.sh${*:+ $*}"
cpu=0 out=docs gpu_dirs=() gpu_run=0 parts="gpt resnet encoder metrics scaling layouts gemm"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu) cpu=1; shift ;;
    --gpu-run) gpu_run=1; shift ;;
    --parts)
      [[ $# -ge 2 ]] || { echo "report.sh: --parts needs a list" >&2; exit 2; }
      for p in $2; do
        [[ " gpt resnet encoder metrics scaling layouts gemm " == *" $p "* ]] || { echo "report.sh: --parts: no part $p" >&2; exit 2; }
      done
      parts=$2; shift 2 ;;
    --gpu)
      [[ $# -ge 2 ]] || { echo "report.sh: --gpu needs a results directory" >&2; exit 2; }
      [[ -d "${2%%=*}" ]] || { echo "report.sh: --gpu ${2%%=*}: not a directory" >&2; exit 2; }
      gpu_dirs+=("$2"); shift 2 ;;
    --out)
      [[ $# -ge 2 ]] || { echo "report.sh: --out needs a directory" >&2; exit 2; }
      out=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "report.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ $cpu -eq 0 && ${#gpu_dirs[@]} -eq 0 && $gpu_run -eq 0 ]]; then
  cpu=1
  # The committed raw GPU files, each with the command that wrote it (bench/RESULTS.md's sections).
  gpu_dirs=(
    "bench/results/h200-2026-11-27-metrics=scripts/gpu-metrics-check.sh"
    "bench/results/h200x2-2026-11-27-shared-comms=scripts/launch.sh -n 2 gpt_train --batch 16 --seq 1024 --steps 20 --warmup 5 --model fused|composed [--tp 2 | --pp 2 ...] (bench/RESULTS.md, sixth session)"
    "bench/results/h200-2026-11-27-llmc=scripts/gpu-bench.sh"
    "bench/results/h100x2-2026-11-26-resnet-dp=bench/results/h100x2-2026-11-26-resnet-dp/job.sh (scripts/resnet-bench.sh's steps 3-4)"
    "bench/results/h100-2026-11-28-encoder-bench=scripts/encoder-bench.sh --models 'bert vit' --modes compile"
    "bench/results/h200x2-2026-11-28-encoder-bench=scripts/encoder-bench.sh --models bert; scripts/encoder-bench.sh --models vit"
  )
  # scripts/report.sh --gpu-run's parts, each with the command.txt it wrote
  for d in bench/results/h200-2026-11-29-report/*/; do
    d=${d%/}
    gpu_dirs+=("$d=scripts/report.sh --gpu-run: $(cat "$d/command.txt")")
  done
fi

work=${DPML_REPORT_WORK:-build/report/cpu}
export OPENBLAS_NUM_THREADS=1

if [[ $cpu -eq 1 ]]; then
  build=${DPML_BUILD_DIR:-build/cpu}
  fm=$build/examples/fashion_mnist/fashion_mnist
  gpt=$build/examples/train_gpt/train_gpt
  gemm=$build/examples/gemm_reduce/gemm_reduce
  if [[ ! -x $fm || ! -x $gpt || ! -x $gemm ]]; then
    [[ -z "${DPML_BUILD_DIR:-}" ]] || { echo "report.sh: $DPML_BUILD_DIR lacks fashion_mnist, train_gpt or gemm_reduce" >&2; exit 2; }
    cmake --preset cpu
    cmake --build --preset cpu --parallel "${DPML_JOBS:-2}" --target fashion_mnist train_gpt gemm_reduce
  fi
  rm -rf "$work"
  mkdir -p "$work"
  started=$(date +%s)

  # run STUDIES NAME RANKS PROGRAM ARGS... (STUDIES comma-separated): one launch, its metrics (or
  # gemm_reduce's record) in $work/NAME.jsonl, its output in $work/NAME.txt, and a line in runs.jsonl (the command as typed,
  # ranks, wall seconds, the 1-minute load average before and after: other jobs show there).
  run() {
    local study=$1 name=$2 ranks=$3 t0 t1 load0 load1
    shift 3
    local cmd=(scripts/launch.sh -n "$ranks" "$@" --metrics "$work/$name.jsonl")
    echo "== $name: ${cmd[*]}"
    load0=$(cut -d' ' -f1 /proc/loadavg)
    t0=$EPOCHREALTIME
    "${cmd[@]}" >"$work/$name.txt" 2>&1 || { tail -20 "$work/$name.txt"; echo "report.sh: $name failed" >&2; exit 1; }
    t1=$EPOCHREALTIME
    load1=$(cut -d' ' -f1 /proc/loadavg)
    tail -1 "$work/$name.txt"
    python3 -c 'import json, sys; print(json.dumps({"study": sys.argv[1], "name": sys.argv[2], "ranks": int(sys.argv[3]),
      "wall_s": round(float(sys.argv[5]) - float(sys.argv[4]), 2), "load": [float(sys.argv[6]), float(sys.argv[7])],
      "metrics": sys.argv[8], "command": sys.argv[9]}))' \
      "$study" "$name" "$ranks" "$t0" "$t1" "$load0" "$load1" "$work/$name.jsonl" "${cmd[*]}" >>"$work/runs.jsonl"
  }

  # Seed 000: one epoch of a 784-1024-1024-10 MLP, no augmentation (the layouts see the same
  # images); strong: global batch 128; weak: 64 per rank
  # (weak at 2 ranks is the strong run at 2 ranks: the same global batch).
  mlp=(--model mlp --hidden 1024 --depth 2 --epochs 1 --no-augment --log-interval 100)
  for k in 1 2 4 8; do
    study=strong
    [[ $k -eq 2 ]] && study=strong,weak
    run "$study" "mlp-strong-$k" "$k" "$fm" "${mlp[@]}" --global-batch 128
  done
  for k in 1 4 8; do
    run weak "mlp-weak-$k" "$k" "$fm" "${mlp[@]}" --global-batch $((64 * k))
  done

  # Seed 001: one model and global batch, four layouts.
  gptargs=(--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --global-batch 32
           --micro-batch 4 --train-iters 24 --eval-interval 24 --log-interval 8 --sample-tokens 0)
  run layouts gpt-1 1 "$gpt" "${gptargs[@]}"
  run layouts gpt-dp2 2 "$gpt" "${gptargs[@]}"
  run layouts gpt-tp2 2 "$gpt" "${gptargs[@]}" --tp 2
  run layouts gpt-pp2 2 "$gpt" "${gptargs[@]}" --pp 2
  # Seed 004: one product, split over the ranks along K (partial C summed) or M (row blocks gathered).
  for k in 1 2 4; do
    for split in k m; do
      run gemm "gemm-$split-$k" "$k" "$gemm" --m 1024 --n 1024 --k 1024 --split "$split" --repeat 5
    done
  done
  echo "CPU part: $(( $(date +%s) - started )) s"
fi

status=0
if [[ $gpu_run -eq 1 ]]; then
  gwork=${DPML_REPORT_GPU_WORK:-build/report/gpu}
  gpus="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)"
  [[ $gpus -ge 1 ]] || { echo "report.sh: --gpu-run: nvidia-smi lists no GPU" >&2; exit 2; }
  export NCCL_NVLS_ENABLE=0  # NVLink multicast off (TOOLCHAIN.md)
  # gpu_part NAME SHOWN COMMAND...: the command with RESULTS=$gwork/NAME (the bench scripts' JSON
  # lines land there); SHOWN is what the report names as its source
  gpu_part() {
    local name=$1 shown=$2 dir=$gwork/$1
    shift 2
    rm -rf "$dir" && mkdir -p "$dir"
    echo "== report.sh: $name: $shown"
    RESULTS=$dir "$@" >"$dir/run.log" 2>&1 || { tail -30 "$dir/run.log"; echo "report.sh: part $name failed" >&2; status=1; }
    grep -A40 '^== summary' "$dir/run.log" || tail -5 "$dir/run.log"
    mkdir -p "$dir"  # a script may have replaced its folder
    echo "$shown" >"$dir/command.txt"
    nvidia-smi --id=0 --query-gpu=name --format=csv,noheader >"$dir/device.txt" 2>/dev/null || true
  }
  # seed 004 on GPUs: C = A · B of 4096³ over 1 and 2 ranks, each split
  gemm_runs() {
    source scripts/lib/gpu-build.sh
    gpu_build build/cuda-openmpi "$RESULTS" gemm_reduce
    for k in 1 2; do
      for split in k m; do
        scripts/launch.sh -n "$k" build/cuda-openmpi/examples/gemm_reduce/gemm_reduce --device cuda --m 4096 --n 4096 \
          --k 4096 --split "$split" --repeat 5 --metrics "$RESULTS/gemm-$split-$k.jsonl" || return 1
      done
    done
  }
  script() { gpu_part "$1" "${*:2}" "${@:2}"; }  # a part that is one script: shown as typed
  # seed 001 on GPUs: one model (GPT-2 124M, 16 sequences of 1024 per data rank), four layouts
  layout_runs() {
    source scripts/lib/gpu-build.sh
    gpu_build build/cuda-openmpi "$RESULTS" gpt_train
    local gpt=build/cuda-openmpi/bench/gpt_train/gpt_train
    "$gpt" >"$RESULTS/gpt-1gpu.txt" || return 1
    scripts/launch.sh -n 2 "$gpt" >"$RESULTS/gpt-dp2.txt" || return 1
    scripts/launch.sh -n 2 "$gpt" --tp 2 >"$RESULTS/gpt-tp2.txt" || return 1
    scripts/launch.sh -n 2 "$gpt" --pp 2 --micro-batch 4 --pipeline-schedule zb-h1 >"$RESULTS/gpt-pp2.txt"
  }
  for p in $parts; do
    case $p in
      gpt) script gpt scripts/gpu-bench.sh ;;
      resnet) script resnet scripts/resnet-bench.sh --compile ;;
      encoder) script encoder scripts/encoder-bench.sh --modes compile ;;
      metrics) gpu_part metrics scripts/gpu-metrics-check.sh scripts/gpu-metrics-check.sh --dir "$gwork/metrics/run" ;;
      scaling)
        if [[ $gpus -ge 2 ]]; then script scaling scripts/scaling-bench.sh --ranks 2 --no-tests
        else echo "== report.sh: scaling skipped: nvidia-smi lists $gpus GPU, 2 are needed"; fi ;;
      layouts)
        if [[ $gpus -ge 2 ]]; then
          gpu_part layouts "scripts/launch.sh -n 1|2 gpt_train [--tp 2 | --pp 2 --micro-batch 4 --pipeline-schedule zb-h1]" layout_runs
        else echo "== report.sh: layouts skipped: nvidia-smi lists $gpus GPU, 2 are needed"; fi ;;
      gemm)
        gpu_part gemm "scripts/launch.sh -n 1|2 gemm_reduce --device cuda --m 4096 --n 4096 --k 4096 --split k|m --repeat 5" gemm_runs ;;
    esac
  done
  for d in "$gwork"/*/; do
    d=${d%/}
    [[ -f $d/command.txt ]] && gpu_dirs+=("$d=$(cat "$d/command.txt")")
  done
fi

device="$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^model name[[:space:]]*: //'), $(nproc) cores"
args=(--out "$out" --cpu-work "$work" --cpu-device "$device" --invocation "$invocation")
for d in "${gpu_dirs[@]}"; do args+=(--gpu "$d"); done
python3 scripts/report.py "${args[@]}"
exit $status
