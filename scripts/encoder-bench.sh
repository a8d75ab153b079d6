#!/usr/bin/env bash
# BERT-base and ViT-B/16 training on one GPU: dpml against PyTorch eager and torch.compile, in one job
# (a GPU machine; ~8 minutes, most of it torch.compile).
#
#   1. configure the cuda-openmpi preset, build encoder_train
#   2. for --model bert, then vit: encoder_train (dpml's models::Bert / models::Vit under its trainers),
#      then bench/reference/torch_encoder.py eager and compiled, the same architecture, batch and
#      optimizer; for vit also torchvision's vit_b_16 (eager, compiled) where torchvision imports
#   3. with ≥ 2 GPUs (NCCL_NVLS_ENABLE=0): encoder_train on 2 ranks (scripts/launch.sh -n 2, data
#      parallel, each rank its own batch of B) and torch_encoder.py under torchrun --nproc_per_node 2
#      (DDP), for each model and mode
#   4. a table: samples/s, ms/step, MFU, memory, power, the ratios dpml / torch at the same number of
#      GPUs, the 2-GPU scaling efficiency, and the kernel families
#
# Usage: scripts/encoder-bench.sh [--steps N] [--warmup N] [--models "bert vit"] [--modes "eager compile"]
#   --modes: the PyTorch runs (eager, compile or both)
# JSON lines land in $RESULTS (default build/cuda-openmpi/encoder-bench), and also in $OUT when set.
# Exit status: non-zero if the build or any benchmark failed (all of them still run).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=20 warmup=5 models="bert vit" modes="eager compile"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps|--warmup|--models|--modes)
      [[ $# -ge 2 ]] || { echo "encoder-bench.sh: $1 needs a value" >&2; exit 2; }
      declare "${1#--}=$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "encoder-bench.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done

build=build/cuda-openmpi
results=${RESULTS:-$build/encoder-bench}
source scripts/lib/gpu-build.sh
gpu_build "$build" "$results" encoder_train
rm -f "$results"/*.txt

status=0
common=(--steps "$steps" --warmup "$warmup")
for model in $models; do
  echo "== dpml encoder_train --model $model"
  "$build/bench/encoder_train/encoder_train" --model "$model" "${common[@]}" | tee "$results/$model-dpml.txt" || status=1
  for mode in $modes; do
    echo "== torch $model $mode"
    python3 bench/reference/torch_encoder.py --model "$model" --mode "$mode" "${common[@]}" |
      tee "$results/$model-torch-$mode.txt" || status=1
    if [[ $model == vit ]] && python3 -c 'import torchvision' 2>/dev/null; then
      echo "== torchvision vit_b_16 $mode"
      python3 bench/reference/torch_encoder.py --model vit --torchvision --mode "$mode" "${common[@]}" |
        tee "$results/$model-torchvision-$mode.txt" || status=1
    fi
  done
done

gpus="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)"
if [[ "$gpus" -ge 2 ]]; then
  export NCCL_NVLS_ENABLE=0  # NVLink multicast off
  for model in $models; do
    echo "== dpml encoder_train --model $model on 2 GPUs"
    scripts/launch.sh -n 2 "$build/bench/encoder_train/encoder_train" --model "$model" "${common[@]}" |
      tee "$results/$model-dpml-dp2.txt" || status=1
    for mode in $modes; do
      echo "== torch $model $mode, DDP on 2 GPUs"
      torch_ranks 2 bench/reference/torch_encoder.py --model "$model" --mode "$mode" "${common[@]}" |
        tee "$results/$model-torch-$mode-ddp2.txt" || status=1
    done
  done
else
  echo "== 2 GPUs skipped: nvidia-smi lists $gpus GPU(s)"
fi

echo "== summary"
python3 - "$results" <<'PY' || status=1
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
runs, fams = {}, {}
for p in sorted(d.glob("*.txt")):
    for line in p.read_text().splitlines():
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        key = (j.get("model"), j["impl"])
        if j["bench"] == "encoder_train":
            runs[key] = j
        elif j["bench"] == "encoder_train_family":
            fams.setdefault(f"{key[0]} {key[1]}", {})[j["family"]] = j["ms"]
print("| model | impl | device | samples/s | ms/step | MFU | memory GiB | power W | samples/J | loss first → last |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (model, impl), j in runs.items():
    print(f"| {model} | {impl} | {j['device']} | {j['samples_per_s']:.0f} | {j['ms_per_step']:.2f} | {100 * j['mfu']:.1f} % | "
          f"{j['mem_gib']:.2f} | {j.get('power_w') or ''} | {j.get('samples_per_j') or ''} | {j['loss_first']:.3f} → {j['loss_last']:.3f} |")
print()
print("| ratio (the same number of GPUs) | samples/s | memory |")
print("|---|---|---|")
for (model, impl), j in runs.items():
    if not impl.startswith("dpml"):
        continue
    for (m2, ref), r in runs.items():
        if m2 == model and not ref.startswith("dpml") and r.get("ranks", 1) == j.get("ranks", 1):
            print(f"| {model}: {impl} / {ref} | {j['samples_per_s'] / r['samples_per_s']:.3f} | {j['mem_gib'] / r['mem_gib']:.3f} |")
many = [(k, j) for k, j in runs.items() if j.get("ranks", 1) > 1]
if many:
    print()
    print("| 2-GPU scaling (samples/s over 2 × the 1-GPU run's) | efficiency |")
    print("|---|---|")
    for (model, impl), j in many:
        base = impl.removesuffix(f"-dp{j['ranks']}").removesuffix(f"-ddp{j['ranks']}")
        if (model, base) in runs:
            one = runs[(model, base)]["samples_per_s"]
            print(f"| {model} {impl} | {j['samples_per_s'] / (j['ranks'] * one):.3f} |")
sys.path.insert(0, "scripts/lib")
from family_table import print_family_table
print_family_table(fams)
PY
if [[ -n "${OUT:-}" ]]; then cp "$results"/*.txt "$OUT"/ 2>/dev/null || true; fi
exit $status
