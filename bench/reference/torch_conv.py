#!/usr/bin/env python3
"""cuDNN (through PyTorch) on ResNet-50's convolutions: the reference for bench/conv/bench_conv.

The same distinct convolutions of ResNet-50 v1.5 (torchvision resnet50, 224 px input), in the same
order and with the same labels as bench_conv's kResNet50 table; bf16 channels_last tensors on the GPU,
torch.backends.cudnn.benchmark = True (so cuDNN picks its fastest algorithm per shape during the
warmup). Per shape it times three passes, each `--warmup` untimed calls then `--iters` calls between
two torch.cuda.Events:
  fwd    F.conv2d(x, w)                                          y  (N, Cout, Ho, Wo)
  dgrad  aten.convolution_backward(..., output_mask [T, F, F])   dx (N, Cin, H, W)
  wgrad  aten.convolution_backward(..., output_mask [F, T, F])   dw (Cout, Cin, kh, kw), bf16
(the stem has no dgrad). The stem is timed with its input padded to 8 channels, as dpml runs it.
FLOPs = 2·N·Ho·Wo·Cout·kh·kw·Cin per pass. Output: one JSON line per shape and pass,
{"bench":"conv","shape":..,"pass":..,"policy":"cudnn","ms":..,"tflops":..,"count":..,"batch":..},
then a table and the network's convolution time per step, Σ count × (fwd + dgrad + wgrad); with
--json-only, the JSON lines alone. Exits 1 if an output is not finite.
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

# (label, count, H = W of the input, Cin, Cout, kernel, stride); padding k // 2. Keep in step with
# bench/conv/bench_conv.cu (kResNet50): scripts/conv-bench.sh joins the two by label.
RESNET50 = [
    ("stem 7x7/2 8->64 @224", 1, 224, 8, 64, 7, 2),
    ("s1 reduce 1x1 64->64 @56", 1, 56, 64, 64, 1, 1),
    ("s1 reduce 1x1 256->64 @56", 2, 56, 256, 64, 1, 1),
    ("s1 3x3 64->64 @56", 3, 56, 64, 64, 3, 1),
    ("s1 expand+proj 1x1 64->256 @56", 4, 56, 64, 256, 1, 1),
    ("s2 reduce 1x1 256->128 @56", 1, 56, 256, 128, 1, 1),
    ("s2 3x3/2 128->128 @56", 1, 56, 128, 128, 3, 2),
    ("s2 reduce 1x1 512->128 @28", 3, 28, 512, 128, 1, 1),
    ("s2 3x3 128->128 @28", 3, 28, 128, 128, 3, 1),
    ("s2 expand 1x1 128->512 @28", 4, 28, 128, 512, 1, 1),
    ("s2 proj 1x1/2 256->512 @56", 1, 56, 256, 512, 1, 2),
    ("s3 reduce 1x1 512->256 @28", 1, 28, 512, 256, 1, 1),
    ("s3 3x3/2 256->256 @28", 1, 28, 256, 256, 3, 2),
    ("s3 reduce 1x1 1024->256 @14", 5, 14, 1024, 256, 1, 1),
    ("s3 3x3 256->256 @14", 5, 14, 256, 256, 3, 1),
    ("s3 expand 1x1 256->1024 @14", 6, 14, 256, 1024, 1, 1),
    ("s3 proj 1x1/2 512->1024 @28", 1, 28, 512, 1024, 1, 2),
    ("s4 reduce 1x1 1024->512 @14", 1, 14, 1024, 512, 1, 1),
    ("s4 3x3/2 512->512 @14", 1, 14, 512, 512, 3, 2),
    ("s4 reduce 1x1 2048->512 @7", 2, 7, 2048, 512, 1, 1),
    ("s4 3x3 512->512 @7", 2, 7, 512, 512, 3, 1),
    ("s4 expand 1x1 512->2048 @7", 3, 7, 512, 2048, 1, 1),
    ("s4 proj 1x1/2 1024->2048 @14", 1, 14, 1024, 2048, 1, 2),
]
assert sum(c for _, c, *_ in RESNET50) == 53, "ResNet-50 has 53 convolutions"
PASSES = ("fwd", "dgrad", "wgrad")


def time_ms(fn, warmup, iters):
    """Mean milliseconds of one fn() over iters calls, after warmup untimed ones; fn's last result."""
    for _ in range(warmup):
        out = fn()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        out = fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / iters, out


def bench_layer(label, count, H, cin, cout, k, stride, a):
    """({pass: ms}, FLOPs per pass) for one shape; prints its JSON lines; raises if an output is not finite."""
    dev, bf = "cuda", torch.bfloat16
    pad = k // 2
    ho = (H + 2 * pad - k) // stride + 1
    cl = torch.channels_last
    x = torch.empty(a.batch, cin, H, H, device=dev, dtype=bf).uniform_(-1, 1).to(memory_format=cl)
    w = (torch.empty(cout, cin, k, k, device=dev, dtype=bf).uniform_(-1, 1) / math.sqrt(cin * k * k)).to(
        memory_format=cl
    )
    dy = torch.empty(a.batch, cout, ho, ho, device=dev, dtype=bf).uniform_(-1, 1).to(memory_format=cl)

    # aten.convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    # transposed, output_padding, groups, output_mask) → (dx, dw, db), None where the mask is False.
    def backward(mask, which):
        return lambda: torch.ops.aten.convolution_backward(
            dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1, mask
        )[which]

    runs = {
        "fwd": lambda: F.conv2d(x, w, None, stride, pad),
        "dgrad": backward([True, False, False], 0),
        "wgrad": backward([False, True, False], 1),
    }
    flops = 2.0 * a.batch * ho * ho * cout * k * k * cin
    result = {}
    for p in PASSES:
        if p == "dgrad" and label.startswith("stem"):
            continue  # nothing upstream of the stem needs dx
        ms, out = time_ms(runs[p], a.warmup, a.iters)
        if not torch.isfinite(out).all():
            raise RuntimeError(f"{label} {p}: non-finite output")
        result[p] = ms
        rec = {"bench": "conv", "shape": label, "pass": p, "policy": "cudnn", "ms": round(ms, 4),
               "tflops": round(flops / (ms * 1e-3) / 1e12, 1), "count": count, "batch": a.batch}
        print(json.dumps(rec, separators=(",", ":")), flush=True)
    return result, flops


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256, help="images per step (default 256)")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per shape and pass (default 20)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls before them, cuDNN autotuning included (default 5)")
    ap.add_argument("--json-only", action="store_true", help="print the JSON lines only")
    a = ap.parse_args()
    if a.batch < 1 or a.iters < 1 or a.warmup < 1:
        ap.error(f"need --batch ≥ 1, --iters ≥ 1 and --warmup ≥ 1 (cudnn.benchmark tunes on the first call); "
                 f"got {a.batch}, {a.iters}, {a.warmup}")
    if not torch.cuda.is_available():
        sys.exit("torch_conv.py: no CUDA device")
    torch.backends.cudnn.benchmark = True
    if not a.json_only:
        print(f"# torch_conv: {torch.cuda.get_device_name()} | torch {torch.__version__}, cuDNN "
              f"{torch.backends.cudnn.version()} | ResNet-50 v1.5 @224, batch {a.batch} | "
              f"{a.warmup} warmup + {a.iters} timed runs")

    rows, failed = [], False
    with torch.no_grad():
        for layer in RESNET50:
            try:
                ms, flops = bench_layer(*layer, a)
            except RuntimeError as e:
                print(f"torch_conv.py: {e}", file=sys.stderr)
                failed, ms, flops = True, {}, 0.0
            rows.append((layer[0], layer[1], ms, flops))

    if not a.json_only:
        print("\n| shape | count | fwd ms | fwd TFLOP/s | dgrad ms | dgrad TFLOP/s | wgrad ms | wgrad TFLOP/s | count × step ms |")
        print("|---|---|---|---|---|---|---|---|---|")
        total = 0.0
        for label, count, ms, flops in rows:
            cells = []
            for p in PASSES:
                if p in ms:
                    cells += [f"{ms[p]:.3f}", f"{flops / (ms[p] * 1e-3) / 1e12:.1f}"]
                else:
                    cells += ["-", "-"]
            step = count * sum(ms.values())
            total += step
            print(f"| {label} | {count} | " + " | ".join(cells) + f" | {step:.2f} |")
        print(f"\nResNet-50 convolutions per training step (batch {a.batch}, Σ count × (fwd + dgrad + wgrad), "
              f"stem without dgrad):\n  cudnn {total:9.2f} ms")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
