#!/usr/bin/env bash
# Planned against measured pipeline bubble (issue 39): a qwen3 of 2P layers (D 256, S 128) over mesh.stage = P
# ranks with each schedule and M = P and 4P micro-batches (P = 2: 2 and 8). Planned: `meshtrain compile`'s
# bubble, from the planned ops' predicted times on the schedule (the largest stage's). Measured:
# bench/pipeline/bubble.py on a traced step (every rank's trace on one clock: the step's span over every
# rank, each rank's compute ops' time; the largest stage's idle share). Each configuration runs REPEATS
# times and reports the least disturbed run (the shortest step span). With P = 2 each rank has its own core
# on a 2-core machine; with P = 4 ranks share cores, so idle time there includes waiting for a core.
# Prints a table; always exits 0.
# Usage: bench/pipeline/run_bubble.sh [BUILD_DIR] [P] [REPEATS]
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../../build}
stages=${2:-2}
repeats=${3:-3}
meshtrain="$build/meshtrain"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
steps=4
model=(dataset_type=synthetic tokenizer_path= dataset_path= eval_dataset_path= eval_interval=0
  enable_checkpointing=false base_num_decoder_layers=$((2 * stages)) base_emb_dim=256 base_mlp_dim=768
  head_dim=64 base_num_query_heads=4 base_num_kv_heads=2 vocab_size=256 max_target_length=128
  per_device_batch_size=2 mesh.stage="$stages")
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; P = $stages, $repeats runs each"
printf '%-18s %3s %10s %10s %8s %12s\n' schedule M planned measured points "span ms"
for schedule in gpipe 1f1b interleaved_1f1b zero_bubble; do
  for M in "$stages" $((4 * stages)); do
    keys=("${model[@]}" pipeline_schedule=$schedule gradient_accumulation_steps=$M)
    [ "$schedule" = interleaved_1f1b ] && keys+=(num_pipeline_repeats=2)
    planned=$("$meshtrain" compile qwen3-tiny "${keys[@]}" topology=cpu 2>&1 |
      sed -n 's/.*bubble up to \([0-9.]*\)%.*/\1/p')
    best=""
    for run in $(seq "$repeats"); do
      dir="$work/${schedule}_${M}_${run}"
      if ! "${mpirun[@]}" -np "$stages" "$meshtrain" train qwen3-tiny "${keys[@]}" steps=$steps profiler=trace \
        profiler_steps=$steps run_dir="$dir" >"$dir.log" 2>&1; then
        echo "# $schedule M=$M failed: $(grep -m1 error "$dir.log")"
        continue 2
      fi
      measured=$(python3 "$here/bubble.py" "$dir" "$steps" "$stages")
      best=$(python3 -c 'import json,sys; runs=[json.loads(x) for x in sys.argv[1:] if x]; print(json.dumps(min(runs, key=lambda r: r["span_ms"])))' "$best" "$measured")
    done
    python3 - "$schedule" "$M" "${planned:-nan}" "$best" <<'PY'
import json, sys
schedule, M, planned, best = sys.argv[1], sys.argv[2], float(sys.argv[3]), json.loads(sys.argv[4])
measured = 100 * best["max_bubble"]
print(f"{schedule:<18} {M:>3} {planned:>9.2f}% {measured:>9.2f}% {measured - planned:>+8.2f} {best['span_ms']:>12.1f}")
PY
  done
done
