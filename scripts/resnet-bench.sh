#!/usr/bin/env bash
# ResNet-50 training on one GPU: dpml against PyTorch eager, in one job (a GPU machine; ~3-4 minutes),
# and data parallel on two GPUs where nvidia-smi lists at least two (a few minutes more).
#
#   1. configure the cuda-openmpi preset, build resnet_train, test_cuda_resnet_composed,
#      test_resnet_composed_dp
#   2. test_cuda_resnet_composed: the composed ResNet (models::BottleneckResNet<bf16, CudaSpace>)
#      against the float64 host ResNet (loss, gradients, an SGD loss curve, refused batches)
#   3. resnet_train with --conv cudnn and --conv own (dpml's implicit-GEMM convolutions), then
#      bench/reference/torch_resnet.py (eager; --compile adds torch.compile), same B/steps
#   4. with ≥ 2 GPUs (NCCL_NVLS_ENABLE=0): test_resnet_composed_dp (2 ranks against one GPU), then
#      resnet_train on 2 ranks (scripts/launch.sh -n 2, both --conv) and torch_resnet.py under
#      torchrun --nproc_per_node 2 (DDP), each rank on its own batch of B
#   5. a table: img/s, ms/step, memory, and the ratios dpml / torch; with 2 GPUs also the scaling
#      efficiency, 2-GPU img/s / (2 × 1-GPU img/s), and dpml's exposed communication per step
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
gpus="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)"
targets=(resnet_train test_cuda_resnet_composed)
[[ "$gpus" -ge 2 ]] && targets+=(test_resnet_composed_dp)
gpu_build "$build" "$results" "${targets[@]}"

status=0
echo "== test_cuda_resnet_composed"
ctest --test-dir "$build" -R '^test_cuda_resnet_composed$' --output-on-failure || status=1

common=(--batch "$batch" --steps "$steps" --warmup "$warmup")
for conv in cudnn own; do
  echo "== dpml resnet_train --conv $conv"
  "$build/bench/resnet_train/resnet_train" "${common[@]}" --conv "$conv" |
    tee "$results/dpml-composed-$conv.txt" || status=1
done
echo "== torch"
python3 bench/reference/torch_resnet.py "${common[@]}" "${compile[@]}" | tee "$results/torch.txt" || status=1

rm -f "$results"/dpml-*-dp2.txt "$results/torch-ddp2.txt"  # a summary of this run only
if [[ "$gpus" -ge 2 ]]; then
  export NCCL_NVLS_ENABLE=0  # NVLink multicast off
  echo "== test_resnet_composed_dp (2 ranks)"
  ctest --test-dir "$build" -R '^test_resnet_composed_dp_np2$' --output-on-failure || status=1
  for conv in cudnn own; do
    echo "== dpml resnet_train --conv $conv on 2 GPUs"
    scripts/launch.sh -n 2 "$build/bench/resnet_train/resnet_train" "${common[@]}" --conv "$conv" |
      tee "$results/dpml-composed-$conv-dp2.txt" || status=1
  done
  echo "== torch DDP on 2 GPUs"
  torch_ranks 2 bench/reference/torch_resnet.py "${common[@]}" "${compile[@]}" |
    tee "$results/torch-ddp2.txt" || status=1
else
  echo "== data parallel skipped: nvidia-smi lists $gpus GPU(s), 2 are needed"
fi

echo "== summary"
python3 - "$results" <<'PY' || status=1
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
runs, fams = {}, {}
by_ranks = {}  # (impl on one GPU, ranks) -> (img/s, exposed comm ms or None)
for f in ("dpml-composed-cudnn.txt", "dpml-composed-own.txt", "torch.txt", "dpml-composed-cudnn-dp2.txt",
          "dpml-composed-own-dp2.txt", "torch-ddp2.txt"):
    p = d / f
    if not p.exists():
        continue
    for line in p.read_text().splitlines():
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if j["bench"] == "resnet_train_family":
            fams.setdefault(j["impl"], {})[j["family"]] = j["ms"]
            continue
        if j["bench"] == "resnet_train":
            ips = j["img_per_s"]
        elif j["bench"] == "resnet50":
            ips = j["images_per_s"]
        else:
            continue
        runs[j["impl"]] = (ips, j["ms_per_step"], j["mem_gib"], j.get("power_w"))
        k = j.get("ranks", 1)
        base = j["impl"].removesuffix(f"-dp{k}").removesuffix(f"-ddp{k}")
        by_ranks[(base, k)] = (ips, j.get("exposed_comm_ms"))
print("| impl | img/s | ms/step | memory GiB | power W | img/J |")
print("|---|---|---|---|---|---|")
for impl, (ips, ms, mem, watts) in runs.items():
    print(f"| {impl} | {ips:.0f} | {ms:.2f} | {mem:.2f} | {watts or ''} | {f'{ips / watts:.2f}' if watts else ''} |")
scaling = [(b, k) for (b, k) in by_ranks if k > 1 and (b, 1) in by_ranks]
if scaling:
    print()
    print("| data parallel (img/s: total over ranks) | 1 GPU | 2 GPUs | scaling efficiency | exposed comm ms/step |")
    print("|---|---|---|---|---|")
    for b, k in scaling:
        one, (many, exposed) = by_ranks[(b, 1)][0], by_ranks[(b, k)]
        shown = "n/a" if exposed is None else f"{exposed:.2f}"
        print(f"| {b} × {k} | {one:.0f} | {many:.0f} | {many / (k * one):.3f} | {shown} |")
print()
print("| ratio (img/s; memory) | value |")
print("|---|---|")
for our_suffix, ref_suffix in (("", ""), ("-dp2", "-ddp2")):  # one GPU; two
    for ours in ("dpml-composed-cudnn" + our_suffix, "dpml-composed-own" + our_suffix):
        for ref in ("torch-eager" + ref_suffix, "torch-compile" + ref_suffix):
            if ours in runs and ref in runs:
                print(f"| {ours} / {ref} | {runs[ours][0] / runs[ref][0]:.3f}; {runs[ours][2] / runs[ref][2]:.3f} |")
sys.path.insert(0, "scripts/lib")
from family_table import print_family_table
print_family_table(fams)
PY
if [[ -n "${OUT:-}" ]]; then cp "$results"/*.txt "$OUT"/ 2>/dev/null || true; fi
exit $status
