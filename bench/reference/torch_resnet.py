#!/usr/bin/env python3
"""ResNet-50 training throughput in PyTorch on one GPU: the reference our ResNet-50 bench competes with.

torchvision's resnet50 (v1.5: Bottleneck blocks with the stride on the 3x3 conv, expansion 4, layers
[3, 4, 6, 3], torchvision's kaiming init), written out here so that torchvision need not be installed.
The standard recipe: fp32 parameters under bf16 autocast (forward and loss), model and input in
channels_last, cudnn.benchmark, torch.optim.SGD (lr 0.1, momentum 0.9, weight decay 1e-4 on every
tensor, PyTorch's default foreach implementation), cross-entropy on synthetic data (random normal
images and random labels made on the GPU once and reused every step, as llm.c and our bench do).
Modes: eager, and with --compile also torch.compile of the model (each on a fresh model).

Data parallel: under torchrun (WORLD_SIZE > 1) each rank takes the GPU LOCAL_RANK, makes its own
random batch of B images (seeded by its rank), and trains the model wrapped in
DistributedDataParallel over NCCL (bucket_cap_mb 25, gradient_as_bucket_view, broadcast_buffers
off: BatchNorm running statistics stay per rank, as in bench/resnet_train under scripts/launch.sh
-n K); img/s counts all ranks over the slowest rank's step time, "ranks" says how many, and only
rank 0 prints (memory is rank 0's). --sync-bn converts every BatchNorm2d to nn.SyncBatchNorm
(statistics over all ranks' batches, as bench/resnet_train --sync-bn); "sync_bn" in the JSON says
so. On one rank (no process group) SyncBatchNorm runs as plain BatchNorm.

Steps are timed with CUDA events after the warm-up, with no host synchronisation between steps.
Prints one JSON line per mode, {"bench":"resnet50","impl":"torch-eager"|"torch-compile",...}, with
img/s, ms/step and peak memory (torch.cuda.max_memory_allocated over the timed steps, GiB), then a
short table (not with --json-only). power_w and images_per_j: the GPUs' mean power while training
--energy-seconds more after the timed steps (gpu_power.py, the rule of the dpml benches). Reference figure (H100, eager, B=256, 224 px): 3911 img/s, 11.0 GiB.
"""
import argparse
import json
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from gpu_power import add_energy_flag, mean_power_w, per_joule
from torch_gpt import join_ranks, slowest_ms


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        width, out = planes, planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)  # v1.5: stride here
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + identity)


class ResNet(nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, inplanes = [], 64
        for i, blocks in enumerate(layers):
            planes = 64 * 2**i
            for b in range(blocks):
                stages.append(Bottleneck(inplanes, planes, 2 if b == 0 and i > 0 else 1))
                inplanes = planes * Bottleneck.expansion
        self.blocks = nn.Sequential(*stages)
        self.fc = nn.Linear(inplanes, classes)  # PyTorch's default init, as torchvision
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):  # x: (B, 3, H, W) channels_last
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.blocks(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))  # (B, classes)


def measure(a, mode, images, labels, ranks):
    """Trains a fresh model for warmup + steps steps; returns the JSON record of the timed steps."""
    torch.manual_seed(1337)  # the same model on every rank (DDP also broadcasts rank 0's)
    model = ResNet(classes=a.classes).cuda().to(memory_format=torch.channels_last)
    if a.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    fwd = model
    if ranks > 1:
        fwd = nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()], bucket_cap_mb=25,
                                                  gradient_as_bucket_view=True, broadcast_buffers=False)
    fwd = torch.compile(fwd) if mode == "compile" else fwd

    def train_step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(fwd(images), labels)  # fp32 under autocast
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    t_warm = time.time()
    losses = [train_step() for _ in range(a.warmup)]
    torch.cuda.synchronize()
    warm_s = time.time() - t_warm
    if ranks > 1:
        dist.barrier()  # the ranks start the timed steps together
    torch.cuda.reset_peak_memory_stats()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    losses += [train_step() for _ in range(a.steps)]
    e1.record()
    e1.synchronize()
    ms = slowest_ms(e0.elapsed_time(e1) / a.steps, ranks)
    mem = torch.cuda.max_memory_allocated() / 2**30
    watts = mean_power_w(train_step, a.energy_seconds, ms)
    losses = [l.item() for l in losses]
    impl = "torch-" + mode + (f"-ddp{ranks}" if ranks > 1 else "") + ("-syncbn" if a.sync_bn else "")
    return {"bench": "resnet50", "impl": impl, "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "batch": a.batch, "image": a.image, "classes": a.classes, "params": n_params,
            "dtype": "bf16-autocast", "optimizer": "sgd", "steps": a.steps, "warmup": a.warmup,
            "warmup_s": round(warm_s, 1), "ms_per_step": round(ms, 3),
            "images_per_s": round(a.batch * ranks / (ms * 1e-3), 1), "mem_gib": round(mem, 3),
            "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
            "finite": all(math.isfinite(l) for l in losses), "ranks": ranks, "sync_bn": a.sync_bn,
            "power_w": watts and round(watts, 1), "images_per_j": per_joule(a.batch * ranks / (ms * 1e-3), watts)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image", type=int, default=224, help="height and width in pixels")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=50, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (cudnn.benchmark, compilation)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the model (default: eager only)")
    ap.add_argument("--sync-bn", action="store_true",
                    help="synchronised BatchNorm over the ranks (nn.SyncBatchNorm.convert_sync_batchnorm)")
    ap.add_argument("--json-only", action="store_true", help="print the JSON lines only, no table")
    add_energy_flag(ap)
    a = ap.parse_args()
    if a.steps < 1:
        ap.error("--steps must be at least 1")

    ranks, rank = join_ranks()
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    gen = torch.Generator(device="cuda").manual_seed(rank)  # each rank its own batch
    images = torch.randn(a.batch, 3, a.image, a.image, device="cuda", generator=gen)  # (B, 3, H, W)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, a.classes, (a.batch,), device="cuda", generator=gen)  # (B,)

    records = []
    for mode in ["eager"] + (["compile"] if a.compile else []):
        records.append(measure(a, mode, images, labels, ranks))
        if rank == 0:
            print(json.dumps(records[-1]), flush=True)
        torch.cuda.empty_cache()  # the next mode starts from its own fresh model
    if ranks > 1:
        dist.destroy_process_group()
    if rank == 0 and not a.json_only:
        on = f"{ranks} x {records[0]['device']} (DDP, B={a.batch} per rank)" if ranks > 1 else records[0]["device"]
        bn = ", SyncBatchNorm" if a.sync_bn else ""
        print(f"\nResNet-50, B={a.batch}, {a.image} px, bf16 autocast, SGD{bn}, {on}")
        print(f"{'impl':<15} {'img/s':>9} {'ms/step':>9} {'peak GiB':>9} {'loss':>15}")
        for r in records:
            loss = f"{r['loss_first']} -> {r['loss_last']}"
            print(f"{r['impl']:<15} {r['images_per_s']:>9.1f} {r['ms_per_step']:>9.2f} {r['mem_gib']:>9.2f} {loss:>15}")


if __name__ == "__main__":
    main()
