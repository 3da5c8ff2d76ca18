#!/usr/bin/env bash
# Checkpoints across pipeline stage counts (issue 39): a state saved at 2 stages (1F1B) loads at one process
# and at 4 stages (GPipe), and one saved by one process loads at 2 stages. Each load saves again at once,
# bitwise the tensors it loaded (checkpoint_tensors.py), and then trains on with the losses of the one-process
# run that resumed the same checkpoint (1e-5 relative; resuming sets the cosine schedule's length, so resumed
# runs are compared with resumed runs). Once per layer with untied embeddings; once stacked (scan_layers: the
# one scan group split between the stages) with tied embeddings (both ends hold the table), through a
# per-layer one-process run. A single-file checkpoint loads at 2 stages in either layout. A checkpoint of
# another model (fewer layers) is refused by every stage rank with the same message.
# 8 rows per micro-batch everywhere (per_device_batch_size x ranks), 2 micro-batches per step.
# Usage: pipeline_checkpoints.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny=("${tiny[@]/base_num_decoder_layers=2/base_num_decoder_layers=4}")
tiny+=(learning_rate=1e-2 collective_timeout_s=120 gradient_accumulation_steps=2)
status=0

train() {  # train STAGES [key=value ...]: one process when STAGES is 1; GPipe beyond 2 stages (2 micro-batches)
  local stages=$1
  shift
  if [ "$stages" -eq 1 ]; then
    "$meshtrain" train qwen3-tiny "${tiny[@]}" per_device_batch_size=8 "$@"
  else
    local schedule=1f1b
    [ "$stages" -gt 2 ] && schedule=gpipe
    "${mpirun[@]}" -np "$stages" "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.stage="$stages" \
      pipeline_schedule=$schedule per_device_batch_size=$((8 / stages)) "$@"
  fi >>"$work/log" 2>&1 || { echo "FAIL: train $stages $*"; tail -20 "$work/log"; exit 1; }
}

same_losses() {  # same_losses FIRST LAST REFERENCE RUN: steps FIRST..LAST of RUN against REFERENCE's
  python3 - "$@" <<'PY' || status=1
import json, os, sys
first, last, reference, run = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
def losses(run):
    return {m["step"]: m["loss"] for m in map(json.loads, open(f"{run}/metrics.jsonl"))}
a, b = losses(reference), losses(run)
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in range(first, last + 1))
print(f"steps {first}-{last}: {os.path.basename(run)} against {os.path.basename(reference)}: "
      f"worst relative loss difference {worst:.2e} (bound 1e-5)")
sys.exit(worst > 1e-5)
PY
}

# same_tensors STEP SOURCE_RUN RUN: RUN's checkpoint of STEP holds SOURCE_RUN's tensors bitwise, and its
# metadata.json the same model (the whole model's parameter count, whatever the stages).
same_tensors() {
  local step
  step=$(printf 'step_%08d' "$1")
  python3 "$(dirname "$0")/checkpoint_tensors.py" --same "$2/checkpoints/$step" "$3/checkpoints/$step" ||
    { echo "FAIL: $(basename "$3")'s checkpoint of step $1 differs from $(basename "$2")'s"; exit 1; }
  python3 - "$2/checkpoints/$step" "$3/checkpoints/$step" <<'PY' || { echo "FAIL: metadata.json's model differs"; exit 1; }
import json, sys
a, b = (json.load(open(f"{path}/metadata.json"))["model"] for path in sys.argv[1:])
if a != b:
    sys.exit(f"{sys.argv[1]}: {a}; {sys.argv[2]}: {b}")
PY
}

# moved STEP SOURCE RUN STAGES [key=value ...]: RUN loads SOURCE's checkpoint of STEP on STAGES and, its
# `steps` being STEP, saves it again at once: bitwise SOURCE's.
moved() {
  local step=$1 source=$2 run=$3
  shift 3
  train "$@" steps="$step" load_full_state_path="$source/checkpoints/$(printf 'step_%08d' "$step")" run_dir="$run"
  same_tensors "$step" "$source" "$run"
}

# continued STEPS REFERENCE "STAGES [key=value ...]" RUN "STAGES [key=value ...]": both resume their own
# checkpoint and train on to STEPS; RUN's last two steps' losses against REFERENCE's.
continued() {
  local steps=$1 words
  read -r -a words <<<"$3"
  train "${words[@]}" steps="$steps" run_dir="$2"
  read -r -a words <<<"$5"
  train "${words[@]}" steps="$steps" run_dir="$4"
  same_losses $((steps - 1)) "$steps" "$2" "$4"
}

# chain NAME "STAGE_KEYS" "ONE_PROCESS_KEYS": the source at 2 stages; loaded by one process and at 4 stages,
# both trained on; the one process's step-5 state loaded at 2 stages, trained on.
chain() {
  local name=$1 staged one
  read -r -a staged <<<"$2"
  read -r -a one <<<"$3"
  local source="$work/${name}_2" reference="$work/${name}_1" four="$work/${name}_4" back="$work/${name}_1to2"
  train 2 "${staged[@]}" steps=3 run_dir="$source"
  moved 3 "$source" "$reference" 1 "${one[@]}"
  moved 3 "$source" "$four" 4 "${staged[@]}"
  echo "$name: saved at 2 stages, loaded at 1 process and at 4 stages: parameters and moments bitwise equal"
  continued 5 "$reference" "1 $3" "$four" "4 $2"
  moved 5 "$reference" "$back" 2 "${staged[@]}"
  echo "$name: saved by 1 process, loaded at 2 stages: parameters and moments bitwise equal"
  continued 7 "$reference" "1 $3" "$back" "2 $2"
}

chain per_layer "logits_via_embedding=false" "logits_via_embedding=false"
# Stacked at 2 and 4 stages, per layer in one process; tied embeddings (the preset's). The stacked stage
# ranks start from the one process's initial weights: the first three steps' losses match its own run's.
train 1 scan_layers=false steps=3 run_dir="$work/scratch_1"
chain stacked "scan_layers=true" "scan_layers=false"
same_losses 1 3 "$work/scratch_1" "$work/stacked_2"

# A single-file checkpoint (format 2, stacked: tests/reference/checkpoint_v2) at 2 stages, stacked and per
# layer: step 3 has the loss its own run had (1e-6 relative, as tests/e2e/checkpoint_v1.sh).
fixture="$(dirname "$0")/../reference/checkpoint_v2/qwen3_stacked"
for scan in true false; do
  "${mpirun[@]}" -np 2 "$meshtrain" train "$fixture/config.yaml" load_full_state_path="$fixture/step_00000002" \
    mesh.stage=2 pipeline_schedule=gpipe per_device_batch_size=1 scan_layers=$scan run_dir="$work/single_file_$scan" \
    >>"$work/log" 2>&1 || { echo "FAIL: the single-file checkpoint at 2 stages (scan_layers=$scan)"; tail -20 "$work/log"; exit 1; }
  python3 - "$fixture" "$work/single_file_$scan" "$scan" <<'PY' || status=1
import json, sys
def losses(run):
    return {m["step"]: m["loss"] for m in map(json.loads, open(f"{run}/metrics.jsonl"))}
saved, loaded = losses(sys.argv[1])[3], losses(sys.argv[2])[3]
difference = abs(saved - loaded) / abs(saved)
print(f"format-2 checkpoint at 2 stages (scan_layers={sys.argv[3]}): step 3 loss {loaded:.9f} against {saved:.9f} "
      f"({difference:.1e}, bound 1e-6)")
sys.exit(difference > 1e-6)
PY
done

# A checkpoint of a 4-layer model loaded by a 6-layer run at 2 stages: every rank names the first tensor the
# checkpoint lacks of the whole model (whichever stage holds it) and the key that differs.
rc=0
"${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${tiny[@]/base_num_decoder_layers=4/base_num_decoder_layers=6}" \
  mesh.stage=2 per_device_batch_size=4 logits_via_embedding=false steps=4 \
  load_full_state_path="$work/per_layer_2/checkpoints/step_00000003" run_dir="$work/other_model" \
  >"$work/other_model.log" 2>&1 || rc=$?
needle="missing from the checkpoint (fix: the checkpoint was saved from a different model (base_num_decoder_layers 4 in the checkpoint, 6 here)"
ranks=$(grep -F -- "$needle" "$work/other_model.log" | sed -n 's/.*meshtrain: error (rank \([0-9]*\)).*/\1/p' |
  sort -u | wc -l)
if [ "$rc" -ne 1 ] || [ "$ranks" -ne 2 ]; then
  echo "FAIL: another model's checkpoint: exit status $rc (expected 1), $ranks of 2 ranks named it:"
  cat "$work/other_model.log"
  status=1
else
  echo "another model's checkpoint: refused by both stage ranks: $(grep -m1 -F -- "$needle" "$work/other_model.log")"
fi
exit $status
