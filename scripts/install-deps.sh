#!/usr/bin/env bash
# Installs what dpml needs to build, test and run its examples on Debian 12 or Ubuntu 24.04:
# compilers, CMake + Ninja, MPICH, Catch2, OpenBLAS, zlib, the Fashion-MNIST and fortunes data
# packages, python3 with matplotlib (scripts/plot-metrics.py) — and, in a Python venv at
# /opt/dpml-venv ($DPML_VENV), the `tensorboard` package, whose reader checks dpml's event files
# (tests/train/check_tensorboard.py) and which shows them (`/opt/dpml-venv/bin/tensorboard
# --logdir DIR`), and `safetensors` (reading exported models: tests/train/hf_export.py).
# Idempotent: packages already installed are skipped, apt is not touched at all when nothing is
# missing, and pip is not run when the venv imports both. Runs apt-get (and
# writes /opt) as root, through sudo otherwise.
set -euo pipefail

packages=(build-essential cmake ninja-build mpich libmpich-dev catch2 libopenblas-dev zlib1g-dev
          dataset-fashion-mnist fortunes python3 python3-matplotlib python3-venv)
venv="${DPML_VENV:-/opt/dpml-venv}"

missing=()
for p in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]]; then
    missing+=("$p")
  fi
done
need_venv=1
if "$venv/bin/python3" -c 'import tensorboard, safetensors' >/dev/null 2>&1; then need_venv=0; fi
if (( ${#missing[@]} == 0 && need_venv == 0 )); then
  echo "install-deps: all ${#packages[@]} packages present, and tensorboard and safetensors in $venv"
  exit 0
fi

if (( EUID == 0 )); then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  what=("${missing[@]}")
  if (( need_venv )); then what+=("tensorboard and safetensors (a venv at $venv)"); fi
  echo "install-deps: missing ${what[*]}; run this script as root (no sudo found)" >&2
  exit 1
fi

if (( ${#missing[@]} > 0 )); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${as_root[@]}" apt-get update -q
  "${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if (( need_venv )); then
  echo "install-deps: installing tensorboard and safetensors into $venv"
  "${as_root[@]}" /usr/bin/python3 -m venv "$venv"
  "${as_root[@]}" "$venv/bin/python3" -m pip install -q --disable-pip-version-check 'tensorboard>=2,<3' 'safetensors<1'
  "$venv/bin/python3" -c 'import tensorboard, safetensors' || { echo "install-deps: tensorboard or safetensors does not import from $venv" >&2; exit 1; }
fi
