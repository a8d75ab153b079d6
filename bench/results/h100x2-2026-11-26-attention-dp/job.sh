#!/usr/bin/env bash
# session 13 call 6 (2 GPUs): the data-parallel scaling job on today's code (faster attention), test_gpt_dp
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
source scripts/lib/gpu-build.sh
gpu_build build/cuda-openmpi $OUT test_gpt_dp >$OUT/build.log 2>&1 || { grep -m10 -i error $OUT/build.log; exit 1; }
ctest --test-dir build/cuda-openmpi -R "test_gpt_dp" --timeout 120 --output-on-failure >$OUT/ctest.txt 2>&1; echo "ctest rc=$?"; grep -E "Test +#|tests passed" $OUT/ctest.txt
echo "tests $(( $(date +%s)-t0 )) s"
OUT= RESULTS=/tmp/scaling bash scripts/scaling-bench.sh --no-tests --steps 20 --warmup 5 >/tmp/scaling.log 2>&1; echo "scaling-bench rc=$?"
cp /tmp/scaling.log $OUT/scaling-bench.log
tar czf $OUT/scaling.tgz -C /tmp scaling
sed -n '/== summary/,$p' /tmp/scaling.log
echo "total $(( $(date +%s)-t0 )) s"
