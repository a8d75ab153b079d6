#!/usr/bin/env python3
"""Resilience tests of Step 6, run through examples/train_gpt under mpiexec (CTest label `resilience`).

Every run trains the same tiny GPT (2 layers, C = 32, 2 heads, T = 16, global batch 8) on the
fortunes text for a few steps. train_gpt --loss-log writes each step's loss in hexadecimal
(exact) and --export writes the final weights as one safetensors file, so "bitwise equal" means
equal loss strings and byte-equal exports.

    resilience.py <test> --train <train_gpt> --mpiexec <mpiexec> [--np-flag -n] [--preflags a,b]
                  --work <dir> --data <text file> [--python-reader tests/checkpoint/read_safetensors.py]

tests:
  bitwise   (dp,tp,pp) = (2,1,2), without and with ZeRO-1: 6 steps uninterrupted vs 3 steps
            (--exit-interval 3, checkpoint) + a new launch resuming + 3 steps: same losses, bit
            for bit, and byte-equal exported weights.
  reshard   save after 3 steps on one layout, resume on another, finish: every loss within 1e-4
            (relative) of the uninterrupted sequential run; (2,2,2)+ZeRO → (1,1,1),
            (1,1,1) → (2,2,2)+ZeRO, (4,1,2) → (2,2,2), (4,1,2)+ZeRO → (2,2,2)+ZeRO, and with a
            vocabulary that tp 2 pads (V 129): (2,2,1)+ZeRO → (1,1,2).
  export    the exported file has GPT-2's names and shapes and holds the checkpoint's values
            under GPT-2's layout (Conv1D weights (in, out), c_attn columns [q|k|v]) — checked here
            by an independent parser (read_safetensors.py's); --import of it on another layout
            with lr 0 exports the same bytes again (round trip).
  faults    20 seeded trials on 2 ranks (pp 2), a checkpoint every step: one rank SIGKILLs itself,
            in half the trials after a random step (its save still in flight), in the others at
            a random time (half of those with slow saves); the job must end (no hang), then --resume latest is rerun until the run
            completes; each resume must start from the checkpoint `latest` names (a torn .tmp is
            never loaded; a skipped corrupt one is announced) and the final weights must equal
            the uninterrupted run's byte for byte.
  skip      --on-nonfinite skip with a NaN injected at step 3: the step is skipped with a message
            naming it and changes no weight or optimizer state (the checkpoint after step 3 holds
            the tensors of the one after step 2), training finishes with finite losses.
  gpu       --device cuda (exits 77, skipped, where no GPU is visible), a model the GPU kernels take
            (C = 64, head dim 32): 6 steps uninterrupted vs 3 + a resumed launch + 3 on the GPU
            (bf16, the library's trainer): the same losses bit for bit and byte-equal exports (the
            device kernels are deterministic; fp32 master weights and both AdamW moments go
            through the checkpoint); a GPU checkpoint resumed on CPU ranks (pp 2), a CPU checkpoint
            on the GPU, a checkpoint of 4 GPU ranks at tp 2 × pp 2 (NCCL, or comm::Staged on fewer
            GPUs) on one GPU and on CPU ranks (tp 2), and a CPU one on GPUs at tp 2 × pp 2: every
            loss within 2e-2 (relative; bf16 forward against fp32) of the uninterrupted run.
  corrupt   checkpoints that fail their checks and saves that fail: a flipped bit in a manifest's
            step (its own checksum) makes --resume latest fall back to the previous checkpoint,
            named once; every checkpoint bad stops the run naming --save and them, or starts
            fresh with --resume-fresh-if-corrupt (and removes a leftover step-N.tmp, named once);
            a --save that cannot be written: each failed save named once, training goes on, and
            --save-max-failures failures in a row stop the run.
  disk-full a disk that fills up during a save: a tmpfs sized for one checkpoint and a half (the
            size measured from a plain save first) where this process may mount one (root with
            CAP_SYS_ADMIN), else (or with DPML_DISK_FULL_INJECT=1) --inject-fault save-fail:3,
            which writes part of each rank's file, then fails with ENOSPC; the path taken is
            printed. Saves every 2 steps, --keep 2: step 2's save commits, step 4's and 6's fail
            for lack of space — each named once (step, path, "No space left on device"), no
            step-N.tmp left, training finishes with the uninterrupted run's losses; step-2 (and
            `latest`) stay intact: --resume latest from it (copied off the tmpfs, which is always
            unmounted) reproduces the uninterrupted losses of steps 3-6 bit for bit.
  bad-setup writes the bad checkpoints that the failure tests (CMakeLists.txt) resume from:
            truncated file, flipped byte, missing tensor, shape that disagrees with the model (the
            edited manifests without their checksum: a manifest that lies consistently).
Exits non-zero with a message on the first failure.
"""
import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import time

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--global-batch", "8", "--micro-batch", "1", "--lr-warmup-iters", "1", "--log-interval", "1000",
         "--eval-interval", "1000", "--sample-tokens", "0", "--collective-timeout", "60"]


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


class Runner:
    def __init__(self, a):
        self.train, self.work, self.data = a.train, a.work, a.data
        self.mpi = [a.mpiexec, a.np_flag]
        self.pre = [p for p in re.split(r"[;,]", a.preflags) if p]
        os.makedirs(self.work, exist_ok=True)

    def path(self, *p):
        return os.path.join(self.work, *p)

    def run(self, np, flags, timeout=180, ok=True):
        cmd = self.mpi + [str(np)] + self.pre + [self.train, "--data-path", self.data] + MODEL + flags
        try:
            p = subprocess.run(cmd, cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                               timeout=timeout, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        except subprocess.TimeoutExpired:
            fail(f"hang: killed after {timeout} s: {' '.join(cmd)}")
        if ok and p.returncode != 0:
            fail(f"exit {p.returncode}: {' '.join(cmd)}\n{p.stdout}")
        return p.returncode, p.stdout


def layout(np, tp, pp, zero):
    return np, ["--tp", str(tp), "--pp", str(pp)] + (["--zero"] if zero else [])


def losses(path):
    """{step: (hex, float)} from a --loss-log file."""
    out = {}
    with open(path) as f:
        for line in f:
            step, hexa, _ = line.split()
            out[int(step)] = (hexa, float.fromhex(hexa))
    return out


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------

def resume_equals_uninterrupted(r, np, flags, tag):
    """6 steps in one launch vs 3 (--exit-interval 3, checkpoint) + 3 resumed in a second launch:
    the same losses bit for bit and byte-equal exports. Returns the uninterrupted run's output."""
    base = flags + ["--train-iters", "6"]
    _, full_out = r.run(np, base + ["--loss-log", f"{tag}-full.log", "--export", f"{tag}-full.safetensors"])
    shutil.rmtree(r.path(f"{tag}-ckpt"), ignore_errors=True)
    r.run(np, base + ["--save", f"{tag}-ckpt", "--exit-interval", "3", "--loss-log", f"{tag}-a.log"])
    _, out = r.run(np, base + ["--save", f"{tag}-ckpt", "--resume", "latest", "--loss-log", f"{tag}-b.log",
                               "--export", f"{tag}-resumed.safetensors"])
    if "at step 3" not in out:
        fail(f"{tag}: did not resume at step 3:\n{out}")
    full = losses(r.path(f"{tag}-full.log"))
    parts = {**losses(r.path(f"{tag}-a.log")), **losses(r.path(f"{tag}-b.log"))}
    if sorted(parts) != list(range(1, 7)):
        fail(f"{tag}: steps {sorted(parts)} logged by the interrupted runs")
    for s in range(1, 7):
        if full[s][0] != parts[s][0]:
            fail(f"{tag}: step {s} loss {parts[s][0]} after resume, {full[s][0]} uninterrupted")
    if read_bytes(r.path(f"{tag}-full.safetensors")) != read_bytes(r.path(f"{tag}-resumed.safetensors")):
        fail(f"{tag}: final weights differ from the uninterrupted run's")
    return full_out


def test_bitwise(r):
    for zero in (False, True):
        np, lay = layout(4, 1, 2, zero)
        tag = "zero" if zero else "plain"
        resume_equals_uninterrupted(r, np, lay, tag)
        print(f"bitwise ({tag}, dp 2 tp 1 pp 2): 6 losses and the final weights equal bit for bit")


def test_reshard(r):
    refs = {}
    for vocab in ("256", "129"):
        r.run(1, ["--train-iters", "6", "--vocab-size", vocab, "--loss-log", f"ref-{vocab}.log"])
        refs[vocab] = losses(r.path(f"ref-{vocab}.log"))
    # (np, tp, pp, zero) before and after; V = 129 makes tp 2 pad the vocabulary (130 rows).
    cases = [((8, 2, 2, True), (1, 1, 1, False), "256"), ((1, 1, 1, False), (8, 2, 2, True), "256"),
             ((8, 1, 2, False), (8, 2, 2, False), "256"), ((8, 1, 2, True), (8, 2, 2, True), "256"),
             ((4, 2, 1, True), (2, 1, 2, False), "129")]
    for i, (src, dst, vocab) in enumerate(cases):
        d = f"reshard-{i}"
        ref = refs[vocab]
        shutil.rmtree(r.path(d), ignore_errors=True)
        v = ["--train-iters", "6", "--vocab-size", vocab, "--save", d]
        np, lay = layout(*src)
        r.run(np, v + ["--exit-interval", "3", "--loss-log", f"{d}-a.log"] + lay)
        np, lay = layout(*dst)
        _, out = r.run(np, v + ["--resume", "latest", "--loss-log", f"{d}-b.log"] + lay)
        if "at step 3" not in out:
            fail(f"{src} -> {dst}: did not resume at step 3:\n{out}")
        got = {**losses(r.path(f"{d}-a.log")), **losses(r.path(f"{d}-b.log"))}
        for s in range(1, 7):
            rel = abs(got[s][1] - ref[s][1]) / abs(ref[s][1])
            if rel > 1e-4:
                fail(f"{src} -> {dst}: step {s} loss {got[s][1]!r} vs sequential {ref[s][1]!r} (rel {rel:.2e})")
        print(f"reshard (np,tp,pp,zero) {src} -> {dst}, V {vocab}: losses of steps 1-6 within 1e-4 of the sequential run")


def test_export(r, reader):
    sys.path.insert(0, os.path.dirname(os.path.abspath(reader)))
    from read_safetensors import plain_read  # the independent parser of the published format
    shutil.rmtree(r.path("export-ckpt"), ignore_errors=True)
    prompt = "It was the"
    _, out = r.run(1, ["--train-iters", "300", "--lr", "0.01", "--save", "export-ckpt", "--export", "model.safetensors",
                       "--sample-tokens", "12", "--temperature", "0", "--prompt", prompt])
    header, gpt2 = plain_read(r.path("model.safetensors"))
    _, ours = plain_read(r.path("export-ckpt", "step-300", "rank-0.safetensors"))
    L, C, H, V, T = 2, 32, 2, 256, 16
    D = C // H
    want = {"wte.weight": [V, C], "wpe.weight": [T, C], "ln_f.weight": [C], "ln_f.bias": [C]}
    for i in range(L):
        h = f"h.{i}."
        want.update({h + "ln_1.weight": [C], h + "ln_1.bias": [C], h + "ln_2.weight": [C], h + "ln_2.bias": [C],
                     h + "attn.c_attn.weight": [C, 3 * C], h + "attn.c_attn.bias": [3 * C],
                     h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
                     h + "mlp.c_fc.weight": [C, 4 * C], h + "mlp.c_fc.bias": [4 * C],
                     h + "mlp.c_proj.weight": [4 * C, C], h + "mlp.c_proj.bias": [C]})
    got = {k: v[1] for k, v in gpt2.items()}
    if got != want:
        fail(f"exported names/shapes {sorted(got.items())} are not GPT-2's {sorted(want.items())}")
    for name, (dtype, shape, values, _) in gpt2.items():
        if dtype != "F32":
            fail(f"{name}: dtype {dtype}")
        o = ours[name][2]  # our layout: linear weights (out, in); c_attn rows (head, {q,k,v}, D)
        for idx, v in enumerate(values):
            if len(shape) == 2 and name not in ("wte.weight", "wpe.weight"):
                i, j = divmod(idx, shape[1])  # GPT-2 (in, out)
                if name.endswith("c_attn.weight"):
                    s, rest = divmod(j, C)
                    head, d = divmod(rest, D)
                    j = head * 3 * D + s * D + d
                src = o[j * shape[0] + i]
            elif name.endswith("c_attn.bias"):
                s, rest = divmod(idx, C)
                head, d = divmod(rest, D)
                src = o[head * 3 * D + s * D + d]
            else:
                src = o[idx]
            if src != v:
                fail(f"{name}[{idx}]: exported {v}, the checkpoint holds {src} there")
    print(f"export: {len(gpt2)} tensors with GPT-2's names, shapes and layouts (independent parser)")
    # GPT-2's forward pass (Hugging Face semantics), written here from the file alone: greedy
    # decoding must continue the prompt exactly as train_gpt's sampler did with temperature 0.
    m = re.search(r"---- sample \(temperature 0.00, top-k \d+\) ----\n(.*)\n----", out, re.S)
    if not m:
        fail(f"no sample in the output:\n{out}")
    w = {k: v[2] for k, v in gpt2.items()}
    tokens = list(prompt.encode())
    for _ in range(12):
        tokens.append(gpt2_greedy_next(w, tokens[-T:], L, C, H, V))
    mine = bytes(tokens).decode("utf-8", "replace")
    if mine != m.group(1):
        fail(f"GPT-2 forward on the exported file continues {prompt!r} as {mine!r}, train_gpt as {m.group(1)!r}")
    print(f"export: a GPT-2 forward pass on the file alone continues {prompt!r} as train_gpt does: {mine!r}")
    # Round trip through --import on another layout (tp 2, pp 2); lr 0 leaves the weights as read.
    r.run(4, ["--tp", "2", "--pp", "2", "--train-iters", "1", "--lr-warmup-iters", "0", "--lr", "0", "--min-lr", "0",
              "--import", "model.safetensors", "--export", "again.safetensors"])
    if read_bytes(r.path("model.safetensors")) != read_bytes(r.path("again.safetensors")):
        fail("--import then --export (tp 2, pp 2) changed the model")
    print("export -> import (tp 2, pp 2) -> export: byte-equal")
    # A vocabulary that tp 2 pads (V = 129 → 130 rows): the padding stays out of the file.
    r.run(2, ["--tp", "2", "--vocab-size", "129", "--train-iters", "6", "--export", "v129.safetensors"])
    _, v129 = plain_read(r.path("v129.safetensors"))
    if v129["wte.weight"][1] != [129, 32]:
        fail(f"wte.weight exported as {v129['wte.weight'][1]}, expected [129, 32] (no padding rows)")
    r.run(1, ["--vocab-size", "129", "--train-iters", "1", "--lr-warmup-iters", "0", "--lr", "0", "--min-lr", "0",
              "--import", "v129.safetensors", "--export", "v129-again.safetensors"])
    if read_bytes(r.path("v129.safetensors")) != read_bytes(r.path("v129-again.safetensors")):
        fail("V = 129: export (tp 2, padded) -> import (tp 1) -> export changed the model")
    print("export of a padded vocabulary (V 129, tp 2): 129 rows; import at tp 1 and export again: byte-equal")


def gpt2_greedy_next(w, tokens, L, C, H, V):
    """argmax of GPT-2's next-token logits (float64, plain Python): wte + wpe, L blocks of
    ln_1 → c_attn (x · W, W (C, 3C), columns [q | k | v]) → causal attention → c_proj, ln_2 →
    c_fc → gelu (tanh) → c_proj, then ln_f and logits = h · wteᵀ."""
    import math
    T, D = len(tokens), C // H

    def linear(x, name, n_in, n_out):  # GPT-2 Conv1D: y = x · W + b, W (in, out)
        W, b = w[name + ".weight"], w[name + ".bias"]
        return [[b[o] + sum(row[i] * W[i * n_out + o] for i in range(n_in)) for o in range(n_out)] for row in x]

    def layer_norm(x, name):
        g, b = w[name + ".weight"], w[name + ".bias"]
        out = []
        for row in x:
            mu = sum(row) / C
            var = sum((v - mu) ** 2 for v in row) / C
            out.append([(v - mu) / math.sqrt(var + 1e-5) * g[i] + b[i] for i, v in enumerate(row)])
        return out

    def gelu(v):
        return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))

    x = [[w["wte.weight"][t * C + c] + w["wpe.weight"][p * C + c] for c in range(C)] for p, t in enumerate(tokens)]
    for l in range(L):
        h = f"h.{l}."
        qkv = linear(layer_norm(x, h + "ln_1"), h + "attn.c_attn", C, 3 * C)
        att = [[0.0] * C for _ in range(T)]
        for head in range(H):
            q = [row[head * D:(head + 1) * D] for row in qkv]
            k = [row[C + head * D:C + (head + 1) * D] for row in qkv]
            v = [row[2 * C + head * D:2 * C + (head + 1) * D] for row in qkv]
            for i in range(T):
                s = [sum(a * b for a, b in zip(q[i], k[j])) / math.sqrt(D) for j in range(i + 1)]
                top = max(s)
                e = [math.exp(z - top) for z in s]
                for d in range(D):
                    att[i][head * D + d] = sum(e[j] * v[j][d] for j in range(i + 1)) / sum(e)
        x = [[a + b for a, b in zip(r0, r1)] for r0, r1 in zip(x, linear(att, h + "attn.c_proj", C, C))]
        m = [[gelu(v) for v in row] for row in linear(layer_norm(x, h + "ln_2"), h + "mlp.c_fc", C, 4 * C)]
        x = [[a + b for a, b in zip(r0, r1)] for r0, r1 in zip(x, linear(m, h + "mlp.c_proj", 4 * C, C))]
    last = layer_norm(x, "ln_f")[-1]
    logits = [sum(last[c] * w["wte.weight"][t * C + c] for c in range(C)) for t in range(V)]
    return max(range(V), key=lambda t: logits[t])


def complete_steps(d):
    if not os.path.isdir(d):
        return []
    return sorted(int(n[5:]) for n in os.listdir(d) if re.fullmatch(r"step-\d+", n)
                  and os.path.exists(os.path.join(d, n, "manifest.json")))


def test_faults(r):
    flags = ["--pp", "2", "--train-iters", "12", "--save-interval", "1", "--keep", "2"]
    shutil.rmtree(r.path("faults-ref"), ignore_errors=True)
    t0 = time.monotonic()
    r.run(2, flags + ["--save", "faults-ref", "--export", "faults-ref.safetensors"])
    duration = time.monotonic() - t0
    ref = read_bytes(r.path("faults-ref.safetensors"))
    killed = mid_save = 0
    for trial in range(20):
        rng = random.Random(7000 + trial)
        d, out_file = f"faults-{trial}", f"faults-{trial}.safetensors"
        shutil.rmtree(r.path(d), ignore_errors=True)
        if os.path.exists(r.path(out_file)):
            os.remove(r.path(out_file))
        rank = rng.randrange(2)
        if trial % 2 == 0:  # after a random step, that step's save in flight: always a kill
            fault = f"kill-after:{rank}:{rng.randint(1, 11)}"
        else:  # at a random time, half the trials with slow saves
            slow = rng.random() < 0.5
            when = rng.uniform(0.05, duration + (12 * 0.04 if slow else 0.0))
            fault = f"kill:{rank}:{when:.3f}" + (",slow-save:40" if slow else "")
        rc, out = r.run(2, flags + ["--save", d, "--inject-fault", fault, "--export", out_file], timeout=120, ok=False)
        if rc != 0:
            killed += 1
            mid_save += any(n.endswith(".tmp") for n in os.listdir(r.path(d))) if os.path.isdir(r.path(d)) else 0
        attempts = 0
        while rc != 0:
            attempts += 1
            if attempts > 4:
                fail(f"trial {trial} ({fault}): not finished after 4 resumes:\n{out}")
            latest = None
            if os.path.exists(r.path(d, "latest")):
                name = open(r.path(d, "latest")).read().strip()
                if os.path.exists(r.path(d, name, "manifest.json")):
                    latest = int(name[5:])
            newest = complete_steps(r.path(d))
            expect = latest if latest is not None else (newest[-1] if newest else None)
            rc, out = r.run(2, flags + ["--save", d, "--resume", "latest", "--export", out_file], timeout=120, ok=False)
            m = re.search(r"resumed from '([^']*)' at step (\d+)", out)
            got = int(m.group(2)) if m else None
            if got != expect and "skipping checkpoint" not in out:
                fail(f"trial {trial} ({fault}): resumed at step {got}, expected {expect} "
                     f"(latest {latest}, complete {newest}):\n{out}")
            if m and m.group(1).endswith(".tmp"):
                fail(f"trial {trial}: loaded the torn checkpoint {m.group(1)}")
        if read_bytes(r.path(out_file)) != ref:
            fail(f"trial {trial} ({fault}): final weights differ from the uninterrupted run's")
        print(f"trial {trial:2d}: {fault:28s} {'killed' if attempts else 'finished first'}; "
              f"{attempts} resume(s); final weights equal")
    if killed < 10 or mid_save < 5:
        fail(f"only {killed} of 20 trials killed a rank ({mid_save} mid-save): the trials test too little")
    print(f"faults: {killed} of 20 trials killed a rank ({mid_save} left a save in flight); all resumed bitwise")


def test_skip(r, reader):
    sys.path.insert(0, os.path.dirname(os.path.abspath(reader)))
    from read_safetensors import plain_read
    for d in ("skip-2", "skip-3"):
        shutil.rmtree(r.path(d), ignore_errors=True)
    base = ["--pp", "2", "--train-iters", "6", "--on-nonfinite", "skip"]
    r.run(2, base + ["--exit-interval", "2", "--save", "skip-2"])
    r.run(2, base + ["--exit-interval", "3", "--save", "skip-3", "--inject-fault", "nan:3"])
    for f in ("rank-0.safetensors", "rank-1.safetensors"):  # the skipped step left every tensor as it was
        _, before = plain_read(r.path("skip-2", "step-2", f))
        _, after = plain_read(r.path("skip-3", "step-3", f))
        if sorted(before) != sorted(after) or any(before[k][3] != after[k][3] for k in before):
            fail(f"the skipped step 3 changed weights or optimizer state ({f})")
    rc, out = r.run(2, base + ["--inject-fault", "nan:3", "--loss-log", "skip.log"])
    if len(re.findall(r"step 3: non-finite loss \(-?nan\); first non-finite gradient: 'wte.weight'"
                      r" — skipping the step", out)) != 1:
        fail(f"no skip message naming step 3 and wte.weight (once):\n{out}")
    log = losses(r.path("skip.log"))
    if log[3][1] == log[3][1] or any(log[s][1] != log[s][1] for s in (1, 2, 4, 5, 6)):
        fail(f"step 3 should be NaN and the others finite: {log}")
    print("skip: step 3 skipped with a message and no update; training finished with finite losses")


def once(out, pattern, what):
    n = len(re.findall(pattern, out))
    if n != 1:
        fail(f"{what}: {n} times (once expected) /{pattern}/ in:\n{out}")


def test_corrupt(r):
    base = ["--pp", "2", "--train-iters", "6", "--save-interval", "2", "--keep", "0"]
    shutil.rmtree(r.path("corrupt"), ignore_errors=True)
    r.run(2, base + ["--save", "corrupt/ref"])
    # The step of step-6's manifest, one bit flipped (6 → 7): its tensor files are intact.
    d = r.path("corrupt", "one")
    shutil.copytree(r.path("corrupt", "ref"), d)
    m = os.path.join(d, "step-6", "manifest.json")
    text = open(m).read()
    open(m, "w").write(text.replace('"step":6', '"step":7', 1))
    _, out = r.run(2, base + ["--save", "corrupt/one", "--resume", "latest"])
    once(out, r"skipping checkpoint '[^']*one/step-6': bad checkpoint manifest '[^']*step-6/manifest.json': "
              r"manifest checksum mismatch", "the skipped checkpoint")
    once(out, r"resumed from '[^']*one/step-4' at step 4 ", "the resume from the previous checkpoint")
    print("corrupt: a flipped bit in a manifest's step: resumed from the previous checkpoint, the skip named once")

    # Every checkpoint bad: stop, naming --save and each one; or start fresh when told.
    d = r.path("corrupt", "all")
    shutil.copytree(r.path("corrupt", "ref"), d)
    for step in (2, 4, 6):
        f = os.path.join(d, f"step-{step}", "rank-0.safetensors")
        blob = bytearray(read_bytes(f))
        blob[-7] ^= 0x40
        open(f, "wb").write(blob)
    rc, out = r.run(2, base + ["--save", "corrupt/all", "--resume", "latest"], ok=False)
    if rc == 0:
        fail(f"every checkpoint corrupt, yet the run went on:\n{out}")
    once(out, r"every checkpoint in --save 'corrupt/all' is corrupt or incomplete \(3 skipped: skipping checkpoint "
              r"'corrupt/all/step-6': checksum mismatch.*; skipping checkpoint 'corrupt/all/step-2': .*\); "
              r"--resume-fresh-if-corrupt starts fresh instead", "the error")
    if "starting fresh" in out.replace("--resume-fresh-if-corrupt starts fresh", ""):
        fail(f"started fresh over corrupt checkpoints:\n{out}")
    os.makedirs(os.path.join(d, "step-8.tmp"))  # a save that died
    _, out = r.run(2, base + ["--save", "corrupt/all", "--resume", "latest", "--resume-fresh-if-corrupt"])
    once(out, r"every checkpoint in --save 'corrupt/all' is corrupt or incomplete \(3 skipped\): starting fresh "
              r"\(--resume-fresh-if-corrupt\)", "the fresh start")
    once(out, r"removed unfinished saves of an earlier run in 'corrupt/all': step-8.tmp\n", "the removed .tmp")
    if "resumed from" in out or os.path.exists(os.path.join(d, "step-8.tmp")):
        fail(f"--resume-fresh-if-corrupt: resumed, or left step-8.tmp:\n{out}")
    print("corrupt: every checkpoint corrupt: an error naming --save and the three; "
          "with --resume-fresh-if-corrupt a fresh start (and the leftover step-8.tmp removed)")

    # Saves that fail (--save below a regular file): named once each, training goes on; the K-th
    # failure in a row stops the run.
    open(r.path("corrupt", "file"), "w").write("not a directory")
    _, out = r.run(2, base + ["--save", "corrupt/file/ckpt", "--save-max-failures", "4"])
    for step in (2, 4, 6):
        once(out, rf"dpml checkpoint: step {step} not saved \(failure {step // 2} in a row; failure 4 stops the run\); "
                  rf"training goes on, the next save retries: checkpoint step {step} failed: rank 0: cannot create "
                  rf"'corrupt/file/ckpt/step-{step}.tmp'", f"the failed save of step {step}")
    once(out, r"final validation loss", "the end of training")
    rc, out = r.run(2, base + ["--save", "corrupt/file/ckpt", "--save-interval", "1"], ok=False)
    if rc == 0:
        fail(f"3 failed saves in a row, yet the run went on:\n{out}")
    once(out, r"3 checkpoint saves failed in a row, the last of step 3: checkpoint step 3 failed: rank 0: cannot create",
         "the stop after 3 failed saves")
    if re.search(r"step [4-6]/6", out) or "final validation loss" in out:
        fail(f"trained on after the 3rd failed save:\n{out}")
    print("corrupt: failed saves named once each while training went on; the 3rd in a row stopped the run")


def mount_tmpfs(mnt, kib):
    """Mounts a tmpfs of `kib` KiB on `mnt`: "" on success, else why not (not root, no CAP_SYS_ADMIN,
    no mount(8))."""
    try:
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", mnt], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if p.returncode != 0:
        return " ".join(p.stdout.split()) or f"mount exited {p.returncode}"
    if not os.path.ismount(mnt):
        return "mount exited 0 but the directory is no mount point"
    return ""


def unmount(mnt):
    if os.path.ismount(mnt) and subprocess.run(["umount", mnt]).returncode != 0:
        subprocess.run(["umount", "-l", mnt])
    if os.path.ismount(mnt):
        fail(f"could not unmount the tmpfs on {mnt}")


def test_disk_full(r):
    d = r.path("disk-full")
    mnt = os.path.join(d, "mnt")
    unmount(mnt)  # left mounted by an earlier run that was killed
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(mnt)
    base = ["--pp", "2", "--train-iters", "6", "--save-interval", "2", "--keep", "2"]
    # The uninterrupted run, on a disk with room: its losses, and what one checkpoint takes (in
    # pages: tmpfs counts whole ones), the newest one and `latest`.
    r.run(2, base + ["--save", "disk-full/ref", "--loss-log", "disk-full/ref.log"])
    ref = losses(r.path("disk-full", "ref.log"))
    page = 4096
    one = sum(-(-os.path.getsize(os.path.join(r.path("disk-full", "ref", "step-6"), f)) // page) * page
              for f in os.listdir(r.path("disk-full", "ref", "step-6"))) + page
    kib = (one * 3 // 2 + 16 * 1024) // 1024  # one checkpoint fits, a second does not
    why = "DPML_DISK_FULL_INJECT is set" if os.environ.get("DPML_DISK_FULL_INJECT") else mount_tmpfs(mnt, kib)
    try:
        if not why:
            save, inject = "disk-full/mnt/ckpt", []
            print(f"disk-full: tmpfs path: a {kib} KiB tmpfs on {mnt} (one checkpoint takes {one // 1024} KiB)")
        else:
            save, inject = "disk-full/ckpt", ["--inject-fault", "save-fail:3"]
            print(f"disk-full: fallback path: no tmpfs ({why}); --inject-fault save-fail:3 fails the saves of steps 4 "
                  "and 6 with ENOSPC after writing part of each rank's file")
        # Step 2's save fits; step 4's and 6's run out of space (--keep 2 deletes nothing to make room).
        _, out = r.run(2, base + ["--save", save, "--save-max-failures", "5", "--loss-log", "disk-full/full.log"] + inject)
        if "step 2 not saved" in out:
            fail(f"the first save (step 2) failed, so the tmpfs ({kib} KiB) is too small for one checkpoint:\n{out}")
        for step in (4, 6):
            once(out, rf"dpml checkpoint: step {step} not saved \(failure {step // 2 - 1} in a row; failure 5 stops the "
                      rf"run\); training goes on, the next save retries: saving checkpoint '{re.escape(save)}/step-{step}' "
                      rf"failed: rank \d: cannot write '{re.escape(save)}/step-{step}\.tmp/[^']+'[^\n]*: No space left on "
                      rf"device\n", f"the failed save of step {step}")
        once(out, rf"checkpoints: 1 saved in '{re.escape(save)}'", "the one save that committed")
        once(out, r"final validation loss", "the end of training")
        got = losses(r.path("disk-full", "full.log"))
        if sorted(got) != list(range(1, 7)) or any(got[s][0] != ref[s][0] for s in got):
            fail(f"the run with full-disk saves logged {got}, the uninterrupted run {ref}")
        left = sorted(os.listdir(r.path(save)))
        if left != ["latest", "step-2"] or read_bytes(r.path(save, "latest")) != b"step-2\n":
            fail(f"{save} holds {left} (latest: {read_bytes(r.path(save, 'latest'))!r}) after the failed saves: "
                 "expected step-2 alone, no step-N.tmp")
        print("disk-full: the saves of steps 4 and 6 failed for lack of space, each named once with its path; "
              "training finished with the uninterrupted run's losses; no step-N.tmp left, `latest` on step-2")
        # The last good checkpoint, as the full disk left it, resumed by a fresh run saving elsewhere:
        # --resume latest verifies the manifest's checksum and every tensor's.
        shutil.copytree(r.path(save), r.path("disk-full", "resume"))
    finally:
        unmount(mnt)
    _, out = r.run(2, base + ["--save", "disk-full/resume", "--resume", "latest", "--loss-log", "disk-full/resumed.log"])
    once(out, r"resumed from 'disk-full/resume/step-2' at step 2 ", "the resume from step 2")
    got = losses(r.path("disk-full", "resumed.log"))
    if sorted(got) != [3, 4, 5, 6]:
        fail(f"steps {sorted(got)} logged after resuming at step 2")
    for s in got:
        if got[s][0] != ref[s][0]:
            fail(f"disk-full: step {s} loss {got[s][0]} after resuming from step-2, {ref[s][0]} uninterrupted")
    print(f"disk-full ({'tmpfs' if not why else 'fallback'}): step-2 intact: resumed with --resume latest, steps 3-6 "
          "equal the uninterrupted run's losses bit for bit")


def bad_setup(r):
    d = r.path("bad")
    shutil.rmtree(d, ignore_errors=True)
    r.run(2, ["--pp", "2", "--train-iters", "6", "--exit-interval", "3", "--save", "bad/base"])
    src = os.path.join(d, "base", "step-3")
    for kind in ("truncated", "flipped", "missing", "shape"):
        shutil.copytree(src, os.path.join(d, kind, "step-3"))
    f = os.path.join(d, "truncated", "step-3", "rank-1.safetensors")
    os.truncate(f, os.path.getsize(f) - 100)
    f = os.path.join(d, "flipped", "step-3", "rank-0.safetensors")
    blob = bytearray(read_bytes(f))
    blob[-7] ^= 0x40
    open(f, "wb").write(blob)
    import json
    m = os.path.join(d, "missing", "step-3", "manifest.json")
    j = json.load(open(m))
    j["tensors"] = [t for t in j["tensors"] if t["name"] != "h.1.mlp.c_fc.weight"]
    del j["manifest_crc32"]  # else its own checksum finds the edit before the loader's checks
    json.dump(j, open(m, "w"))
    m = os.path.join(d, "shape", "step-3", "manifest.json")
    j = json.load(open(m))  # a checkpoint that claims T = 32 but holds wpe.weight (16, 32)
    j["config"]["model.max_seq"] = 32
    j["config"]["data.seq_len"] = 32
    del j["manifest_crc32"]
    json.dump(j, open(m, "w"))
    print("bad checkpoints written under " + d)


GPU_MODEL = ["--device", "cuda", "--hidden-size", "64", "--micro-batch", "4"]  # 2 micro-batches per step


def has_gpu():
    try:
        p = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0 and "GPU" in p.stdout


def test_gpu(r):
    if not has_gpu():
        print("no GPU visible (nvidia-smi -L): skipped")
        sys.exit(77)
    # A model larger than the GPU is refused with the estimate before anything is allocated: 1.2e12
    # parameters (hidden 320000, 2 blocks) need > 4.8 TB of state at 4 bytes each alone.
    rc, out = r.run(1, GPU_MODEL + ["--hidden-size", "320000", "--num-attention-heads", "2"], ok=False)
    if rc == 0 or not re.search(r"need an estimated [0-9.e+]+ GiB on a rank, more than the [0-9.e+]+ GiB a rank has "
                                r"\(the GPU's free memory over the ranks on it\)", out):
        fail(f"a model larger than the GPU: exit {rc}, expected the memory refusal:\n{out}")
    print("gpu: a model larger than the GPU is refused before allocating, naming the GPU's free memory")
    resume_equals_uninterrupted(r, 1, GPU_MODEL, "gpu")
    print("gpu: 3 + 3 steps resumed on the GPU equal 6 uninterrupted ones bit for bit (losses, final weights)")

    # Across devices (bf16): the same checkpoint format both ways.
    gpu_full = losses(r.path("gpu-full.log"))
    cpu = [f for f in GPU_MODEL if f not in ("--device", "cuda")] + ["--train-iters", "6"]
    r.run(1, cpu + ["--loss-log", "cpu-full.log"])
    cpu_full = losses(r.path("cpu-full.log"))
    shutil.rmtree(r.path("cpu-ckpt"), ignore_errors=True)
    r.run(1, cpu + ["--save", "cpu-ckpt", "--exit-interval", "3", "--loss-log", "cpu-a.log"])
    # A GPU run on tp 2 × pp 2 (4 ranks: a GPU each, or sharing GPUs over comm::Staged) and back.
    gpu4 = GPU_MODEL + ["--tp", "2", "--pp", "2", "--train-iters", "6"]
    r.run(4, gpu4 + ["--loss-log", "gpu4-full.log"])
    gpu4_full = losses(r.path("gpu4-full.log"))
    shutil.rmtree(r.path("gpu4-ckpt"), ignore_errors=True)
    r.run(4, gpu4 + ["--save", "gpu4-ckpt", "--exit-interval", "3", "--loss-log", "gpu4-a.log"])
    cases = [("GPU -> CPU (pp 2)", "gpu-to-cpu", "gpu-ckpt/step-3", 2, cpu + ["--pp", "2"], gpu_full),
             ("CPU -> GPU", "cpu-to-gpu", "cpu-ckpt/step-3", 1, GPU_MODEL + ["--train-iters", "6"], cpu_full),
             ("GPU tp 2 x pp 2 -> one GPU", "gpu4-to-gpu", "gpu4-ckpt/step-3", 1, GPU_MODEL + ["--train-iters", "6"],
              gpu4_full),
             ("GPU tp 2 x pp 2 -> CPU (tp 2)", "gpu4-to-cpu", "gpu4-ckpt/step-3", 2, cpu + ["--tp", "2"], gpu4_full),
             ("CPU -> GPU tp 2 x pp 2", "cpu-to-gpu4", "cpu-ckpt/step-3", 4, gpu4, cpu_full)]
    for name, tag, ckpt, np, flags, ref in cases:
        _, out = r.run(np, flags + ["--resume", ckpt, "--loss-log", f"{tag}.log"])
        if "at step 3" not in out:
            fail(f"{name}: did not resume at step 3:\n{out}")
        got = losses(r.path(f"{tag}.log"))
        if sorted(got) != [4, 5, 6]:
            fail(f"{name}: steps {sorted(got)} logged after the resume")
        for s in (4, 5, 6):
            rel = abs(got[s][1] - ref[s][1]) / abs(ref[s][1])
            if rel > 2e-2:
                fail(f"{name}: step {s} loss {got[s][1]!r} vs {ref[s][1]!r} uninterrupted (rel {rel:.2e})")
        print(f"gpu: {name}: losses of steps 4-6 within 2e-2 of the uninterrupted run "
              f"({', '.join(f'{got[s][1]:.5f}/{ref[s][1]:.5f}' for s in (4, 5, 6))})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("test", choices=["bitwise", "reshard", "export", "faults", "skip", "corrupt", "disk-full", "gpu",
                                    "bad-setup"])
    p.add_argument("--train", required=True)
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--np-flag", default="-n")
    p.add_argument("--preflags", default="")
    p.add_argument("--work", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--python-reader", default="")
    a = p.parse_args()
    r = Runner(a)
    {"bitwise": lambda: test_bitwise(r), "reshard": lambda: test_reshard(r),
     "export": lambda: test_export(r, a.python_reader), "faults": lambda: test_faults(r),
     "skip": lambda: test_skip(r, a.python_reader), "corrupt": lambda: test_corrupt(r),
     "disk-full": lambda: test_disk_full(r), "gpu": lambda: test_gpu(r),
     "bad-setup": lambda: bad_setup(r)}[a.test]()


if __name__ == "__main__":
    main()
