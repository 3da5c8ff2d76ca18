#!/usr/bin/env bash
# One rank of a 2-rank FSDP run killed (SIGKILL: no handler, no cleanup) in the middle of a step and at each
# phase of a distributed save (issue 16, item 3): the job ends, the newest committed checkpoint is the one
# the phase allows (a half-written save never counts), and resuming from it reproduces the uninterrupted
# run's losses bit for bit (the same mesh, so the same sums in the same order).
# Usage: rank_faults.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
keys=("${tiny[@]}" mesh.fsdp=2 per_device_batch_size=2 learning_rate=1e-2 steps=6 checkpoint_period=2
  enable_checkpointing=true max_num_checkpoints_to_keep=0 collective_timeout_s=60)
status=0
fail() { echo "FAIL: $*"; status=1; }

train() {  # train RUN_DIR [env ...]: the 2-rank run; its exit status
  local run_dir=$1
  shift
  env "$@" timeout -k 5 300 "${mpirun[@]}" -np 2 -x MESHTRAIN_FAULT -x MESHTRAIN_CHECKPOINT_FAULT "$meshtrain" \
    train qwen3-tiny "${keys[@]}" run_dir="$run_dir" >>"$run_dir.log" 2>&1
}

train "$work/base" MESHTRAIN_FAULT= MESHTRAIN_CHECKPOINT_FAULT= || { fail "the uninterrupted run"; cat "$work/base.log"; exit 1; }
base_losses=$(losses "$work/base/metrics.jsonl")

# case NAME EXPECTED_NEWEST ENV...: killed by ENV, then resumed with no fault.
case_of() {
  local name=$1 expected=$2 rc=0 start
  shift 2
  start=$(date +%s)
  train "$work/$name" "$@" MESHTRAIN_FAULT="${MESHTRAIN_FAULT_CASE:-}" || rc=$?
  # mpirun ends the job when a rank dies (its status then 128 + 9); the 300 s guard is only against a hang.
  if [ "$rc" -eq 0 ]; then
    fail "$name: the job finished although a rank was killed"
  elif [ $(($(date +%s) - start)) -ge 300 ]; then
    fail "$name: the job did not end by itself (the 300 s guard ended it)"
  fi
  local newest
  newest=$(newest_committed "$work/$name")
  [ "$newest" = "$expected" ] || fail "$name: newest committed checkpoint $newest, expected $expected"
  if ! train "$work/$name" MESHTRAIN_FAULT= MESHTRAIN_CHECKPOINT_FAULT=; then
    fail "$name: the resume failed"
    tail -5 "$work/$name.log"
    return
  fi
  grep -q "resuming from .*step_0*$expected" "$work/$name.log" || fail "$name: did not resume from step $expected"
  local resumed
  resumed=$(losses "$work/$name/metrics.jsonl")
  [ "$resumed" = "$base_losses" ] || fail "$name: losses after the resume differ: $resumed vs $base_losses"
  echo "$name: job ended (status $rc), newest committed step $newest, resumed to the uninterrupted losses"
}

MESHTRAIN_FAULT_CASE=kill:5:1 case_of mid_step 4 MESHTRAIN_CHECKPOINT_FAULT=
case_of shard_half_written 2 MESHTRAIN_CHECKPOINT_FAULT=shard_half_written:1:4
case_of metadata_written 2 MESHTRAIN_CHECKPOINT_FAULT=metadata_written:0:4
case_of before_commit 2 MESHTRAIN_CHECKPOINT_FAULT=before_commit:0:4
case_of after_commit 4 MESHTRAIN_CHECKPOINT_FAULT=after_commit:0:4
# A disk that fills on one rank during a save: a run stopped after its step-2 checkpoint (rank 1 killed in
# step 3) is resumed with rank 1's file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail with EFBIG as
# a full disk fails them with ENOSPC) below its shard. Every rank fails the step-4 save naming rank 1's
# file, step 2 stays the newest, and resuming without the limit reproduces the uninterrupted losses.
train "$work/disk_full" MESHTRAIN_FAULT=kill:3:1 MESHTRAIN_CHECKPOINT_FAULT= && fail "disk_full: the kill in step 3"
shard_kib=$(( $(stat -c %s "$work/disk_full/checkpoints/step_00000002/shards/rank_00001.safetensors") / 1024 ))
rc=0
timeout -k 5 300 "${mpirun[@]}" -np 2 bash -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then trap "" XFSZ; ulimit -f "$1"; fi; shift; exec "$@"' _ \
  $((shard_kib / 2)) "$meshtrain" train qwen3-tiny "${keys[@]}" run_dir="$work/disk_full" \
  >>"$work/disk_full.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "disk_full: the run went on although rank 1 could not write its shard"
grep -q "rank_00001.safetensors" "$work/disk_full.log" || fail "disk_full: no message naming rank 1's shard"
grep -q "ulimit -f" "$work/disk_full.log" || fail "disk_full: the message does not say what to fix"
[ "$(newest_committed "$work/disk_full")" = 2 ] || fail "disk_full: newest committed checkpoint is not step 2"
if ! train "$work/disk_full" MESHTRAIN_FAULT= MESHTRAIN_CHECKPOINT_FAULT=; then
  fail "disk_full: the resume failed"
elif [ "$(losses "$work/disk_full/metrics.jsonl")" != "$base_losses" ]; then
  fail "disk_full: losses after the resume differ"
else
  echo "disk_full: the save failed on every rank (status $rc) naming rank 1's shard; resumed to the uninterrupted losses"
fi
exit $status
