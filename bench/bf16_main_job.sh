#!/usr/bin/env bash
# The default main job (qwen3-tiny on the KJV, 500 steps) trained in float32 and in bf16, back to back: the
# eval loss of each at its last step, how far apart they are, and the tokens/s of the last step. The bf16 run
# needs a CPU with AVX512-BF16 or AMX-BF16 (the engine refuses it otherwise, naming the CPU).
#
# usage: bench/bf16_main_job.sh [build-dir] [key=value ...]   (extra overrides go to both runs, e.g. steps=100)
# Writes runs under ${OUT:-/tmp/meshtrain_bf16_main_job}; always exits 0 (it reports, it never judges).
set -u
build=${1:-build}
[ $# -gt 0 ] && shift
out=${OUT:-/tmp/meshtrain_bf16_main_job}
mkdir -p "$out"
"$build/meshtrain" prepare --out data/kjv --vocab-size 8192 >"$out/prepare.log" 2>&1 ||
  { echo "prepare failed (see $out/prepare.log)"; exit 0; }
grep -m1 "model name" /proc/cpuinfo
for dtype in float32 bfloat16; do
  rm -rf "$out/$dtype"
  "$build/meshtrain" train qwen3-tiny run_dir="$out/$dtype" dtype="$dtype" "$@" >"$out/$dtype.log" 2>&1 ||
    echo "$dtype: the run failed (see $out/$dtype.log)"
  grep -m1 "^machine:" "$out/$dtype.log"
done
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
last = {}
for dtype in ("float32", "bfloat16"):
    try:
        rows = [json.loads(line) for line in open(f"{out}/{dtype}/metrics.jsonl") if line.strip()]
    except OSError:
        continue
    evals = [r for r in rows if "eval" in r]
    steps = [r for r in rows if "tokens_per_s" in r]
    if evals and steps:
        last[dtype] = (evals[-1]["step"], evals[-1]["eval"]["loss"], steps[-1]["tokens_per_s"])
        print(f"{dtype:>9}: step {last[dtype][0]} eval loss {last[dtype][1]:.5f}, last step {last[dtype][2]:.0f} tok/s")
if len(last) == 2:
    (_, f32, f32_tps), (_, bf16, bf16_tps) = last["float32"], last["bfloat16"]
    print(f"bf16 eval loss / float32: {bf16 / f32:.4f} ({100 * abs(bf16 - f32) / f32:.2f}% apart); "
          f"tokens/s bf16 / float32: {bf16_tps / f32_tps:.2f}x")
EOF
exit 0
