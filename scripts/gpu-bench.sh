#!/usr/bin/env bash
# GPT-2 124M training on one GPU: dpml against PyTorch, in one job (a GPU machine; ~5-8 minutes).
#
#   1. configure the cuda-openmpi preset, build gpt_train and test_cuda_gpt_step
#   2. test_cuda_gpt_step: the GPU GPT against the host GPT (loss, gradients, 50-step curve)
#   3. gpt_train (dpml; again with --recompute-gelu 0; again in fp16), then bench/reference/torch_gpt.py eager and
#      torch.compile, same B/T/steps
#   4. a table: tokens/s, ms/step, MFU, memory, and the ratios ours / eager, ours / compile,
#      ours / llm.c (495k tok/s, 1×H100, cuDNN attention: ../shared/TOOLCHAIN.md)
#
# Usage: scripts/gpu-bench.sh [--steps N] [--warmup N] [--batch B] [--seq T]
# JSON lines land in $RESULTS (default build/cuda-openmpi/gpu-bench), and also in $OUT when set.
# Exit status: non-zero if the build, the test or any benchmark failed (all of them still run).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=20 warmup=5 batch=16 seq=1024
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

build=build/cuda-openmpi
results=${RESULTS:-$build/gpu-bench}
source scripts/lib/gpu-build.sh
gpu_build "$build" "$results" gpt_train test_cuda_gpt_step

status=0
echo "== test_cuda_gpt_step"
ctest --test-dir "$build" -R '^test_cuda_gpt_step$' --output-on-failure || status=1

common=(--batch "$batch" --seq "$seq" --steps "$steps" --warmup "$warmup")
echo "== dpml gpt_train"
"$build/bench/gpt_train/gpt_train" "${common[@]}" | tee "$results/dpml.txt" || status=1
echo "== dpml gpt_train --recompute-gelu 0 (GELU output saved per block)"
"$build/bench/gpt_train/gpt_train" "${common[@]}" --recompute-gelu 0 | tee "$results/dpml-saved-gelu.txt" || status=1
echo "== dpml gpt_train --precision fp16 (dynamic loss scaling)"
"$build/bench/gpt_train/gpt_train" "${common[@]}" --precision fp16 | tee "$results/dpml-fp16.txt" || status=1
for mode in eager compile; do
  echo "== torch $mode"
  python3 bench/reference/torch_gpt.py --mode "$mode" "${common[@]}" | tee "$results/torch-$mode.txt" || status=1
done

echo "== summary"
python3 - "$results" <<'EOF' || status=1
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
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
LLMC = 495e3
print("| impl | tokens/s | ms/step | MFU | peak GEMM TFLOP/s | memory GiB | loss first → last |")
print("|---|---|---|---|---|---|---|")
for impl, r in runs.items():
    print(f"| {impl} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.2f} | {100*r['mfu']:.1f}% | {r['peak_tflops']:.0f} "
          f"| {r['mem_gib']:.2f} | {r['loss_first']:.3f} → {r['loss_last']:.3f} |")
print("| llm.c (TOOLCHAIN.md, cuDNN attention) | 495000 | 33.1 | | | 7.6 | |")
ours = runs.get("dpml")
if ours:
    print()
    print("| ratio (tokens/s) | value |")
    print("|---|---|")
    for impl in ("torch-eager", "torch-compile"):
        if impl in runs:
            print(f"| dpml / {impl} | {ours['tokens_per_s'] / runs[impl]['tokens_per_s']:.3f} |")
    print(f"| dpml / llm.c 495k | {ours['tokens_per_s'] / LLMC:.3f} |")
names = sorted({f for v in fams.values() for f in v})
if names:
    impls = list(fams)
    print()
    print("| family (ms, one profiled step) | " + " | ".join(impls) + " |")
    print("|---|" + "---|" * len(impls))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{fams[i].get(n, 0):.2f}" for i in impls) + " |")
EOF
if [[ -n "${OUT:-}" ]]; then cp "$results"/*.txt "$OUT"/ 2>/dev/null || true; fi
exit $status
