#!/usr/bin/env python3
"""Prints the public headers (paths relative to include/, one per line) that need the CUDA
toolkit: those that include a CUDA, cuBLAS(Lt), cuRAND, CUB/Thrust, NCCL, NVTX or cuDNN header
outside a preprocessor conditional, or such a dpml header (to a fixed point). tests/CMakeLists.txt
compiles these as CUDA translation units in the header check and the rest as host C++: which
headers are CUDA headers follows from what they include, not from their path.

    python3 scripts/cuda-headers.py [INCLUDE_DIR]     # default: the repository's include/"""
import pathlib, re, sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent / "include")
toolkit = re.compile(r"^(cuda|cublas|curand|cufft|cusparse|cudnn|nccl|nvtx|cub/|thrust/|mma\.h|cooperative_groups|crt/|vector_types)")
include = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
opens, closes = re.compile(r"^\s*#\s*if"), re.compile(r"^\s*#\s*endif")

headers = {h.relative_to(root).as_posix(): h for h in root.rglob("*.hpp")}
direct, uses = set(), {}
for name, path in headers.items():
    depth, deps = 0, set()
    for line in path.read_text(errors="replace").splitlines():
        if opens.match(line):
            depth += 1
        elif closes.match(line):
            depth -= 1
        elif depth == 0 and (m := include.match(line)):
            target = m.group(1)
            if toolkit.match(target):
                direct.add(name)
            elif target in headers:
                deps.add(target)
    uses[name] = deps
cuda = set(direct)
while True:
    more = {n for n, deps in uses.items() if n not in cuda and deps & cuda}
    if not more:
        break
    cuda |= more
print("\n".join(sorted(cuda)))
