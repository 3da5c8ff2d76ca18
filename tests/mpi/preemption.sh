#!/usr/bin/env bash
# Preemption (issue 40, items 1, 3 and 4): SIGUSR1 and SIGTERM, delivered as SLURM delivers them, and the
# wall-time limit (exit_duration_in_mins) make every rank stop at the next step boundary, commit a
# checkpoint and exit 75 ("requeue me"); the requeued run resumes from it to the uninterrupted run's losses.
# - One process, each signal sent to it once its third step is in metrics.jsonl (an event, not a timer);
#   the run waits in step 4 until a signal has come (MESHTRAIN_FAULT=hold:4), so a poller delayed on a loaded
#   machine cannot send it after a 40-step run has ended (a CI run once saw exit status 0 for that), and every
#   signalled run stops after step 4.
# - mpirun, 2 ranks: SIGUSR1 to mpirun (which forwards it at once: the sbatch route); SIGTERM to every rank
#   (srun signals every task); SIGTERM to mpirun (Open MPI 4.1 forwards it and kills the ranks a second later:
#   the window is measured, and whatever it cut, the newest committed checkpoint resumes); one rank
#   signalled alone mid-step (MESHTRAIN_FAULT=sigusr1): both stop at the same boundary; a second signal
#   right after the first stop message: whatever it cuts, the newest committed checkpoint resumes.
# - A signal before the first step: exit 75, nothing saved. exit_duration_in_mins: exit 75 with its reason.
# - A full disk at the preemption save (rank 1's file-size limit below its shard): exit 1 naming rank 1's
#   shard, no checkpoint committed, and a plain restart trains to the uninterrupted losses.
# - Steps lost: a run killed (SIGKILL, no handler) after its metrics went past its last periodic checkpoint:
#   the restart names the steps it trains again, and reproduces the uninterrupted losses.
# - Restart on fewer ranks: 4 ranks stopped by SIGUSR1 resume on 2, the resume naming the ranks that saved
#   the checkpoint and the gradient accumulation derived to keep the global batch, losses within 1e-5.
# Usage: preemption.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
keys=("${tiny[@]}" mesh.data=-1 learning_rate=1e-2 max_num_checkpoints_to_keep=0 collective_timeout_s=60)
status=0
export MESHTRAIN_FAULT=  # each case sets its own
fail() {
  echo "FAIL: $*"
  status=1
}

# run NAME RANKS [key=value ...]: a run in the background ($pid: meshtrain or mpirun); 8 rows a step
# (per_device_batch_size 8 / RANKS unless $rows_per_rank says), $steps steps (40 unless set).
run() {
  local name=$1 ranks=$2
  shift 2
  local batch=(per_device_batch_size=${rows_per_rank:-$((8 / ranks))} steps=${steps:-40})
  if [ "$ranks" -eq 1 ]; then
    "$meshtrain" train qwen3-tiny "${keys[@]}" "${batch[@]}" run_dir="$work/$name" "$@" >>"$work/$name.log" 2>&1 &
  else
    "${mpirun[@]}" -np "$ranks" -x MESHTRAIN_FAULT "$meshtrain" train qwen3-tiny "${keys[@]}" "${batch[@]}" \
      run_dir="$work/$name" "$@" >>"$work/$name.log" 2>&1 &
  fi
  pid=$!
}
finish() {  # finish: waits for $pid; its exit status in $rc
  rc=0
  wait "$pid" || rc=$?
}
# wait_for_step NAME STEP: until metrics.jsonl holds STEP lines (at most 2400 polls of 50 ms, and only while
# the run lives).
wait_for_step() {
  local polls
  for ((polls = 0; polls < 2400; polls++)); do
    [ -f "$work/$1/metrics.jsonl" ] && [ "$(wc -l <"$work/$1/metrics.jsonl")" -ge "$2" ] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
# wait_for_text NAME TEXT: until the log holds TEXT (bounded as above).
wait_for_text() {
  local polls
  for ((polls = 0; polls < 2400; polls++)); do
    grep -qF -- "$2" "$work/$1.log" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
close_losses() {  # close_losses REFERENCE RUN NAME: every step's loss within 1e-5 relative
  python3 - "$@" <<'PY'
import json, sys
def losses(run):
    return {m["step"]: m["loss"] for m in map(json.loads, open(f"{run}/metrics.jsonl"))}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
print(f"{sys.argv[3]}: worst relative loss difference {worst:.2e} against {sys.argv[1].split('/')[-1]} (bound 1e-5)")
sys.exit(worst > 1e-5)
PY
}
last_step() { tail -1 "$work/$1/metrics.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])'; }

# check_stop NAME EXPECTED_RC: the run ended with EXPECTED_RC after committing the checkpoint of its last
# logged step, said so with the time from the signal, and a restart (same ranks, no signal) trains to the
# uninterrupted losses bit for bit.
check_stop() {
  local name=$1 expected=$2 ranks=$3 step
  [ "$rc" -eq "$expected" ] || { fail "$name: exit status $rc, expected $expected"; tail -5 "$work/$name.log"; return; }
  step=$(last_step "$name")
  [ "$(newest_committed "$work/$name")" = "$step" ] ||
    { fail "$name: newest committed checkpoint $(newest_committed "$work/$name"), not the last step $step"; return; }
  grep -q "stopped after step $step: checkpoint .* committed .* after the first rank's signal; exit status 75" \
    "$work/$name.log" || { fail "$name: no line with the time from the signal to the commit"; tail -5 "$work/$name.log"; return; }
  run "$name" "$ranks"
  finish
  [ "$rc" -eq 0 ] || { fail "$name: the restart failed ($rc)"; tail -5 "$work/$name.log"; return; }
  [ "$(losses "$work/$name/metrics.jsonl")" = "$(losses "$work/base_$ranks/metrics.jsonl")" ] ||
    { fail "$name: losses after the restart differ from the uninterrupted run's"; return; }
  echo "$name: exit status $expected after step $step; $(grep -o "committed [0-9.]* s after the first rank's signal" "$work/$name.log" | head -1); the restart reproduces the uninterrupted losses"
}

for ranks in 1 2; do
  run "base_$ranks" "$ranks"
  finish
  [ "$rc" -eq 0 ] || { fail "the uninterrupted $ranks-rank run ($rc)"; cat "$work/base_$ranks.log"; exit 1; }
done

# One process: each signal once the third step is logged.
for signal in USR1 TERM; do
  MESHTRAIN_FAULT=hold:4 run "one_$signal" 1
  wait_for_step "one_$signal" 3 || fail "one_$signal: step 3 never logged"
  kill -s "$signal" "$pid"
  finish
  check_stop "one_$signal" 75 1
done

# mpirun: SIGUSR1 to mpirun (forwarded to the ranks), SIGTERM to every rank (as srun delivers it).
MESHTRAIN_FAULT=hold:4 run mpirun_USR1 2
wait_for_step mpirun_USR1 3 || fail "mpirun_USR1: step 3 never logged"
kill -s USR1 "$pid"
finish
check_stop mpirun_USR1 75 2
MESHTRAIN_FAULT=hold:4 run ranks_TERM 2
wait_for_step ranks_TERM 3 || fail "ranks_TERM: step 3 never logged"
pkill -TERM -P "$pid" -f "meshtrain train" || fail "ranks_TERM: no rank to signal"
finish
check_stop ranks_TERM 75 2

# SIGTERM to mpirun: Open MPI 4.1 forwards it after odls_base_sigkill_timeout (1 s) and kills the ranks as
# long again later; a stop and a save must fit in that second, and need not (a loaded machine once missed it
# with this tiny model). Rank 0 stalls 4 s in step 5, so the kill lands before the stop's save: what must
# hold whatever the timing is that no half-written save counts and the newest committed checkpoint (the
# periodic one) resumes to the uninterrupted losses. The window is measured: SIGTERM to mpirun's end.
MESHTRAIN_FAULT=stall:5:0:4 run mpirun_TERM 2 checkpoint_period=2
wait_for_step mpirun_TERM 3 || fail "mpirun_TERM: step 3 never logged"
term_sent=$(date +%s.%N)
kill -s TERM "$pid"
finish
window=$(python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$term_sent")
newest=$(newest_committed "$work/mpirun_TERM")
run mpirun_TERM 2 checkpoint_period=2
finish
if [ "$rc" -ne 0 ] || [ "$(losses "$work/mpirun_TERM/metrics.jsonl")" != "$(losses "$work/base_2/metrics.jsonl")" ]; then
  fail "mpirun_TERM: the restart from committed step $newest failed ($rc) or its losses differ"
else
  echo "mpirun_TERM: mpirun ended its ranks ${window} s after its SIGTERM (a stop and save must fit there:" \
    "the SIGUSR1 route has no such limit); newest committed step $newest resumes to the uninterrupted losses"
fi

# One rank signalled alone during step 3: both ranks stop at the boundary after it.
MESHTRAIN_FAULT=sigusr1:3:1 run one_rank 2
finish
[ "$(last_step one_rank)" = 3 ] || fail "one_rank: the ranks stopped after step $(last_step one_rank), not 3"
check_stop one_rank 75 2

# A second signal (SIGTERM to mpirun, which then kills the ranks) as soon as the first stop is announced:
# the save is cut wherever it was; the newest committed checkpoint still resumes to the uninterrupted losses.
MESHTRAIN_FAULT=hold:4 run second_signal 2
wait_for_step second_signal 3 || fail "second_signal: step 3 never logged"
kill -s USR1 "$pid"
wait_for_text second_signal "stopping at the boundary" && kill -s TERM "$pid" 2>/dev/null
finish
newest=$(newest_committed "$work/second_signal")
run second_signal 2
finish
if [ "$rc" -ne 0 ] || [ "$(losses "$work/second_signal/metrics.jsonl")" != "$(losses "$work/base_2/metrics.jsonl")" ]; then
  fail "second_signal: the restart from committed step $newest failed ($rc) or its losses differ"
else
  echo "second_signal: cut during the stop, newest committed step $newest resumes to the uninterrupted losses"
fi

# A signal before the first step: nothing trained, nothing saved, still 75.
MESHTRAIN_FAULT=sigterm:0:1 run before_first 2
finish
if [ "$rc" -ne 75 ] || [ -d "$work/before_first/checkpoints" ] && [ -n "$(ls "$work/before_first/checkpoints")" ] ||
  ! grep -q "stopped before training any step: nothing to save" "$work/before_first.log"; then
  fail "before_first: exit status $rc"
  tail -5 "$work/before_first.log"
else
  echo "before_first: exit status 75, nothing saved: $(grep -m1 "nothing to save" "$work/before_first.log")"
fi

# The wall-time limit: 0.05 minutes with steps to spare.
steps=100000 run time_limit 1 exit_duration_in_mins=0.05
finish
if [ "$rc" -ne 75 ] || ! grep -q "exit_duration_in_mins 0.05 passed" "$work/time_limit.log"; then
  fail "time_limit: exit status $rc"
  tail -5 "$work/time_limit.log"
else
  echo "time_limit: exit status 75: $(grep -m1 "exit_duration_in_mins 0.05 passed" "$work/time_limit.log")"
fi

# A full disk at the preemption save: rank 1 of an FSDP pair (each saves half the state) may write no file
# over 16 KiB (SIGXFSZ ignored: writes fail with EFBIG as a full disk fails them with ENOSPC), below its shard. The job must fail (not 75: the steps
# since the last checkpoint are lost, and a requeue would not know).
rc=0
MESHTRAIN_FAULT=sigusr1:3:0 "${mpirun[@]}" -np 2 -x MESHTRAIN_FAULT bash -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then trap "" XFSZ; ulimit -f 16; fi; exec "$@"' _ \
  "$meshtrain" train qwen3-tiny "${keys[@]}" mesh.fsdp=2 per_device_batch_size=4 steps=40 run_dir="$work/disk_full" \
  >>"$work/disk_full.log" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] || [ "$rc" -eq 75 ] || ! grep -q "rank_00001.safetensors" "$work/disk_full.log" ||
  [ "$(newest_committed "$work/disk_full")" != none ]; then
  fail "disk_full: exit status $rc, newest committed $(newest_committed "$work/disk_full")"
  tail -5 "$work/disk_full.log"
else
  save_rc=$rc
  run disk_full 2 mesh.fsdp=2
  finish
  if [ "$rc" -ne 0 ] || ! close_losses "$work/base_2" "$work/disk_full" disk_full; then
    fail "disk_full: the restart failed ($rc) or its losses differ"
  else
    echo "disk_full: the preemption save failed naming rank 1's shard (status $save_rc), nothing committed; the restart reproduces the uninterrupted losses"
  fi
fi

# Steps lost: checkpoints every 3 steps, SIGKILL in step 5 after its backward (MESHTRAIN_FAULT=kill: no
# handler runs), so metrics.jsonl holds step 4 and the newest checkpoint is step 3; the restart says it trains
# step 4 again.
MESHTRAIN_FAULT=kill:5:0 run lost 1 checkpoint_period=3
finish
logged=$(last_step lost) saved=$(newest_committed "$work/lost")
run lost 1 checkpoint_period=3
finish
if [ "$logged $saved" != "4 3" ] || [ "$rc" -ne 0 ] ||
  ! grep -q "steps 4..4 were trained after the checkpoint and are lost" "$work/lost.log" ||
  [ "$(losses "$work/lost/metrics.jsonl")" != "$(losses "$work/base_1/metrics.jsonl")" ]; then
  fail "lost: killed with step $logged logged and step $saved committed; the restart ($rc) did not name step 4 or its losses differ"
  grep "resuming\|lost" "$work/lost.log"
else
  echo "lost: killed in step 5; $(grep -m1 -o "steps 4..4 were trained after the checkpoint and are lost" "$work/lost.log"); the restart reproduces the uninterrupted losses"
fi

# Restart on fewer ranks: 4 ranks stopped after step 3, resumed on 2 (gradient accumulation 1 -> 2).
run base_4 4
finish
[ "$rc" -eq 0 ] || fail "the uninterrupted 4-rank run ($rc)"
MESHTRAIN_FAULT=sigusr1:3:2 run shrink 4
finish
[ "$rc" -eq 75 ] || fail "shrink: the 4-rank run's exit status $rc"
rows_per_rank=2 run shrink 2
finish
[ "$rc" -eq 0 ] || fail "shrink: the 2-rank resume's exit status $rc"
grep -q "resuming from .*step_00000003 (step 3), saved by 4 rank(s) (mesh data=4 .*), now 2 rank(s) (mesh data=2 " \
  "$work/shrink.log" || fail "shrink: the resume does not say which ranks saved the checkpoint"
grep -q "gradient_accumulation_steps 1 -> 2, derived to keep the global batch of 8 rows" "$work/shrink.log" ||
  fail "shrink: no derived gradient accumulation"
close_losses "$work/base_4" "$work/shrink" "shrink (4 ranks stopped after step 3, resumed on 2)" || fail "shrink: losses differ"
exit $status
