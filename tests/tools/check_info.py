#!/usr/bin/env python3
"""Runs dpml-info (the command after --) and checks what it printed against this machine.

    check_info.py --ranks N --cuda-build 0|1 -- mpiexec -n N .../dpml-info [--probe ...]

- exit status 0; the first line names N ranks; the sections host, GPUs, topology (and probe
  with --probe) each printed once, in that order;
- host: the nodes' ranks add up to N and their world ranks are 0..N-1, each once; on one node its
  name is this machine's (socket.gethostname) and its cores os.cpu_count();
- GPUs and topology, once per node: "no NVML" exactly where libnvidia-ml.so.1 does not load here
  (ctypes); "built without CUDA" for a host build, else "no CUDA device" or GPU lines; with
  DPML_NVML_LIBRARY set to tests/tools/fake_nvml.cpp's library, that file's GPUs, NVLinks and values;
- probe: one MPI line per --sizes entry (ending with the blocking MPI_Allreduce's time), whose algbw is bytes / time and busbw 2(N-1)/N · algbw
  (recomputed here from the printed bytes and microseconds, to the printed rounding), busbw > 0 on
  more than one rank; then the GPU probes, or why they did not run.
"""
import ctypes
import os
import re
import socket
import subprocess
import sys

SECTIONS = ["host", "GPUs", "topology", "probe"]


def fail(msg, out):
    sys.exit(f"FAIL: {msg}\n--- output ---\n{out}")


def sizes_of(cmd):
    text = cmd[cmd.index("--sizes") + 1] if "--sizes" in cmd else "64K,1M,16M"
    scale = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30, "GB": 1 << 30}
    return [int(m.group(1)) * scale[m.group(2)] for m in (re.fullmatch(r"(\d+)([KMG]?B?)", s) for s in text.split(","))]


def main():
    argv = sys.argv[1:]
    split = argv.index("--")
    opts, cmd = argv[:split], argv[split + 1:]
    ranks = int(opts[opts.index("--ranks") + 1])
    cuda_build = opts[opts.index("--cuda-build") + 1] == "1"
    probe = "--probe" in cmd

    run = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    out = run.stdout
    if run.returncode != 0:
        fail(f"status {run.returncode}: {run.stderr}", out)
    lines = out.splitlines()
    m = re.match(r"dpml-info \(dpml [\d.]+\): (\d+) rank\(s\) on (\d+) node\(s\)$", lines[0])
    if not m or int(m.group(1)) != ranks:
        fail(f"first line does not name {ranks} ranks", out)
    nodes = int(m.group(2))

    # Sections: each once, in order; "probe" only with --probe.
    want = SECTIONS if probe else SECTIONS[:-1]
    heads = [l[3:-3] for l in lines if re.fullmatch(r"== .+ ==", l)]
    if heads != want:
        fail(f"sections {heads}, expected {want}", out)
    body = {}
    current = None
    for l in lines[1:]:
        if re.fullmatch(r"== .+ ==", l):
            current = l[3:-3]
            body[current] = []
        else:
            body[current].append(l)

    # host: ranks and world ranks add up; one node: this machine's name and cores.
    host = [re.match(r"node (\S+): (\d+) cores \(\d+ usable by its first rank\), (\d+) rank\(s\): world rank (.*)$", l)
            for l in body["host"] if l.startswith("node ")]
    if len(host) != nodes or not all(host):
        fail(f"expected {nodes} node line(s) in host", out)
    if sum(int(h.group(3)) for h in host) != ranks:
        fail("the nodes' ranks do not add up to the launch", out)
    world = sorted(int(r) for h in host for r in h.group(4).split(", "))
    if world != list(range(ranks)):
        fail(f"world ranks {world}, expected 0..{ranks - 1}", out)
    if nodes == 1:
        if host[0].group(1) != socket.gethostname():
            fail(f"host name {host[0].group(1)}, this machine is {socket.gethostname()}", out)
        if int(host[0].group(2)) != os.cpu_count():
            fail(f"{host[0].group(2)} cores, this machine has {os.cpu_count()}", out)
    if sum("MPI library: " in l for l in body["host"]) != nodes:
        fail("no MPI library line per node", out)

    # NVML and CUDA as this machine has them.
    fake = bool(os.environ.get("DPML_NVML_LIBRARY"))
    try:
        ctypes.CDLL(os.environ.get("DPML_NVML_LIBRARY") or "libnvidia-ml.so.1")
        nvml = True
    except OSError:
        nvml = False
    gpus = "\n".join(body["GPUs"])
    topo = "\n".join(body["topology"])
    if fake:  # tests/tools/fake_nvml.cpp's two GPUs, per node
        want = ["  NVML: driver 999.1.2, 2 GPU(s)"]
        want_topo = ["  GPU 0 (00000000:18:00.0): 2 NVLink(s) to NVSwitch, 2 to GPU 1",
                     "  GPU 1 (00000000:2a:00.0): 2 NVLink(s) to NVSwitch, 2 to GPU 0", "  GPU 0 - GPU 1: NVLink x2"]
        if not cuda_build:
            want.append("  NVML GPU 0: Fake GPU 0, 80.0 GiB, power limit 700 W (drawing 250 W), SM clock max 1980 MHz "
                        "(now 1500), memory clock 2619 MHz, 42% busy, 20.0 GiB in use")
        for w in want:
            if body["GPUs"].count(w) != nodes:
                fail(f"expected in GPUs once per node: {w!r}", out)
        for w in want_topo:
            if body["topology"].count(w) != nodes:
                fail(f"expected in topology once per node: {w!r}", out)
    if gpus.count("no NVML") != (0 if nvml else nodes):
        fail(f"'no NVML' printed {gpus.count('no NVML')} time(s); libnvidia-ml.so.1 {'loads' if nvml else 'does not load'} here", out)
    if (topo.count("no NVML, topology unknown") == nodes) == nvml:
        fail("topology does not match NVML's presence", out)
    if not cuda_build and gpus.count("built without CUDA") != nodes:
        fail("a host build must say 'built without CUDA' per node", out)
    if cuda_build and gpus.count("no CUDA device") + len(re.findall(r"^  GPU 0: ", gpus, re.M)) != nodes:
        fail("a CUDA build must say 'no CUDA device' or list GPU 0 per node", out)

    if not probe:
        return
    rows = [re.match(r"\s+(\d+) bytes\s+([\d.]+) us\s+algbw\s+([\d.]+) GB/s\s+busbw\s+([\d.]+) GB/s"
                     r"(\s+MPI_Allreduce\s+[\d.]+ us)?$", l)
            for l in body["probe"] if " bytes " in l]
    if not body["probe"] or not body["probe"][0].startswith("MPI all-reduce"):
        fail("the probe does not start with the MPI all-reduce", out)
    mpi = [r for r in rows[:len(sizes_of(cmd))]]
    if not all(mpi) or [int(r.group(1)) for r in mpi] != sizes_of(cmd):
        fail(f"expected one MPI line per size {sizes_of(cmd)}", out)
    if not all(r.group(5) for r in mpi):
        fail("every MPI line must end with the blocking MPI_Allreduce's time", out)
    for r in mpi:
        size, us, algbw, busbw = int(r.group(1)), float(r.group(2)), float(r.group(3)), float(r.group(4))
        expect_alg = size / (us * 1e-6) / 1e9
        if abs(algbw - expect_alg) > 0.01 * expect_alg + 2e-3:  # us is printed to 0.1
            fail(f"algbw {algbw} for {size} bytes in {us} us, expected {expect_alg:.3f}", out)
        if abs(busbw - algbw * 2 * (ranks - 1) / ranks) > 2e-3:
            fail(f"busbw {busbw} is not 2(n-1)/n x algbw {algbw}", out)
        if ranks > 1 and busbw <= 0:
            fail("busbw must be positive on more than one rank", out)
    if not re.search(r"NCCL all-reduce, bf16 GEMM: (built without CUDA|skipped)|^NCCL [\d.]+ all-reduce", "\n".join(body["probe"]), re.M):
        fail("the GPU probes neither ran nor said why not", out)


if __name__ == "__main__":
    main()
