#!/usr/bin/env python3
"""GPT-2 training throughput in PyTorch: the reference for bench/gpt_train (same model and step).

GPT-2 124M (L=12, d=768, H=12, V=50304 padded, T=1024), tied LM head, pre-LN blocks, GELU (tanh),
causal scaled_dot_product_attention (flash), bf16 autocast over fp32 parameters, fused AdamW
(betas 0.9/0.95, eps 1e-8, weight decay 0.1 on every tensor, as gpt_train), clip_grad_norm_ 1.0,
random tokens. Modes: eager, or torch.compile of the model.

Data parallel: under torchrun (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel
(bucket_cap_mb 25, gradient_as_bucket_view, NCCL), one GPU per rank (LOCAL_RANK), each rank on its
own random batch of B sequences; tokens/s counts all ranks over the slowest rank's step time, and
only rank 0 prints. bench/gpt_train under scripts/launch.sh -n K is the counterpart.

Prints JSON lines: {"bench":"gpt_train","impl":"torch-eager"|"torch-compile",...} with tokens/s,
ms/step, peak memory (torch.cuda.max_memory_allocated over the timed steps), and
{"bench":"gpt_train_family",...} from torch.profiler over one step (CUDA kernel time grouped by
kernel name into families). MFU uses the same formula as gpt_train: (6N + 12·L·T·d) FLOPs per
token, N the parameter count without padding, against a bf16 8192³ matmul measured here. power_w and
tokens_per_j: the GPUs' mean power while training --energy-seconds more after the timed steps (gpu_power.py,
the rule of the dpml benches).
"""
import argparse
import json
import math
import re
import time

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from gpu_power import add_energy_flag, mean_power_w, per_joule


class Block(nn.Module):
    """Pre-LN transformer block; causal attention (GPT-2) or bidirectional (torch_encoder.py's BERT and ViT)."""

    def __init__(self, d, h, causal=True):
        super().__init__()
        self.h = h
        self.causal = causal
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, d, h, vocab, padded_vocab, max_seq):
        super().__init__()
        self.wte = nn.Embedding(padded_vocab, d)
        self.wpe = nn.Embedding(max_seq, d)
        self.h = nn.ModuleList(Block(d, h) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.vocab = vocab
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head over the padded vocabulary
        logits = logits[..., : self.vocab]  # the padding stays out of the softmax, as in gpt_train
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))  # fp32 under autocast


def peak_tflops(n=8192):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(20):
        a @ a
    e1.record()
    e1.synchronize()
    return 2 * n**3 * 20 / (e0.elapsed_time(e1) * 1e-3) / 1e12


FAMILIES = [  # first match wins
    ("communication", r"nccl"),
    ("attention", r"flash|fmha|attention|sdpa|attn"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|matmul|sm90_|sm80_"),
    ("layer_norm", r"layer_norm|layernorm"),
    ("optimizer", r"adam|multi_tensor|foreach|norm_kernel|lpnorm|clip"),
    ("cross_entropy", r"softmax|cross_entropy|nll|log_softmax"),
    ("embedding", r"embedding|index_select|indexing|scatter|gather"),
    ("triton_fused", r"^triton"),
    ("elementwise", r"elementwise|vectorized|gelu|add|mul|copy|fill|reduce"),
]


def family(name):
    low = name.lower()
    for f, pat in FAMILIES:
        if re.search(pat, low):
            return f
    return "other"


def profile_families(train_step):
    """CUDA kernel time (ms) of one profiled step, grouped by kernel name into families."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        train_step()
        torch.cuda.synchronize()
    fam = {}
    for e in prof.key_averages():
        if e.device_type != DeviceType.CUDA:
            continue
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = e.self_cuda_time_total
        if t > 0:
            fam[family(e.key)] = fam.get(family(e.key), 0.0) + t / 1e3  # µs → ms
    return fam


def make_train_step(fwd, model, opt, next_batch, lr, warmup):
    """One step as the dpml benches time it: the next (inputs, targets), the warmed-up lr, bf16
    autocast, backward, clip_grad_norm_ 1.0, the optimizer step; returns the loss as a float (a
    host sync, as the dpml benches' per-step loss read)."""
    step = 0

    def train_step():
        nonlocal step
        step += 1
        x, y = next_batch()
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, step / max(1, warmup))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return train_step


def time_steps(train_step, warmup, steps):
    """Warm-up steps (torch.compile compiles here), then the timed ones: (losses, warm-up seconds,
    ms per timed step, peak GiB allocated during the timed steps)."""
    t_warm = time.time()
    losses = [train_step() for _ in range(warmup)]
    warm_s = time.time() - t_warm
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    losses += [train_step() for _ in range(steps)]
    torch.cuda.synchronize()
    ms = (time.time() - t0) * 1e3 / steps
    return losses, warm_s, ms, torch.cuda.max_memory_allocated() / 2**30


def join_ranks():
    """(ranks, rank) of a torchrun launch (WORLD_SIZE > 1: this rank on GPU LOCAL_RANK, NCCL process
    group initialised), or (1, 0) alone."""
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if ranks > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    return ranks, rank


def slowest_ms(ms, ranks):
    """The slowest rank's ms per step (a data-parallel step goes at its slowest rank's pace)."""
    if ranks == 1:
        return ms
    t = torch.tensor([ms], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def data_parallel(model, ranks):
    """model wrapped in DistributedDataParallel (bucket_cap_mb 25, gradient_as_bucket_view) under torchrun."""
    if ranks == 1:
        return model
    return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25, gradient_as_bucket_view=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=6e-4)
    add_energy_flag(ap)
    a = ap.parse_args()

    ranks, rank = join_ranks()
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = "cuda"
    peak = peak_tflops()
    padded = (a.vocab + 127) // 128 * 128
    model = GPT(a.layers, a.dim, a.heads, a.vocab, padded, max(a.seq, 1024)).to(dev)
    n_params = sum(p.numel() for p in model.parameters()) - (padded - a.vocab) * a.dim
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    fwd = data_parallel(model, ranks)
    fwd = torch.compile(fwd) if a.mode == "compile" else fwd
    gen = torch.Generator(device=dev).manual_seed(rank)

    def next_batch():
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev, generator=gen)
        return idx[:, :-1], idx[:, 1:]

    train_step = make_train_step(fwd, model, opt, next_batch, a.lr, a.warmup)
    losses, warm_s, ms, mem = time_steps(train_step, a.warmup, a.steps)
    ms = slowest_ms(ms, ranks)
    watts = mean_power_w(train_step, a.energy_seconds, ms)

    tok_s = a.batch * a.seq * ranks / (ms * 1e-3)
    fpt = 6 * n_params + 12 * a.layers * a.seq * a.dim
    tflops = fpt * tok_s / ranks / 1e12  # per GPU
    impl = "torch-" + a.mode + (f"-ddp{ranks}" if ranks > 1 else "")
    fam = profile_families(train_step)
    if ranks > 1:
        dist.destroy_process_group()
    if rank != 0:
        return
    print(json.dumps({"bench": "gpt_train", "impl": impl, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "batch": a.batch, "seq": a.seq, "layers": a.layers, "dim": a.dim, "heads": a.heads, "vocab": a.vocab,
                      "params": n_params, "steps": a.steps, "warmup": a.warmup, "warmup_s": round(warm_s, 1),
                      "ms_per_step": round(ms, 3), "tokens_per_s": round(tok_s, 1), "model_tflops": round(tflops, 2),
                      "peak_tflops": round(peak, 1), "mfu": round(tflops / peak, 4), "mem_gib": round(mem, 3),
                      "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
                      "finite": all(math.isfinite(l) for l in losses), "ranks": ranks,
                      "power_w": watts and round(watts, 1), "tokens_per_j": per_joule(tok_s, watts, 1)}), flush=True)
    total = sum(fam.values()) or 1.0
    for f, t in sorted(fam.items(), key=lambda kv: -kv[1]):
        print(json.dumps({"bench": "gpt_train_family", "impl": impl, "family": f, "ms": round(t, 3),
                          "share": round(t / total, 4)}), flush=True)


if __name__ == "__main__":
    main()
