#!/usr/bin/env bash
# Engram and mHC under context parallelism and the other layouts equal one process (issue 13): a small
# deepseek-tiny with Engram on both layers (orders 2 and 3, a 4-tap ShortConv of dilation 3: a halo of 9
# tokens) and mHC with 4 streams, on packed documents of 4..8 tokens (shorter than the halo, so the conv and
# the n-grams reach across documents and chunk seams alike). Each layout's first step is compared with one
# process gradient by gradient (compare_gradients.py): the hash ids are made before the context cut and the
# ShortConv receives each chunk's halo from the rank holding its natural predecessor, so every gradient is
# the natural-order one. Layouts: mesh.context 2 and 4 under dual_chunk_swap (all_gather and ring
# attention), a plain split, context x data, context x tensor (the tables' rows split over tensor), tensor,
# fsdp, remat full (the recompute passes the halos again), G = 1, MoE layers, and striped with a pointwise
# conv (K = 1 reads no history). Then the configuration errors: striped with a halo, and chunks shorter than
# the halo (K = 6: 15 tokens, against chunks of 12 under mesh.context=4).
# Why one step: the reference's gate is sigmoid(sign(s) sqrt(|s|)), whose slope is unbounded at a zero score,
# so over many steps the rounding differences of ANY two layouts grow (measured over 20 steps, data=2 against
# one process: losses 4e-6 apart, parameters 5e-3 of their largest), past the 20-step bounds of the dense
# models; the first step's gradients are the exact statement of equivalence.
# Usage: engram_equivalence.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"

# Packed short documents (common.sh): a byte-level tokenizer (257 ids), one token per letter.
prepare_packed_documents

keys=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=4 base_mlp_dim=128 base_num_decoder_layers=2
  max_target_length=96 kv_lora_rank=24 qk_nope_head_dim=12 qk_rope_head_dim=8 v_head_dim=16 q_lora_rank=16
  steps=1 gradient_accumulation_steps=2 checkpoint_period=0 eval_interval=0 collective_timeout_s=120
  dataset_type=tokens dataset_path="$work/packed" eval_dataset_path="$work/packed"
  tokenizer_path="$work/packed/tokenizer.json" vocab_size=257
  engram_layers=[0,1] engram_num_heads=2 engram_head_dim=8 engram_vocab_bases=[61,67])

run() {  # run NAME RANKS per_device_batch_size [key=value ...]
  local name=$1 ranks=$2 batch=$3
  shift 3
  local all=("${keys[@]}" per_device_batch_size="$batch" run_dir="$work/$name" "$@")
  if [ "$ranks" -eq 1 ]; then
    "$meshtrain" train deepseek-tiny "${all[@]}" >"$work/$name.log" 2>&1
  else
    "${mpirun[@]}" -np "$ranks" "$meshtrain" train deepseek-tiny "${all[@]}" >"$work/$name.log" 2>&1
  fi || { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
}
compare() {  # compare NAME BASELINE
  python3 "$(dirname "$0")/compare_gradients.py" "$work/$2" "$work/$1" "$1"
}
refuses() {  # refuses NAME RANKS EXPECTED_TEXT [key=value ...]: a configuration error naming the fix
  local name=$1 ranks=$2 expected=$3
  shift 3
  if "${mpirun[@]}" -np "$ranks" "$meshtrain" train deepseek-tiny "${keys[@]}" per_device_batch_size=4 \
    run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1; then
    echo "FAIL: $name trained"; return 1
  fi
  grep -q -- "$expected" "$work/$name.log" || { echo "FAIL: $name: no '$expected'"; cat "$work/$name.log"; return 1; }
  echo "$name: refused: $(grep -m1 'error' "$work/$name.log")"
}

mhc=(mhc_expansion_rate=4 engram_kernel_size=4 num_experts=0)
status=0
run single 1 8 "${mhc[@]}"
run cp2 2 4 "${mhc[@]}" mesh.context=2
compare cp2 single || status=1
run cp4_ring 4 2 "${mhc[@]}" mesh.context=4 context_parallel_strategy=ring
compare cp4_ring single || status=1
run cp2_plain 2 4 "${mhc[@]}" mesh.context=2 context_parallel_load_balance=false
compare cp2_plain single || status=1
run cp2_dp2 4 2 "${mhc[@]}" mesh.context=2 mesh.data=2
compare cp2_dp2 single || status=1
run cp2_tp2 4 2 "${mhc[@]}" mesh.context=2 mesh.tensor=2
compare cp2_tp2 single || status=1
run tp2 2 4 "${mhc[@]}" mesh.tensor=2
compare tp2 single || status=1
run fsdp2 2 4 "${mhc[@]}" mesh.fsdp=2
compare fsdp2 single || status=1
run cp2_remat 2 4 "${mhc[@]}" mesh.context=2 remat_policy=full
compare cp2_remat single || status=1
run single_g1 1 8 mhc_expansion_rate=1 engram_kernel_size=4 num_experts=0
run cp2_g1 2 4 mhc_expansion_rate=1 engram_kernel_size=4 num_experts=0 mesh.context=2
compare cp2_g1 single_g1 || status=1
moe=(num_experts=4 num_experts_per_tok=2 base_moe_mlp_dim=32 first_num_dense_layers=1 routed_score_func=sigmoid
  norm_topk_prob=true)
run single_moe 1 8 mhc_expansion_rate=4 engram_kernel_size=4 "${moe[@]}"
run cp2_moe 2 4 mhc_expansion_rate=4 engram_kernel_size=4 "${moe[@]}" mesh.context=2
compare cp2_moe single_moe || status=1
run single_k1 1 8 mhc_expansion_rate=4 engram_kernel_size=1 num_experts=0
run cp2_striped_k1 2 4 mhc_expansion_rate=4 engram_kernel_size=1 num_experts=0 mesh.context=2 context_parallel_reorder=striped
compare cp2_striped_k1 single_k1 || status=1

refuses striped_halo 2 "context_parallel_reorder" "${mhc[@]}" mesh.context=2 context_parallel_reorder=striped \
  || status=1
refuses short_chunks 4 "at least the ShortConv" mhc_expansion_rate=4 num_experts=0 engram_kernel_size=6 \
  mesh.context=4 || status=1
exit $status
