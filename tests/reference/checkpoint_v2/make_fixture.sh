#!/usr/bin/env bash
# A checkpoint in format version 2 (one model.safetensors and optimizer.safetensors, the decoder layers
# STACKED: scan_layers true, the layer axis at param_scan_axis 1), kept so that the distributed format (3)
# and every later change are tested against a stacked single-file checkpoint written before them. A tiny
# Qwen3 trained 2 steps on synthetic tokens: the committed step_00000002/, the run's metrics.jsonl (the step-3
# loss a load must reproduce) and config.yaml.
# Usage: tests/reference/checkpoint_v2/make_fixture.sh BUILD_DIR   (from the repository root; rewrites the fixture)
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/meshtrain" train qwen3-tiny vocab_size=64 max_target_length=16 per_device_batch_size=2 \
  dataset_type=synthetic tokenizer_path= dataset_path= eval_dataset_path= eval_interval=0 checkpoint_period=2 \
  base_num_decoder_layers=2 base_emb_dim=32 base_num_query_heads=4 base_num_kv_heads=2 head_dim=8 \
  base_mlp_dim=48 scan_layers=true param_scan_axis=1 steps=3 run_dir="$work/run" >"$work/run.log" 2>&1 ||
  { cat "$work/run.log"; exit 1; }
rm -rf "${here:?}/qwen3_stacked"
mkdir -p "$here/qwen3_stacked"
cp -r "$work/run/checkpoints/step_00000002" "$work/run/metrics.jsonl" "$work/run/config.yaml" \
  "$here/qwen3_stacked/"
du -sh "$here"
