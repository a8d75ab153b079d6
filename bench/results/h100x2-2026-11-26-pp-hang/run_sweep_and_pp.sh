#!/usr/bin/env bash
# session 9 call 2: comm-stream priority × NCCL CTA cap; the pipeline test's failure
set -u
cd "$(dirname "$0")/.."
source scripts/lib/gpu-build.sh
B=build/cuda-openmpi
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
gpu_build $B $OUT gpt_train test_gpt_pp >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
pp=$(find $B -name test_gpt_pp -type f -perm -u+x | head -1)
DPML_NCCL_TIMEOUT_S=25 timeout 60 mpirun --allow-run-as-root --oversubscribe -n 2 $pp -s >$OUT/pp.log 2>&1; echo "pp rc=$?"
grep -n -B3 -A30 -m2 "FAILED\|failed\|rror" $OUT/pp.log | head -80
gpt=$B/bench/gpt_train/gpt_train
common="--batch 16 --seq 1024 --steps 30 --warmup 5"
: > $OUT/sweep.txt
run() { local tag=$1; shift; env "$@" 2>&1 | grep '^{"bench":"gpt_train"' | sed "s/^{/{\"tag\":\"$tag\",/" >>$OUT/sweep.txt; }
run one $gpt $common
run two-high NCCL_DEBUG=WARN scripts/launch.sh -n 2 $gpt $common
run two-low DPML_EXPERIMENT_LOW_PRIORITY=1 scripts/launch.sh -n 2 $gpt $common
for c in 4 8 16; do run two-high-ctas$c NCCL_MAX_CTAS=$c scripts/launch.sh -n 2 $gpt $common; done
run two-high-b12 scripts/launch.sh -n 2 $gpt $common --bucket-mb 12
run one-again $gpt $common
python3 - $OUT/sweep.txt <<'PY'
import json,sys
rs=[json.loads(l) for l in open(sys.argv[1])]
b=rs[0]['tokens_per_s']
print("| run | tok/s | ms/step | min | median | exposed | scaling |")
for r in rs:
    k=r.get('ranks',2 if 'two' in r['tag'] else 1)
    print(f"| {r['tag']} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.2f} | {r['step_ms_min']:.2f} | {r['step_ms_median']:.2f} | {r.get('exposed_comm_ms',0):.2f} | {r['tokens_per_s']/(k*b):.4f} |")
PY
echo "total $(( $(date +%s)-t0 )) s"
