#!/usr/bin/env bash
# Runs tests again and again while two busy processes hold both cores, as CI may find the machine: each
# multi-process and end-to-end test REPEATS times in a row (default 20), or with --suite the whole README test
# command (./scripts/test.sh) REPEATS times (default 3). Stops at the first failure and prints its output.
#   usage: tests/load/repeat_under_load.sh [--suite] [BUILD_DIR] [REPEATS] [CTEST_REGEX]
#   BUILD_DIR default build; CTEST_REGEX default '^(mpi|e2e)\.' (tests run one at a time, as ctest names them)
# Exit status 0 when every run passed. Not part of ctest: it takes an hour or so.
set -uo pipefail
cd "$(dirname "$0")/../.."
suite=false
if [ "${1:-}" = "--suite" ]; then suite=true; shift; fi
build_dir=${1:-build}
repeats=${2:-$($suite && echo 3 || echo 20)}
regex=${3:-'^(mpi|e2e)\.'}

load_pids=()
start_load() {
  for _ in 1 2; do
    (while :; do :; done) &
    load_pids+=($!)
  done
}
stop_load() { [ ${#load_pids[@]} -eq 0 ] || kill "${load_pids[@]}" 2>/dev/null; }
trap stop_load EXIT
start_load
echo "# load: ${#load_pids[@]} busy processes (pids ${load_pids[*]}) on $(nproc) cores; cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"

# runs NAME COMMAND...: REPEATS runs; prints min / median / max seconds; returns 1 at the first failure.
runs() {
  local name=$1 times=() i start rc log
  shift
  log=$(mktemp)
  for ((i = 1; i <= repeats; i++)); do
    start=$(date +%s.%N)
    "$@" >"$log" 2>&1
    rc=$?
    times+=("$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')")
    if [ $rc -ne 0 ]; then
      echo "FAIL: $name: run $i of $repeats exited $rc after ${times[-1]} s; its output:"
      cat "$log"
      rm -f "$log"
      return 1
    fi
  done
  rm -f "$log"
  printf '%-28s %d/%d passed   seconds min %.1f  median %.1f  max %.1f\n' "$name" "$repeats" "$repeats" \
    $(printf '%s\n' "${times[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[1], v[int((NR + 1) / 2)], v[NR] }')
}

status=0
if $suite; then
  runs "scripts/test.sh" ./scripts/test.sh || status=1
else
  mapfile -t names < <(cd "$build_dir" && ctest -N -R "$regex" | sed -n 's/^ *Test *#[0-9]*: //p')
  [ ${#names[@]} -gt 0 ] || { echo "no test matches $regex in $build_dir"; exit 1; }
  for name in "${names[@]}"; do
    runs "$name" bash -c "cd '$build_dir' && ctest --output-on-failure -R '^${name//./\\.}\$'" || { status=1; break; }
  done
fi
exit $status
