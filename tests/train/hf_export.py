#!/usr/bin/env python3
"""train_gpt --export DIR/ and --import in Hugging Face's format, checked from outside dpml.

    hf_export.py --train <train_gpt> --mpiexec <mpiexec> [--np-flag -n] [--preflags a,b] --work <dir>

1. A short host run writes DIR/ (--export out/). config.json must hold GPT2Config's fields for the
   model the flags describe, and model.safetensors exactly the tensors (names, shapes, F32) that
   transformers' GPT2LMHeadModel has for that config — both written out below from the config
   alone, not from dpml's code: "transformer." names, Conv1D weights (in, out), no lm_head.weight
   (tied to transformer.wte.weight; save_pretrained leaves it out). Read with the `safetensors`
   package where it imports, else by a plain parser of the published format (an 8-byte length, a
   JSON header, the data). The values are those of --export FILE.safetensors (GPT-2's bare names,
   whose layout tests/resilience checks against a GPT-2 forward pass) of the same run.
   (The safetensors package needs numpy: without both, the plain parser and writer are used.)
2. Round trip: --import out/ (1 rank) and --import out/model.safetensors (tp 2) into fresh runs
   with lr 0, exported again: the same bytes, and the validation loss of the imported model equals
   the exporting run's final one (the same layout; within 1e-5 at tp 2).
3. What transformers' save_pretrained may hold, written here (by the safetensors package where it
   imports): a model in bfloat16 (imported as its values widened to fp32), an lm_head.weight equal to
   the embedding and GPT-2's attention-mask buffers are taken (the same model); an lm_head.weight
   that differs (on 1 rank, and on 2 ranks where every rank stops: one message), a config.json of
   another depth, and a tensor the model lacks are refused with a message naming them.
Exits non-zero with a message on the first failure.
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys

L, C, H, T = 2, 32, 2, 16  # the model every run trains (byte vocabulary: V = 256)
V = 256
MODEL = ["--num-layers", str(L), "--hidden-size", str(C), "--num-attention-heads", str(H), "--seq-length", str(T),
         "--global-batch", "8", "--micro-batch", "4", "--lr-warmup-iters", "0", "--sample-tokens", "0",
         "--log-interval", "1000", "--eval-interval", "1000"]
LR0 = ["--train-iters", "1", "--lr", "0", "--min-lr", "0"]  # one step that leaves the weights as they are


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def expected_config():
    """GPT2Config's fields (transformers' names) for the model of MODEL, as dpml computes it."""
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V, "n_positions": T,
            "n_embd": C, "n_layer": L, "n_head": H, "n_inner": None, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True,
            "bos_token_id": None, "eos_token_id": None,  # V < 50257: no <|endoftext|> token
            "torch_dtype": "float32", "dtype": "float32"}


def expected_tensors(cfg):
    """{name: shape} of GPT2LMHeadModel's parameters for config.json `cfg`, lm_head.weight left out."""
    c, n_inner = cfg["n_embd"], cfg.get("n_inner") or 4 * cfg["n_embd"]
    want = {"transformer.wte.weight": [cfg["vocab_size"], c], "transformer.wpe.weight": [cfg["n_positions"], c],
            "transformer.ln_f.weight": [c], "transformer.ln_f.bias": [c]}
    for i in range(cfg["n_layer"]):
        h = f"transformer.h.{i}."
        want.update({h + "ln_1.weight": [c], h + "ln_1.bias": [c], h + "ln_2.weight": [c], h + "ln_2.bias": [c],
                     h + "attn.c_attn.weight": [c, 3 * c], h + "attn.c_attn.bias": [3 * c],  # Conv1D: (in, out)
                     h + "attn.c_proj.weight": [c, c], h + "attn.c_proj.bias": [c],
                     h + "mlp.c_fc.weight": [c, n_inner], h + "mlp.c_fc.bias": [n_inner],
                     h + "mlp.c_proj.weight": [n_inner, c], h + "mlp.c_proj.bias": [c]})
    return want


def read_plain(path):
    """(metadata, {name: (dtype, shape, raw bytes)}) by the published format."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    return meta, {k: (e["dtype"], e["shape"], data[e["data_offsets"][0]:e["data_offsets"][1]]) for k, e in header.items()}


def write_file(path, tensors, meta):
    """Writes {name: (dtype, shape, raw bytes)} as a safetensors file: all F32 with the safetensors
    package where it imports (as save_pretrained does), else (numpy has no bfloat16) by the
    published format."""
    try:
        import numpy as np
        from safetensors.numpy import save_file
        if all(dtype == "F32" for dtype, _, _ in tensors.values()):
            save_file({k: np.frombuffer(raw, dtype="<f4").reshape(shape) for k, (_, shape, raw) in tensors.items()}, path, meta)
            return
    except ImportError:
        pass
    header, at = {"__metadata__": meta}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, raw in tensors.values()))


def names_and_shapes(path):
    """{name: shape} and the reader used: the safetensors package where it imports, else read_plain."""
    try:
        from safetensors import safe_open
        with safe_open(path, framework="np") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}, "safetensors"
    except ImportError:
        return {k: v[1] for k, v in read_plain(path)[1].items()}, "plain parser"


class Runner:
    def __init__(self, a):
        self.train, self.work = a.train, a.work
        self.mpi = [a.mpiexec, a.np_flag]
        self.pre = [p for p in re.split(r"[;,]", a.preflags) if p]
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.data = self.path("text.txt")
        with open(self.data, "w") as f:
            f.write("It was the best of times, it was the worst of times; it was the age of wisdom.\n" * 120)

    def path(self, *p):
        return os.path.join(self.work, *p)

    def run(self, np, flags, ok=True):
        cmd = self.mpi + [str(np)] + self.pre + [self.train, "--data-path", self.data] + MODEL + flags
        p = subprocess.run(cmd, cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                           timeout=120, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        if ok and p.returncode != 0:
            fail(f"exit {p.returncode}: {' '.join(cmd)}\n{p.stdout}")
        if not ok and p.returncode == 0:
            fail(f"accepted, should be refused: {' '.join(cmd)}\n{p.stdout}")
        return p.stdout

    def refused(self, flags, pattern, np=1):
        out = self.run(np, flags, ok=False)
        if len(re.findall(pattern, out)) != 1:
            fail(f"expected one message matching {pattern!r}, got:\n{out}")

    def val_loss(self, metrics):
        with open(self.path(metrics)) as f:
            return [json.loads(line) for line in f][-1]["val_loss"]

    def read(self, *p):
        with open(self.path(*p), "rb") as f:
            return f.read()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--train", required=True)
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--np-flag", default="-n")
    p.add_argument("--preflags", default="")
    p.add_argument("--work", required=True)
    r = Runner(p.parse_args())

    # 1. DIR/ against GPT2Config and GPT2LMHeadModel; its values are the bare file's.
    trained = ["--train-iters", "3", "--metrics", "a.jsonl"]
    out = r.run(1, trained + ["--export", "out/"])
    if "exported 'out/'" not in out:
        fail(f"no export reported:\n{out}")
    r.run(1, trained + ["--export", "bare.safetensors"])  # the same run (seeded): the same weights
    if sorted(os.listdir(r.path("out"))) != ["config.json", "model.safetensors"]:
        fail(f"out/ holds {sorted(os.listdir(r.path('out')))}")
    with open(r.path("out", "config.json")) as f:
        cfg = json.load(f)
    for key, want in expected_config().items():
        if key not in cfg or cfg[key] != want or isinstance(cfg[key], bool) != isinstance(want, bool):
            fail(f"config.json: {key} is {cfg.get(key, '(absent)')!r}, expected {want!r}")
    shapes, reader = names_and_shapes(r.path("out", "model.safetensors"))
    want = expected_tensors(cfg)
    if shapes != want:
        fail(f"model.safetensors: names/shapes {sorted(shapes.items())}, GPT2LMHeadModel has {sorted(want.items())}")
    meta, hf = read_plain(r.path("out", "model.safetensors"))
    if meta.get("format") != "pt":
        fail(f"__metadata__ {meta}: transformers loads only format 'pt'")
    _, bare = read_plain(r.path("bare.safetensors"))
    for name, (dtype, shape, raw) in hf.items():
        if dtype != "F32" or bare[name[len("transformer."):]] != (dtype, shape, raw):
            fail(f"{name}: {dtype} {shape}, not the bare export's '{name[len('transformer.'):]}'")
    if len(bare) != len(hf):
        fail(f"the bare export has {len(bare)} tensors, out/ {len(hf)}")
    print(f"--export out/: config.json as GPT2Config; {len(hf)} tensors with GPT2LMHeadModel's names and shapes ({reader}), "
          "the bare export's values")

    # 2. Round trips: the same bytes, the same validation loss.
    val = r.val_loss("a.jsonl")
    r.run(1, LR0 + ["--import", "out/", "--export", "again/", "--metrics", "b.jsonl"])
    r.run(2, LR0 + ["--tp", "2", "--import", "out/model.safetensors", "--export", "again.safetensors", "--metrics", "c.jsonl"])
    if r.read("again", "model.safetensors") != r.read("out", "model.safetensors") or \
            r.read("again", "config.json") != r.read("out", "config.json"):
        fail("--import out/ then --export again/ changed the model")
    if r.read("again.safetensors") != r.read("bare.safetensors"):
        fail("--import out/model.safetensors (tp 2) then --export changed the model")
    if r.val_loss("b.jsonl") != val:  # the same layout: the same arithmetic
        fail(f"validation loss of the model imported from out/ {r.val_loss('b.jsonl')}, the exporting run's {val}")
    if abs(r.val_loss("c.jsonl") - val) > 1e-5 * val:  # tp 2 sums in another order
        fail(f"validation loss of the model imported at tp 2 {r.val_loss('c.jsonl')}, the exporting run's {val}")
    print(f"--import out/ and out/model.safetensors (tp 2) -> --export: the same bytes; validation loss {val} "
          f"(tp 2: {r.val_loss('c.jsonl')})")

    # 3. save_pretrained's extras taken, other models refused.
    os.makedirs(r.path("saved"))
    shutil.copy(r.path("out", "config.json"), r.path("saved", "config.json"))
    extra = dict(hf)
    extra["lm_head.weight"] = hf["transformer.wte.weight"]
    tril = b"".join(struct.pack("<f", float(j <= i)) for i in range(T) for j in range(T))
    for i in range(L):
        extra[f"transformer.h.{i}.attn.bias"] = ("F32", [1, 1, T, T], tril)
        extra[f"transformer.h.{i}.attn.masked_bias"] = ("F32", [], struct.pack("<f", -1e4))
    write_file(r.path("saved", "model.safetensors"), extra, {"format": "pt"})
    r.run(1, LR0 + ["--import", "saved/", "--export", "saved-again/"])
    if r.read("saved-again", "model.safetensors") != r.read("out", "model.safetensors"):
        fail("a tied lm_head.weight and the attention masks changed the imported model")
    print("--import of a file with a tied lm_head.weight and GPT-2's attention masks: the same model")

    def bf16(raw):  # float32 → bfloat16 by dropping the low half (exact in bfloat16), and back
        halves = struct.unpack(f"<{len(raw) // 2}H", raw)[1::2]
        return struct.pack(f"<{len(halves)}H", *halves), b"".join(b"\0\0" + struct.pack("<H", h) for h in halves)
    os.makedirs(r.path("half"))
    write_file(r.path("half", "model.safetensors"), {k: ("BF16", shape, bf16(raw)[0]) for k, (_, shape, raw) in hf.items()},
               {"format": "pt"})
    r.run(1, LR0 + ["--import", "half/", "--export", "half-again/"])
    _, widened = read_plain(r.path("half-again", "model.safetensors"))
    for name, (dtype, shape, raw) in hf.items():
        if widened[name] != ("F32", shape, bf16(raw)[1]):
            fail(f"{name}: imported from BF16 and exported, not the bfloat16 values widened")
    print("--import of a BF16 file: its values, widened to F32 exactly")

    wte = bytearray(hf["transformer.wte.weight"][2])
    wte[0] ^= 1
    untied = dict(extra, **{"lm_head.weight": ("F32", hf["transformer.wte.weight"][1], bytes(wte))})
    write_file(r.path("saved", "model.safetensors"), untied, {"format": "pt"})
    # "dpml: ", not "dpml error on rank 0: ": an Error of every rank (dpml::run prints it once, every rank exits 1),
    # not one rank's (which would end the job by MPI_Abort)
    untied_message = (r"dpml: importing 'saved/' failed: rank 0: '[^']*saved/model.safetensors': lm_head.weight differs "
                      r"from the token embedding 'transformer.wte.weight'")
    r.refused(LR0 + ["--import", "saved/"], untied_message)
    r.refused(LR0 + ["--pp", "2", "--import", "saved/"], untied_message, np=2)  # every rank stops, the message once
    write_file(r.path("saved", "model.safetensors"), extra, {"format": "pt"})
    deeper = dict(cfg, n_layer=L + 1)
    with open(r.path("saved", "config.json"), "w") as f:
        json.dump(deeper, f)
    r.refused(LR0 + ["--import", "saved/model.safetensors"],
              rf"'[^']*saved/config.json' has n_layer {L + 1}, this run has --num-layers {L}")
    os.remove(r.path("saved", "config.json"))
    write_file(r.path("saved", "model.safetensors"),
                dict(extra, **{"transformer.h.9.ln_1.weight": ("F32", [C], bytes(4 * C))}), {"format": "pt"})
    r.refused(LR0 + ["--import", "saved/"],
              r"'[^']*saved/model.safetensors' has 1 tensor the model does not use, e.g. 'transformer.h.9.ln_1.weight' "
              rf"\(the file has more layers than --num-layers {L}\?\)")
    print("refused: an untied lm_head.weight (1 rank; 2 ranks, pp 2), a config.json of another depth, a tensor of a deeper "
          "model")


if __name__ == "__main__":
    main()
