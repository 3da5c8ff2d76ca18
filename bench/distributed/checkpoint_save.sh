#!/usr/bin/env bash
# Distributed checkpoints (issue 16): save time and peak resident memory per rank at 1, 2 and 4 ranks
# (fsdp), next to the planned arena. A run of 1 step (batch 1 per rank, S 64: small activations, so the
# arena is mostly parameters, gradients and moments) saves at its end; the save line gives GiB, seconds and
# GiB/s; /usr/bin/time gives each rank's peak RSS. Then one process loads the 4-rank checkpoint and trains a
# step without saving (peak RSS of a load, against a fresh run's). With OTHER_BINARY, a build from before
# distributed checkpoints saves the same way for comparison (its save gathered every tensor on each rank).
# Synthetic tokens. Always exits 0.
# usage: bench/distributed/checkpoint_save.sh [BUILD_DIR] [MODEL] [OTHER_BUILD_DIR]   (default build qwen3-0.6b)
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../../build}
model=${2:-qwen3-0.6b}
other=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(dataset_type=synthetic tokenizer_path= dataset_path= eval_dataset_path= eval_interval=0
  per_device_batch_size=1 max_target_length=64 collective_timeout_s=600)
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
echo "# checkpoint save, $model, $(date -u '+%Y-%m-%d %H:%M UTC'), cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) CPUs, $(free -g | awk '/Mem:/ {print $2}') GiB RAM, disk: $(df -h "$work" | awk 'NR == 2 {print $1 " " $2}')"
run() {  # run NAME BINARY RANKS [key=value ...]: each rank's peak RSS in NAME.rss.<rank>
  local name=$1 binary=$2 ranks=$3
  shift 3
  local launch=()
  [ "$ranks" -gt 1 ] && launch=("${mpirun[@]}" -np "$ranks")
  "${launch[@]}" sh -c '/usr/bin/time -f %M -o "$0.${OMPI_COMM_WORLD_RANK:-0}" "$@"' "$work/$name.rss" \
    "$binary" train "$model" "${common[@]}" run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    echo "# $name failed: $(tail -1 "$work/$name.log")"
}
report() {  # report NAME RANKS
  python3 - "$work" "$1" "$2" <<'PY'
import glob, json, re, sys
work, name, ranks = sys.argv[1:]
log = open(f"{work}/{name}.log").read()
save = re.search(r"checkpoint step \d+: ([0-9.]+) GiB from \d+ rank\(s\) in ([0-9.]+) s \(([0-9.]+) GiB/s\)", log)
rss = [int(open(f).read().split()[-1]) / 2**20 for f in sorted(glob.glob(f"{work}/{name}.rss.*"))]
try:
    arena = json.load(open(f"{work}/{name}/plan_fwd_bwd.json"))["memory"]["process_arena"] / 2**30
except OSError:
    arena = float("nan")
saved = f"{save[1]} GiB in {float(save[2]):.2f} s ({save[3]} GiB/s)" if save else "(no save line)"
print(f"{name:<24} {ranks:>5}  arena {arena:6.2f} GiB  peak RSS per rank {' '.join(f'{r:.2f}' for r in rss)} GiB  "
      f"(max - arena {max(rss) - arena:+.2f})  {saved}")
PY
}
for ranks in 1 2 4; do
  run "save_${ranks}" "$build/meshtrain" "$ranks" steps=1 mesh.fsdp="$ranks"
  report "save_${ranks}" "$ranks"
done
if [ -n "$other" ]; then  # 1 rank only: a gathering save holds the whole state on every rank
  run other_save_1 "$other/meshtrain" 1 steps=1
  report other_save_1 1
fi
run fresh "$build/meshtrain" 1 steps=1 enable_checkpointing=false
report fresh 1
run load_4_on_1 "$build/meshtrain" 1 steps=2 enable_checkpointing=false \
  load_full_state_path="$work/save_4/checkpoints/step_00000001"
report load_4_on_1 1
echo "# peak RSS: /usr/bin/time's maximum resident set of each rank; arena: the plan's process arena per rank"
exit 0
