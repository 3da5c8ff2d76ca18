#!/usr/bin/env bash
# Checkpoints hold global tensors, so a state saved on one mesh loads on any other (issue 5): 4 ranks
# (data 2 x fsdp 2, ZeRO-1) -> 2 ranks (fsdp 2) -> 1 process -> 4 ranks (data 4) -> TP 2 x DP 2 -> DP 4,
# each conversion bitwise
# (the converted checkpoint's tensor files equal the source's byte for byte), and training continues on the
# new mesh with the losses of a run that never changed mesh (1e-5 relative).
# Context meshes (issue 11): a state saved under context 2 x data 2 (ZeRO-1) loads under context 4, one
# process, context 2 x tensor 2 and back under context 2 x data 2, each bitwise, and training continues on
# each of them with the losses of the context 2 x data 2 run that never changed mesh.
# Expert meshes (issue 12): a mixture-of-experts model saved under expert 2 x data 2 (ZeRO-1) loads under
# expert 4 (one routed expert a rank), one process, expert 2 x tensor 2 and data 2 (experts whole on every
# rank), each bitwise, and training continues on each with the losses of the run that never changed mesh.
# Usage: resharding.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny+=(learning_rate=1e-2 collective_timeout_s=120)
preset=qwen3-tiny
keys=("${tiny[@]}")
train() {  # train RANKS per_device_batch_size [key=value ...]: $preset with ${keys[@]}
  local ranks=$1 batch=$2
  shift 2
  if [ "$ranks" -eq 1 ]; then
    "$meshtrain" train "$preset" "${keys[@]}" per_device_batch_size="$batch" "$@"
  else
    "${mpirun[@]}" -np "$ranks" "$meshtrain" train "$preset" "${keys[@]}" per_device_batch_size="$batch" "$@"
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

# Context meshes: every row's 32 tokens cut over 2 (or 4) ranks, 8 rows per step as above.
train 4 2 mesh.context=2 mesh.data=2 shard_optimizer_over_data=true steps=3 run_dir="$work/cp_a"
train 4 2 mesh.context=4 steps=3 load_full_state_path="$work/cp_a/checkpoints/step_00000003" \
  run_dir="$work/cp_b"
same_tensors "$work/cp_a/checkpoints/step_00000003" "$work/cp_b/checkpoints/step_00000003"
train 1 8 steps=3 load_full_state_path="$work/cp_b/checkpoints/step_00000003" run_dir="$work/cp_c"
same_tensors "$work/cp_a/checkpoints/step_00000003" "$work/cp_c/checkpoints/step_00000003"
train 4 2 mesh.context=2 mesh.tensor=2 steps=3 load_full_state_path="$work/cp_c/checkpoints/step_00000003" \
  run_dir="$work/cp_d"
same_tensors "$work/cp_a/checkpoints/step_00000003" "$work/cp_d/checkpoints/step_00000003"
train 4 2 mesh.context=2 mesh.data=2 shard_optimizer_over_data=true steps=3 \
  load_full_state_path="$work/cp_d/checkpoints/step_00000003" run_dir="$work/cp_e"
same_tensors "$work/cp_a/checkpoints/step_00000003" "$work/cp_e/checkpoints/step_00000003"
echo "4 ranks (context 2 x data 2, ZeRO-1) -> context 4 -> 1 process -> context 2 x tensor 2 ->"
echo "  context 2 x data 2: parameters and moments bitwise equal"

continues() {  # continues REFERENCE RUN...: steps 4-5 of each run against the reference run's
  python3 - "$@" <<'PY'
import json, os, sys
def losses(run):
    return {m["step"]: m["loss"] for m in map(json.loads, open(f"{run}/metrics.jsonl"))}
reference, status = losses(sys.argv[1]), 0
for run in sys.argv[2:]:
    other = losses(run)
    worst = max(abs(reference[s] - other[s]) / abs(reference[s]) for s in (4, 5))
    print(f"steps 4-5 after resharding {os.path.basename(sys.argv[1])} -> {os.path.basename(run)}: "
          f"worst relative loss difference {worst:.2e} (bound 1e-5)")
    status |= worst > 1e-5
sys.exit(status)
PY
}

# Training continues: 2 more steps on fsdp 2 from the 4-rank checkpoint vs the 4-rank run itself.
train 4 2 mesh.data=2 mesh.fsdp=2 shard_optimizer_over_data=true steps=5 run_dir="$work/a"
train 2 4 mesh.fsdp=2 steps=5 run_dir="$work/b"
status=0
continues "$work/a" "$work/b" || status=1
# And from the context 2 x data 2 checkpoint on each context mesh (and one process) vs that run itself.
train 4 2 mesh.context=2 mesh.data=2 shard_optimizer_over_data=true steps=5 run_dir="$work/cp_a"
train 4 2 mesh.context=4 steps=5 run_dir="$work/cp_b"
train 1 8 steps=5 run_dir="$work/cp_c"
train 4 2 mesh.context=2 mesh.tensor=2 steps=5 run_dir="$work/cp_d"
continues "$work/cp_a" "$work/cp_b" "$work/cp_c" "$work/cp_d" || status=1

# Expert meshes: 4 routed experts (top-2, one shared, the selection bias on) after a dense first layer.
preset=deepseek-tiny
keys=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=4 base_mlp_dim=128 base_num_decoder_layers=2
  vocab_size=256 max_target_length=32 dataset_type=synthetic tokenizer_path= dataset_path= eval_dataset_path=
  eval_interval=0 kv_lora_rank=24 qk_nope_head_dim=12 qk_rope_head_dim=8 v_head_dim=16 q_lora_rank=16
  num_experts=4 num_experts_per_tok=2 base_moe_mlp_dim=32 first_num_dense_layers=1 learning_rate=3e-3
  collective_timeout_s=120)
train 4 2 mesh.expert=2 mesh.data=2 shard_optimizer_over_data=true steps=3 run_dir="$work/ep_a"
train 4 2 mesh.expert=4 steps=3 load_full_state_path="$work/ep_a/checkpoints/step_00000003" run_dir="$work/ep_b"
same_tensors "$work/ep_a/checkpoints/step_00000003" "$work/ep_b/checkpoints/step_00000003"
train 1 8 steps=3 load_full_state_path="$work/ep_b/checkpoints/step_00000003" run_dir="$work/ep_c"
same_tensors "$work/ep_a/checkpoints/step_00000003" "$work/ep_c/checkpoints/step_00000003"
train 4 2 mesh.expert=2 mesh.tensor=2 steps=3 load_full_state_path="$work/ep_c/checkpoints/step_00000003" \
  run_dir="$work/ep_d"
same_tensors "$work/ep_a/checkpoints/step_00000003" "$work/ep_d/checkpoints/step_00000003"
train 2 4 mesh.data=2 steps=3 load_full_state_path="$work/ep_d/checkpoints/step_00000003" run_dir="$work/ep_e"
same_tensors "$work/ep_a/checkpoints/step_00000003" "$work/ep_e/checkpoints/step_00000003"
echo "4 ranks (expert 2 x data 2, ZeRO-1) -> expert 4 -> 1 process -> expert 2 x tensor 2 -> data 2:"
echo "  parameters and moments bitwise equal"
train 4 2 mesh.expert=2 mesh.data=2 shard_optimizer_over_data=true steps=5 run_dir="$work/ep_a"
train 4 2 mesh.expert=4 steps=5 run_dir="$work/ep_b"
train 1 8 steps=5 run_dir="$work/ep_c"
train 4 2 mesh.expert=2 mesh.tensor=2 steps=5 run_dir="$work/ep_d"
train 2 4 mesh.data=2 steps=5 run_dir="$work/ep_e"
continues "$work/ep_a" "$work/ep_b" "$work/ep_c" "$work/ep_d" "$work/ep_e" || status=1
exit $status
