#!/usr/bin/env bash
# A real SLURM cluster (issue 40, item 5): slurmctld and two slurmd on this machine (cluster.sh), a job of 2
# nodes x 2 tasks training the tiny model under mpirun inside sbatch, preempted with
# `scancel --signal=USR1` once step 5 is in its metrics.jsonl (an event, never a timer); every rank must stop
# at the same step, commit a checkpoint of it and exit 75, which the job script answers with
# `scontrol requeue`. Then mt-node2 goes DOWN, the requeued job restarts on mt-node1 alone with 2 tasks
# (SLURM_RESTART_COUNT=1), resumes from that checkpoint with the global batch kept (gradient accumulation 1
# -> 2) and trains to the end with the losses of an uninterrupted 4-rank run of the same config under plain
# mpirun (relative 1e-5, as tests/mpi/pipeline_checkpoints.sh's same_losses).
# Skips (status 77) where the slurm daemons cannot run. Every wait is bounded in count and time.
# Usage: slurm_cluster.sh BUILD_DIR
source "$(dirname "$0")/../mpi/common.sh" "$1"
source "$(dirname "$0")/cluster.sh"

# One config for 4 ranks and for 2: fsdp fills the mesh; 1 row a device and no accumulation is a global
# batch of 4 rows, which the engine keeps on 2 ranks by accumulating 2 micro-batches
# (keep_checkpoint_global_batch).
# 300 steps of ~10 ms leave seconds between the signal (at step 5) and the end of the run; here the ranks
# stopped 1-2 steps after it, on a machine loaded 6-fold too.
steps=300
settings=(gradient_accumulation_steps=1 mesh.fsdp=-1 steps=$steps checkpoint_period=100)
keys=("${tiny[@]}" per_device_batch_size=1 "${settings[@]}")

cluster_start
echo "[${SECONDS} s] cluster: $(cluster_node_states | tr '\n' ' ')"
run reference 4 1 "${settings[@]}"
echo "[${SECONDS} s] reference: $steps steps on 4 ranks under plain mpirun"

# write_job_script FILE RUN_DIR: the batch script `meshtrain launch --sbatch` writes for 2 nodes x 2 tasks
# (mpirun inside sbatch, --requeue, the batch shell's USR1 / TERM trap forwarding SIGUSR1 to mpirun,
# `scontrol requeue $SLURM_JOB_ID` when the run exits 75). The checks below read slurm's view of the job and
# meshtrain's own output; sbatch's command line sets where the output goes.
write_job_script() {
  "$meshtrain" launch "$preset" "${keys[@]}" run_dir="$2" --nodes 2 --tasks-per-node 2 --job-name meshtrain-tiny \
    --sbatch "$1" >"$work/launch.log" 2>&1 || { echo "FAIL: meshtrain launch"; cat "$work/launch.log"; exit 1; }
  grep -qx "sbatch $1" "$work/launch.log" || { echo "FAIL: launch did not print 'sbatch $1'"; cat "$work/launch.log"; exit 1; }
}

# job_field NAME: NAME's value in `scontrol show job` of the job (JobState, Restarts, NodeList, ...); empty
# where scontrol got no answer (the waits below ask again).
job_field() {
  scontrol show job "$job" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}
job_failed() {  # job_failed WHAT: the failure, the job's output and the run's log, then the end
  echo "FAIL: $*"
  echo "--- job output"
  cat "$work/job.out" 2>/dev/null || true
  echo "--- slurmctld log (last lines)"
  tail -n 15 "$cluster_dir/log/slurmctld.log"
  exit 1
}
steps_in_metrics() {  # the newest step the run's metrics.jsonl holds, 0 before the first
  local last
  last=$(tail -n 1 "$run_dir/metrics.jsonl" 2>/dev/null | sed -n 's/.*"step":\([0-9]*\).*/\1/p')
  echo "${last:-0}"
}

# Ranks of one host reach each other through shared memory, named after the host: two nodes on one host
# would share those names, so only TCP between ranks here (cluster.sh's header); sbatch passes this on, and
# Open MPI's permission to run as root (launch never adds --allow-run-as-root).
export OMPI_MCA_btl=self,tcp OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run_dir=$work/preempted
write_job_script "$work/job.sh" "$run_dir"
# Appended to, so the first run's output stays when the requeued one starts.
job=$(sbatch --parsable --output="$work/job.out" --open-mode=append "$work/job.sh")

# Mid-run: step 5 in metrics.jsonl (at most 180 s: the job starts within a second, 4 ranks on 2 cores).
for try in $(seq 1800); do
  [ "$(steps_in_metrics)" -lt 5 ] || break
  case "$(job_field JobState)" in "" | PENDING | CONFIGURING | RUNNING) ;; *) job_failed "job $job ended ($(job_field JobState)) before step 5" ;; esac
  [ "$try" -lt 1800 ] || job_failed "no step 5 in $run_dir/metrics.jsonl 180 s after submitting job $job"
  sleep 0.1
done
[ "$(job_field NodeList)" = "mt-node[1-2]" ] || job_failed "job $job runs on $(job_field NodeList), not both nodes"
# No new job may land on mt-node2 from here on (the requeued one must not start there before it is DOWN);
# draining leaves the running job alone.
scontrol update nodename=mt-node2 state=drain reason="meshtrain test: leaving"
scancel --signal=USR1 "$job"
signalled_at=$(steps_in_metrics)
echo "[${SECONDS} s] job $job: SIGUSR1 sent at step $signalled_at of $steps"

# The run stops, commits its checkpoint, exits 75 and the script requeues the job: pending with Restarts=1
# (a requeued job waits 121 s before it is eligible, so it cannot start again before the checks below).
# Nothing else requeues it here: a run that exits otherwise leaves the job FAILED (mt-node2 only drains).
for try in $(seq 1200); do
  state=$(job_field JobState)
  [ "$state" = PENDING ] && [ "$(job_field Restarts)" = 1 ] && break
  case "$state" in
    "" | RUNNING | COMPLETING | REQUEUED | PENDING) ;;
    *) job_failed "job $job ended ($state, exit $(job_field ExitCode)) instead of requeueing itself: the run must save and exit 75 on SIGUSR1" ;;
  esac
  [ "$try" -lt 1200 ] || job_failed "job $job not requeued 120 s after SIGUSR1"
  sleep 0.1
done
stopped_at=$(newest_committed "$run_dir")
[ "$stopped_at" != none ] && [ "$stopped_at" -ge "$signalled_at" ] && [ "$stopped_at" -lt "$steps" ] ||
  job_failed "newest committed checkpoint: step $stopped_at (expected one at or after step $signalled_at, before $steps)"
[ "$(steps_in_metrics)" -eq "$stopped_at" ] ||
  job_failed "metrics.jsonl ends at step $(steps_in_metrics), the committed checkpoint is step $stopped_at"
echo "[${SECONDS} s] job $job: stopped at step $stopped_at, its checkpoint committed, requeued by its script"

# A node lost: the requeued job keeps the node and task counts it ran with (2 and 4), which one node
# cannot hold; 2 tasks fit the node left, and it need not wait out the 121 s. Not at once, though: slurmd
# revoked the first run's credential when it killed it, and refuses a launch credential made in the same
# second or before ("Killing non-startable batch JobId=1: Job credential revoked", seen in a CI run where
# the restart came 0.3 s after the requeue); by PENDING the kill is done, so 2 s on is past it.
scontrol update nodename=mt-node2 state=down reason="meshtrain test: node lost"
scontrol update jobid="$job" NumNodes=1-1 NumCPUs=2 NumTasks=2 StartTime=now+2
for try in $(seq 3000); do  # at most 300 s: the rest of the run on 2 ranks
  state=$(job_field JobState)
  [ "$state" = COMPLETED ] && break  # the script's exit status 0
  case "$state" in "" | PENDING | CONFIGURING | RUNNING | COMPLETING) ;; *) job_failed "the requeued job $job ended $state" ;; esac
  [ "$try" -lt 3000 ] || job_failed "the requeued job $job has not completed 300 s after its restart"
  sleep 0.1
done
[ "$(job_field Restarts) $(job_field NodeList) $(job_field NumTasks)" = "1 mt-node1 2" ] ||
  job_failed "the requeued job ran $(job_field Restarts) restart(s) on $(job_field NodeList) with $(job_field NumTasks) tasks (expected 1 restart on mt-node1 with 2 tasks)"
grep -qF "resuming from $run_dir/checkpoints/step_$(printf %08d "$stopped_at") (step $stopped_at)" "$work/job.out" ||
  job_failed "the requeued run did not resume from the step-$stopped_at checkpoint"
grep -q "gradient_accumulation_steps 1 -> 2, derived to keep the global batch of 4 rows" "$work/job.out" ||
  job_failed "the resumed run did not keep the global batch by accumulating 2 micro-batches"
echo "[${SECONDS} s] job $job: restarted (Restarts=1) on mt-node1 with 2 tasks, resumed from step $stopped_at with" \
  "gradient accumulation 1 -> 2"

python3 - "$work/reference" "$run_dir" "$steps" <<'PY'
import json, sys
reference, run, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def losses(run):
    return {m["step"]: m["loss"] for m in map(json.loads, open(f"{run}/metrics.jsonl"))}
a, b = losses(reference), losses(run)
missing = [s for s in range(1, steps + 1) if s not in b]
if missing:
    sys.exit(f"FAIL: the preempted run has no loss for steps {missing[:5]}...")
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in range(1, steps + 1))
print(f"steps 1-{steps}: preempted and resumed run against the uninterrupted one: worst relative loss "
      f"difference {worst:.2e} (bound 1e-5)")
sys.exit(worst > 1e-5)
PY
# srun --mpi=pmix inside an allocation, through `meshtrain launch --srun` (one node: two slurmd on one host
# collide on srun's PMIx folder, cluster.sh): the ranks find each other through PMIx and say who started them.
scontrol update nodename=mt-node2 state=resume
srun_command=$(printf '%q ' "$meshtrain" launch "$preset" "${tiny[@]}" per_device_batch_size=2 steps=3 \
  mesh.data=-1 run_dir="$work/srun" --nodes 1 --tasks-per-node 2 --srun)
timeout -k 5 120 sbatch --wait --nodes=1 --ntasks-per-node=2 --output="$work/srun.out" --wrap "$srun_command" \
  >/dev/null || job_failed "meshtrain launch --srun in a job of 1 node x 2 tasks: $(tail -5 "$work/srun.out")"
grep -q "^meshtrain: 2 rank(s) on 1 host(s), started by srun (SLURM job [0-9]*)" "$work/srun.out" &&
  [ "$(wc -l <"$work/srun/metrics.jsonl")" -eq 3 ] ||
  job_failed "launch --srun did not train 3 steps on 2 ranks started by srun: $(cat "$work/srun.out")"
echo "[${SECONDS} s] launch --srun: $(grep -m1 "^meshtrain: 2 rank" "$work/srun.out")"
echo "[${SECONDS} s] PASS"
