#!/usr/bin/env bash
# session 13 call 10 (1 GPU): scripts/gpu-bench.sh on today's code — dpml against PyTorch eager and torch.compile in one job
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
RESULTS=/tmp/gpu-bench OUT= bash scripts/gpu-bench.sh --steps 10 --warmup 3 >/tmp/gpu-bench.log 2>&1; echo "gpu-bench rc=$?"
cp /tmp/gpu-bench.log $OUT/gpu-bench.log
tar czf $OUT/gpu-bench.tgz -C /tmp gpu-bench
grep -A30 "== summary\|| impl" /tmp/gpu-bench.log | head -40
echo "total $(( $(date +%s)-t0 )) s"
