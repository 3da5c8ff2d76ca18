#!/usr/bin/env bash
# Stacked layers through the CLI (issue 14, layers-and-checkpoints.md): a run with scan_layers=true trains
# with the per-layer run's losses bitwise; resumed without scan_layers it adopts the checkpoint's layout
# (and says so) and continues with the same losses; a per-layer run loads the stacked checkpoint (and the
# stacked run the per-layer one) and continues alike; export-hf of both layouts writes identical weights.
# Usage: scan_layouts.sh BUILD_DIR
set -euo pipefail
meshtrain="$1/meshtrain"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tiny=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=2 head_dim=16 base_mlp_dim=128
  base_num_decoder_layers=3 vocab_size=256 max_target_length=32 dataset_type=synthetic tokenizer_path=
  dataset_path= eval_dataset_path= eval_interval=0 per_device_batch_size=4 learning_rate=1e-2
  checkpoint_period=3 steps=6)
train() {  # train NAME [key=value ...]
  local name=$1
  shift
  "$meshtrain" train qwen3-tiny "${tiny[@]}" run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
}
train per_layer
train stacked scan_layers=true param_scan_axis=2
# Resumed from step 3 without scan_layers: the checkpoint's layout is adopted.
cp -r "$work/stacked" "$work/adopted"
rm -rf "$work/adopted/checkpoints/step_00000006"
head -n 3 "$work/stacked/metrics.jsonl" >"$work/adopted/metrics.jsonl"
train adopted
grep -q "scan_layers=true param_scan_axis=2 (unset here) adopted from" "$work/adopted.log" ||
  { echo "FAIL: the resumed run did not say it adopted the checkpoint's layout"; cat "$work/adopted.log"; exit 1; }
# Across layouts: step 3 of each loaded into the other.
train stacked_from_per_layer scan_layers=true load_full_state_path="$work/per_layer/checkpoints/step_00000003"
train per_layer_from_stacked scan_layers=false load_full_state_path="$work/stacked/checkpoints/step_00000003"
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl"))}
reference, status = losses("per_layer"), 0
for name, steps in [("stacked", range(1, 7)), ("adopted", range(1, 7)), ("stacked_from_per_layer", range(4, 7)),
                    ("per_layer_from_stacked", range(4, 7))]:
    other = losses(name)
    same = sorted(other) == list(steps) and all(other[s] == reference[s] for s in steps)
    print(f"{name}: steps {steps.start}..{steps.stop - 1} {'bitwise equal to' if same else 'DIFFER from'} "
          f"the per-layer run's losses")
    status |= not same
sys.exit(status)
PY
"$meshtrain" export-hf "$work/per_layer/checkpoints/step_00000006" --out "$work/hf_per_layer" >/dev/null
"$meshtrain" export-hf "$work/stacked/checkpoints/step_00000006" --out "$work/hf_stacked" >/dev/null
cmp "$work/hf_per_layer/model.safetensors" "$work/hf_stacked/model.safetensors"
echo "export-hf: the stacked and the per-layer checkpoints export identical weights"
