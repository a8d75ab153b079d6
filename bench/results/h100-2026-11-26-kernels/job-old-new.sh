#!/usr/bin/env bash
# session 13 call 2 (1 GPU): attention with fixed per-thread tile copies, ex2.approx.ftz, masks on the diagonal only
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv,noheader
source scripts/lib/gpu-build.sh
mk() { rm -rf /tmp/$1 && mkdir /tmp/$1 && cp -r CMakeLists.txt CMakePresets.json cmake include bench tests examples /tmp/$1/; }
mk old; cp scratch/attention_mma_old.hpp /tmp/old/include/dpml/kernels/cuda/attention_mma.hpp
mk v3; sed -i 's/^    backward_dkv_kernel(/    __launch_bounds__(kThreads, 3) backward_dkv_kernel(/; ' /tmp/v3/include/dpml/kernels/cuda/attention_mma.hpp
grep -n "launch_bounds__(kThreads, 3)" /tmp/v3/include/dpml/kernels/cuda/attention_mma.hpp | head -2
gpu_build build/cuda-openmpi $OUT test_cuda_attention test_cuda_gpt_step bench_kernels gpt_train >$OUT/build.log 2>&1 || { grep -m10 -i error $OUT/build.log; tail -20 $OUT/build.log; exit 1; }
echo "built new $(( $(date +%s)-t0 )) s"
(cd /tmp/old && gpu_build build/cuda-openmpi /tmp/old-log bench_kernels gpt_train >/tmp/old-build.log 2>&1) || { grep -m10 -i error /tmp/old-build.log; }
(cd /tmp/v3 && gpu_build build/cuda-openmpi /tmp/v3-log bench_kernels >/tmp/v3-build.log 2>&1) || { grep -m10 -i error /tmp/v3-build.log; }
echo "built old, v3 $(( $(date +%s)-t0 )) s"
b=build/cuda-openmpi
$b/tests/cuda/test_cuda_attention >$OUT/test_attention.txt 2>&1; echo "test_cuda_attention rc=$?"
sed 's/\x1b\[[0-9;]*m//g' $OUT/test_attention.txt | grep -E "passed|failed|FAILED|with expansion|err_" | head -20
$b/tests/cuda/test_cuda_gpt_step >/tmp/gs.txt 2>&1; echo "test_cuda_gpt_step rc=$?"; tail -2 /tmp/gs.txt
for v in old new v3 old new v3; do
  d=$b; [[ $v != new ]] && d=/tmp/$v/$b
  $d/bench/kernels/bench_kernels --iters 50 >/tmp/bk-$v.txt 2>&1
  grep '"attention.*tensor' /tmp/bk-$v.txt | sed "s/^/$v /" | tee -a $OUT/bench_kernels.jsonl | cut -c1-130
done
g=bench/gpt_train/gpt_train
for v in old new old new; do
  d=$b; [[ $v == old ]] && d=/tmp/old/$b
  $d/$g --batch 16 --seq 1024 --steps 15 --warmup 3 >/tmp/gpt-$v.txt 2>&1
  grep -h '^{"bench":"gpt_train' /tmp/gpt-$v.txt | sed "s/^/$v /" >>$OUT/gpt.jsonl
  grep -h '^{"bench":"gpt_train"' /tmp/gpt-$v.txt | python3 -c 'import sys,json; r=json.loads(sys.stdin.read()); print("'$v'", {k:r[k] for k in ("ms_per_step","tokens_per_s","loss_first","loss_last")})' 2>/dev/null || tail -3 /tmp/gpt-$v.txt
  grep -h '"family":"attention"' /tmp/gpt-$v.txt
done
echo "benched $(( $(date +%s)-t0 )) s"
timeout 150 ncu --kernel-name regex:attn_mma --launch-count 3 --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section LaunchStats $b/bench/kernels/bench_kernels --iters 1 >$OUT/ncu-new.txt 2>&1; echo "ncu rc=$?"
grep -E "attn_mma|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued" $OUT/ncu-new.txt | cut -c1-120 | head -50
echo "total $(( $(date +%s)-t0 )) s"
