#!/usr/bin/env bash
# session 12 call 2 (2 GPUs): scaling-bench (control, NCCL and copy-engine buckets, PyTorch DDP), then copy-engine variants
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
which nsys ncu 2>&1 | head -2
OUT= RESULTS=/tmp/scaling bash scripts/scaling-bench.sh --no-tests --steps 20 --warmup 5 >/tmp/scaling.log 2>&1; echo "scaling-bench rc=$?"
cp /tmp/scaling.log $OUT/scaling-bench.log
sed -n '/== summary/,$p' /tmp/scaling.log
echo "bench $(( $(date +%s)-t0 )) s"
g=build/cuda-openmpi/bench/gpt_train/gpt_train
run() { local name=$1; shift
  timeout 60 scripts/launch.sh -n 2 $g --batch 16 --seq 1024 --steps 20 --warmup 5 "$@" >/tmp/$name.txt 2>&1; echo "$name rc=$?"
  grep -h '^{"bench":"gpt_train"' /tmp/$name.txt >>$OUT/variants.jsonl
  grep '^{"bench":"gpt_train"' /tmp/$name.txt | python3 -c 'import sys,json; r=json.loads(sys.stdin.read()); print({k:r[k] for k in ("impl","tied_grad","bucket_mb","ms_per_step","step_ms_min","tokens_per_s","exposed_comm_ms")})' 2>/dev/null || tail -5 /tmp/$name.txt; }
run ce-b12 --dp-comm copy-engine --bucket-mb 12
run ce-b50 --dp-comm copy-engine --bucket-mb 50
run ce-tied-allreduce --dp-comm copy-engine --tied-grad allreduce
run nccl-again
run ce-again --dp-comm copy-engine
echo "total $(( $(date +%s)-t0 )) s"
