#!/usr/bin/env python3
"""BERT-base and ViT-B/16 training throughput in PyTorch: the reference for bench/encoder_train.

The same architectures as dpml's models::Bert and models::Vit, in plain PyTorch:
  bert  L=12, d=768, H=12, V=30522 (embedding padded to a multiple of 128), T=512, B=32: token and
        position embeddings, pre-LN blocks of bidirectional scaled_dot_product_attention, GELU (tanh),
        a final LayerNorm and the masked-LM head tied to the token embedding, cross-entropy over the
        round(0.15·T) chosen positions per sequence (logits on every position, targets −1 elsewhere,
        as BERT's MLM head); [MASK] = 103 at the chosen positions. Random tokens, a new batch per step
        drawn on the GPU. AdamW betas (0.9, 0.98), weight decay 0.01.
  vit   224 px, patch 16 (a stride-16 Conv2d, as torchvision's conv_proj), class token, learned
        positions, the same blocks, LayerNorm of the class token, a 1000-class head, B=128; one batch of
        random images and labels on the GPU, reused. AdamW betas (0.9, 0.999), weight decay 0.05.
        --torchvision trains torchvision.models.vit_b_16 instead (exact GELU, LayerNorm eps 1e-6),
        where torchvision is installed.
bf16 autocast over fp32 parameters, fused AdamW, clip_grad_norm_ 1.0, lr warm-up as encoder_train.
Modes: eager, or torch.compile of the model.

Data parallel: under torchrun (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel
(bucket_cap_mb 25, gradient_as_bucket_view, NCCL), one GPU per rank (LOCAL_RANK), each rank on its
own batch of B (seeded by its rank); samples/s counts all ranks over the slowest rank's step time,
impl ends in -ddpK, and only rank 0 prints (encoder_train under scripts/launch.sh -n K is the
counterpart).

Prints a JSON line {"bench":"encoder_train","model":...,"impl":"torch-eager"|"torch-compile"|
"torchvision-…",...} with samples/s, ms/step, peak memory (torch.cuda.max_memory_allocated over the
timed steps) and MFU by encoder_train's formula ((6N + 12·L·T·d) FLOPs per token, N without padding,
T = 512 or 197), then {"bench":"encoder_train_family",...} lines: one profiled step's CUDA kernel
time by family (torch_gpt.py's grouping). power_w and samples_per_j: the GPU's mean power while training
--energy-seconds more after the timed steps (gpu_power.py, the rule of the dpml benches).
"""
import argparse
import json
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from gpu_power import add_energy_flag, mean_power_w, per_joule
from torch_gpt import (Block, data_parallel, join_ranks, make_train_step, peak_tflops, profile_families, slowest_ms,
                       time_steps)


def init_weights(model):
    for n, p in model.named_parameters():
        if p.dim() >= 2:
            nn.init.normal_(p, 0.0, 0.02)
        elif n.endswith("bias"):
            nn.init.zeros_(p)


class Bert(nn.Module):
    def __init__(self, layers, d, h, vocab, padded_vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(padded_vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList(Block(d, h, causal=False) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.vocab = vocab
        init_weights(self)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)[..., : self.vocab]  # tied head, padding left out
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1), ignore_index=-1)


class Vit(nn.Module):
    def __init__(self, layers, d, h, image, patch, classes):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, d))
        self.h = nn.ModuleList(Block(d, h, causal=False) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)
        init_weights(self)

    def forward(self, images, labels):
        x = self.conv_proj(images).flatten(2).transpose(1, 2)  # (B, T, d)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for b in self.h:
            x = b(x)
        return F.cross_entropy(self.head(self.ln_f(x[:, 0])), labels)


class TorchvisionVit(nn.Module):
    def __init__(self, classes):
        super().__init__()
        import torchvision

        self.net = torchvision.models.vit_b_16(num_classes=classes)

    def forward(self, images, labels):
        return F.cross_entropy(self.net(images), labels)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["bert", "vit"], default="bert")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--torchvision", action="store_true", help="vit: torchvision.models.vit_b_16 instead")
    ap.add_argument("--batch", type=int, default=0, help="0: BERT 32, ViT 128")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--mask-prob", type=float, default=0.15)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--patch", type=int, default=16)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-4)
    add_energy_flag(ap)
    a = ap.parse_args()
    bert = a.model == "bert"
    batch = a.batch or (32 if bert else 128)
    ranks, rank = join_ranks()

    torch.manual_seed(1337)  # the same model on every rank (DDP also broadcasts rank 0's)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = "cuda"
    peak = peak_tflops()
    if bert:
        padded = (a.vocab + 127) // 128 * 128
        model = Bert(a.layers, a.dim, a.heads, a.vocab, padded, a.seq).to(dev)
        n_params = sum(p.numel() for p in model.parameters()) - (padded - a.vocab) * a.dim
        tokens, betas, decay = a.seq, (0.9, 0.98), 0.01
        chosen = round(a.mask_prob * a.seq)
        gen = torch.Generator(device=dev).manual_seed(1337 + rank)  # each rank its own batches

        def next_batch():
            idx = torch.randint(0, a.vocab, (batch, a.seq), device=dev, generator=gen)
            pos = torch.rand(batch, a.seq, device=dev, generator=gen).topk(chosen, dim=1).indices
            targets = torch.full_like(idx, -1).scatter_(1, pos, idx.gather(1, pos))
            return idx.scatter(1, pos, 103), targets
    else:
        model = (TorchvisionVit(a.classes) if a.torchvision else Vit(a.layers, a.dim, a.heads, a.image, a.patch, a.classes)).to(dev)
        n_params = sum(p.numel() for p in model.parameters())
        tokens, betas, decay = (a.image // a.patch) ** 2 + 1, (0.9, 0.999), 0.05
        gen = torch.Generator(device=dev).manual_seed(1337 + rank)
        images = torch.randn(batch, 3, a.image, a.image, device=dev, generator=gen)
        labels = torch.randint(0, a.classes, (batch,), device=dev, generator=gen)

        def next_batch():
            return images, labels
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=betas, eps=1e-8, weight_decay=decay, fused=True)
    fwd = data_parallel(model, ranks)
    fwd = torch.compile(fwd) if a.mode == "compile" else fwd
    train_step = make_train_step(fwd, model, opt, next_batch, a.lr, a.warmup)
    losses, warm_s, ms, mem = time_steps(train_step, a.warmup, a.steps)
    ms = slowest_ms(ms, ranks)
    watts = mean_power_w(train_step, a.energy_seconds, ms)

    samples_s = batch * ranks / (ms * 1e-3)
    fpt = 6 * n_params + 12 * a.layers * tokens * a.dim
    tflops = fpt * tokens * samples_s / ranks / 1e12  # per GPU
    impl = ("torchvision-" if a.torchvision and not bert else "torch-") + a.mode + (f"-ddp{ranks}" if ranks > 1 else "")
    fam = profile_families(train_step)
    if ranks > 1:
        dist.destroy_process_group()
    if rank != 0:
        return
    print(json.dumps({"bench": "encoder_train", "model": a.model, "impl": impl, "device": torch.cuda.get_device_name(),
                      "torch": torch.__version__, "batch": batch, "tokens": tokens, "layers": a.layers, "dim": a.dim,
                      "heads": a.heads, "params": n_params, "steps": a.steps, "warmup": a.warmup, "warmup_s": round(warm_s, 1),
                      "ms_per_step": round(ms, 3), "samples_per_s": round(samples_s, 1), "model_tflops": round(tflops, 2),
                      "peak_tflops": round(peak, 1), "mfu": round(tflops / peak, 4), "mem_gib": round(mem, 3),
                      "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
                      "finite": all(math.isfinite(l) for l in losses), "ranks": ranks,
                      "power_w": watts and round(watts, 1), "samples_per_j": per_joule(samples_s, watts)}), flush=True)
    total = sum(fam.values()) or 1.0
    for f, t in sorted(fam.items(), key=lambda kv: -kv[1]):
        print(json.dumps({"bench": "encoder_train_family", "model": a.model, "impl": impl, "family": f, "ms": round(t, 3),
                          "share": round(t / total, 4)}), flush=True)


if __name__ == "__main__":
    main()
