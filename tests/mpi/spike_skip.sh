#!/usr/bin/env bash
# Spike skipping under mpirun (issue 41, skip_step_on_spikes): a loss spike injected on one rank
# (MESHTRAIN_FAULT=spike_loss) is skipped by every rank alike on data, tensor and pipeline meshes (the
# decision is each rank's own, on the step's global loss): the step is logged with why, and the parameters and
# Adam moments after it are bitwise those before it. The spike window survives a resume (a run resumed just
# before the spike decides and trains as the uninterrupted one, and the skipped batch is consumed), and
# skip_step_max_consecutive spikes in a row stop the run with status 1, the message on every rank and a
# checkpoint of the state before the last one.
# Usage: spike_skip.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
status=0
fail() { echo "FAIL: $*"; status=1; }
spike=(skip_step_on_spikes=true learning_rate_schedule_steps=10 learning_rate=1e-2 per_device_batch_size=2
  max_num_checkpoints_to_keep=0 collective_timeout_s=60)
train() {  # train NAME FAULT [key=value ...]: 2 ranks on the tiny keys; the exit status is the job's
  local name=$1 fault=$2
  shift 2
  MESHTRAIN_FAULT=$fault timeout -k 5 300 "${mpirun[@]}" -np 2 -x MESHTRAIN_FAULT "$meshtrain" train qwen3-tiny \
    "${tiny[@]}" "${spike[@]}" run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1
}
same() { python3 "$(dirname "$0")/checkpoint_tensors.py" --same "$work/$1/checkpoints/$2" "$work/$3/checkpoints/$4"; }
field() {  # field RUN_DIR FIELD: each step's FIELD in metrics.jsonl ("-" where it has none)
  python3 -c 'import json,sys; print(" ".join(str(json.loads(l).get(sys.argv[2], "-")) for l in open(sys.argv[1])))' \
    "$work/$1/metrics.jsonl" "$2"
}
skipped_steps() {
  python3 -c 'import json,sys; print(" ".join(str(r["step"]) for r in map(json.loads, open(sys.argv[1])) if "skipped" in r))' \
    "$work/$1/metrics.jsonl"
}

# Each mesh with the rank the spike is put on; under stages a first-stage rank: the hook multiplies the loss of
# that rank's rows, which the last stage computes. skip_step_interval 6: the check starts once the window holds
# max(2, 6 / 2) - 1 = 2 losses (MaxText's rule), at step 3.
for case in "mesh.data=2:1" "mesh.tensor=2:1" "mesh.stage=2 gradient_accumulation_steps=2:0"; do
  mesh=${case%:*} rank=${case##*:} name=$(echo "${case%:*}" | tr ' =.' '___')
  # shellcheck disable=SC2086
  train "${name}_clean" "" $mesh skip_step_interval=6 steps=6 checkpoint_period=1 || fail "$mesh: the clean run failed: $(tail -3 "$work/${name}_clean.log")"
  # shellcheck disable=SC2086
  train "${name}_spike" "spike_loss:4:$rank" $mesh skip_step_interval=6 steps=4 ||
    fail "$mesh: the run with a spike failed: $(tail -3 "$work/${name}_spike.log")"
  [ "$(skipped_steps "${name}_spike")" = "4" ] || fail "$mesh: skipped steps '$(skipped_steps "${name}_spike")', expected 4"
  grep -q "training step 4: loss spike, step skipped (loss .* > mean .* + 6 x std .* of the last 3 losses)" \
    "$work/${name}_spike.log" || fail "$mesh: no skip message: $(grep -m1 'step 4' "$work/${name}_spike.log")"
  grep -q '"skipped": *"loss spike: loss' "$work/${name}_spike/metrics.jsonl" || fail "$mesh: no 'skipped' field"
  same "${name}_clean" step_00000003 "${name}_spike" step_00000004 >"$work/${name}_same.log" ||
    fail "$mesh: the skipped step changed the state: $(cat "$work/${name}_same.log")"
  echo "$mesh (spike on rank $rank): skipped steps $(skipped_steps "${name}_spike"); losses $(field "${name}_spike" loss)"
done

# The window in the checkpoint: interval 8 checks from 3 losses on, so a run resumed after step 4 sees the spike
# at step 5 only with its 4 saved losses.
window=(mesh.data=2 skip_step_interval=8 steps=6)
train whole "spike_loss:5:1" "${window[@]}" || fail "the uninterrupted run failed: $(tail -3 "$work/whole.log")"
train legs "" "${window[@]/steps=6/steps=4}" || fail "the first leg failed: $(tail -3 "$work/legs.log")"
train legs "spike_loss:5:1" "${window[@]}" || fail "the resumed leg failed: $(tail -3 "$work/legs.log")"
[ "$(skipped_steps whole)" = "5" ] || fail "the uninterrupted run skipped '$(skipped_steps whole)', expected 5"
for what in step loss skipped batch_crc32c; do
  [ "$(field legs $what)" = "$(field whole $what)" ] ||
    fail "resumed: $what '$(field legs $what)', uninterrupted '$(field whole $what)'"
done
[ "$(field whole batch_crc32c | cut -d' ' -f6)" = "$(field mesh_data_2_clean batch_crc32c | cut -d' ' -f6)" ] ||
  fail "step 6 after the skip did not read the clean run's step 6 batch: the skipped batch was not consumed"

# Spikes from step 4 on with skip_step_max_consecutive=3: each skipped spike enters the window, so the threshold
# rises; with interval 8 and 1 standard deviation three of them in a row are still spikes (step 4: 3 losses a
# before it; step 5: 3 a and 1 spike S, mean S / 4, std S / 2; step 6: mean 2 S / 5, std 0.55 S). The third
# stops the run, status 1, every rank names it, and the checkpoint of step 5 holds the state of step 3 (both
# skips changed nothing).
rc=0
train in_a_row "spike_loss:4:1:5" mesh.data=2 steps=8 skip_step_interval=8 skip_step_scaling_factor=1 \
  skip_step_max_consecutive=3 || rc=$?
[ "$rc" -eq 1 ] || fail "three spikes in a row: exit status $rc, expected 1: $(tail -3 "$work/in_a_row.log")"
message="training step 6: expected at most skip_step_max_consecutive=3 loss spikes in a row, found 3 in a row (steps 4..6)"
ranks_saying=$(grep -F -- "$message" "$work/in_a_row.log" | sed -n 's/.*meshtrain: error (rank \([0-9]*\)).*/\1/p' | sort -u | wc -l)
[ "$ranks_saying" -eq 2 ] || fail "not both ranks said '$message': $(grep -m2 error "$work/in_a_row.log")"
[ "$(newest_committed "$work/in_a_row")" = 5 ] || fail "newest checkpoint $(newest_committed "$work/in_a_row"), expected 5"
[ "$(skipped_steps in_a_row)" = "4 5" ] || fail "logged skips '$(skipped_steps in_a_row)', expected '4 5'"
same mesh_data_2_clean step_00000003 in_a_row step_00000005 >"$work/in_a_row_same.log" ||
  fail "the skips in a row changed the state: $(cat "$work/in_a_row_same.log")"
grep -m1 -F "$message" "$work/in_a_row.log" || true

[ "$status" -eq 0 ] && echo "spike_skip: all checks passed"
exit "$status"
