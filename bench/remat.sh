#!/usr/bin/env bash
# Recomputation measured against its plan: for each case (model, B x S, gradient accumulation, remat_policy)
# the planned process arena and predicted step time next to the measured peak resident memory (the whole
# process, from /usr/bin/time and the run's own getrusage figure) and the median step time after the first.
# The plan is of this machine: `meshtrain measure-machine` writes its float32 GEMM peak and memory bandwidth
# to a topology file passed as topologies_path. Then `compile --search --memory-budget` for each budget, to
# set its choice beside the measured cases. Synthetic tokens, no checkpoints. Always exits 0.
# usage: bench/remat.sh [BUILD_DIR] [STEPS] [CASE ...] [-- BUDGET ...]
#   CASE = MODEL:B:S:GA:POLICY (default: gpt2-124m at 8x256 with none, minimal, full; qwen3-0.6b at 8x256
#   with none, minimal, full and at 4x256 x GA 2 with none); BUDGET e.g. 12GiB (default 12GiB 10GiB)
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../build}
steps=${2:-4}
shift $(($# < 2 ? $# : 2))
cases=() budgets=()
while (($#)); do
  if [[ $1 == -- ]]; then shift; budgets=("$@"); break; fi
  cases+=("$1"); shift
done
((${#cases[@]})) || cases=(gpt2-124m:8:256:1:none gpt2-124m:8:256:1:minimal gpt2-124m:8:256:1:full
  qwen3-0.6b:8:256:1:none qwen3-0.6b:8:256:1:minimal qwen3-0.6b:8:256:1:full qwen3-0.6b:4:256:2:none)
((${#budgets[@]})) || budgets=(12GiB 10GiB)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "# remat $(date -u '+%Y-%m-%d %H:%M UTC'), cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')), $(nproc) CPUs, $(free -g | awk '/Mem:/ {print $2}') GiB RAM"
"$build/meshtrain" measure-machine --out "$work/machine.yaml" | head -1
for case in "${cases[@]}"; do
  IFS=: read -r model batch length ga policy <<<"$case"
  name="${model}_${batch}x${length}_ga${ga}_${policy}"
  /usr/bin/time -f '%M' -o "$work/$name.rss" "$build/meshtrain" train "$model" dataset_type=synthetic \
    eval_interval=0 enable_checkpointing=false steps="$steps" per_device_batch_size="$batch" \
    max_target_length="$length" gradient_accumulation_steps="$ga" remat_policy="$policy" \
    topologies_path="$work/machine.yaml" run_dir="$work/$name" >"$work/$name.log" 2>&1 ||
    echo "# $name: $(tail -1 "$work/$name.log")"
done
python3 - "$work" "${cases[@]}" <<'PY'
import json, os, statistics, sys
work, cases = sys.argv[1], sys.argv[2:]
GiB = 2**30
print(f"{'model':<11} {'B x S':>7} {'GA':>3} {'remat':<8} {'arena GiB':>9} {'peak RSS GiB':>12} {'run peak GiB':>12} "
      f"{'predicted s':>11} {'measured s':>10} {'[min-max]':>13} {'meas/pred':>9} {'tok/s':>7}")
for case in cases:
    model, batch, length, ga, policy = case.split(":")
    name = f"{model}_{batch}x{length}_ga{ga}_{policy}"
    run = f"{work}/{name}"
    def plan(kernel):
        return json.load(open(f"{run}/plan_{kernel}.json"))
    try:
        fwd_bwd, update = plan("fwd_bwd"), plan("update")
        accum = plan("fwd_bwd_accum") if int(ga) > 1 else None
        rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl")][1:]  # the first step warms up
    except (OSError, ValueError, KeyError):
        print(f"{model:<11} {batch + 'x' + length:>7} {ga:>3} {policy:<8}  (no result)")
        continue
    predicted = fwd_bwd["cost"]["predicted_seconds"] + update["cost"]["predicted_seconds"]
    if accum:
        predicted += (int(ga) - 1) * accum["cost"]["predicted_seconds"]
    arena = fwd_bwd["memory"]["process_arena"] / GiB
    rss = int(open(f"{run}.rss").read().split()[-1]) * 1024 / GiB
    seconds = [r["step_time_s"] for r in rows]
    median = statistics.median(seconds)
    tokens = int(batch) * int(length) * int(ga)
    print(f"{model:<11} {batch + 'x' + length:>7} {ga:>3} {policy:<8} {arena:>9.2f} {rss:>12.2f} "
          f"{max(r['peak_memory_bytes'] for r in rows) / GiB:>12.2f} {predicted:>11.2f} {median:>10.2f} "
          f"{min(seconds):>6.2f}-{max(seconds):<6.2f} {median / predicted:>9.2f} {tokens / median:>7.0f}")
print("# arena: the plan's process arena (persistent + largest temporaries); peak RSS: /usr/bin/time's maximum "
      "resident set; run peak: the run's own peak_memory_bytes; predicted: fwd_bwd + (GA-1) x fwd_bwd_accum + "
      "update with this machine's measured peaks (measure-machine); measured: median step_time_s after step 1")
PY
for budget in "${budgets[@]}"; do
  for model in $(printf '%s\n' "${cases[@]}" | cut -d: -f1 | sort -u); do
    shape=$(printf '%s\n' "${cases[@]}" | grep "^$model:" | awk -F: '{print $2 * $4 ":" $3}' | sort -t: -k1,1nr | head -1)
    echo "# $model, $budget per device: meshtrain compile $model per_device_batch_size=${shape%%:*} max_target_length=${shape##*:} --search --memory-budget=$budget"
    "$build/meshtrain" compile "$model" per_device_batch_size="${shape%%:*}" max_target_length="${shape##*:}" \
      topologies_path="$work/machine.yaml" --search --memory-budget="$budget" 2>&1 | sed -n '3p;5,9p;$p'
  done
done
exit 0
