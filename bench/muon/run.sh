#!/usr/bin/env bash
# AdamW vs Muon on the default main job (qwen3-tiny on the KJV) at equal steps, back to back on this machine:
# opt_type=adamw; opt_type=muon with muon_consistent_rms=0.2 (MaxText's recommendation: the update's RMS
# matched to AdamW's, so both share learning_rate); and opt_type=muon with the shape scale (unset). Prints
# the eval loss of each at its last step and the last step's tokens/s, with the CPU named.
#
# usage: bench/muon/run.sh [build-dir] [key=value ...]   (extra overrides go to every run, e.g. steps=200)
# Writes runs under ${OUT:-/tmp/meshtrain_muon_bench}; always exits 0 (it reports, it never judges).
set -u
build=${1:-build}
[ $# -gt 0 ] && shift
out=${OUT:-/tmp/meshtrain_muon_bench}
mkdir -p "$out"
"$build/meshtrain" prepare --out data/kjv --vocab-size 8192 >"$out/prepare.log" 2>&1 ||
  { echo "prepare failed (see $out/prepare.log)"; exit 0; }
grep -m1 "model name" /proc/cpuinfo
declare -A candidates=(
  [adamw]="opt_type=adamw"
  [muon_rms0.2]="opt_type=muon muon_consistent_rms=0.2"
  [muon_shape]="opt_type=muon muon_consistent_rms=null"
)
names=(adamw muon_rms0.2 muon_shape)
for name in "${names[@]}"; do
  rm -rf "${out:?}/$name"
  # shellcheck disable=SC2086  # the candidate's keys are words
  "$build/meshtrain" train qwen3-tiny run_dir="$out/$name" ${candidates[$name]} "$@" >"$out/$name.log" 2>&1 ||
    echo "$name: the run failed (see $out/$name.log)"
done
python3 - "$out" "${names[@]}" <<'PY'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
for name in names:
    try:
        rows = [json.loads(line) for line in open(f"{out}/{name}/metrics.jsonl") if line.strip()]
    except OSError:
        continue
    evals = [r for r in rows if "eval" in r]
    steps = [r for r in rows if "tokens_per_s" in r]
    if evals and steps:
        print(f"{name:>12}: step {evals[-1]['step']} eval loss {evals[-1]['eval']['loss']:.4f}, "
              f"train loss {steps[-1]['loss']:.4f}, last step {steps[-1]['tokens_per_s']:.0f} tok/s")
PY
exit 0
