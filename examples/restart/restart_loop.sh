#!/usr/bin/env bash
# restart_loop.sh: run a dpml training job until it completes, resuming from the newest complete
# checkpoint after each failure (a killed rank, a node lost, the collective watchdog ending a
# hung job), giving up after MAX_FAILURES failures in a row without progress.
#
#   MAX_FAILURES=5 NP=8 examples/restart/restart_loop.sh runs/gpt \
#       build/cpu/examples/train_gpt/train_gpt --tp 2 --pp 2 --train-iters 5000 --save-interval 200
#
# What makes this safe:
#   * train_gpt --save DIR writes each checkpoint into DIR/step-N.tmp and renames it only once
#     every rank's file is on disk (fsync'ed) and the manifest with checksums is written: a crash
#     mid-save leaves a .tmp directory that is never read;
#   * --resume latest loads DIR/latest, or the newest intact step-N; a torn or corrupt one is
#     skipped with a message naming it; with no checkpoint at all the run starts fresh, with
#     only corrupt ones it stops (each attempt alike, so the loop gives up) unless
#     --resume-fresh-if-corrupt; a failed save is reported and retried at the next interval
#     (--save-max-failures in a row end the attempt);
#   * a dead or stuck rank cannot hang the job: MPI ends the job when a rank dies, and the
#     watchdog (--collective-timeout, default 300 s) ends it when a rank stops communicating.
# The job's exit status tells completion (0) from failure (anything else). The number of
# failures is counted only while no new checkpoint appears, so a long run that fails now and
# then still finishes.
set -u

if [ $# -lt 2 ]; then
  echo "usage: $0 CHECKPOINT_DIR TRAIN_PROGRAM [flags...]   (env: NP, MPIEXEC, MPIEXEC_FLAGS, MAX_FAILURES)" >&2
  exit 2
fi
dir=$1
shift
np=${NP:-4}
mpiexec=${MPIEXEC:-mpiexec}
max_failures=${MAX_FAILURES:-5}

newest() { cat "$dir/latest" 2>/dev/null || echo none; }

failures=0
while :; do
  before=$(newest)
  # shellcheck disable=SC2086  # MPIEXEC_FLAGS is a list of words (Open MPI as root: --allow-run-as-root)
  "$mpiexec" -n "$np" ${MPIEXEC_FLAGS:-} "$@" --save "$dir" --resume latest
  status=$?
  if [ $status -eq 0 ]; then
    echo "restart_loop: completed (last checkpoint $(newest))"
    exit 0
  fi
  if [ "$(newest)" != "$before" ]; then
    failures=0  # progress was made: only failures in a row count
  fi
  failures=$((failures + 1))
  echo "restart_loop: job failed with status $status (failure $failures of $max_failures in a row); last checkpoint $(newest)" >&2
  if [ $failures -ge "$max_failures" ]; then
    echo "restart_loop: giving up" >&2
    exit $status
  fi
  sleep "${RESTART_DELAY:-5}"  # let the scheduler / MPI clean up the dead job
done
