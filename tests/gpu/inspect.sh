#!/usr/bin/env bash
# A closer look on a GPU machine, beside run.sh: compute-sanitizer's memcheck over a short qwen3-tiny training
# run (every kernel of a training step, over the planned arena) and racecheck over one attention test
# (shared-memory tiles; racecheck took over 75 s for all of CudaAttention.* on an H200), then Nsight Compute's time of every kernel of one gpt2-124m bf16 step,
# summed per kernel name. Needs a Firecracker-kind machine (ncu and compute-sanitizer work there).
# Usage: tests/gpu/inspect.sh BUNDLE [OUT_DIR]     (the bundle of tests/gpu/bundle.sh)
source "$(dirname "$0")/unpack.sh" "$@"
summary="$out/inspect.txt"
say() { echo "$*" | tee -a "$summary"; }
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
say "# meshtrain GPU inspection $(date -u '+%Y-%m-%d %H:%M UTC'); compute-sanitizer ${sanitizer:-missing}, ncu ${ncu:-missing}"

source "$here/tiny.sh"
timeout 90 "$sanitizer" --tool memcheck --error-exitcode 3 "$b/bin/meshtrain" train qwen3-tiny \
  "${tiny[@]/#steps=20/steps=2}" enable_checkpointing=false topology=h200x1 run_dir="$(mktemp -d)/memcheck" >"$out/memcheck.log" 2>&1
say "memcheck, qwen3-tiny 2 steps on the GPU: exit $? ($(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1))"
timeout 75 "$sanitizer" --tool racecheck --error-exitcode 3 "$b/bin/meshtrain_gpu_tests" \
  --gtest_filter='CudaAttention.IsDeterministic' --gtest_brief=1 >"$out/racecheck.log" 2>&1
say "racecheck, CudaAttention.IsDeterministic: exit $? ($(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/racecheck.log" | tail -1))"

timeout 120 "$ncu" --clock-control none --launch-count 700 --metrics gpu__time_duration.sum --csv "$b/bin/meshtrain" train gpt2-124m \
  topology=h200x1 dataset_type=synthetic tokenizer_path= dataset_path= eval_dataset_path= eval_interval=0 \
  enable_checkpointing=false steps=1 per_device_batch_size=16 max_target_length=1024 dtype=bfloat16 \
  run_dir="$(mktemp -d)/ncu" >"$out/ncu.csv" 2>"$out/ncu.log"
say "ncu, one gpt2-124m 16x1024 bf16 step: exit $?"
python3 - "$out/ncu.csv" <<'PY' | tee -a "$summary"
import csv, io, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.DictReader(io.StringIO("".join(lines))))
total, count = {}, {}
for row in rows:
    if row.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = row["Kernel Name"].split("(")[0][:70]
    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}.get(row["Metric Unit"], 1e-6)
    total[name] = total.get(name, 0.0) + float(row["Metric Value"].replace(",", "")) * scale
    count[name] = count.get(name, 0) + 1
step = sum(total.values())
print(f"{len(rows)} kernel launches, {step:.1f} ms of kernel time")
for name in sorted(total, key=total.get, reverse=True)[:25]:
    print(f"{total[name]:9.2f} ms {100 * total[name] / step:5.1f}% {count[name]:5d}x  {name}")
PY
(cd "$out" && tar -czf inspect_logs.tar.gz memcheck.log racecheck.log ncu.csv ncu.log --remove-files)
