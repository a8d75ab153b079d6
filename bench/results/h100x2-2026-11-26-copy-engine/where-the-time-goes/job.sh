#!/usr/bin/env bash
# session 12 call 5 (2 GPUs): where the data-parallel cost goes — a lone step beside copy-engine traffic
# of a DP step's size; a DP step with the bulk copies left out (signals, sums, gather kept)
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
source scripts/lib/gpu-build.sh
gpu_build build/cuda-openmpi $OUT gpt_train >$OUT/build.log 2>&1 || { grep -m10 -i error $OUT/build.log; tail -20 $OUT/build.log; exit 1; }
nvcc -O2 -o /tmp/traffic scratch/traffic.cu || exit 1
rm -rf /tmp/exp && mkdir /tmp/exp && cp -r CMakeLists.txt CMakePresets.json cmake include bench tests examples scripts /tmp/exp/ 2>/dev/null
cp scratch/nccl_copy_engine_no_bulk.hpp /tmp/exp/include/dpml/comm/nccl_copy_engine.hpp
(cd /tmp/exp && gpu_build build/exp $OUT/exp gpt_train >$OUT/build-exp.log 2>&1) || { tail -20 $OUT/build-exp.log; }
echo "built $(( $(date +%s)-t0 )) s"
g=build/cuda-openmpi/bench/gpt_train/gpt_train
common="--batch 16 --seq 1024 --steps 30 --warmup 5"
show() { grep '^{"bench":"gpt_train"' $1 | python3 -c 'import sys,json; r=json.loads(sys.stdin.read()); print({k:r[k] for k in ("impl","ms_per_step","step_ms_min","step_ms_median","tokens_per_s","exposed_comm_ms")})' 2>/dev/null || tail -3 $1; }
sample() { nvidia-smi --query-gpu=index,utilization.gpu,clocks.sm,power.draw --format=csv,noheader,nounits -lms 200 >$OUT/$1.gpu.csv & smi=$!; }
clocks() { kill $smi; wait $smi 2>/dev/null; python3 -c "
import statistics,sys
rows=[l.split(',') for l in open('$OUT/$1.gpu.csv')]
for g in ('0','1'):
  xs=[(float(r[2]),float(r[3])) for r in rows if r[0].strip()==g and float(r[1])>=50]
  if xs: print('  GPU',g,'busy',len(xs),'SM MHz',statistics.median_high([x[0] for x in xs]),'W',statistics.median_high([x[1] for x in xs]))"; }
lone() { local name=$1; shift; sample $name; "$@" >$OUT/$name.txt 2>&1; echo "$name rc=$?"; show $OUT/$name.txt; clocks $name; }
lone dp1 env CUDA_VISIBLE_DEVICES=0 $g $common
/tmp/traffic 25 40 250 25 >$OUT/traffic1.txt 2>&1 & tp=$!; sleep 1
lone dp1-traffic env CUDA_VISIBLE_DEVICES=0 $g $common
wait $tp; cat $OUT/traffic1.txt
/tmp/traffic 25 40 500 25 >$OUT/traffic2.txt 2>&1 & tp=$!; sleep 1
lone dp1-traffic-x2 env CUDA_VISIBLE_DEVICES=0 $g $common
wait $tp; cat $OUT/traffic2.txt
lone dp2-nccl scripts/launch.sh -n 2 $g $common
lone dp2-ce scripts/launch.sh -n 2 $g $common --dp-comm copy-engine
lone dp2-ce-nobulk env DPML_EXP_NO_BULK=1 scripts/launch.sh -n 2 /tmp/exp/build/exp/bench/gpt_train/gpt_train $common --dp-comm copy-engine
lone dp2-ce-tied-allreduce-nobulk env DPML_EXP_NO_BULK=1 scripts/launch.sh -n 2 /tmp/exp/build/exp/bench/gpt_train/gpt_train $common --dp-comm copy-engine --tied-grad allreduce
lone dp1-again env CUDA_VISIBLE_DEVICES=0 $g $common
echo "total $(( $(date +%s)-t0 )) s"
