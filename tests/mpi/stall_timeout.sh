#!/usr/bin/env bash
# A rank that never arrives at a collective: the ranks that did arrive name it and the job ends non-zero
# through the timeout, while the stalled rank still sleeps, instead of hanging. Four cases: an ordinary rank, the group's
# coordinator (rank 0), a rank of a data-axis sub-communicator, and a rank that leaves main early (as on a
# rank-local error) while the others wait for it.
# Usage: stall_timeout.sh MESHTRAIN_MPI_TESTS [MPIRUN]
set -euo pipefail
tests="$1"
mpirun="${2:-mpirun}"
timeout_s=3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run_case NAME RANKS STALL_RANK AXIS SLEEP_SECONDS PATTERN...: every PATTERN must appear in stderr.
# SLEEP_SECONDS -1: the rank returns from main instead of sleeping. The bound on the time is the stall itself:
# the job (mpirun's start-up included) must end while the stalled rank still sleeps, so the timeout ended it;
# no guess at how fast a loaded machine starts processes. A rank that left main must not hang the job.
stall_s=60
run_case() {
  local name=$1 ranks=$2 stall=$3 axis=$4 sleep_s=$5
  shift 5
  local start end rc=0
  start=$(date +%s%N)
  timeout -k 5 $((stall_s + 60)) "$mpirun" --oversubscribe --allow-run-as-root --bind-to none -np "$ranks" "$tests" \
    --stall "$stall" --timeout "$timeout_s" --axis "$axis" --sleep "$sleep_s" >"$work/$name.out" 2>"$work/$name.err" || rc=$?
  end=$(date +%s%N)
  local elapsed_ms=$(((end - start) / 1000000))
  echo "$name: exit $rc after ${elapsed_ms} ms (timeout ${timeout_s} s)"
  grep "meshtrain: error" "$work/$name.err" || true
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    echo "FAIL: $name: expected a non-zero exit from MPI_Abort, got $rc (124: hung until killed)"
    cat "$work/$name.err"
    exit 1
  fi
  if [ "$sleep_s" -gt 0 ] && [ "$elapsed_ms" -ge $((sleep_s * 1000)) ]; then
    echo "FAIL: $name: took ${elapsed_ms} ms: the job outlived the ${sleep_s} s stall, so the timeout did not end it"
    exit 1
  fi
  for pattern in "$@"; do
    if ! grep -q -- "$pattern" "$work/$name.err"; then
      echo "FAIL: $name: stderr lacks '$pattern'"
      cat "$work/$name.err"
      exit 1
    fi
  done
}

line="collective all_reduce 'update/grad_norm' #3 at step 12 timed out after 3 s on the world axis"
run_case rank2 3 2 world $stall_s \
  "$line: rank 2 did not arrive (reported by rank 0)" \
  "$line: rank 2 did not arrive (reported by rank 1)"
# Without the coordinator the others time out on their own; the first to abort may end the job before the
# other has printed, so one report is required (both usually appear).
run_case coordinator 3 0 world $stall_s \
  "$line: rank 0 did not arrive (it coordinates this group's timeout check" "(reported by rank "
run_case data_axis 4 3 data $stall_s \
  "collective all_reduce 'update/grad_norm' #2 at step 12 timed out after 3 s on the data axis: rank 3 did not arrive (reported by rank 1)"
run_case early_exit 3 1 world -1 \
  "$line: rank 1 did not arrive (reported by rank 0)" \
  "$line: rank 1 did not arrive (reported by rank 2)"
echo "stall_timeout: all cases passed"
