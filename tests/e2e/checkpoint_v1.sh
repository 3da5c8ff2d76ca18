#!/usr/bin/env bash
# Checkpoints written before a format or layout change keep loading (layers-and-checkpoints.md): each
# committed format-1 checkpoint (tests/reference/checkpoint_v1/, made by make_fixture.sh beside it: a tiny
# Qwen3, and a DeepSeek-style model with MLA, MoE, Engram and mHC) and the format-2 stacked one
# (tests/reference/checkpoint_v2/qwen3_stacked: single files, layers stacked) loads as a full state into its run's
# config and trains its third step with the loss its own run had at step 3 (1e-6 relative: the same state
# and batch, on any machine only the kernels' rounding differs). Each loads a second time into a stacked run
# (scan_layers=true, issue 14: the per-layer tensors stacked on load), whose step-3 loss must equal the
# per-layer load's bitwise.
# Usage: checkpoint_v1.sh BUILD_DIR
set -euo pipefail
meshtrain="$1/meshtrain"
fixtures=$(cd "$(dirname "$0")/../reference" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for fixture in checkpoint_v1/qwen3 checkpoint_v1/deepseek checkpoint_v2/qwen3_stacked; do
  model=${fixture##*/}
  for layout in per_layer stacked; do
    scan=false
    [ "$layout" = stacked ] && scan=true
    "$meshtrain" train "$fixtures/$fixture/config.yaml" load_full_state_path="$fixtures/$fixture/step_00000002" \
      scan_layers=$scan run_dir="$work/${model}_$layout" >"$work/${model}_$layout.log" 2>&1 ||
      { echo "FAIL: $model $layout"; cat "$work/${model}_$layout.log"; exit 1; }
  done
  /usr/bin/python3 - "$fixtures/$fixture/metrics.jsonl" "$work/${model}_per_layer/metrics.jsonl" \
    "$work/${model}_stacked/metrics.jsonl" "$model" "${fixture:12:1}" <<'PY' || status=1
import json, sys
saved = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
resumed = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
stacked = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[3]))}
assert sorted(resumed) == [3] and sorted(stacked) == [3], (sorted(resumed), sorted(stacked))
difference = abs(resumed[3] - saved[3]) / abs(saved[3])
print(f"{sys.argv[4]}: checkpoint of step 2 (format {sys.argv[5]}) loaded; step 3 loss {resumed[3]:.9f} against "
      f"{saved[3]:.9f} when it was written ({difference:.1e}, bound 1e-6); loaded stacked: "
      f"{stacked[3]:.9f} ({'bitwise equal' if stacked[3] == resumed[3] else 'DIFFERENT'})")
sys.exit(0 if difference <= 1e-6 and stacked[3] == resumed[3] else 1)
PY
done
exit $status
