#!/usr/bin/env python3
"""Checks that dependencies between include/dpml's folders point down (README, Architecture):
a header includes only headers of its own folder or of folders below it in this order, and
nothing above kernels/ and core/ (and comm/, whose communicators wrap it) calls the CUDA runtime
directly. Prints each violation; exit 1 if any. Run from anywhere: python3 scripts/check-floors.py

Every header is checked: the hand-fused GPU models and their private runtime, once exempt as the
composed models' measured baseline, were removed when the composed ones matched them (Step 8)."""
import pathlib, re, sys

ORDER = ["train", "models", "layers", "parallel", "optim", "data", "checkpoint", "comm", "kernels", "core"]
root = pathlib.Path(__file__).resolve().parent.parent / "include" / "dpml"
include = re.compile(r'#include\s+[<"]dpml/([a-z_]+)/')
runtime = re.compile(r"\bcuda(Malloc|Free|Memcpy|Memset|Stream[A-Z]\w*|Event[A-Z]\w*|DeviceSynchronize|LaunchKernel)\b")
bad = []
for h in sorted(root.rglob("*.hpp")):
    rel = h.relative_to(root)
    if len(rel.parts) < 2:
        continue  # dpml.hpp: the umbrella
    mine = ORDER.index(rel.parts[0])
    text = h.read_text()
    for n, line in enumerate(text.splitlines(), 1):
        m = include.search(line)
        if m and m.group(1) in ORDER and ORDER.index(m.group(1)) < mine:
            bad.append(f"{rel}:{n}: includes dpml/{m.group(1)}/ from a folder above {rel.parts[0]}/")
        code = line.split("//")[0]
        if rel.parts[0] not in ("kernels", "core", "comm") and runtime.search(code):
            bad.append(f"{rel}:{n}: calls the CUDA runtime above kernels/ and core/: {code.strip()}")
for b in bad:
    print(b)
print(f"check-floors: {len(bad)} violation(s)")
sys.exit(1 if bad else 0)
