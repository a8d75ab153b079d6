#!/usr/bin/env python3
"""Does transformers compute dpml's loss from a directory that train_gpt --export DIR/ wrote?

Needs torch and transformers (not run in CI). Loads DIR with GPT2LMHeadModel.from_pretrained, and
compares its loss on one window of tokens (fp32, CPU) with the loss train_gpt computes after
--import DIR/ — within 1e-5 relative (--tolerance). Exit status 0 when they agree.

    python3 scripts/hf-check.py out/ --train build/cpu/examples/train_gpt/train_gpt
        [--mpiexec mpiexec] [--tokens 464,3290,...] [--seed 1] [--tolerance 1e-5]

How dpml's loss is read exactly: train_gpt reports each step's training loss in hexadecimal
(--loss-log), but the batch of a step is drawn at random. So the script writes an llm.c token
shard whose training part is ONE window of T = n_positions tokens repeated (every window, however
shuffled, is that window) followed by a validation part, and runs one step of
    train_gpt --import DIR/ --data-path shard.bin --vocab-size V --num-layers … (from config.json)
              --global-batch 1 --micro-batch 1 --train-iters 1 --loss-log …
whose loss is the mean cross-entropy over that window's T next-token predictions, the same
quantity transformers' model(input_ids) gives here. The window's tokens are --tokens (ids,
repeated to fill T) or, by default, drawn at random below the vocabulary (--seed). A text model
(V = 256) and a GPT-2 of 50257 tokens alike; T must fit the model (n_positions).
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile


def shard(path, tokens):
    """An llm.c token shard: 256 int32 (magic 20240520, version 1, count), then uint16 tokens."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def data_of(window, T, V, seed):
    """Tokens whose training part (train_gpt keeps the first n - n//20) is `window` repeated
    (n_train = K·T + 1: every window of T+1 tokens is window + window[0]), and whose validation
    part holds at least one window of its own."""
    n = 20 * (T + 2)
    while (n - n // 20 - 1) % T != 0:
        n += 1
    train = n - n // 20
    rng = random.Random(seed + 1)
    return [window[i % T] for i in range(train)] + [rng.randrange(V) for _ in range(n - train)]


def dpml_loss(args, cfg, window, work):
    T = cfg["n_positions"]
    shard(os.path.join(work, "tokens.bin"), data_of(window, T, cfg["vocab_size"], args.seed))
    log = os.path.join(work, "loss.log")
    cmd = ([args.mpiexec, "-n", "1"] if args.mpiexec else []) + [
        args.train, "--import", args.dir.rstrip("/") + "/", "--data-path", os.path.join(work, "tokens.bin"),
        "--vocab-size", str(cfg["vocab_size"]), "--num-layers", str(cfg["n_layer"]), "--hidden-size", str(cfg["n_embd"]),
        "--num-attention-heads", str(cfg["n_head"]), "--seq-length", str(T), "--global-batch", "1", "--micro-batch", "1",
        "--train-iters", "1", "--lr-warmup-iters", "0", "--lr", "0", "--min-lr", "0", "--sample-tokens", "0",
        "--loss-log", log]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"train_gpt failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}")
    with open(log) as f:
        step, hexa, _ = f.readline().split()
    return float.fromhex(hexa)


def transformers_loss(directory, window):
    import torch
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(directory).float().eval()  # (the dtype argument's name varies by version)
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        sys.exit("transformers did not tie lm_head.weight to transformer.wte.weight")
    inputs = torch.tensor([window])                      # (1, T)
    targets = torch.tensor([window[1:] + window[:1]])    # the next token; the last one wraps (see data_of)
    with torch.no_grad():
        logits = model(inputs).logits                    # (1, T, V) fp32
    return torch.nn.functional.cross_entropy(logits.double().reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", help="a directory train_gpt --export DIR/ wrote (config.json, model.safetensors)")
    p.add_argument("--train", required=True, help="train_gpt (a host build: fp32)")
    p.add_argument("--mpiexec", default="", help="launch train_gpt with '<mpiexec> -n 1' (default: directly)")
    p.add_argument("--tokens", default="", help="comma-separated token ids, repeated to fill n_positions")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tolerance", type=float, default=1e-5, help="relative")
    args = p.parse_args()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        sys.exit(f"hf-check.py needs torch and transformers: {e}")
    with open(os.path.join(args.dir, "config.json")) as f:
        cfg = json.load(f)
    T, V = cfg["n_positions"], cfg["vocab_size"]
    ids = [int(t) for t in args.tokens.split(",") if t.strip()] if args.tokens else []
    rng = random.Random(args.seed)
    window = [ids[i % len(ids)] for i in range(T)] if ids else [rng.randrange(V) for _ in range(T)]
    if max(window) >= V or min(window) < 0:
        sys.exit(f"--tokens: ids must lie in [0, {V})")
    with tempfile.TemporaryDirectory() as work:
        ours = dpml_loss(args, cfg, window, work)
    theirs = transformers_loss(args.dir, window)
    rel = abs(ours - theirs) / abs(theirs)
    ok = rel <= args.tolerance
    print(f"{'OK' if ok else 'MISMATCH'}: loss on {T} tokens: dpml {ours!r}, transformers {theirs!r}, relative difference "
          f"{rel:.3g} (tolerance {args.tolerance:g})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
