#!/usr/bin/env bash
# Starts a dpml program on one rank per GPU, with the same line everywhere:
#
#   scripts/launch.sh [-n RANKS] <program> [args...]
#
# * Inside a Slurm job (SLURM_JOB_ID set): `srun [-n RANKS] <program> ...`; the job's
#   --ntasks-per-node should equal its GPUs per node (examples/slurm/train_gpt.sbatch). Extra srun
#   flags: DPML_SRUN_FLAGS.
# * Otherwise, on one host: `mpiexec -n RANKS <program> ...` (mpirun where mpiexec is missing);
#   RANKS defaults to the number of GPUs nvidia-smi lists (1 without any). Under Open MPI it adds
#   --allow-run-as-root when run as root, --oversubscribe when RANKS exceeds the cores, and
#   --bind-to none unless DPML_MPIEXEC_FLAGS binds: Open MPI binds 2 ranks to a core each, which
#   left a 6.7B GPT's initialisation (drawn on the rank's cores, layers/init.hpp) on one thread,
#   ~3 minutes before the first step on 2 H200s; MPICH does not bind. Extra flags: DPML_MPIEXEC_FLAGS.
# Each rank picks its GPU from its node-local rank (comm::select_device), so nothing here binds
# GPUs (Slurm's --gpus-per-task=1 binding works too). NCCL_NVLS_ENABLE=0 is exported unless
# already set (NVLink multicast stays off).
# DPML_LAUNCH_DRY_RUN=1 prints the command instead of running it.
set -euo pipefail

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit "${1:-0}"
}

ranks=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n | --ranks)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { echo "launch.sh: $1 needs a positive number of ranks" >&2; exit 2; }
      ranks="$2"
      shift 2
      ;;
    -h | --help) usage 0 ;;
    --) shift; break ;;
    -*) echo "launch.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[[ $# -ge 1 ]] || { echo "launch.sh: no program given (see --help)" >&2; exit 2; }

export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"

if [[ -n "${SLURM_JOB_ID:-}" ]]; then
  cmd=(srun)
  [[ -n "$ranks" ]] && cmd+=(-n "$ranks")
  # shellcheck disable=SC2206  # user-supplied flags are split on purpose
  cmd+=(${DPML_SRUN_FLAGS:-})
else
  launcher="$(command -v mpiexec || command -v mpirun || true)"
  [[ -n "$launcher" ]] || { echo "launch.sh: neither mpiexec nor mpirun is on PATH" >&2; exit 2; }
  if [[ -z "$ranks" ]]; then
    ranks="$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)"
    [[ "$ranks" -ge 1 ]] || ranks=1
  fi
  cmd=("$launcher" -n "$ranks")
  if "$launcher" --version 2>&1 | grep -qiE 'open mpi|openrte'; then
    [[ "$(id -u)" -eq 0 ]] && cmd+=(--allow-run-as-root)
    [[ "$ranks" -gt "$(nproc)" ]] && cmd+=(--oversubscribe)
    [[ "${DPML_MPIEXEC_FLAGS:-}" == *--bind-to* ]] || cmd+=(--bind-to none)
  fi
  # shellcheck disable=SC2206
  cmd+=(${DPML_MPIEXEC_FLAGS:-})
fi
cmd+=("$@")

if [[ "${DPML_LAUNCH_DRY_RUN:-0}" == 1 ]]; then
  echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE ${cmd[*]}"
  exit 0
fi
exec "${cmd[@]}"
