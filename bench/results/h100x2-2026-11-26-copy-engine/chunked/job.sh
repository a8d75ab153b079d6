#!/usr/bin/env bash
# session 12 call 4 (2 GPUs): the copy-engine all-reduce in chunks on two streams
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
source scripts/lib/gpu-build.sh
gpu_build build/cuda-openmpi $OUT test_nccl test_gpt_dp bench_allreduce gpt_train >$OUT/build.log 2>&1 || { grep -m10 -i error $OUT/build.log; tail -20 $OUT/build.log; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
b=build/cuda-openmpi
mpi="mpirun --allow-run-as-root -x NCCL_NVLS_ENABLE -x DPML_CE_CHUNK_MB"
for c in 4 1; do export DPML_CE_CHUNK_MB=$c
timeout 90 $mpi -n 2 $b/tests/nccl/test_nccl "[copy-engine]" >$OUT/test_ce_$c.txt 2>&1; echo "chunk $c MB: test_nccl [copy-engine] rc=$?"
sed 's/\x1b\[[0-9;]*m//g' $OUT/test_ce_$c.txt | grep -E "passed|failed|FAILED|with expansion" | head -10
done
export DPML_CE_CHUNK_MB=4
timeout 120 $mpi -n 2 $b/tests/nccl/test_gpt_dp >$OUT/test_gpt_dp.txt 2>&1; echo "test_gpt_dp rc=$?"; sed 's/\x1b\[[0-9;]*m//g' $OUT/test_gpt_dp.txt | grep -E "passed|failed|FAILED" | head -5
for c in 1024 8 4 2; do export DPML_CE_CHUNK_MB=$c
timeout 100 $mpi -n 2 $b/bench/allreduce/bench_allreduce --min-bytes 4M --max-bytes 256M --iters 10 --repeats 5 >$OUT/allreduce_$c.txt 2>&1; echo "chunk $c MB allreduce rc=$?"
grep "^| bf16" $OUT/allreduce_$c.txt
done
g=$b/bench/gpt_train/gpt_train
run() { local name=$1 n=$2; shift 2
  timeout 60 $mpi -n $n $g --batch 16 --seq 1024 --steps 20 --warmup 5 "$@" >/tmp/$name.txt 2>&1; echo "$name rc=$?"
  grep -h '^{"bench":"gpt_train"' /tmp/$name.txt | sed "s/^{/{\"run\":\"$name\",/" >>$OUT/gpt.jsonl
  grep '^{"bench":"gpt_train"' /tmp/$name.txt | python3 -c 'import sys,json; r=json.loads(sys.stdin.read()); print({k:r[k] for k in ("impl","ms_per_step","step_ms_min","tokens_per_s","exposed_comm_ms")})' 2>/dev/null || tail -5 /tmp/$name.txt; }
run dp1 1
run nccl 2
DPML_CE_CHUNK_MB=4 run ce-c4 2 --dp-comm copy-engine
DPML_CE_CHUNK_MB=1024 run ce-c1024 2 --dp-comm copy-engine
DPML_CE_CHUNK_MB=2 run ce-c2 2 --dp-comm copy-engine
run nccl-again 2
DPML_CE_CHUNK_MB=4 run ce-c4-again 2 --dp-comm copy-engine
echo "total $(( $(date +%s)-t0 )) s"
