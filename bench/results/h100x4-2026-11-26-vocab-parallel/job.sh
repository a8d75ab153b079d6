#!/usr/bin/env bash
# session 12 call 3 (4 GPUs): the vocabulary-parallel head and ZeRO-1 with stages over NCCL at 4 ranks; throughput
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
nvidia-smi --query-gpu=index,name,power.limit,enforced.power.limit,power.max_limit --format=csv,noheader
source scripts/lib/gpu-build.sh
gpu_build build/cuda-openmpi $OUT test_gpt_tp test_gpt_pp test_gpt_zero gpt_train >$OUT/build.log 2>&1 || { grep -m10 -i error $OUT/build.log; tail -20 $OUT/build.log; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
b=build/cuda-openmpi
ctest --test-dir $b -R "test_gpt_tp|test_gpt_pp|test_gpt_zero" --timeout 150 --output-on-failure >$OUT/ctest.txt 2>&1; echo "ctest rc=$?"
grep -E "Test +#|tests passed" $OUT/ctest.txt; sed 's/\x1b\[[0-9;]*m//g' $OUT/ctest.txt | grep -E "FAILED|with expansion|<=|:=|==|ranks share" | head -30
g=$b/bench/gpt_train/gpt_train
run() { local name=$1 n=$2; shift 2
  timeout 90 mpirun --allow-run-as-root -x NCCL_NVLS_ENABLE -n $n $g --batch 16 --seq 1024 --steps 15 --warmup 3 "$@" >$OUT/$name.txt 2>&1; echo "$name rc=$?"
  grep -h '^{"bench":"gpt_train"' $OUT/$name.txt >>$OUT/gpt.jsonl
  grep '^{"bench":"gpt_train"' $OUT/$name.txt | python3 -c 'import sys,json; r=json.loads(sys.stdin.read()); print({k:r[k] for k in ("impl","ms_per_step","tokens_per_s","mem_gib","loss_first","loss_last")})' 2>/dev/null || tail -5 $OUT/$name.txt; }
run one 1
run tp2 2 --tp 2
run tp2-dp2 4 --tp 2
run tp2-pp2 4 --tp 2 --pp 2 --micro-batch 4
run pp2-dp2-zero1 4 --pp 2 --micro-batch 4 --use-distributed-optimizer
run pp2-dp2 4 --pp 2 --micro-batch 4
echo "total $(( $(date +%s)-t0 )) s"
