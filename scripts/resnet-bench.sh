#!/usr/bin/env bash
# ResNet-50 training on one GPU: dpml against PyTorch eager, in one job (a GPU machine; ~3-4 minutes).
#
#   1. configure the cuda-openmpi preset, build resnet_train and test_cuda_resnet_step
#   2. test_cuda_resnet_step: the GPU ResNet against the host ResNet (loss, gradients, 30-step curve)
#   3. resnet_train --conv cudnn and --conv own (dpml's implicit-GEMM convolutions), then
#      bench/reference/torch_resnet.py (eager; --compile adds torch.compile), same B/steps
#   4. a table: img/s, ms/step, memory, and the ratios dpml / torch
#
# Usage: scripts/resnet-bench.sh [--steps N] [--warmup N] [--batch B] [--compile]
# JSON lines land in $RESULTS (default build/cuda-openmpi/resnet-bench), and also in $OUT when set.
# Exit status: non-zero if the build, the test or any benchmark failed (all of them still run).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=30 warmup=10 batch=256 compile=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps|--warmup|--batch)
      [[ $# -ge 2 ]] || { echo "resnet-bench.sh: $1 needs a value" >&2; exit 2; }
      declare "${1#--}=$2"; shift 2 ;;
    --compile) compile=(--compile); shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "resnet-bench.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done

build=build/cuda-openmpi
results=${RESULTS:-$build/resnet-bench}
source scripts/lib/gpu-build.sh
gpu_build "$build" "$results" resnet_train test_cuda_resnet_step

status=0
echo "== test_cuda_resnet_step"
ctest --test-dir "$build" -R '^test_cuda_resnet_step$' --output-on-failure || status=1

common=(--batch "$batch" --steps "$steps" --warmup "$warmup")
for conv in cudnn own; do
  echo "== dpml resnet_train --conv $conv"
  "$build/bench/resnet_train/resnet_train" "${common[@]}" --conv "$conv" | tee "$results/dpml-$conv.txt" || status=1
done
echo "== torch"
python3 bench/reference/torch_resnet.py "${common[@]}" "${compile[@]}" | tee "$results/torch.txt" || status=1

echo "== summary"
python3 - "$results" <<'PY' || status=1
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
runs, fams = {}, {}
for f in ("dpml-cudnn.txt", "dpml-own.txt", "torch.txt"):
    p = d / f
    if not p.exists():
        continue
    for line in p.read_text().splitlines():
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if j["bench"] == "resnet_train":
            runs[j["impl"]] = (j["img_per_s"], j["ms_per_step"], j["mem_gib"])
        elif j["bench"] == "resnet50":
            runs[j["impl"]] = (j["images_per_s"], j["ms_per_step"], j["mem_gib"])
        elif j["bench"] == "resnet_train_family":
            fams.setdefault(j["impl"], {})[j["family"]] = j["ms"]
print("| impl | img/s | ms/step | memory GiB |")
print("|---|---|---|---|")
for impl, (ips, ms, mem) in runs.items():
    print(f"| {impl} | {ips:.0f} | {ms:.2f} | {mem:.2f} |")
print()
print("| ratio (img/s; memory) | value |")
print("|---|---|")
for ours in ("dpml-cudnn", "dpml-own"):
    for ref in ("torch-eager", "torch-compile"):
        if ours in runs and ref in runs:
            print(f"| {ours} / {ref} | {runs[ours][0] / runs[ref][0]:.3f}; {runs[ours][2] / runs[ref][2]:.3f} |")
names = sorted({f for v in fams.values() for f in v})
if names:
    impls = list(fams)
    print()
    print("| family (ms, one profiled step) | " + " | ".join(impls) + " |")
    print("|---|" + "---|" * len(impls))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{fams[i].get(n, 0):.2f}" for i in impls) + " |")
PY
if [[ -n "${OUT:-}" ]]; then cp "$results"/*.txt "$OUT"/ 2>/dev/null || true; fi
exit $status
