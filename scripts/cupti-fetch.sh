#!/usr/bin/env bash
# Stages CUPTI (NVIDIA's profiling interface: headers and libcupti.so.13) for bench/timeline's
# tracer. The GPU machines have no network and no matching CUPTI of their own (Nsight Compute's is
# older, Triton's headers lack the CUDA 13 records), so the development machine downloads NVIDIA's
# wheel from PyPI into build/cupti, an ignored folder a GPU job carries (the device tool's
# carry ["build/cupti"], ~5 MiB). Configure there with CUPTI_ROOT=$PWD/build/cupti.
#
#   build/cupti/include/   cupti*.h      build/cupti/lib/   libcupti.so.13
#
# Usage: scripts/cupti-fetch.sh   (pip must reach PyPI; the version pin matches the toolkit's 13.0)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=build/cupti
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" "nvidia-cuda-cupti==13.0.*"
python3 -m zipfile -e "$tmp"/nvidia_cuda_cupti-*.whl "$tmp/x"
rm -rf "$dest"
mkdir -p "$dest/lib"
cp -r "$tmp/x/nvidia/cu13/include" "$dest/include"
cp "$tmp/x/nvidia/cu13/lib/libcupti.so.13" "$dest/lib/"
du -sh "$dest"
