#!/usr/bin/env bash
# The zero-bubble schedule (ZB-H1: each backward run as its input-gradient part, then later its weight-gradient
# part) equals one process: a 4-layer qwen3 on 2 and 4 stage ranks with M = P and 2P micro-batches, 2 stages
# x fsdp=2 and x tensor=2, and a DeepSeek-style model (MLA, a routed MoE layer, Engram and mHC) on 2, trained
# 5 steps. Against the same
# stages under 1F1B every loss and gradient norm is bitwise equal (each gradient sums its micro-batches in the
# same order; only when W runs moves); against one process with the same global batch, losses within 1e-5
# relative and gradient norms within 1e-4 (the stages' sums add in another order; tensor=2's norms drift
# most, 3e-5 after 5 steps).
# Usage: pipeline_zero_bubble.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny=("${tiny[@]/#base_num_decoder_layers=*/base_num_decoder_layers=4}")
tiny+=(checkpoint_period=0 enable_checkpointing=false steps=5 learning_rate=1e-2
  collective_timeout_s=120)
deepseek=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=4 base_mlp_dim=128 base_num_decoder_layers=2
  vocab_size=256 max_target_length=32 dataset_type=synthetic tokenizer_path= dataset_path= eval_dataset_path=
  eval_interval=0 kv_lora_rank=24 qk_nope_head_dim=12 qk_rope_head_dim=8 v_head_dim=16 q_lora_rank=16
  num_experts=4 num_experts_per_tok=2 base_moe_mlp_dim=32 first_num_dense_layers=1 shared_experts=1
  engram_layers=[0,1] engram_num_heads=2 engram_head_dim=8 engram_vocab_bases=[61,67] engram_kernel_size=3
  mhc_expansion_rate=4 checkpoint_period=0 enable_checkpointing=false steps=5 learning_rate=3e-3
  collective_timeout_s=120)

run() {  # run NAME PRESET RANKS per_device_batch_size [key=value ...]: the keys replace the preset's defaults
  local name=$1 preset=$2 ranks=$3 batch=$4 defaults keys=() key given
  shift 4
  if [ "$preset" = qwen3-tiny ]; then defaults=("${tiny[@]}"); else defaults=("${deepseek[@]}"); fi
  for key in "${defaults[@]}"; do
    for given in "$@"; do [ "${key%%=*}" != "${given%%=*}" ] || continue 2; done
    keys+=("$key")
  done
  keys+=(per_device_batch_size="$batch" run_dir="$work/$name" "$@")
  if [ "$ranks" -eq 1 ]; then
    "$meshtrain" train "$preset" "${keys[@]}" >"$work/$name.log" 2>&1
  else
    "${mpirun[@]}" -np "$ranks" "$meshtrain" train "$preset" "${keys[@]}" >"$work/$name.log" 2>&1
  fi || { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
}

status=0
compare() {  # compare NAME ONE_F_ONE_B SINGLE: bitwise against 1F1B, within 1e-5 of one process
  python3 - "$work" "$@" <<'PY' || status=1
import json, sys
work, name, one_f_one_b, single = sys.argv[1:]
def metrics(run):
    return [json.loads(line) for line in open(f"{work}/{run}/metrics.jsonl")]
zb, ofob, one = metrics(name), metrics(one_f_one_b), metrics(single)
assert len(zb) == len(ofob) == len(one) == 5, (len(zb), len(ofob), len(one))
bitwise = all(a[k] == b[k] for a, b in zip(zb, ofob) for k in ("loss", "raw_grad_norm", "grad_norm"))
def worst(key):
    return max(abs(a[key] - b[key]) / abs(b[key]) for a, b in zip(zb, one))
loss, norm = worst("loss"), max(worst("raw_grad_norm"), worst("grad_norm"))
print(f"{name}: bitwise equal to {one_f_one_b}: {bitwise}; worst relative difference to {single}: loss "
      f"{loss:.2e} (bound 1e-5), grad norm {norm:.2e} (bound 1e-4)")
sys.exit(0 if bitwise and loss <= 1e-5 and norm <= 1e-4 else 1)
PY
}

# qwen3: P stage ranks take per_device_batch_size x P rows per micro-batch, as one process with that batch.
for case in "2 4" "2 8" "4 4" "4 8"; do
  read -r stages micro <<<"$case"
  run "single_p${stages}_m$micro" qwen3-tiny 1 $((4 * stages)) gradient_accumulation_steps="$micro"
  for schedule in 1f1b zero_bubble; do
    run "${schedule}_p${stages}_m$micro" qwen3-tiny "$stages" 4 gradient_accumulation_steps="$micro" \
      mesh.stage="$stages" pipeline_schedule="$schedule"
  done
  compare "zero_bubble_p${stages}_m$micro" "1f1b_p${stages}_m$micro" "single_p${stages}_m$micro"
done

# Stage x fsdp and stage x tensor (4 ranks, 2 stages): 4 rows per rank, 16 per micro-batch.
run single_b16_m2 qwen3-tiny 1 16 gradient_accumulation_steps=2
for axis in fsdp tensor; do
  for schedule in 1f1b zero_bubble; do
    run "${schedule}_$axis" qwen3-tiny 4 4 gradient_accumulation_steps=2 mesh.stage=2 "mesh.$axis=2" \
      pipeline_schedule="$schedule"
  done
  compare "zero_bubble_$axis" "1f1b_$axis" single_b16_m2
done

run deepseek_single deepseek-custom-tiny 1 8 gradient_accumulation_steps=2
for schedule in 1f1b zero_bubble; do
  run "deepseek_$schedule" deepseek-custom-tiny 2 4 gradient_accumulation_steps=2 mesh.stage=2 \
    pipeline_schedule="$schedule"
done
compare deepseek_zero_bubble deepseek_1f1b deepseek_single
exit $status
