#!/usr/bin/env bash
# Two builds of meshtrain back to back on the main job's model (qwen3-tiny, B 16 x S 128, synthetic tokens,
# no checkpoints): A B A B ... so drift of a shared machine hits both alike. Prints each build's tokens/s
# (median over its runs of each run's median step after the first) and the ratio B / A pair by pair.
# Always exits 0: it reports speed, it never judges it.
#   usage: bench/compare_builds.sh BUILD_A BUILD_B [PAIRS] [STEPS]   (default 4 pairs of 12 steps)
set -u
build_a=$1 build_b=$2 pairs=${3:-4} steps=${4:-12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "# compare builds $(date -u '+%Y-%m-%d %H:%M UTC'), cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) CPUs"
run() {  # run BUILD NAME
  "$1/meshtrain" train qwen3-tiny dataset_type=synthetic eval_interval=0 enable_checkpointing=false \
    per_device_batch_size=16 max_target_length=128 steps="$steps" run_dir="$work/$2" >"$work/$2.log" 2>&1 ||
    echo "# $2 failed: $(tail -2 "$work/$2.log")"
}
for pair in $(seq "$pairs"); do
  run "$build_a" "a$pair"
  run "$build_b" "b$pair"
done
python3 - "$work" "$pairs" "$build_a" "$build_b" <<'PY'
import json, os, statistics, sys
work, pairs, build_a, build_b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def tokens_per_second(name):
    path = f"{work}/{name}/metrics.jsonl"
    if not os.path.exists(path):
        return None
    rows = [json.loads(line) for line in open(path)][1:]  # the first step warms caches up
    return statistics.median(row["tokens_per_s"] for row in rows)
a = [tokens_per_second(f"a{p}") for p in range(1, pairs + 1)]
b = [tokens_per_second(f"b{p}") for p in range(1, pairs + 1)]
ratios = [y / x for x, y in zip(a, b) if x and y]
for label, build, values in (("A", build_a, a), ("B", build_b, b)):
    good = [v for v in values if v]
    if good:
        print(f"{label} {build}: tok/s median {statistics.median(good):.0f} [{min(good):.0f}-{max(good):.0f}] over {len(good)} runs")
if ratios:
    print(f"B / A per pair: median {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")
PY
