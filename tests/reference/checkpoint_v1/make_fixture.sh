#!/usr/bin/env bash
# Checkpoints in today's format (format version 1: per-layer tensors, scan_layers false), kept so that later
# format or layout changes (issue 14: stacked layers) are tested against checkpoints written before them.
# Two tiny models trained 2 steps on synthetic tokens: a Qwen3 (dense, tied) and a DeepSeek-style model with
# MLA, MoE, Engram and mHC (its checkpoint holds engram.safetensors). Each is the committed checkpoint
# directory step_00000002 (model and optimizer tensors, metadata.json, COMMITTED) and the run's metrics.jsonl,
# whose step-3 loss a load must reproduce when training continues.
# Usage: tests/reference/checkpoint_v1/make_fixture.sh BUILD_DIR   (from the repository root; rewrites the fixture)
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(vocab_size=64 max_target_length=16 per_device_batch_size=2 dataset_type=synthetic tokenizer_path=
  dataset_path= eval_dataset_path= eval_interval=0 checkpoint_period=2 base_num_decoder_layers=2)
make() {  # make NAME PRESET [key=value ...]: 3 steps, the checkpoint of step 2 kept
  local name=$1 preset=$2
  shift 2
  "$build/meshtrain" train "$preset" "${common[@]}" steps=3 run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; exit 1; }
  rm -rf "${here:?}/$name"
  mkdir -p "$here/$name"
  cp -r "$work/$name/checkpoints/step_00000002" "$here/$name/"
  cp "$work/$name/metrics.jsonl" "$here/$name/"
  cp "$work/$name/config.yaml" "$here/$name/"
}
make qwen3 qwen3-tiny base_emb_dim=32 base_num_query_heads=4 base_num_kv_heads=2 head_dim=8 base_mlp_dim=48
make deepseek deepseek-tiny base_emb_dim=32 base_num_query_heads=4 base_num_kv_heads=4 base_mlp_dim=48 \
  q_lora_rank=12 kv_lora_rank=10 qk_nope_head_dim=6 qk_rope_head_dim=4 v_head_dim=8 num_experts=4 \
  num_experts_per_tok=2 base_moe_mlp_dim=16 first_num_dense_layers=1 engram_layers=[1] engram_num_heads=2 \
  engram_head_dim=4 engram_vocab_bases=[31,37] engram_kernel_size=2 mhc_expansion_rate=2
du -sh "$here"
