#!/usr/bin/env bash
# Mixture of experts against dense at equal training FLOPs on the default corpus (issue 12, item 7):
# qwen3-tiny for QWEN_STEPS steps, then deepseek-tiny for the steps that spend the same training FLOPs
# (`meshtrain info`'s standard TFLOPs a step, which count the activated experts only), with DeepSeek-V3's
# selection-bias update on (the preset) and off. Each run evaluates once at its end (20 batches of the KJV
# validation split). Prints the eval losses and, per run, the worst MoE layer's expert load (busiest expert
# over the mean; 4.00 = E / k, every token choosing the same expert) averaged over the last 20 steps, its
# peak, and the load every 50 steps: the bias update shows as a flattening load. Needs the README's data (data/kjv). Always exits 0.
# Usage: bench/moe/kjv_equal_flops.sh [BUILD_DIR] [QWEN_STEPS]   (from the repository root)
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../../build}
qwen_steps=${2:-500}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -f data/kjv/tokenizer.json ] || { echo "# no data/kjv: run ./build/meshtrain prepare --out data/kjv --vocab-size 8192"; exit 0; }
tflops() { "$build/meshtrain" info "$1" | sed -n 's/^training TFLOPs per device per step: \([0-9.]*\).*/\1/p'; }
qwen_tflops=$(tflops qwen3-tiny)
deepseek_tflops=$(tflops deepseek-tiny)
deepseek_steps=$(python3 -c "print(round($qwen_steps * $qwen_tflops / $deepseek_tflops))")
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; one process, KJV, 16 x 128 tokens a step"
echo "# qwen3-tiny $qwen_steps steps x $qwen_tflops TFLOP = deepseek-tiny $deepseek_steps steps x $deepseek_tflops TFLOP"
run() {  # run NAME PRESET STEPS [key=value ...]
  local name=$1 preset=$2 steps=$3
  shift 3
  "$build/meshtrain" train "$preset" steps="$steps" eval_interval="$steps" enable_checkpointing=false \
    run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1 || echo "# $name failed: $(tail -1 "$work/$name.log")"
}
run qwen3 qwen3-tiny "$qwen_steps"
run deepseek_bias deepseek-tiny "$deepseek_steps"
run deepseek_no_bias deepseek-tiny "$deepseek_steps" routed_bias=false
python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
def records(name):
    path = f"{work}/{name}/metrics.jsonl"
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []
print(f"{'run':18} {'steps':>5} {'train TFLOP':>11} {'eval loss':>9} {'load last 20':>12} {'peak load':>9}")
for name in ["qwen3", "deepseek_bias", "deepseek_no_bias"]:
    rs = [r for r in records(name) if "loss" in r]
    if not rs:
        print(f"{name:18} no metrics")
        continue
    evals = [r["eval"]["loss"] for r in rs if "eval" in r]
    flops = sum(r.get("tflops_per_device", 0.0) * r.get("step_time_s", 0.0) for r in rs)
    loads = [[layer["load_max_over_mean"] for layer in r.get("moe", {}).values()] for r in rs]
    worst = [max(l) for l in loads if l]
    last = f"{sum(worst[-20:]) / len(worst[-20:]):.2f}" if worst else "-"
    peak = f"{max(worst):.2f}" if worst else "-"
    print(f"{name:18} {len(rs):5d} {flops:11.1f} {evals[-1] if evals else float('nan'):9.4f} {last:>12} {peak:>9}")
    if worst:
        print(f"  worst layer's load every 50 steps: " + " ".join(f"{w:.2f}" for w in worst[49::50]))
PY
exit 0
