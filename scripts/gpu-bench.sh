#!/usr/bin/env bash
# GPT-2 124M training on one GPU: dpml against PyTorch and llm.c, in one job (a GPU machine; ~6-9 minutes).
#
#   1. configure the cuda-openmpi preset, build gpt_train and test_gpt_composed
#   2. test_gpt_composed on one rank: the GPU GPT against the host GPT (loss, gradients, a 30-step
#      curve, micro-batch accumulation, fp16, checkpoint round trip)
#   3. gpt_train (dpml; again with --recompute-granularity none; again in fp16), then bench/reference/torch_gpt.py eager and
#      torch.compile, then llm.c's train_gpt2cu with cuDNN attention (below); same B/T/steps/lr, AdamW
#   4. a table: tokens/s, ms/step, MFU, memory, and the ratios ours / eager, ours / compile, ours / llm.c
#
# llm.c (karpathy/llm.c, a pinned commit; nothing of it is in the repository): on the development machine,
# scripts/llmc-fetch.sh stages it with cudnn-frontend's headers in build/llmc (~4 MiB); the GPU job carries that
# folder (device tool: carry ["build/llmc"]) and this script builds it there (scripts/lib/llmc.sh: a copy in
# build/llmc-build, adapted to CUDA 13) and runs `train_gpt2cu -e d12` on random token shards. Without
# build/llmc the table shows TOOLCHAIN.md's 495k tok/s instead, marked "not measured in this job".
#
# Usage: scripts/gpu-bench.sh [--steps N] [--warmup N] [--batch B] [--seq T] [--llmc DIR]
#   --llmc DIR: llm.c staged by scripts/llmc-fetch.sh (default build/llmc, skipped when absent)
# JSON lines land in $RESULTS (default build/cuda-openmpi/gpu-bench), and also in $OUT when set.
# Exit status: non-zero if the build, the test or any benchmark failed (all of them still run).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=20 warmup=5 batch=16 seq=1024 lr=6e-4 llmc_src=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --llmc) llmc_src=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

build=build/cuda-openmpi
results=${RESULTS:-$build/gpu-bench}
source scripts/lib/gpu-build.sh
source scripts/lib/llmc.sh
mkdir -p "$results"
rm -f "$results"/llmc*.txt "$results/llmc.json"

# llm.c builds (mostly one nvcc at a time, ~2 min) beside dpml's build and test, done before any timed run.
llmc=skip llmc_pid=""
if [[ -z $llmc_src && ! -d build/llmc ]]; then
  llmc_why="no build/llmc: scripts/llmc-fetch.sh stages it"
elif ((seq > 1024)); then
  llmc_why="GPT-2 d12 holds 1024 positions, --seq $seq"
else
  llmc_src=${llmc_src:-build/llmc} llmc=build
  echo "== llm.c: building train_gpt2cu from $llmc_src in the background (build/llmc-build)"
  llmc_build "$llmc_src" build/llmc-build >"$results/llmc-build-steps.txt" 2>&1 &
  llmc_pid=$!
fi

gpu_build "$build" "$results" gpt_train test_gpt_composed

status=0
echo "== test_gpt_composed (one rank)"
ctest --test-dir "$build" -R '^test_gpt_composed_np1$' --output-on-failure || status=1

if [[ -n $llmc_pid ]]; then
  echo "== llm.c build"
  if wait "$llmc_pid"; then llmc=built; else llmc=failed status=1; fi
  cat "$results/llmc-build-steps.txt"
  if [[ -f build/llmc-build/build.log ]]; then cp build/llmc-build/build.log "$results/llmc-build.txt"; fi
fi

common=(--batch "$batch" --seq "$seq" --steps "$steps" --warmup "$warmup" --lr "$lr")
echo "== dpml gpt_train"
"$build/bench/gpt_train/gpt_train" "${common[@]}" | tee "$results/dpml.txt" || status=1
echo "== dpml gpt_train --recompute-granularity none (GELU output saved per block)"
"$build/bench/gpt_train/gpt_train" "${common[@]}" --recompute-granularity none | tee "$results/dpml-saved-gelu.txt" || status=1
echo "== dpml gpt_train --precision fp16 (dynamic loss scaling)"
"$build/bench/gpt_train/gpt_train" "${common[@]}" --precision fp16 | tee "$results/dpml-fp16.txt" || status=1
for mode in eager compile; do
  echo "== torch $mode"
  python3 bench/reference/torch_gpt.py --mode "$mode" "${common[@]}" | tee "$results/torch-$mode.txt" || status=1
done

case $llmc in
  skip) echo "== llm.c: not measured in this job ($llmc_why)" ;;
  failed) echo "== llm.c: not measured in this job (its build failed: $results/llmc-build.txt)" ;;
  built)
    echo "== llm.c train_gpt2cu, cuDNN attention (built from $llmc_src)"
    llmc_data=$(cd "$results" && pwd)/llmc-data
    # llm.c reports no peak memory: the GPU's memory in use, sampled by nvidia-smi ~0.1-0.2 s apart (a process a
    # sample: no buffered line lost when the loop is killed); the first line is from before the run
    smi() { nvidia-smi --id=0 --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null || true; }
    if llmc_shards "$llmc_data" "$batch" "$seq" $((warmup + steps)); then
      smi >"$results/llmc-mem.txt"
      while :; do smi; sleep 0.1; done >>"$results/llmc-mem.txt" &
      llmc_smi=$!
      llmc_run build/llmc-build "$llmc_data" "$batch" "$seq" "$warmup" "$steps" "$lr" | tee "$results/llmc.txt" || status=1
      kill "$llmc_smi" 2>/dev/null || true
    else
      status=1
    fi
    if [[ -f $llmc_src/COMMITS ]]; then cp "$llmc_src/COMMITS" "$results/llmc-commits.txt"; fi
    rm -rf "$llmc_data" ;;
esac

echo "== summary"
python3 - "$results" "$batch" "$seq" "$warmup" "$steps" <<'EOF' || status=1
import json, re, statistics, sys, pathlib
d = pathlib.Path(sys.argv[1])
batch, seq, warmup, steps = map(int, sys.argv[2:6])
runs, fams = {}, {}
for f in ("dpml.txt", "dpml-saved-gelu.txt", "dpml-fp16.txt", "torch-eager.txt", "torch-compile.txt"):
    p = d / f
    if not p.exists():
        continue
    for line in p.read_text().splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            if j["bench"] == "gpt_train":
                runs[j["impl"]] = j
            elif j["bench"] == "gpt_train_family":
                fams.setdefault(j["impl"], {})[j["family"]] = j["ms"]

# llm.c's log: its per-step lines ("step  k/n | loss … | 33.10 ms | 47.0% bf16 MFU | 495000 tok/s", cudaEvent
# times of the training section), its model table and "device memory usage" (before the first step). Steps
# after the warm-up count, as gpt_train's: ms_per_step their mean (tokens/s = B·T / it, as gpt_train and
# torch_gpt.py report), step_ms_median beside it; MFU with their FLOPs per token (6N + 12·L·T·d, N without the
# vocabulary padding) over the GEMM peak gpt_train measured in this job.
def parse_llmc(text):
    num = lambda key: int(re.search(r"\| " + re.escape(key) + r"\s*\| (\d+)", text)[1])
    rows = [(int(m[1]), float(m[2]), float(m[3]))
            for m in re.finditer(r"^step\s+(\d+)/\d+ \| loss (\S+) .*\| ([\d.]+) ms \|", text, re.M)]
    timed = [ms for k, _, ms in rows if k > warmup]
    if len(rows) < warmup + steps or not timed:
        raise SystemExit(f"llm.c: {len(rows)} step lines in llmc.txt, {warmup + steps} expected")
    L, C, V, Vp = num("num_layers L"), num("channels C"), num("vocab_size V"), num("padded_vocab_size Vp")
    params = num("num_parameters") - (Vp - V) * C
    ms = statistics.fmean(timed)
    tok_s = batch * seq / (ms * 1e-3)
    tflops = (6 * params + 12 * L * seq * C) * tok_s / 1e12
    peak = next((runs[i]["peak_tflops"] for i in ("dpml", "torch-eager", "torch-compile") if i in runs), None)
    state = re.search(r"device memory usage: (\d+) MiB", text)  # printed once its state is allocated
    smi = [int(x) for x in (d / "llmc-mem.txt").read_text().split() if x.isdigit()] if (d / "llmc-mem.txt").exists() else []
    mem = (max(smi) - smi[0]) / 1024 if len(smi) > 1 else None
    losses = [l for _, l, _ in rows]
    return {"bench": "gpt_train", "impl": "llm.c-cudnn", "batch": batch, "seq": seq, "layers": L, "dim": C, "vocab": V,
            "params": params, "steps": len(timed), "warmup": warmup, "ms_per_step": round(ms, 3),
            "tokens_per_s": round(tok_s, 1), "model_tflops": round(tflops, 2), "peak_tflops": peak,
            "mfu": round(tflops / peak, 4) if peak else None, "mem_gib": mem,
            "mem_gib_state": int(state[1]) / 1024 if state else None,
            "loss_first": losses[0], "loss_last": losses[-1], "step_ms_median": statistics.median(timed),
            "step_ms_min": min(timed), "llmc_mfu_last": float(re.findall(r"(-?[\d.]+)% bf16 MFU", text)[-1]) / 100}

if (d / "llmc.txt").exists():
    j = parse_llmc((d / "llmc.txt").read_text())
    print(json.dumps(j))
    (d / "llmc.json").write_text(json.dumps(j) + "\n")
    runs["llm.c-cudnn"] = j
cell = lambda v, fmt, scale=1: "" if v is None else format(v * scale, fmt)
print("| impl | tokens/s | ms/step | MFU | peak GEMM TFLOP/s | memory GiB | power W | tokens/J | loss first → last |")
print("|---|---|---|---|---|---|---|---|---|")
for impl, r in runs.items():
    mem = cell(r["mem_gib"], ".2f") + ("*" if impl.startswith("llm.c") and r["mem_gib"] is not None else "")
    print(f"| {impl} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.2f} | {cell(r['mfu'], '.1f', 100)}% "
          f"| {cell(r['peak_tflops'], '.0f')} | {mem} | {cell(r.get('power_w'), '.0f')} | {cell(r.get('tokens_per_j'), '.0f')} "
          f"| {r['loss_first']:.3f} → {r['loss_last']:.3f} |")
llmc = runs.get("llm.c-cudnn")
if llmc:
    print(f"\nllm.c: median step {llmc['step_ms_median']:.2f} ms, fastest {llmc['step_ms_min']:.2f} ms; MFU over the GEMM "
          f"peak gpt_train measured (llm.c's own, over its spec sheet peak: {100 * llmc['llmc_mfu_last']:.1f}%).")
    print("* llm.c's memory: the GPU's peak memory in use during its run less that before it (nvidia-smi, ~0.1-0.2 s apart: "
          "CUDA context and library workspaces included); llm.c's own count once its state is allocated, before the "
          f"first step: {cell(llmc['mem_gib_state'], '.2f')} GiB.")
else:
    print("| llm.c + cuDNN attention (TOOLCHAIN.md, 1×H100: not measured in this job) | 495000 | 33.1 | | | 7.6 | |")
ours = runs.get("dpml")
if ours:
    print()
    print("| ratio (tokens/s) | value |")
    print("|---|---|")
    for impl in ("torch-eager", "torch-compile", "llm.c-cudnn"):
        if impl in runs:
            print(f"| dpml / {impl} | {ours['tokens_per_s'] / runs[impl]['tokens_per_s']:.3f} |")
    if not llmc:
        print(f"| dpml / llm.c 495k (TOOLCHAIN.md, not measured in this job) | {ours['tokens_per_s'] / 495e3:.3f} |")
sys.path.insert(0, "scripts/lib")
from family_table import print_family_table
print_family_table(fams)
EOF
if [[ -n "${OUT:-}" ]]; then cp "$results"/*.txt "$results"/*.json "$OUT"/ 2>/dev/null || true; fi
exit $status
