#!/usr/bin/env bash
# Engram and mHC on the default corpus (issue 13, item 7): deepseek-custom-tiny (deepseek-tiny with Engram on
# layers 1 and 4 and mHC with 4 streams) against deepseek-tiny, the same steps, data and schedule (each
# preset's eval every eval_interval steps on 20 batches of the KJV validation split). Prints each run's eval
# losses, its median tokens/s over the steps after the first 10 (the machine's load shows there: run it
# alone), and the Engram tables' parameters and memory (`meshtrain info`). Needs the README's data
# (data/kjv). Always exits 0.
# Usage: bench/engram/kjv_engram.sh [BUILD_DIR] [STEPS]   (from the repository root)
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../../build}
steps=${2:-500}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -f data/kjv/tokenizer.json ] || { echo "# no data/kjv: run ./build/meshtrain prepare --out data/kjv --vocab-size 8192"; exit 0; }
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; one process, KJV, 16 x 128 tokens a step, $steps steps"
"$build/meshtrain" info deepseek-custom-tiny | grep -E '^(parameters|activated|engram|mhc)' | sed 's/^/# /'
run() {  # run NAME PRESET
  "$build/meshtrain" train "$2" steps="$steps" enable_checkpointing=false run_dir="$work/$1" \
    >"$work/$1.log" 2>&1 || echo "# $1 failed: $(tail -1 "$work/$1.log")"
}
run engram deepseek-custom-tiny
run baseline deepseek-tiny
python3 - "$work" <<'PY'
import json, os, statistics, sys
work = sys.argv[1]
def records(name):
    path = f"{work}/{name}/metrics.jsonl"
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []
runs = {"deepseek-custom-tiny": records("engram"), "deepseek-tiny": records("baseline")}
steps = sorted({r["step"] for rs in runs.values() for r in rs if "eval" in r})
print(f"{'eval loss at step':24}" + "".join(f"{s:>8}" for s in steps) + f"{'tok/s':>9}")
for name, rs in runs.items():
    evals = {r["step"]: r["eval"]["loss"] for r in rs if "eval" in r}
    speeds = [r["tokens_per_s"] for r in rs[10:] if "tokens_per_s" in r]
    speed = f"{statistics.median(speeds):9.0f}" if speeds else "        -"
    print(f"{name:24}" + "".join(f"{evals.get(s, float('nan')):8.4f}" for s in steps) + speed)
PY
exit 0
