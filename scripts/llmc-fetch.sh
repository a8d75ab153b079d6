#!/usr/bin/env bash
# Stages llm.c and cudnn-frontend's headers for scripts/gpu-bench.sh's llm.c row. Runs on the development
# machine (the GPU machines have no network): exports two pinned snapshots into build/llmc, an ignored
# folder that a GPU job gets by carrying it (the device tool's carry ["build/llmc"]). Nothing of either
# project enters the repository; gpu-bench.sh builds llm.c from a copy of build/llmc on the GPU machine.
#
#   build/llmc/llm.c/                   git archive of karpathy/llm.c at LLMC_COMMIT, less dev/ and doc/
#   build/llmc/cudnn-frontend/include/  include/ of NVIDIA/cudnn-frontend at FRONTEND_COMMIT (headers only)
#   build/llmc/COMMITS                  the two commits, read back by gpu-bench.sh for its table
#
# Usage: scripts/llmc-fetch.sh [LLMC_GIT_DIR [FRONTEND_GIT_DIR]]
#   defaults: /work/.mirror/karpathy+llm.c/repo and /work/.mirror/NVIDIA+cudnn-frontend/repo
#   (git directories, bare or not). Refuses (exit 1) when a snapshot is missing or lacks the pinned
#   commit; to move a pin, edit it here and rerun gpu-bench.sh's llm.c row on a GPU before relying on it.
set -euo pipefail
cd "$(dirname "$0")/.."

LLMC_COMMIT=f1e2ace651495b74ae22d45d1723443fd00ecd3a      # karpathy/llm.c master, 2025-05-10 (PR #801)
FRONTEND_COMMIT=3929da2ef4c1dba1bb8acb68727b9134f26f40c0  # NVIDIA/cudnn-frontend main, v1.23.0-4, 2026-05-08

llmc_git=${1:-/work/.mirror/karpathy+llm.c/repo}
frontend_git=${2:-/work/.mirror/NVIDIA+cudnn-frontend/repo}
dest=build/llmc
max_bytes=$((32 << 20))  # the device tool carries 64 MiB in all: keep this well under it

# check NAME GIT_DIR COMMIT: the snapshot exists and holds COMMIT (its HEAD may be newer; the pin decides)
check() {
  local name=$1 dir=$2 commit=$3 head
  if ! git -C "$dir" rev-parse --git-dir >/dev/null 2>&1; then
    echo "llmc-fetch.sh: no $name snapshot at $dir (a git directory; fetch github:$name first)" >&2
    exit 1
  fi
  if ! git -C "$dir" cat-file -e "$commit^{commit}" 2>/dev/null; then
    head=$(git -C "$dir" rev-parse HEAD 2>/dev/null || echo none)
    echo "llmc-fetch.sh: the $name snapshot at $dir is at $head and lacks the pinned commit $commit" >&2
    exit 1
  fi
  head=$(git -C "$dir" rev-parse HEAD 2>/dev/null || echo none)
  [[ $head == "$commit" ]] || echo "llmc-fetch.sh: note: the $name snapshot's HEAD is $head; exporting the pinned $commit"
}
check karpathy/llm.c "$llmc_git" "$LLMC_COMMIT"
check NVIDIA/cudnn-frontend "$frontend_git" "$FRONTEND_COMMIT"

rm -rf "$dest"
mkdir -p "$dest/llm.c" "$dest/cudnn-frontend"
git -C "$llmc_git" archive "$LLMC_COMMIT" | tar -x -C "$dest/llm.c"
rm -rf "$dest/llm.c/dev" "$dest/llm.c/doc"  # data scripts, kernels' dev versions and notes: not built
git -C "$frontend_git" archive "$FRONTEND_COMMIT" include | tar -x -C "$dest/cudnn-frontend"
printf 'llm.c %s\ncudnn-frontend %s\n' "$LLMC_COMMIT" "$FRONTEND_COMMIT" >"$dest/COMMITS"

for f in Makefile train_gpt2.cu llmc/cuda_utils.cuh llmc/cudnn_att.cpp; do
  [[ -f $dest/llm.c/$f ]] || { echo "llmc-fetch.sh: $dest/llm.c/$f missing after the export" >&2; exit 1; }
done
[[ -f $dest/cudnn-frontend/include/cudnn_frontend.h ]] || { echo "llmc-fetch.sh: cudnn_frontend.h missing" >&2; exit 1; }

bytes=$(du -sb "$dest" | cut -f1)
if ((bytes > max_bytes)); then
  echo "llmc-fetch.sh: $dest holds $bytes bytes, over the $max_bytes allowed (the carry limit is 64 MiB in all)" >&2
  exit 1
fi
echo "llm.c           $LLMC_COMMIT"
echo "cudnn-frontend  $FRONTEND_COMMIT ($(git -C "$frontend_git" describe --tags "$FRONTEND_COMMIT" 2>/dev/null || echo untagged))"
echo "$dest: $(du -sh "$dest" | cut -f1) ($bytes bytes, $(find "$dest" -type f | wc -l) files)"
echo "carry: [\"$dest\"]   then on the GPU machine: scripts/gpu-bench.sh (it finds $dest by itself)"
