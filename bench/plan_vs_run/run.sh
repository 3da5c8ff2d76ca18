#!/usr/bin/env bash
# The plan's predicted step time against the measured one, per compute dtype, on this machine:
# `meshtrain measure-machine` writes this machine's topology (GEMM peaks, matmul, attention, loss-softmax and
# elementwise rates, memory bandwidth), each dtype's run is planned with it (its plan files) and trained for
# STEPS steps of synthetic tokens, every step after the first traced. Prints per dtype the predicted step
# (fwd_bwd + update), the median measured step after the first and their ratio; the sum of each op's least
# time over the traced steps (the step least disturbed by other processes on a shared machine) and its
# ratio; the prediction of a plan that prices every op at the GEMM peak (before the rates); and per op kind
# the plan's time against the ops' least times (where the time goes when they differ). Always exits 0.
# usage: bench/plan_vs_run/run.sh [BUILD_DIR] [STEPS] [MODEL:B:S] [DTYPE ...]
#   defaults: build, 4 steps, gpt2-124m:8:256, float32 bfloat16 (bfloat16 needs AVX512-BF16 or AMX)
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../../build}
steps=${2:-4}
shape=${3:-gpt2-124m:8:256}
shift $(($# < 3 ? $# : 3))
dtypes=("$@")
((${#dtypes[@]})) || dtypes=(float32 bfloat16)
IFS=: read -r model batch length <<<"$shape"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "# plan_vs_run $(date -u '+%Y-%m-%d %H:%M UTC'), cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')), $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/meshtrain" measure-machine --out "$work/machine.yaml" | head -1
grep -E '^  (peak_tflops|matmul_tflops|attention_tflops|loss_softmax_glogits|memory_bandwidth_gbs|elementwise_gbs):' "$work/machine.yaml"
# The same entry without the matmul, attention, softmax and elementwise rates: every op at the GEMM peak and the
# memory bandwidth (the plan before them).
grep -vE '^  (matmul_tflops|attention_tflops|loss_softmax_glogits|elementwise_gbs):' "$work/machine.yaml" >"$work/gemm_peak_only.yaml"
for dtype in "${dtypes[@]}"; do
  "$build/meshtrain" compile "$model" per_device_batch_size="$batch" max_target_length="$length" dtype="$dtype" \
    topologies_path="$work/gemm_peak_only.yaml" plan_out="$work/gemm_peak_only_$dtype" >/dev/null 2>&1
  "$build/meshtrain" compile "$model" per_device_batch_size="$batch" max_target_length="$length" dtype="$dtype" \
    topologies_path="$work/machine.yaml" 2>&1 | grep -m1 '^ *topology' | sed "s/^ */# $dtype plan: /"
  "$build/meshtrain" train "$model" dataset_type=synthetic eval_interval=0 enable_checkpointing=false \
    steps="$steps" per_device_batch_size="$batch" max_target_length="$length" dtype="$dtype" \
    topologies_path="$work/machine.yaml" profiler=trace profiler_steps="$(seq -s, 2 "$steps")" run_dir="$work/$dtype" \
    >"$work/$dtype.log" 2>&1 || echo "# $dtype: $(tail -1 "$work/$dtype.log")"
done
python3 - "$work" "$steps" "$model" "$batch" "$length" "${dtypes[@]}" <<'PY'
import json, statistics, sys
work, steps, model, batch, length, dtypes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
print(f"{'model':<11} {'B x S':>7} {'dtype':<9} {'predicted s':>11} {'measured s':>10} {'[min-max]':>13} {'meas/pred':>9}"
      f" {'op minima s':>11} {'min/pred':>8} {'at GEMM peak s':>14} {'meas/pred':>9}")
splits = {}
for dtype in dtypes:
    run = f"{work}/{dtype}"
    try:
        plans = {k: json.load(open(f"{run}/plan_{k}.json")) for k in ("fwd_bwd", "update")}
        seconds = [json.loads(line)["step_time_s"] for line in open(f"{run}/metrics.jsonl")][1:]
        trace = json.load(open(f"{run}/trace_step{steps}.json"))["traceEvents"]  # every traced step's events
    except (OSError, ValueError, KeyError) as error:
        print(f"{model:<11} {batch + 'x' + length:>7} {dtype:<9}  (no result: {error})")
        continue
    predicted = sum(plan["cost"]["predicted_seconds"] for plan in plans.values())
    median = statistics.median(seconds)
    try:
        peak_only = sum(json.load(open(f"{work}/gemm_peak_only_{dtype}_{k}.json"))["cost"]["predicted_seconds"]
                        for k in ("fwd_bwd", "update"))
        before = f"{peak_only:>14.2f} {median / peak_only:>9.2f}"
    except (OSError, ValueError, KeyError):
        before = f"{'-':>14} {'-':>9}"
    # Per op: its least disturbed time, the minimum over the traced steps (other processes only add time).
    kind_of, split, minima = {}, {}, {}
    for plan in plans.values():
        for op in plan["ops"]:
            kind_of[op["name"]] = op["kind"]
            split.setdefault(op["kind"], [0.0, 0.0])[0] += op["seconds"]
    per_step = {}
    for event in trace:
        if event.get("ph") == "X" and event.get("cat") in ("op", "collective") and event["name"] in kind_of:
            key = (event["name"], event.get("args", {}).get("step"))
            per_step[key] = per_step.get(key, 0.0) + event["dur"] / 1e6
    for (name, _), value in per_step.items():
        minima[name] = min(minima.get(name, value), value)
    for name, value in minima.items():
        split[kind_of[name]][1] += value
    least = sum(minima.values())
    print(f"{model:<11} {batch + 'x' + length:>7} {dtype:<9} {predicted:>11.2f} {median:>10.2f} "
          f"{min(seconds):>6.2f}-{max(seconds):<6.2f} {median / predicted:>9.2f} {least:>11.2f} "
          f"{least / predicted:>8.2f} {before}")
    splits[dtype] = split
print("# predicted: fwd_bwd + update of the run's plan (this machine's measure-machine topology); measured: "
      "median step_time_s after step 1; op minima: each op's least time over the traced steps 2.., summed (the step "
      "least disturbed by other processes); at GEMM peak: the same topology without its matmul, attention, "
      "softmax and elementwise rates (every op at the GEMM peak and the memory bandwidth, as plans priced them before)")
for dtype, split in splits.items():
    print(f"# {dtype}, per op kind: predicted s / op minima s (ratio)")
    for kind, (plan_s, traced_s) in sorted(split.items(), key=lambda item: -item[1][1]):
        ratio = f"{traced_s / plan_s:.2f}" if plan_s > 0 else "-"
        print(f"  {kind:<12} {plan_s:>8.3f} {traced_s:>8.3f}  ({ratio})")
PY
exit 0
