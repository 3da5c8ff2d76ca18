#!/usr/bin/env bash
# Failure behaviour of distributed runs (issue 5): a rank that stalls makes the others exit within
# collective_timeout_s naming the collective, the step and the missing rank; a NaN on one rank is seen by
# every rank before the optimizer step: the run stops naming the step and rank, or (skip_nonfinite_steps)
# skips the step with parameters unchanged; set-up errors (different configs, a mesh that is not the rank
# count, a bad key, an expert degree that does not fit the experts) are printed by every rank before the job
# ends.
# Usage: failures.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny+=(enable_checkpointing=false per_device_batch_size=2 learning_rate=1e-2)
status=0
fail() { echo "FAIL: $*"; status=1; }

# A stall of 120 s on rank 1 at step 2 with a 5 s timeout: the timeout, not the end of the stall, must end
# the job. The bound is the stall itself (the job, start-up included, ended while rank 1 still slept), not a
# guess at how fast a loaded machine starts mpirun.
stall_s=120
start=$(date +%s)
if MESHTRAIN_FAULT=stall:2:1:$stall_s timeout -k 5 $((stall_s + 60)) "${mpirun[@]}" -np 2 -x MESHTRAIN_FAULT "$meshtrain" \
  train qwen3-tiny "${tiny[@]}" mesh.data=2 steps=4 collective_timeout_s=5 run_dir="$work/stall" >"$work/stall.log" 2>&1; then
  fail "a stalled rank did not end the job"
fi
elapsed=$(($(date +%s) - start))
echo "stall: job ended after ${elapsed} s (timeout 5 s, stall ${stall_s} s)"
[ "$elapsed" -lt "$stall_s" ] || fail "the job took ${elapsed} s to end: the stall ended it, not the timeout"
grep -q "timed out" "$work/stall.log" || fail "no timeout message"
grep -q "step 2" "$work/stall.log" || fail "the message does not name step 2"
grep -qE "rank(s)? 1 did not arrive" "$work/stall.log" || fail "the message does not name rank 1"
grep -m1 "timed out" "$work/stall.log" || true

# A NaN loss on rank 1 at step 3: every rank stops with the step and the rank.
if MESHTRAIN_FAULT=nan_loss:3:1 "${mpirun[@]}" -np 2 -x MESHTRAIN_FAULT "$meshtrain" train qwen3-tiny "${tiny[@]}" \
  mesh.data=2 steps=5 run_dir="$work/nan" >"$work/nan.log" 2>&1; then
  fail "a NaN loss did not stop the run"
fi
grep -q "training step 3, rank 1: expected a finite loss" "$work/nan.log" || fail "no 'step 3, rank 1' message"
test "$(wc -l <"$work/nan/metrics.jsonl")" -eq 2 || fail "steps after the NaN were logged"

# A NaN gradient on rank 1 at step 3 with skip_nonfinite_steps: both ranks skip the step (parameters unchanged,
# tested in Plan.NonFiniteGradientLeavesParametersUnchanged), the run finishes and logs 4 of 5 steps.
MESHTRAIN_FAULT=nan_gradient:3:1 "${mpirun[@]}" -np 2 -x MESHTRAIN_FAULT "$meshtrain" train qwen3-tiny "${tiny[@]}" \
  mesh.data=2 steps=5 skip_nonfinite_steps=true run_dir="$work/skip" >"$work/skip.log" 2>&1 || fail "the skipping run failed"
grep -q "step 3: non-finite gradient, step skipped" "$work/skip.log" || fail "no skip message"
test "$(wc -l <"$work/skip/metrics.jsonl")" -eq 4 || fail "expected 4 logged steps"

# A NaN loss on one rank of a tensor pair, skipped: both ranks skip (the decision is world-wide, not per data
# group), and with data 2 the reductions started during the last backward finish before the next step.
for mesh in mesh.tensor=2 mesh.data=2; do
  MESHTRAIN_FAULT=nan_loss:3:1 timeout -k 5 120 "${mpirun[@]}" -np 2 -x MESHTRAIN_FAULT "$meshtrain" train qwen3-tiny \
    "${tiny[@]}" $mesh steps=5 skip_nonfinite_steps=true run_dir="$work/skip_loss_$mesh" >"$work/skip_loss.log" 2>&1 ||
    fail "a skipped NaN loss with $mesh failed: $(tail -2 "$work/skip_loss.log")"
  grep -q "training step 3, rank 1: non-finite loss, step skipped" "$work/skip_loss.log" || fail "no skip message ($mesh)"
done

# Set-up errors that every rank sees alike are printed by every rank before the job ends (the ranks agree
# on them first), and the job exits 1. count_ranks LOG TEXT: how many different ranks printed TEXT.
count_ranks() { grep -F -- "$2" "$1" | sed -n 's/.*meshtrain: error (rank \([0-9]*\)).*/\1/p' | sort -u | wc -l; }
expect_refused() {  # NAME RANKS TEXT COMMAND...: the job fails with status 1 and every rank printed TEXT
  local name=$1 ranks=$2 text=$3 rc=0
  shift 3
  timeout -k 5 120 "$@" >"$work/$name.log" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] || fail "$name: exit status $rc, expected 1: $(tail -3 "$work/$name.log")"
  [ "$(count_ranks "$work/$name.log" "$text")" -eq "$ranks" ] ||
    fail "$name: not every one of $ranks ranks printed '$text': $(cat "$work/$name.log")"
}
start=$(date +%s)
# Different configs on the ranks: every rank sees every identity hash.
expect_refused mixed 2 "binary and resolved config" "${mpirun[@]}" -np 1 "$meshtrain" train qwen3-tiny "${tiny[@]}" \
  mesh.data=2 steps=1 run_dir="$work/a" : -np 1 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.data=2 steps=2 run_dir="$work/a"
# A mesh that is not the number of ranks, a tensor degree that does not divide the heads, a bad key.
expect_refused mesh 2 "expected a product of 2" "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${tiny[@]}" \
  mesh.data=4 steps=1 run_dir="$work/mesh"
expect_refused heads 3 "base_num_query_heads" "${mpirun[@]}" -np 3 "$meshtrain" train qwen3-tiny "${tiny[@]}" \
  mesh.tensor=3 steps=1 run_dir="$work/heads"
expect_refused bad_key 2 "learning_rat" "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.data=2 \
  learning_rat=1 run_dir="$work/key"
# Context parallelism: a row length the reorder cannot cut (dual_chunk_swap: a multiple of 2C; striped: of C)
# and a context degree that does not divide the ranks are refused by every rank before the run directory
# exists.
short=("${tiny[@]/max_target_length=32/max_target_length=18}")
expect_refused cp_dual_chunk_swap 2 "config key 'max_target_length' (with mesh.context=2 and context_parallel_reorder=dual_chunk_swap): expected a multiple of 2 x mesh.context = 4" \
  "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${short[@]}" mesh.context=2 steps=1 run_dir="$work/cp_dual"
short=("${tiny[@]/max_target_length=32/max_target_length=19}")
expect_refused cp_striped 2 "(with mesh.context=2 and context_parallel_reorder=striped): expected a multiple of mesh.context = 2" \
  "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${short[@]}" mesh.context=2 context_parallel_reorder=striped \
  steps=1 run_dir="$work/cp_striped"
expect_refused cp_devices 2 "expected axes whose product divides the 2 devices of 2 processes started by mpirun, found data=-1 fsdp=1 context=3" \
  "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.data=-1 mesh.context=3 steps=1 \
  run_dir="$work/cp_devices"
# Expert parallelism: an expert degree that does not divide the routed experts, and one on a dense model.
expect_refused ep_divides 3 "config key 'mesh.expert': expected a divisor of num_experts (8)" \
  "${mpirun[@]}" -np 3 "$meshtrain" train deepseek-tiny "${tiny[@]}" mesh.expert=3 steps=1 run_dir="$work/ep_divides"
expect_refused ep_dense 2 "config key 'mesh.expert': expected 1 for a dense model (num_experts=0)" \
  "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.expert=2 steps=1 run_dir="$work/ep_dense"
# Pipeline stages: scan_layers over a stage's non-contiguous chunks, a stage degree that does not divide the
# ranks, fewer micro-batches than stages for 1f1b, a split that does not place the layers, more chunks than
# layers, and num_pipeline_repeats 0.
expect_refused pp_scan_repeats 2 "config key 'scan_layers': expected false with num_pipeline_repeats > 1" \
  "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${tiny[@]/base_num_decoder_layers=2/base_num_decoder_layers=4}" \
  mesh.stage=2 num_pipeline_repeats=2 pipeline_schedule=interleaved_1f1b scan_layers=true \
  gradient_accumulation_steps=2 steps=1 run_dir="$work/pp_scan_repeats"
expect_refused pp_world 3 "config key 'mesh': expected a product of 3 (the devices of 3 processes started by mpirun), found data=1 stage=2" \
  "${mpirun[@]}" -np 3 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.stage=2 gradient_accumulation_steps=2 \
  steps=1 run_dir="$work/pp_world"
expect_refused pp_micro_batches 2 "gradient_accumulation_steps: expected at least mesh.stage=2 micro-batches" \
  "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.stage=2 steps=1 run_dir="$work/pp_micro_batches"
expect_refused pp_split 2 "config key 'pipeline_layers_per_chunk': expected counts summing to base_num_decoder_layers" \
  "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.stage=2 pipeline_layers_per_chunk=[1,2] \
  steps=1 run_dir="$work/pp_split"
expect_refused pp_chunks 3 "config keys 'mesh.stage' / 'num_pipeline_repeats': expected at most base_num_decoder_layers" \
  "${mpirun[@]}" -np 3 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.stage=3 steps=1 run_dir="$work/pp_chunks"
expect_refused pp_repeats 2 "config key 'num_pipeline_repeats': expected 1 or more" \
  "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.stage=2 num_pipeline_repeats=0 steps=1 \
  run_dir="$work/pp_repeats"
for name in cp_dual cp_striped cp_devices ep_divides ep_dense pp_scan_repeats pp_world pp_micro_batches pp_split pp_chunks pp_repeats; do
  [ ! -e "$work/$name" ] || fail "$name: the run directory was made before the refusal"
done
# A set-up error of one rank only (the plan file it is told to verify is missing): that rank names the file,
# the other says it stops because of it, and both end with status 1.
expect_refused one_rank 1 "no_such_plan" "${mpirun[@]}" -np 1 "$meshtrain" train qwen3-tiny "${tiny[@]}" \
  mesh.data=2 steps=1 run_dir="$work/one" : -np 1 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.data=2 steps=1 \
  run_dir="$work/one" plan_in="$work/no_such_plan"
grep -q "meshtrain: error (rank 0): stopping: 1 of 2 ranks failed during set-up (rank 1's message is above)" \
  "$work/one_rank.log" || fail "rank 0 did not say why it stopped: $(cat "$work/one_rank.log")"
echo "set-up errors: printed by every rank that saw them, refused after $(($(date +%s) - start)) s"
exit $status
