#!/usr/bin/env bash
# Distributed training equals one process (issue 5): the same global batch (synthetic tokens are a function
# of (seed, step, global row)) trained for 20 steps with GA 2 on 1 process and on 2 and 4 ranks in data,
# FSDP, ZeRO-1, tensor-parallel and combined layouts. Losses must agree within 1e-5 relative (sums over
# ranks add in another order) and the final parameters (from each run's checkpoint, global tensors) within
# 1e-3 of each tensor's largest magnitude; the same layout run twice must give bitwise-equal losses. Muon
# (issue 41) on 2 and 4 data ranks, FSDP 2, tensor 2, ZeRO-1 over data 2 and FSDP 2 x tensor 2 against its
# one process.
# Context parallelism (issue 11), each case once per strategy (all_gather and ring, context_cases):
# mesh.context=2 and 4 with each reorder, C=2 with data=2, tensor=2, fsdp=2 and ZeRO-1, remat minimal and full, untied
# embeddings (alone and with tensor=2), GPT-2 (learned positions), and packed short documents (a prepared
# corpus of 3..7-token documents, so a chunk of S / 2C = 8 tokens holds several documents and documents
# cross chunk boundaries) with each reorder and C=4, with eval every 5 steps whose losses must agree within
# 1e-5 too; each against the one-process run of the same model and data. The same documents unpacked and in
# stream order (enable_data_shuffling=false) on 2 data ranks, and a two-source mixture of them on 2 data ranks. Under context the global batch is
# per_device_batch_size x devices rows as for tensor, each row cut over the context ranks.
# Usage: equivalence.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny+=(checkpoint_period=0 steps=20 gradient_accumulation_steps=2 learning_rate=1e-2 collective_timeout_s=120)

cases=()  # "NAME BASELINE": each run compared at the end against a one-process run
check() {  # check NAME BASELINE RANKS per_device_batch_size [key=value ...]: run it, compare it at the end
  run "$1" "${@:3}"
  cases+=("$1 $2")
}

compare() {  # compare NAME BASELINE: losses, eval losses, grad norms and final parameters
  python3 "$(dirname "$0")/compare_runs.py" "$work/$2" "$work/$1" "$1"
}

# Packed short documents (common.sh): the loader packs them into windows of 32 (segment ids and positions
# restart after every EOS, the target after an EOS is masked); eval reads the validation split (5% of them).
prepare_packed_documents
packed=(dataset_type=tokens dataset_path="$work/packed" eval_dataset_path="$work/packed"
  tokenizer_path="$work/packed/tokenizer.json" vocab_size=257 eval_interval=5 eval_steps=1)
gpt2=(base_num_kv_heads=4 max_position_embeddings=32)  # GPT-2: MHA, one learned position per token

# The one-process baselines, global batch 8 rows per micro-batch (per_device_batch_size x devices).
run single 1 8
run single_untied 1 8 logits_via_embedding=false
run packed_single 1 8 "${packed[@]}"
# The same documents unpacked and unshuffled (enable_data_shuffling=false): rows in stream order, taken by
# global row index, so 2 data ranks train on the one process's global batch.
unshuffled=("${packed[@]}" packing=false enable_data_shuffling=false)
run unshuffled_single 1 8 "${unshuffled[@]}"
# A two-source mixture (3:1) of the same documents: the draw is a function of the global row, so 2 data ranks
# train on the one process's global batch.
mixture=("${packed[@]/#dataset_path=*/dataset_path=$work/packed/train.tokens,3;$work/packed,1}")
run mixture_single 1 8 "${mixture[@]}"
preset=gpt2-124m run gpt2_single 1 8 "${gpt2[@]}"

check dp2 single 2 4 mesh.data=2
check unshuffled_dp2 unshuffled_single 2 4 mesh.data=2 "${unshuffled[@]}"
check mixture_dp2 mixture_single 2 4 mesh.data=2 "${mixture[@]}"
run dp2_again 2 4 mesh.data=2
check fsdp2 single 2 4 mesh.fsdp=2
check zero1_2 single 2 4 mesh.data=2 shard_optimizer_over_data=true
check dp4 single 4 2 mesh.data=4
check dp2_fsdp2 single 4 2 mesh.data=2 mesh.fsdp=2
check zero1_dp2_fsdp2 single 4 2 mesh.data=2 mesh.fsdp=2 shard_optimizer_over_data=true
# Tensor parallel: per_device_batch_size x devices rows, replicated over tensor.
check tp2 single 2 4 mesh.tensor=2
check dp2_tp2 single 4 2 mesh.data=2 mesh.tensor=2
check fsdp2_tp2 single 4 2 mesh.fsdp=2 mesh.tensor=2
check zero1_dp2_tp2 single 4 2 mesh.data=2 mesh.tensor=2 shard_optimizer_over_data=true
check tp4 single 4 2 mesh.tensor=4  # 4 query heads, 2 kv heads: each kv head replicated on 2 ranks

# Every context case under each context_parallel_strategy.
context_cases() {  # context_cases STRATEGY [key=value ...]: the context cases, named STRATEGY_*
  local s=$1 keys=(context_parallel_strategy="$1" "${@:2}")
  # Every row's 32 tokens cut over 2 ranks (16 each).
  check "${s}_cp2" single 2 4 mesh.context=2 "${keys[@]}"  # dual_chunk_swap, the default
  check "${s}_cp2_striped" single 2 4 mesh.context=2 context_parallel_reorder=striped "${keys[@]}"
  check "${s}_cp2_plain" single 2 4 mesh.context=2 context_parallel_load_balance=false "${keys[@]}"
  check "${s}_cp2_dp2" single 4 2 mesh.context=2 mesh.data=2 "${keys[@]}"
  check "${s}_cp2_tp2" single 4 2 mesh.context=2 mesh.tensor=2 "${keys[@]}"
  check "${s}_cp2_fsdp2" single 4 2 mesh.context=2 mesh.fsdp=2 "${keys[@]}"
  check "${s}_cp2_zero1_dp2" single 4 2 mesh.context=2 mesh.data=2 shard_optimizer_over_data=true "${keys[@]}"
  check "${s}_cp2_fsdp2_zero1" single 4 2 mesh.context=2 mesh.fsdp=2 shard_optimizer_over_data=true "${keys[@]}"
  check "${s}_cp4" single 4 2 mesh.context=4 "${keys[@]}"  # 8 chunks of 4 tokens
  check "${s}_cp4_striped" single 4 2 mesh.context=4 context_parallel_reorder=striped "${keys[@]}"
  check "${s}_cp4_plain" single 4 2 mesh.context=4 context_parallel_load_balance=false "${keys[@]}"
  # Remat recomputes from activations only: the gathered positions (and under full the gathered K / V) are
  # activations so that a recomputed attention sees this layer's whole rows.
  check "${s}_cp2_remat_minimal" single 2 4 mesh.context=2 remat_policy=minimal "${keys[@]}"
  check "${s}_cp2_remat_full" single 2 4 mesh.context=2 remat_policy=full "${keys[@]}"
  # Untied: a separate output projection (vocab-sharded under tensor).
  check "${s}_cp2_untied" single_untied 2 4 mesh.context=2 logits_via_embedding=false "${keys[@]}"
  check "${s}_cp2_tp2_untied" single_untied 4 2 mesh.context=2 mesh.tensor=2 logits_via_embedding=false \
    "${keys[@]}"
  # Packed short documents (and eval) with each reorder; under C=4 a chunk is 4 tokens, shorter than most
  # documents.
  check "${s}_packed_cp2" packed_single 2 4 mesh.context=2 "${packed[@]}" "${keys[@]}"
  check "${s}_packed_cp2_striped" packed_single 2 4 mesh.context=2 context_parallel_reorder=striped \
    "${packed[@]}" "${keys[@]}"
  check "${s}_packed_cp2_plain" packed_single 2 4 mesh.context=2 context_parallel_load_balance=false \
    "${packed[@]}" "${keys[@]}"
  check "${s}_packed_cp4" packed_single 4 2 mesh.context=4 "${packed[@]}" "${keys[@]}"
  # GPT-2: learned positions, LayerNorm, GELU.
  preset=gpt2-124m check "${s}_gpt2_cp2" gpt2_single 2 4 mesh.context=2 "${gpt2[@]}" "${keys[@]}"
}
context_cases all_gather
context_cases ring
# Stacked layers (issue 14: scan_layers=true, FSDP gathering each layer's block of the stacked shard, ZeRO-1
# slicing the stacked tensors): the same losses as the one process, and bitwise the per-layer run's on the
# same mesh.
check fsdp2_stacked single 2 4 mesh.fsdp=2 scan_layers=true
check zero1_dp2_tp2_stacked single 4 2 mesh.data=2 mesh.tensor=2 shard_optimizer_over_data=true scan_layers=true
check all_gather_cp2_fsdp2_stacked single 4 2 mesh.context=2 mesh.fsdp=2 context_parallel_strategy=all_gather \
  scan_layers=true
# Muon (opt_type=muon): 2 and 4 data ranks, and the meshes that shard its matrices (the plan gathers each
# whole for Newton-Schulz): FSDP, tensor, ZeRO-1 and FSDP x tensor, against the one process.
run single_muon 1 8 opt_type=muon
check dp2_muon single_muon 2 4 mesh.data=2 opt_type=muon
check dp4_muon single_muon 4 2 mesh.data=4 opt_type=muon
check fsdp2_muon single_muon 2 4 mesh.fsdp=2 opt_type=muon
check tp2_muon single_muon 2 4 mesh.tensor=2 opt_type=muon
check zero1_dp2_muon single_muon 2 4 mesh.data=2 shard_optimizer_over_data=true opt_type=muon
check fsdp2_tp2_muon single_muon 4 2 mesh.fsdp=2 mesh.tensor=2 opt_type=muon

status=0
for pair in "${cases[@]}"; do
  read -r name baseline <<<"$pair"
  compare "$name" "$baseline" || status=1
done
# The same layout twice, and the stacked runs against the per-layer ones: bitwise-equal losses.
for pair in "dp2 dp2_again" "fsdp2 fsdp2_stacked" "zero1_dp2_tp2 zero1_dp2_tp2_stacked" \
  "all_gather_cp2_fsdp2 all_gather_cp2_fsdp2_stacked"; do
  read -r first second <<<"$pair"
  python3 - "$work/$first/metrics.jsonl" "$work/$second/metrics.jsonl" "$first" "$second" <<'PY' || status=1
import json, sys
a = [json.loads(line)["loss"] for line in open(sys.argv[1])]
b = [json.loads(line)["loss"] for line in open(sys.argv[2])]
print(f"{sys.argv[3]} and {sys.argv[4]}: losses bitwise equal" if a == b
      else f"FAIL: {sys.argv[3]} and {sys.argv[4]} differ: {a} vs {b}")
sys.exit(0 if a == b else 1)
PY
done
exit $status
