#!/usr/bin/env bash
# Soak: qwen3-tiny on the KJV for many steps (default 2,000, batch 1 x 128 so it takes minutes), with eval and
# checkpoints on, while the script samples the process every second: resident memory (VmRSS) and open file
# descriptors. Prints the samples' summary: RSS right after warm-up (the first sample at or past step 100)
# against the largest later one, and the descriptor counts. Always exits 0: it reports, it never judges.
#
# usage: bench/soak.sh [build-dir] [steps] [key=value ...]
set -u
build=${1:-build}
steps=${2:-2000}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] && shift
out=${OUT:-/tmp/meshtrain_soak}
rm -rf "$out" && mkdir -p "$out"
"$build/meshtrain" prepare --out data/kjv --vocab-size 8192 >"$out/prepare.log" 2>&1 ||
  { echo "prepare failed (see $out/prepare.log)"; exit 0; }
grep -m1 "model name" /proc/cpuinfo
"$build/meshtrain" train qwen3-tiny run_dir="$out/run" steps="$steps" per_device_batch_size=1 eval_interval=250 \
  eval_steps=5 checkpoint_period=250 max_num_checkpoints_to_keep=2 "$@" >"$out/train.log" 2>&1 &
pid=$!
: >"$out/samples.tsv"
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
  fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
  step=0
  [ -f "$out/run/metrics.jsonl" ] && step=$(wc -l <"$out/run/metrics.jsonl")
  [ -n "$rss" ] && printf '%s\t%s\t%s\n' "$step" "$rss" "$fds" >>"$out/samples.tsv"
  sleep 1
done
wait "$pid"
echo "train exit status $? (log $out/train.log); $(wc -l <"$out/samples.tsv") samples in $out/samples.tsv"
python3 - "$out/samples.tsv" <<'EOF'
import sys
rows = [tuple(int(x) for x in line.split()) for line in open(sys.argv[1]) if line.strip()]
after = [r for r in rows if r[0] >= 100]
if not after:
    print("no samples past step 100")
    sys.exit(0)
first, peak = after[0], max(after, key=lambda r: r[1])
last = after[-1]
print(f"RSS after warm-up (step {first[0]}): {first[1] / 1024:.1f} MiB; largest later: {peak[1] / 1024:.1f} MiB "
      f"at step {peak[0]} (+{100 * (peak[1] - first[1]) / first[1]:.2f}%); last sample (step {last[0]}): "
      f"{last[1] / 1024:.1f} MiB ({100 * (last[1] - first[1]) / first[1]:+.2f}%)")
fds = [r[2] for r in after]
print(f"open file descriptors past step 100: min {min(fds)}, max {max(fds)}, first {fds[0]}, last {fds[-1]}")
EOF
exit 0
