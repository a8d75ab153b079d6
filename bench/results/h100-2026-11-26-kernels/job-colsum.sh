#!/usr/bin/env bash
# session 13 call 13 (1 GPU): LayerNorm's weight gradient and the bias gradients on 8-column column sums
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
source scripts/lib/gpu-build.sh
rm -rf /tmp/old && mkdir /tmp/old && cp -r CMakeLists.txt CMakePresets.json cmake include bench tests examples /tmp/old/
cp -r scratch/old/* /tmp/old/include/dpml/kernels/cuda/
gpu_build build/cuda-openmpi $OUT test_cuda_kernels test_cuda_conv test_cuda_gpt_step bench_kernels gpt_train >$OUT/build.log 2>&1 || { grep -m10 -i error $OUT/build.log; exit 1; } &
(cd /tmp/old && gpu_build build/cuda-openmpi /tmp/old-log bench_kernels gpt_train >/tmp/old-build.log 2>&1) || grep -m5 -i error /tmp/old-build.log &
wait
echo "built $(( $(date +%s)-t0 )) s"
b=build/cuda-openmpi
for t in test_cuda_kernels test_cuda_conv test_cuda_gpt_step; do
  $b/tests/cuda/$t >$OUT/$t.txt 2>&1; echo "$t rc=$?"; tail -2 $OUT/$t.txt | head -1
  sed 's/\x1b\[[0-9;]*m//g' $OUT/$t.txt | grep -E "FAILED|with expansion" -A3 | head -12
done
for rep in 1 2; do for v in old new; do
  d=$b; [[ $v != new ]] && d=/tmp/$v/$b
  $d/bench/kernels/bench_kernels --iters 50 >/tmp/bk-$v.txt 2>&1
  grep '"layer_norm\|"bias_grad' /tmp/bk-$v.txt | sed "s/^/$v /" | tee -a $OUT/bench_kernels.jsonl | cut -c1-120
done; done
cp /tmp/bk-new.txt $OUT/bench_kernels-new.txt
g=bench/gpt_train/gpt_train
for v in old new old new; do
  d=$b; [[ $v == old ]] && d=/tmp/old/$b
  $d/$g --batch 16 --seq 1024 --steps 15 --warmup 3 >/tmp/gpt-$v.txt 2>&1
  grep -h '^{"bench":"gpt_train' /tmp/gpt-$v.txt | sed "s/^/$v /" >>$OUT/gpt.jsonl
  grep -h '^{"bench":"gpt_train"' /tmp/gpt-$v.txt | python3 -c 'import sys,json; r=json.loads(sys.stdin.read()); print("'$v'", {k:r[k] for k in ("ms_per_step","tokens_per_s","loss_first","loss_last","mem_gib")})' 2>/dev/null || tail -3 /tmp/gpt-$v.txt
  grep -h '"family":"layer_norm"\|"family":"elementwise"' /tmp/gpt-$v.txt
done
echo "total $(( $(date +%s)-t0 )) s"
