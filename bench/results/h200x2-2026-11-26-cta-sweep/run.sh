#!/usr/bin/env bash
# session 9 call 1: validate refactors, NCCL CTA sweep, pipeline hang diagnosis
set -u
cd "$(dirname "$0")/.."
source scripts/lib/gpu-build.sh
B=build/cuda-openmpi
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
gpu_build $B $OUT gpt_train test_nccl test_staged test_gpt_dp test_gpt_zero test_gpt_tp test_gpt_pp test_resnet_dp \
  test_resnet_syncbn nccl_select_device test_cuda_gpt_step test_cuda_kernels >$OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
gpt=$B/bench/gpt_train/gpt_train
common="--batch 16 --seq 1024 --steps 20 --warmup 5"
: > $OUT/sweep.txt
run() { local tag=$1; shift; echo "== $tag" >>$OUT/sweep.txt; env "$@" 2>&1 | grep '^{' | sed "s/^{/{\"tag\":\"$tag\",/" >>$OUT/sweep.txt; }
run one $gpt $common
run two-default scripts/launch.sh -n 2 $gpt $common
for c in 2 4 8 16; do run two-maxctas$c NCCL_MAX_CTAS=$c scripts/launch.sh -n 2 $gpt $common; done
run two-policy-eff NCCL_CTA_POLICY=1 scripts/launch.sh -n 2 $gpt $common
run two-maxctas4-b50 NCCL_MAX_CTAS=4 scripts/launch.sh -n 2 $gpt $common --bucket-mb 50
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_MAX_CTAS=4 scripts/launch.sh -n 2 $gpt --batch 16 --seq 1024 --steps 2 --warmup 1 2>&1 | grep -i "channel\|CTA" | sort | uniq -c | head -12
echo "sweep done $(( $(date +%s)-t0 )) s"
ctest --test-dir $B -L nccl -E gpt_pp --timeout 120 2>&1 | tail -15
ctest --test-dir $B -R "cuda_gpt_step|cuda_kernels" --timeout 200 2>&1 | tail -5
echo "tests done $(( $(date +%s)-t0 )) s"
pp=$(find $B -name test_gpt_pp -type f -perm -u+x | head -1)
for v in PLAIN=1 NCCL_RUNTIME_CONNECT=0 CUDA_MODULE_LOADING=EAGER; do
  s=$(date +%s)
  env $v timeout 45 mpirun --allow-run-as-root --oversubscribe -n 2 $pp >$OUT/pp-$v.log 2>&1; rc=$?
  echo "pp [$v] rc=$rc $(( $(date +%s)-s )) s: $(grep -E 'test cases|assertions' $OUT/pp-$v.log | tail -1)"
done
python3 - $OUT/sweep.txt <<'PY'
import json,sys
rs=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
one=[r for r in rs if r['tag']=='one']
b=one[0]['tokens_per_s'] if one else None
print("| run | tok/s | ms/step | exposed ms | scaling |")
for r in rs:
    k=r.get('ranks',1); e=r['tokens_per_s']/(k*b) if b else 0
    print(f"| {r['tag']} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.2f} | {r.get('exposed_comm_ms',0):.2f} | {e:.4f} |")
PY
echo "total $(( $(date +%s)-t0 )) s"
