#!/usr/bin/env bash
# Checkpoints hold global tensors, so a state saved on one mesh loads on any other (issue 5): 4 ranks
# (data 2 x fsdp 2, ZeRO-1) -> 2 ranks (fsdp 2) -> 1 process -> 4 ranks (data 4) -> TP 2 x DP 2 -> DP 4,
# each conversion bitwise
# (the converted checkpoint's tensor files equal the source's byte for byte), and training continues on the
# new mesh with the losses of a run that never changed mesh (1e-5 relative).
# Usage: resharding.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny+=(learning_rate=1e-2 collective_timeout_s=120)
train() {  # train RANKS per_device_batch_size [key=value ...]
  local ranks=$1 batch=$2
  shift 2
  if [ "$ranks" -eq 1 ]; then
    "$meshtrain" train qwen3-tiny "${tiny[@]}" per_device_batch_size="$batch" "$@"
  else
    "${mpirun[@]}" -np "$ranks" "$meshtrain" train qwen3-tiny "${tiny[@]}" per_device_batch_size="$batch" "$@"
  fi >>"$work/log" 2>&1 || { echo "FAIL: train $*"; cat "$work/log"; exit 1; }
}
same_tensors() {  # same_tensors DIR_A DIR_B
  cmp "$1/model.safetensors" "$2/model.safetensors" && cmp "$1/optimizer.safetensors" "$2/optimizer.safetensors"
}

# 8 rows per step everywhere: per_device_batch_size x ranks.
train 4 2 mesh.data=2 mesh.fsdp=2 shard_optimizer_over_data=true steps=3 run_dir="$work/a"
train 2 4 mesh.fsdp=2 steps=3 load_full_state_path="$work/a/checkpoints/step_00000003" run_dir="$work/b"
same_tensors "$work/a/checkpoints/step_00000003" "$work/b/checkpoints/step_00000003"
train 1 8 steps=3 load_full_state_path="$work/b/checkpoints/step_00000003" run_dir="$work/c"
same_tensors "$work/a/checkpoints/step_00000003" "$work/c/checkpoints/step_00000003"
train 4 2 mesh.data=4 steps=3 load_full_state_path="$work/c/checkpoints/step_00000003" run_dir="$work/d"
same_tensors "$work/a/checkpoints/step_00000003" "$work/d/checkpoints/step_00000003"
train 4 2 mesh.data=2 mesh.tensor=2 steps=3 load_full_state_path="$work/d/checkpoints/step_00000003" \
  run_dir="$work/e"
same_tensors "$work/a/checkpoints/step_00000003" "$work/e/checkpoints/step_00000003"
train 4 2 mesh.data=4 steps=3 load_full_state_path="$work/e/checkpoints/step_00000003" run_dir="$work/f"
same_tensors "$work/a/checkpoints/step_00000003" "$work/f/checkpoints/step_00000003"
echo "4 ranks (data 2 x fsdp 2, ZeRO-1) -> fsdp 2 -> 1 process -> data 4 -> tensor 2 x data 2 -> data 4:"
echo "  parameters and moments bitwise equal"

# Training continues: 2 more steps on fsdp 2 from the 4-rank checkpoint vs the 4-rank run itself.
train 4 2 mesh.data=2 mesh.fsdp=2 shard_optimizer_over_data=true steps=5 run_dir="$work/a"
train 2 4 mesh.fsdp=2 steps=5 run_dir="$work/b"
python3 - "$work/a/metrics.jsonl" "$work/b/metrics.jsonl" <<'PY'
import json, sys
a = {m["step"]: m["loss"] for m in map(json.loads, open(sys.argv[1]))}
b = {m["step"]: m["loss"] for m in map(json.loads, open(sys.argv[2]))}
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in (4, 5))
print(f"steps 4-5 after resharding: worst relative loss difference {worst:.2e} (bound 1e-5)")
sys.exit(0 if worst <= 1e-5 else 1)
PY
