# A SLURM cluster on this machine for the tests: `source cluster.sh`, then `cluster_start` runs slurmctld and
# two slurmd (nodes mt-node1 and mt-node2, 2 CPUs each) from a temporary folder and exports SLURM_CONF, so
# sbatch, srun, scancel and scontrol talk to it; `cluster_stop` (run at exit) ends every daemon and job
# process it started and removes the folder. Where the daemons cannot run (not root, slurm-wlm missing, a
# chroot where they fail) cluster_start prints "SKIP: why" and exits with status 77.
#
# Nothing outside the folder is read or written: config, state, spool, logs, pid files and TmpFS all live in
# it (never /etc/slurm or /var/spool); AuthType=auth/none with CredType=cred/none (no munge), only 127.0.0.1,
# ports that were free at start, a cluster name and folder unique to the run, so a run killed earlier does
# not clash with this one. Every process of the cluster (daemons, slurmstepd, job scripts, ranks) carries
# its folder in its environment (below): that, not a process name, is how cluster_stop finds them.
#
# What Debian 12's slurm-wlm 22.05 with Open MPI 4.1.4 / PMIx 4.2 does here (probed on a 2-core VM,
# 2026-12-05; the figures are what the engine and `meshtrain launch` have to live with):
# - Two nodes on one host: each node is NodeAddr=127.0.0.1 with its own Port; CPUs=2 per node is the real
#   core count, so slurmd accepts it without config_overrides and 2 x 2 tasks oversubscribe the 2 cores.
#   ReturnToService=1: with 2, a node set DOWN by hand is back within seconds (its slurmd still answers).
# - srun --mpi=pmix -N1 -n2 of an MPI program works: ranks see PMIX_RANK, PMIX_NAMESPACE, SLURM_PROCID = rank,
#   SLURM_LOCALID, SLURM_NTASKS = SLURM_STEP_NUM_TASKS = world, SLURM_STEP_TASKS_PER_NODE, and no
#   OMPI_COMM_WORLD_* and no PMIX_SIZE. meshtrain (f0f4e9c) initialises MPI only where OMPI_COMM_WORLD_SIZE
#   is set, so under srun each task trains alone as one process into the same run_dir (with -N2 -n4 their
#   checkpoint renames collide).
# - srun --mpi=pmix -N2 -n4 with one TmpFS fails: both slurmstepd create <TmpFS>/spmix_appdir_<uid>_<job>.<step>
#   ("Cannot create client cli tmpdir ... File exists", task launch failed). A TmpFS per node fixes it: each
#   slurmd reads its own copy of slurm.conf differing only in TmpFS (DebugFlags=NO_CONF_HASH quiets the
#   mismatch); a TMPDIR in the job's environment does not move the folder (TmpFS decides). Open MPI's shared-memory transport then collides next: both "nodes" are host "vm" and name
#   their segments /dev/shm/vader_segment.vm.<job>.<local rank> alike ("unlink ... No such file" warnings);
#   OMPI_MCA_btl=self,tcp avoids it (only where two nodes share a host; real nodes have their own /dev/shm).
# - sbatch --nodes=2 --ntasks-per-node=2 running mpirun (OMPI_ALLOW_RUN_AS_ROOT=1,
#   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1): mpirun starts one orted a node through srun (step 0, --mpi=none) and
#   the 4 ranks see OMPI_COMM_WORLD_RANK 0..3, OMPI_COMM_WORLD_LOCAL_RANK 0..1, OMPI_COMM_WORLD_LOCAL_SIZE 2,
#   PMIX_RANK = rank, SLURM_JOB_ID, SLURM_STEP_ID=0, but SLURM_PROCID = the node's orted index (0 or 1),
#   SLURM_LOCALID=0 and SLURM_NTASKS=2 (the orted step's): none of them is the rank or the world.
#   SLURM_CPUS_PER_TASK is set only when the job asks for --cpus-per-task (then the ranks see it too).
# - Signals under sbatch + mpirun (a rank logging sender pids; strace on the batch shell, mpirun, orteds):
#   `scancel --signal=USR1 JOB` reaches step 0 only: each node's slurmstepd signals every process of its step
#   (proctrack/linuxproc), so every rank gets USR1 twice within 1 ms (from slurmstepd and again from its
#   orted, which forwards it); the batch shell and mpirun get nothing. `scancel --batch --signal=USR1` reaches
#   the batch shell only (not mpirun, not the ranks): a trap there must forward it. `scancel --full
#   --signal=USR1` reaches the batch shell and mpirun (every process of the batch step), and mpirun forwards
#   it through the orteds: each rank gets it once from its orted (twice if the batch shell's trap forwards
#   too). A rank must treat a repeated signal as one request. The time-limit warning goes the same ways:
#   `sbatch --time=1 --signal=USR1@50` reached the steps only (each rank twice), 17 s later than asked;
#   `--signal=B:USR1@50` the batch shell only, 9 s earlier than asked (slurm sends it at a periodic check).
# - SIGTERM and Open MPI 4.1: mpirun (or orted) receiving SIGTERM sends its ranks SIGCONT, waits
#   odls_base_sigkill_timeout seconds (default 1), sends SIGTERM, waits as long again, then SIGKILL. Plain
#   `mpirun -np 2`: TERM reached the ranks 1.0 s after mpirun's and SIGKILL 1.0 s after that. Under sbatch,
#   `scancel JOB` (SIGCONT + SIGTERM to every process of every step and the batch shell, SIGKILL after
#   KillWait=30 s) reaches the ranks directly from slurmstepd, and their orted, which got it too, kills them
#   1.0-2.0 s later: that is the whole time a save has. `scancel --signal=TERM JOB` (the steps only) of the
#   tiny run: its ranks agreed and committed step 6 within that time, but the orteds exit on SIGTERM and
#   mpirun then exits 205 ("ORTE has lost communication with a remote daemon") whatever the ranks returned
#   (plain scancel: 1), so the batch script cannot read the ranks' status on the SIGTERM route; SIGUSR1 to
#   the steps leaves orted and mpirun up, and mpirun returns the ranks' status. With
#   OMPI_MCA_odls_base_sigkill_timeout=10 in the job's environment the ranks lived 20 s after scancel (TERM
#   from slurmstepd at once, TERM from orted at 10 s, SIGKILL at 20 s): the launch script can widen the
#   window up to KillWait (or the partition's GraceTime on preemption).
# - Requeue: a requeued job (scontrol requeue, from its own script or not) waits for EligibleTime = the
#   requeue + 121 s, and keeps the NumNodes and NumTasks of the allocation it ran on (2 and 4 after a
#   --nodes=1-2 --ntasks-per-node=2 job ran on 2 nodes), so with a node DOWN it stays pending
#   (ReqNodeNotAvail). `scontrol update jobid=J NumTasks=2 StartTime=now` (or NumNodes=1; NumNodes=1-2 alone
#   changes nothing) restarts it at once on the remaining node with 2 tasks; its script sees
#   SLURM_RESTART_COUNT=1 (unset the first time), SLURM_JOB_NODELIST=mt-node1, SLURM_NNODES=1,
#   SLURM_NTASKS=2, and mpirun starts 2 ranks. Setting a node
#   DOWN while the job runs on it kills the job at once (and requeues it, JobRequeue=1): no checkpoint.
#   Without --open-mode=append the requeued job's output file replaces the first run's.
#
# Needs slurmctld, slurmd, slurm-client (scripts/setup.sh tests installs them; their dependency
# slurm-wlm-basic-plugins holds auth/none, cred/none, proctrack/linuxproc, task/none and mpi/pmix, whose PMIx
# library libopenmpi-dev's libpmix-dev brings).

cluster_nodes=(mt-node1 mt-node2)
cluster_dir=""
cluster_script=$(realpath "${BASH_SOURCE[0]}")

cluster_skip() {
  echo "SKIP: $*"
  exit 77
}

# cluster_processes: the pids of this cluster's daemons (started with MESHTRAIN_SLURM_CLUSTER naming the
# folder), and of its slurmstepd and job processes: slurmd gives them SLURM_CONF=<folder>/<node>/slurm.conf
# (this script's own children have <folder>/slurm.conf).
cluster_processes() {
  local node
  {
    grep -lzxF "MESHTRAIN_SLURM_CLUSTER=$cluster_dir" /proc/[0-9]*/environ
    for node in "${cluster_nodes[@]}"; do grep -lzxF "SLURM_CONF=$cluster_dir/$node/slurm.conf" /proc/[0-9]*/environ; done
  } 2>/dev/null | sed -e 's#^/proc/##' -e 's#/environ$##' | sort -u
  return 0
}

cluster_stop() {
  [ -n "$cluster_dir" ] && [ -d "$cluster_dir" ] || return 0
  local pids try signal
  # Jobs first, so slurmd can end their steps; then whatever still runs (daemons included) by pid. The
  # config is named here, whatever the environment: another cluster's jobs are never asked for.
  local jobs
  jobs=$(SLURM_CONF=$cluster_dir/slurm.conf squeue -h -o %i 2>/dev/null) || true
  [ -z "$jobs" ] || SLURM_CONF=$cluster_dir/slurm.conf scancel --full --signal=KILL --quiet $jobs 2>/dev/null || true
  for signal in TERM KILL; do
    pids=$(cluster_processes)
    [ -n "$pids" ] || break
    kill -s "$signal" $pids 2>/dev/null || true
    for try in $(seq 50); do  # at most 5 s a signal
      [ -n "$(cluster_processes)" ] || break
      sleep 0.1
    done
  done
  rm -rf "$cluster_dir"
  cluster_dir=""
}

# cluster_free_ports N: N TCP ports on 127.0.0.1 that nothing listens on now.
cluster_free_ports() {
  /usr/bin/python3 - "$1" <<'PY'
import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))
PY
}

# cluster_write_config FILE TMPFS: the cluster's slurm.conf (each node's copy differs in TmpFS only).
cluster_write_config() {
  local node
  cat >"$1" <<EOF
ClusterName=mt$$
SlurmctldHost=$cluster_host(127.0.0.1)
SlurmctldPort=$cluster_ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$cluster_dir/state
SlurmdSpoolDir=$cluster_dir/spool-%n
SlurmctldPidFile=$cluster_dir/slurmctld.pid
SlurmdPidFile=$cluster_dir/slurmd-%n.pid
SlurmctldLogFile=$cluster_dir/log/slurmctld.log
SlurmdLogFile=$cluster_dir/log/slurmd-%n.log
PlugStackConfig=$cluster_dir/plugstack.conf
TmpFS=$2
MailProg=/bin/true
DebugFlags=NO_CONF_HASH
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=1
EOF
  for node in "${!cluster_nodes[@]}"; do
    echo "NodeName=${cluster_nodes[$node]} NodeAddr=127.0.0.1 NodeHostname=$cluster_host" \
      "Port=${cluster_node_ports[$node]} CPUs=2 State=UNKNOWN" >>"$1"
  done
  echo "PartitionName=mt Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$1"
}

# cluster_node_states: "NAME STATE" a line, as slurmctld sees the nodes now.
cluster_node_states() {
  sinfo -h -N -o '%N %t' 2>/dev/null | sort -u
}

cluster_start() {
  local binary node index ports try states
  [ "$(id -u)" -eq 0 ] || cluster_skip "the slurm daemons run as root here (SlurmUser=root); this runs as uid $(id -u)"
  for binary in slurmctld slurmd sinfo sbatch scontrol scancel squeue; do
    command -v "$binary" >/dev/null ||
      cluster_skip "no $binary: scripts/setup.sh tests installs slurmctld, slurmd and slurm-client"
  done
  cluster_dir=$(mktemp -d /tmp/meshtrain-slurm.XXXXXX)
  local previous_exit
  previous_exit=$(trap -p EXIT | sed -e "s/^trap -- '//" -e "s/' EXIT\$//")
  trap "cluster_stop; $previous_exit" EXIT
  # A test killed outright (ctest's timeout) runs no trap, and the daemons outlive it: a watchdog outside
  # its process tree stops the cluster once the test's shell is gone (it looks for at most an hour).
  (setsid bash -c "source '$cluster_script'; cluster_dir='$cluster_dir'
    for try in \$(seq 3600); do kill -0 $$ 2>/dev/null || break; sleep 1; done; cluster_stop" \
    </dev/null >/dev/null 2>&1 &)
  cluster_host=$(hostname -s)
  read -r cluster_ctld_port ports <<<"$(cluster_free_ports $((1 + ${#cluster_nodes[@]})))"
  read -r -a cluster_node_ports <<<"$ports"
  mkdir -p "$cluster_dir/state" "$cluster_dir/log"
  touch "$cluster_dir/plugstack.conf"
  export SLURM_CONF=$cluster_dir/slurm.conf
  cluster_write_config "$SLURM_CONF" "$cluster_dir/tmp-${cluster_nodes[0]}"
  for index in "${!cluster_nodes[@]}"; do
    node=${cluster_nodes[$index]}
    mkdir -p "$cluster_dir/spool-$node" "$cluster_dir/tmp-$node" "$cluster_dir/$node"
    cluster_write_config "$cluster_dir/$node/slurm.conf" "$cluster_dir/tmp-$node"
  done
  # -i: no state from an earlier run (there is none in a fresh folder; this silences the search for it).
  MESHTRAIN_SLURM_CLUSTER=$cluster_dir slurmctld -i >"$cluster_dir/log/slurmctld.out" 2>&1 ||
    cluster_skip "slurmctld did not start: $(tail -q -n 3 "$cluster_dir/log/slurmctld.out" "$cluster_dir/log/slurmctld.log" 2>/dev/null)"
  for node in "${cluster_nodes[@]}"; do
    # The node's own copy of the config (its TmpFS).
    MESHTRAIN_SLURM_CLUSTER=$cluster_dir slurmd -f "$cluster_dir/$node/slurm.conf" -N "$node" >"$cluster_dir/log/slurmd-$node.out" 2>&1 ||
      cluster_skip "slurmd $node did not start: $(tail -q -n 3 "$cluster_dir/log/slurmd-$node.out" "$cluster_dir/log/slurmd-$node.log" 2>/dev/null)"
  done
  # Until slurmctld has both nodes idle: at most 60 s (a node registers within a second here).
  for try in $(seq 300); do
    states=$(cluster_node_states)
    [ "$(grep -c ' idle$' <<<"$states")" -eq ${#cluster_nodes[@]} ] && return 0
    for binary in slurmctld "${cluster_nodes[@]/#/slurmd-}"; do
      [ -s "$cluster_dir/$binary.pid" ] && kill -0 "$(cat "$cluster_dir/$binary.pid")" 2>/dev/null && continue
      [ "$try" -lt 25 ] && continue  # a daemon writes its pid file once it has started
      cluster_skip "${binary%%-*} ended or never wrote its pid file: $(tail -q -n 3 "$cluster_dir/log/$binary.log" 2>/dev/null)"
    done
    sleep 0.2
  done
  echo "FAIL: the nodes are not idle 60 s after the daemons started: $states"
  tail -n 5 "$cluster_dir"/log/*.log
  exit 1
}
