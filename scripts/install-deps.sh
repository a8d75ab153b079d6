#!/usr/bin/env bash
# Installs what dpml needs to build, test and run its examples on Debian 12 or Ubuntu 24.04:
# compilers, CMake + Ninja, MPICH, Catch2, OpenBLAS, zlib, the Fashion-MNIST and fortunes data
# packages, python3 with matplotlib (scripts/plot-metrics.py). Idempotent: packages already
# installed are skipped, and apt is not touched at all when nothing is missing. Runs apt-get as root, through sudo otherwise.
set -euo pipefail

packages=(build-essential cmake ninja-build mpich libmpich-dev catch2 libopenblas-dev zlib1g-dev
          dataset-fashion-mnist fortunes python3 python3-matplotlib)

missing=()
for p in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]]; then
    missing+=("$p")
  fi
done
if (( ${#missing[@]} == 0 )); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if (( EUID == 0 )); then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "install-deps: missing ${missing[*]}; run this script as root (no sudo found)" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -q
"${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
