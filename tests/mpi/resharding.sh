#!/usr/bin/env bash
# Checkpoints hold global tensors, so a state saved on one mesh loads on any other (issue 5): 4 ranks
# (data 2 x fsdp 2, ZeRO-1) -> 2 ranks (fsdp 2) -> 1 process -> 4 ranks (data 4) -> TP 2 x DP 2 -> DP 4,
# each conversion bitwise (the converted checkpoint's tensors equal the source's, checkpoint_tensors.py), and
# training continues on each new mesh with the losses of the run that never changed mesh (1e-5 relative).
# Context meshes (issue 11): a state saved under context 2 x data 2 (ZeRO-1) loads under context 4, one
# process, context 2 x tensor 2 and back under context 2 x data 2, the same way.
# Expert meshes (issue 12): a mixture-of-experts model saved under expert 2 x data 2 (ZeRO-1) loads under
# expert 4 (one routed expert a rank), one process, expert 2 x tensor 2 and data 2 (experts whole on every
# rank), the same way.
# Engram and mHC (issue 13): context 2 x tensor 2 -> one process -> tensor 2 -> context 2 x data 2 (ZeRO-1).
# Layouts (issue 14): the same chains between stacked (scan_layers=true, the layer axis at param_scan_axis)
# and per-layer checkpoints on different meshes; each save holds, bitwise, the tensors of the first save of
# the same layout.
# 8 rows per step everywhere: per_device_batch_size x ranks.
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

# reshard NAME "RANKS BATCH [key=value ...]" ...: 3 steps on the first mesh; each next mesh loads the
# previous one's checkpoint and saves it again, whose tensors must equal those of the first save of its
# layout bitwise. Then every run trains on to step 5 on its own mesh, and each must match the first mesh's
# losses.
status=0
reshard() {
  local name=$1 i previous="" runs=()
  shift
  local meshes=("$@")
  local -A first_of_layout=()
  for i in "${!meshes[@]}"; do
    local run="$work/${name}_$i" load=()
    [ -n "$previous" ] && load=(load_full_state_path="$previous/checkpoints/step_00000003")
    # shellcheck disable=SC2086  # the mesh's words are separate arguments
    train ${meshes[$i]} steps=3 "${load[@]}" run_dir="$run"
    # The checkpoint layout this mesh saves in: its scan_layers / param_scan_axis words (none: per layer).
    local layout
    layout=$(tr ' ' '\n' <<<"${meshes[$i]}" | grep -E '^(scan_layers|param_scan_axis)=' | tr '\n' ' ' || true)
    layout=${layout:-per_layer}
    local same=${first_of_layout[$layout]:-}
    if [ -n "$same" ]; then
      python3 "$(dirname "$0")/checkpoint_tensors.py" --same "$same/checkpoints/step_00000003" \
        "$run/checkpoints/step_00000003" || { echo "FAIL: $name save $i differs from $same's"; exit 1; }
    else
      first_of_layout[$layout]=$run
    fi
    previous=$run
    runs+=("$run")
  done
  local described="" words
  for i in "${!meshes[@]}"; do
    read -r -a words <<<"${meshes[$i]}"
    words=("${words[@]:2}")
    described+="${described:+ -> }${words[*]:-1 process}"
  done
  echo "$name: ${described//mesh./}: parameters and moments bitwise equal"
  for i in "${!meshes[@]}"; do
    # shellcheck disable=SC2086
    train ${meshes[$i]} steps=5 run_dir="${runs[$i]}"
  done
  continues "${runs[@]}" || status=1
}

reshard dense "4 2 mesh.data=2 mesh.fsdp=2 shard_optimizer_over_data=true" "2 4 mesh.fsdp=2" "1 8" \
  "4 2 mesh.data=4" "4 2 mesh.data=2 mesh.tensor=2" "4 2 mesh.data=4"
reshard dense_layouts "4 2 mesh.data=2 mesh.fsdp=2 shard_optimizer_over_data=true scan_layers=true" \
  "2 4 mesh.tensor=2 scan_layers=false" "1 8 scan_layers=true param_scan_axis=0" \
  "4 2 mesh.fsdp=4 scan_layers=true" "2 4 mesh.data=2 scan_layers=false" "1 8 scan_layers=true"
# Context meshes: every row's 32 tokens cut over 2 (or 4) ranks.
reshard context "4 2 mesh.context=2 mesh.data=2 shard_optimizer_over_data=true" "4 2 mesh.context=4" \
  "1 8" "4 2 mesh.context=2 mesh.tensor=2" "4 2 mesh.context=2 mesh.data=2 shard_optimizer_over_data=true"
# Expert meshes: 4 routed experts (top-2, one shared, the selection bias on) after a dense first layer.
preset=deepseek-tiny
keys=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=4 base_mlp_dim=128 base_num_decoder_layers=2
  vocab_size=256 max_target_length=32 dataset_type=synthetic tokenizer_path= dataset_path= eval_dataset_path=
  eval_interval=0 kv_lora_rank=24 qk_nope_head_dim=12 qk_rope_head_dim=8 v_head_dim=16 q_lora_rank=16
  num_experts=4 num_experts_per_tok=2 base_moe_mlp_dim=32 first_num_dense_layers=1 learning_rate=3e-3
  collective_timeout_s=120)
reshard expert "4 2 mesh.expert=2 mesh.data=2 shard_optimizer_over_data=true" "4 2 mesh.expert=4" \
  "1 8" "4 2 mesh.expert=2 mesh.tensor=2" "2 4 mesh.data=2"
reshard expert_layouts "4 2 mesh.expert=2 mesh.data=2 shard_optimizer_over_data=true scan_layers=true" \
  "1 8 scan_layers=false" "4 2 mesh.expert=4 scan_layers=true" "2 4 mesh.fsdp=2 scan_layers=false"
# Engram and mHC meshes (issue 13): the tables' rows split over tensor, the ShortConv's halos over context;
# the checkpoint's engram.safetensors (multipliers, table sizes, compressed vocabulary) travels along.
keys+=(engram_layers=[0,1] engram_num_heads=2 engram_head_dim=8 engram_vocab_bases=[61,67] engram_kernel_size=3
  mhc_expansion_rate=4)
reshard engram "4 2 mesh.context=2 mesh.tensor=2" "1 8" "2 4 mesh.tensor=2" \
  "4 2 mesh.context=2 mesh.data=2 shard_optimizer_over_data=true"
exit $status
