#!/usr/bin/env bash
# session 12 call 6 (2 GPUs): ResNet-50 data parallel, 1 vs 2 GPUs, dpml (cuDNN convolutions) and PyTorch DDP, one job
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
source scripts/lib/gpu-build.sh
gpu_build build/cuda-openmpi $OUT resnet_train >$OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
r=build/cuda-openmpi/bench/resnet_train/resnet_train
common="--batch 256 --steps 15 --warmup 5"
show() { grep '^{' $OUT/$1.txt | head -1 | python3 -c 'import sys,json; r=json.loads(sys.stdin.read()); print({k:r.get(k) for k in ("impl","ranks","img_per_s","ms_per_step","mem_gib","exposed_comm_ms","loss_last")})' 2>/dev/null || tail -3 $OUT/$1.txt; }
timeout 40 $r $common --conv cudnn >$OUT/dpml-1.txt 2>&1; echo "dpml-1 rc=$?"; show dpml-1
timeout 45 scripts/launch.sh -n 2 $r $common --conv cudnn >$OUT/dpml-2.txt 2>&1; echo "dpml-2 rc=$?"; show dpml-2
echo "at $(( $(date +%s)-t0 )) s"
timeout 60 python3 bench/reference/torch_resnet.py $common >$OUT/torch-1.txt 2>&1; echo "torch-1 rc=$?"; show torch-1
timeout 70 torchrun --standalone --nproc_per_node 2 bench/reference/torch_resnet.py $common >$OUT/torch-ddp2.txt 2>&1; echo "torch-ddp2 rc=$?"; show torch-ddp2
echo "total $(( $(date +%s)-t0 )) s"
