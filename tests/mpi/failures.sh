#!/usr/bin/env bash
# Failure behaviour of distributed runs (issue 5): a rank that stalls makes the others exit within
# collective_timeout_s naming the collective, the step and the missing rank; a NaN on one rank is seen by
# every rank before the optimizer step: the run stops naming the step and rank, or (skip_nonfinite_steps)
# skips the step with parameters unchanged; ranks started with different configs are refused on every rank.
# Usage: failures.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny+=(enable_checkpointing=false per_device_batch_size=2 learning_rate=1e-2)
status=0
fail() { echo "FAIL: $*"; status=1; }

# A stall of 60 s on rank 1 at step 2 with a 5 s timeout: rank 0 must end the job well before the stall ends.
start=$(date +%s)
if MESHTRAIN_FAULT=stall:2:1:60 timeout -k 5 50 "${mpirun[@]}" -np 2 -x MESHTRAIN_FAULT "$meshtrain" train qwen3-tiny \
  "${tiny[@]}" mesh.data=2 steps=4 collective_timeout_s=5 run_dir="$work/stall" >"$work/stall.log" 2>&1; then
  fail "a stalled rank did not end the job"
fi
elapsed=$(($(date +%s) - start))
echo "stall: job ended after ${elapsed} s (timeout 5 s, stall 60 s)"
[ "$elapsed" -lt 40 ] || fail "the job took ${elapsed} s to end"
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

# Different configs on the ranks: refused at start on every rank.
if timeout -k 5 60 "${mpirun[@]}" -np 1 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.data=2 steps=1 run_dir="$work/a" : \
  -np 1 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.data=2 steps=2 run_dir="$work/a" >"$work/mixed.log" 2>&1; then
  fail "ranks with different configs were accepted"
fi
grep -q "binary and resolved config" "$work/mixed.log" || fail "no identity mismatch message"
# A mesh that is not the number of ranks, and a tensor degree that does not divide the heads: the same clear
# error on every rank, and the job ends at once.
start=$(date +%s)
if timeout -k 5 60 "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.data=4 steps=1 \
  run_dir="$work/mesh" >"$work/mesh.log" 2>&1; then
  fail "a mesh of 4 on 2 ranks was accepted"
fi
[ "$(grep -c "expected a product of 2" "$work/mesh.log")" -eq 2 ] || fail "not every rank named the mesh product"
if timeout -k 5 60 "${mpirun[@]}" -np 3 "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.tensor=3 steps=1 \
  run_dir="$work/heads" >"$work/heads.log" 2>&1; then
  fail "a tensor degree of 3 for 4 heads was accepted"
fi
grep -q "base_num_query_heads" "$work/heads.log" || fail "the heads error does not name the key"
echo "bad meshes: refused on every rank after $(($(date +%s) - start)) s"
exit $status
