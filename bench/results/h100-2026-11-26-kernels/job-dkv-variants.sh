#!/usr/bin/env bash
# session 13 call 7 (1 GPU): key/value kernel variants (reordered products; V read from shared memory; 3 blocks/SM)
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
source scripts/lib/gpu-build.sh
vs="vr vr3 vv2-b vv3-b"
gpu_build build/cuda-openmpi $OUT bench_kernels >$OUT/build.log 2>&1 || { grep -m10 -i error $OUT/build.log; exit 1; }
for v in $vs; do
  rm -rf /tmp/$v && mkdir /tmp/$v && cp -r CMakeLists.txt CMakePresets.json cmake include bench tests examples /tmp/$v/
  cp scratch/attention_mma_$v.hpp /tmp/$v/include/dpml/kernels/cuda/attention_mma.hpp
  (cd /tmp/$v && gpu_build build/cuda-openmpi /tmp/$v-log bench_kernels >/tmp/$v-build.log 2>&1) || grep -m5 -i error /tmp/$v-build.log &
done
wait
echo "built $(( $(date +%s)-t0 )) s"
b=build/cuda-openmpi
for rep in 1 2; do for v in new $vs; do
  d=$b; [[ $v != new ]] && d=/tmp/$v/$b
  $d/bench/kernels/bench_kernels --iters 50 >/tmp/bk-$v.txt 2>&1
  grep '"attention.*tensor' /tmp/bk-$v.txt | sed "s/^/$v /" | tee -a $OUT/bench_kernels.jsonl | cut -c1-110
done; done
echo "total $(( $(date +%s)-t0 )) s"
