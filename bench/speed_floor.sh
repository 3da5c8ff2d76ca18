#!/usr/bin/env bash
# The speed floor, one line per model: tokens/s of the engine on qwen3-tiny (the main job's model, B 16 x S 128)
# and gpt2-124m (B 8 x S 256), the fraction of this machine's measured float32 GEMM peak the step reaches
# (mfu as metrics.jsonl reports it), and the GEMM backend with its instruction set. A machine where matmuls
# fell back to a slow path shows it here in one line. Synthetic tokens, no checkpoints; median of the steps
# after the first. Always exits 0: it reports speed, it never judges it.
# usage: bench/speed_floor.sh [BUILD_DIR] [STEPS]   (default build, 6 steps)
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../build}
steps=${2:-6}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(dataset_type=synthetic eval_interval=0 enable_checkpointing=false steps="$steps")
echo "# speed floor $(date -u '+%Y-%m-%d %H:%M UTC'), cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) CPUs; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} (the engine does not use OpenBLAS)"
run() {  # run NAME MODEL [key=value ...]
  local name=$1 model=$2
  shift 2
  "$build/meshtrain" train "$model" "${common[@]}" run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    echo "# $name failed: $(tail -2 "$work/$name.log")"
}
run qwen3-tiny qwen3-tiny per_device_batch_size=16 max_target_length=128
run gpt2-124m gpt2-124m per_device_batch_size=8 max_target_length=256
python3 - "$work" <<'PY'
import json, os, statistics, sys
work = sys.argv[1]
print(f"{'model':<11} {'B x S':>7} {'tok/s median':>12} {'[min-max]':>15} {'of GEMM peak':>12} {'peak GFLOP/s':>12}  matmuls")
for name, shape in (("qwen3-tiny", "16x128"), ("gpt2-124m", "8x256")):
    metrics, machine = f"{work}/{name}/metrics.jsonl", f"{work}/{name}/machine.json"
    if not os.path.exists(metrics) or not os.path.exists(machine):
        print(f"{name:<11} {shape:>7}  (no result)")
        continue
    rows = [json.loads(line) for line in open(metrics)][1:]  # the first step warms up
    m = json.load(open(machine))
    tps = [r["tokens_per_s"] for r in rows]
    mfu = statistics.median(r["mfu"] for r in rows)
    warning = f"  WARNING: {m['gemm_warning']}" if m["gemm_warning"] else ""
    print(f"{name:<11} {shape:>7} {statistics.median(tps):>12.0f} {min(tps):>7.0f}-{max(tps):<7.0f} {100 * mfu:>11.1f}% "
          f"{m['gemm_peak_flops'] / 1e9:>12.0f}  {m['gemm_backend']}, {m['threads']} threads{warning}")
print(f"# fraction of peak = the step's FLOPs (training-step.md's formula) / step time / the best float32 GEMM "
      f"rate measured on this machine ({m['gemm_peak_source']})")
PY
exit 0
