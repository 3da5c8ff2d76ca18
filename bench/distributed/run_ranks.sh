#!/usr/bin/env bash
# Distributed throughput on this machine (issue 5): qwen3-tiny (the default job's model, synthetic tokens)
# with the same global batch on 1 process (2 threads) and on 2 MPI ranks (1 thread each) in data, ZeRO-1
# FSDP, tensor and context layouts (context: all_gather and ring attention): median tokens/s of steps 3..
# and the communication share of a traced step (time inside collective ops / step time, rank 0; for the
# ring, the time its attention ops spent waiting for a pass). Prints ratios to the 1-process run and the
# ring's overlap (the share of its attention time that computed with the next block's pass in flight
# rather than waited). Always exits 0.
# Usage: bench/distributed/run_ranks.sh [BUILD_DIR] [STEPS]
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../../build}
steps=${2:-8}
meshtrain="$build/meshtrain"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(dataset_type=synthetic tokenizer_path= dataset_path= eval_dataset_path= eval_interval=0
  enable_checkpointing=false steps="$steps" profiler=trace profiler_steps="$steps")
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
run() {  # run NAME RANKS per_device_batch_size [key=value ...]
  local name=$1 ranks=$2 batch=$3
  shift 3
  if [ "$ranks" -eq 1 ]; then
    "$meshtrain" train qwen3-tiny "${common[@]}" per_device_batch_size="$batch" run_dir="$work/$name" "$@"
  else
    "${mpirun[@]}" -np "$ranks" "$meshtrain" train qwen3-tiny "${common[@]}" per_device_batch_size="$batch" \
      run_dir="$work/$name" "$@"
  fi >"$work/$name.log" 2>&1 || echo "# $name failed: $(tail -1 "$work/$name.log")"
}
echo "# qwen3-tiny, global batch 16 x 128 tokens, $steps steps, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
run single 1 16
run data2 2 8 mesh.data=2
run zero1 2 8 mesh.data=2 shard_optimizer_over_data=true
run fsdp2 2 8 mesh.fsdp=2
run tensor2 2 8 mesh.tensor=2
run context2 2 8 mesh.context=2
run ring2 2 8 mesh.context=2 context_parallel_strategy=ring
python3 - "$work" "$steps" <<'PY'
import json, os, statistics, sys
work, steps = sys.argv[1], int(sys.argv[2])
base = None
print(f"{'layout':<8} {'ranks':>5} {'tok/s median':>12} {'[min-max]':>17} {'vs 1 proc':>9} {'comm share':>10} {'moved/step':>12}")
ring = None
for name, ranks in (("single", 1), ("data2", 2), ("zero1", 2), ("fsdp2", 2), ("tensor2", 2), ("context2", 2),
                    ("ring2", 2)):
    path = f"{work}/{name}/metrics.jsonl"
    if not os.path.exists(path):
        print(f"{name:<8} {ranks:>5} {'failed':>12}")
        continue
    records = [json.loads(line) for line in open(path)]
    rates = [r["tokens_per_s"] for r in records[2:]] or [r["tokens_per_s"] for r in records]
    median = statistics.median(rates)
    base = base or median
    trace = json.load(open(f"{work}/{name}/trace_step{steps}.json"))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    events = [e for e in events if e.get("ph") == "X"]
    # A ring attention op's passes and waits are events inside its own (named after it).
    inside = lambda e: e["cat"] == "collective" and "/ring_attention_" in e["name"]
    total = sum(e["dur"] for e in events if e["cat"] in ("op", "recompute", "collective") and not inside(e))
    waits = sum(e["dur"] for e in events if inside(e) and e["name"].endswith("/wait"))
    comm = sum(e["dur"] for e in events if e["cat"] == "collective" and not inside(e)) + waits
    if name == "ring2":
        ring_time = sum(e["dur"] for e in events if "/ring_attention_" in e["name"] and e["cat"] != "collective")
        ring = (ring_time, waits)
    moved = sum(records[-1].get("collective_bytes", {}).values())
    print(f"{name:<8} {ranks:>5} {median:>12.0f} {f'[{min(rates):.0f}-{max(rates):.0f}]':>17} {median / base:>8.2f}x "
          f"{100 * comm / total if total else 0:>9.1f}% {moved / 1e6:>10.2f} MB")
if ring and ring[0] > 0:
    print(f"ring attention: {ring[0] / 1e3:.1f} ms in a traced step, {100 * (1 - ring[1] / ring[0]):.1f}% computing "
          f"(each block's compute with the next pass in flight), {100 * ring[1] / ring[0]:.1f}% waiting for a pass")
PY
exit 0
