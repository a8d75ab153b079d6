#!/usr/bin/env bash
# session 13 call 5 (1 GPU): occupancy variant v5 (forward ≥ 5 blocks/SM, dq ≥ 4) against the current attention
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
source scripts/lib/gpu-build.sh
rm -rf /tmp/v5 && mkdir /tmp/v5 && cp -r CMakeLists.txt CMakePresets.json cmake include bench tests examples /tmp/v5/
cp scratch/attention_mma_v5.hpp /tmp/v5/include/dpml/kernels/cuda/attention_mma.hpp
gpu_build build/cuda-openmpi $OUT bench_kernels gpt_train >$OUT/build.log 2>&1 || { grep -m10 -i error $OUT/build.log; exit 1; }
(cd /tmp/v5 && gpu_build build/cuda-openmpi /tmp/v5-log bench_kernels gpt_train test_cuda_attention >/tmp/v5-build.log 2>&1) || { grep -m10 -i error /tmp/v5-build.log; }
echo "built $(( $(date +%s)-t0 )) s"
b=build/cuda-openmpi
/tmp/v5/$b/tests/cuda/test_cuda_attention >$OUT/test_attention_v5.txt 2>&1; echo "test_cuda_attention v5 rc=$?"
for v in new v5 new v5; do
  d=$b; [[ $v != new ]] && d=/tmp/$v/$b
  $d/bench/kernels/bench_kernels --iters 50 >/tmp/bk-$v.txt 2>&1
  grep '"attention.*tensor' /tmp/bk-$v.txt | sed "s/^/$v /" | tee -a $OUT/bench_kernels.jsonl | cut -c1-130
done
g=bench/gpt_train/gpt_train
for v in new v5 new v5; do
  d=$b; [[ $v != new ]] && d=/tmp/$v/$b
  $d/$g --batch 16 --seq 1024 --steps 15 --warmup 3 >/tmp/gpt-$v.txt 2>&1
  grep -h '^{"bench":"gpt_train' /tmp/gpt-$v.txt | sed "s/^/$v /" >>$OUT/gpt.jsonl
  grep -h '^{"bench":"gpt_train"' /tmp/gpt-$v.txt | python3 -c 'import sys,json; r=json.loads(sys.stdin.read()); print("'$v'", {k:r[k] for k in ("ms_per_step","tokens_per_s","loss_last")})' 2>/dev/null || tail -3 /tmp/gpt-$v.txt
  grep -h '"family":"attention"' /tmp/gpt-$v.txt
done
echo "total $(( $(date +%s)-t0 )) s"
