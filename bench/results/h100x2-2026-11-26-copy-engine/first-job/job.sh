#!/usr/bin/env bash
# session 12 call 1 (2 GPUs): comm::CopyEngine (test_nccl, test_gpt_dp, bench_allreduce, gpt_train
# --dp-comm copy-engine) and the vocabulary-parallel head (test_cuda_kernels, test_gpt_tp/pp/zero, gpt step)
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
nvidia-smi --query-gpu=index,name,clocks.max.sm --format=csv,noheader
nvidia-smi topo -m | head -4
source scripts/lib/gpu-build.sh
gpu_build build/cuda-openmpi $OUT test_nccl test_gpt_dp bench_allreduce gpt_train test_cuda_kernels test_gpt_tp test_gpt_pp test_gpt_zero test_cuda_gpt_step >$OUT/build.log 2>&1 || { grep -m10 -i error $OUT/build.log; tail -20 $OUT/build.log; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
b=build/cuda-openmpi
mpi="mpirun --allow-run-as-root -x NCCL_NVLS_ENABLE"
timeout 90 $mpi -n 2 $b/tests/nccl/test_nccl "[copy-engine]" >$OUT/test_ce.txt 2>&1; echo "test_nccl [copy-engine] rc=$?"
sed 's/\x1b\[[0-9;]*m//g' $OUT/test_ce.txt | grep -E "passed|failed|FAILED|with expansion|==|error" | head -20
timeout 100 $mpi -n 2 $b/bench/allreduce/bench_allreduce --min-bytes 4M --max-bytes 256M --iters 10 --repeats 5 >$OUT/allreduce.txt 2>&1; echo "allreduce rc=$?"
grep "^|" $OUT/allreduce.txt
g=$b/bench/gpt_train/gpt_train
run() { local name=$1 n=$2; shift 2
  timeout 60 $mpi -n $n $g "$@" >$OUT/$name.txt 2>&1; echo "$name rc=$?"
  grep '^{"bench":"gpt_train"' $OUT/$name.txt | python3 -c 'import sys,json; r=json.loads(sys.stdin.read()); print({k:r[k] for k in ("impl","ms_per_step","step_ms_min","tokens_per_s","mem_gib","loss_first","loss_last","exposed_comm_ms")})' 2>/dev/null || tail -5 $OUT/$name.txt; }
common="--batch 16 --seq 1024 --steps 15 --warmup 3"
run dp1 1 $common
run dp2 2 $common
run dp2-ce 2 $common --dp-comm copy-engine
run dp2-ce-fp32 2 $common --dp-comm copy-engine --grad-reduce fp32
echo "benched $(( $(date +%s)-t0 )) s"
ctest --test-dir $b -R "test_nccl_np2|test_gpt_dp|test_gpt_tp|test_gpt_pp|test_gpt_zero|test_cuda_gpt_step|test_cuda_kernels" --timeout 150 --output-on-failure >$OUT/ctest.txt 2>&1; echo "ctest rc=$?"
grep -E "Test +#|tests passed" $OUT/ctest.txt; sed 's/\x1b\[[0-9;]*m//g' $OUT/ctest.txt | grep -E "FAILED|with expansion|<=|:=|==" | head -30
echo "total $(( $(date +%s)-t0 )) s"
