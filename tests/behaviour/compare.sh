#!/usr/bin/env bash
# Proof of no change in behaviour: builds BASE (a commit) in a temporary worktree and the working tree in
# BUILD_DIR, records both with record.sh on this machine, and diffs the records. Exit 0 when they are equal.
#   usage: tests/behaviour/compare.sh BASE [BUILD_DIR]     (BUILD_DIR default build, built here first)
set -euo pipefail
base=$1
build=${2:-build}
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/base" "$base" >/dev/null
cmake -S "$work/base" -B "$work/base/build" -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_BENCH=OFF -DMESHTRAIN_TESTS=OFF >/dev/null
cmake --build "$work/base/build" -j "$(nproc)" --target meshtrain >/dev/null
cmake --build "$build" -j "$(nproc)" --target meshtrain >/dev/null
tests/behaviour/record.sh "$work/base/build" "$work/base.txt"
tests/behaviour/record.sh "$build" "$work/current.txt"
if diff "$work/base.txt" "$work/current.txt"; then
  echo "compare: no change in behaviour against $base ($(wc -l <"$work/current.txt") recorded lines)"
else
  echo "compare: behaviour differs from $base (lines above: < base, > working tree)"
  exit 1
fi
