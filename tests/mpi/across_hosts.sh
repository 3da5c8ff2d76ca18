#!/usr/bin/env bash
# Across hosts (issue 16, item 2): two "hosts" as network namespaces joined by a veth pair, mpirun started in
# host A and host B's daemon started in B through Open MPI's rsh launcher (an agent running it with
# `ip netns exec`, under its own hostname), every byte between ranks over TCP on the veth (btl tcp,self: no
# shared-memory transport, which would otherwise work across network namespaces on one machine).
# - Data x FSDP (4 ranks, 2 a host, mapped so the fsdp groups cross the link and again so the data groups
#   do) and tensor (2 ranks, one a host) train 20 steps as the one-process run does, checked as
#   equivalence.sh checks (compare_runs.py); the veth's byte counters grow each way by at least what the
#   collectives of the axis that crosses the link moved (metrics' collective_bytes, the lower bound of what a
#   host's ranks of a 2-rank group must receive).
# - The link cut mid-run (`ip link set ... down` right after the step-2 checkpoint's COMMITTED appears, a
#   data x fsdp run of 4 ranks): every rank ends by itself within collective_timeout_s plus a grace period
#   (below), each host's ranks report the collective, the step and the ranks on the other host as missing,
#   and with the link back up the newest committed checkpoint resumes to the uninterrupted run's losses bit
#   for bit.
# Needs root and iproute2 (`ip netns`); skips (status 77) without them.
# Usage: across_hosts.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "creating network namespaces needs root (this runs as uid $(id -u))"
command -v ip >/dev/null || skip "no ip command: scripts/setup.sh tests installs iproute2"

# Names unique to this run ($$), so namespaces left by a run that was killed do not clash with these; the
# subnet exists only inside the two namespaces.
ns_a=meshtrain-a-$$ ns_b=meshtrain-b-$$ veth_a=mta$$ veth_b=mtb$$
host_a=10.251.0.1 host_b=10.251.0.2 subnet=10.251.0.0/24
cleanup() {  # every process still in the namespaces (the launcher, see below), then the namespaces
  local ns pid
  for ns in "$ns_a" "$ns_b"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns delete "$ns" 2>/dev/null || true  # deleting a namespace deletes its end of the veth
  done
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns_a" 2>"$work/netns.err" || skip "ip netns add failed: $(cat "$work/netns.err")"
# Entering a namespace remounts / as a slave, which fails where / is no mount point (a chroot, such as
# scripts/check-fresh.sh's root): the namespace exists there but cannot be used.
ip netns exec "$ns_a" true 2>"$work/netns.err" ||
  skip "ip netns exec failed (/ is not a mount point here, e.g. inside a chroot): $(cat "$work/netns.err")"
ip netns add "$ns_b"
ip link add "$veth_a" netns "$ns_a" type veth peer name "$veth_b" netns "$ns_b" 2>"$work/veth.err" ||
  skip "no veth pair: $(cat "$work/veth.err")"
ip -n "$ns_a" addr add "$host_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$host_b/24" dev "$veth_b"
# lo too: two ranks of one host reach each other at the host's own address, which the kernel routes via lo.
for end in "$ns_a $veth_a" "$ns_b $veth_b"; do
  read -r ns dev <<<"$end"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$dev" up
done

# wait_for_link: until a TCP connection from each host reaches the other (refused on port 9, where nothing
# listens: the SYN got there), at most 30 s. A launch right after the link came back up once failed to start
# B's daemon ("unable to complete a TCP connection" from B to A; during the cut B's neighbour entry for A
# is FAILED and connections fail with "No route to host"); each launch after the link (re)appears waits
# for a working path first.
wait_for_link() {
  local start=$SECONDS from to
  for from in "$ns_a $host_b" "$ns_b $host_a"; do
    read -r ns to <<<"$from"
    until [[ "$(timeout 2 ip netns exec "$ns" bash -c "exec 3<>/dev/tcp/$to/9" 2>&1)" == *"Connection refused"* ]]; do
      [ $((SECONDS - start)) -lt 30 ] || { echo "FAIL: no TCP path from $ns to $to 30 s after the link came up"; exit 1; }
      sleep 0.1
    done
  done
}
wait_for_link

# Open MPI's rsh launcher runs `AGENT HOST COMMAND...` as it would run ssh; the agent starts the daemon in
# host B's namespace with B's own hostname (a UTS namespace), so Open MPI's messages name the host.
cat >"$work/rsh_agent" <<EOF
#!/bin/sh
[ "\$1" = $host_b ] || { echo "rsh agent: no host \$1 (only $host_b)" >&2; exit 1; }
shift
exec ip netns exec $ns_b unshare --uts /bin/sh -c "hostname meshtrain-host-b && \$*"
EOF
chmod +x "$work/rsh_agent"
printf '%s slots=2\n%s slots=2\n' "$host_a" "$host_b" >"$work/hosts"
# Session directories under $work (orte_tmpdir_base): the launcher the cut leaves behind is killed, which
# leaves its session directory, and $work goes at exit.
across=(ip netns exec "$ns_a" mpirun --allow-run-as-root --bind-to none --hostfile "$work/hosts"
  --mca plm_rsh_agent "$work/rsh_agent" --mca btl tcp,self --mca btl_tcp_if_include "$subnet"
  --mca oob_tcp_if_include "$subnet" --mca orte_tmpdir_base "$work")

veth_bytes() {  # veth_bytes: bytes sent by A and by B on the veth so far
  echo "$(ip netns exec "$ns_a" cat "/sys/class/net/$veth_a/statistics/tx_bytes")" \
    "$(ip netns exec "$ns_b" cat "/sys/class/net/$veth_b/statistics/tx_bytes")"
}
status=0
fail() {
  echo "FAIL: $*"
  status=1
}

# run NAME RANKS MAP AXIS per_device_batch_size [key=value ...]: RANKS across the two hosts mapped by MAP
# (node: rank r on host r mod 2; slot: the first half on A), AXIS the one mesh axis whose groups cross the
# link (its bytes are checked against the veth's counters); RANKS 1: one process, no launcher.
equivalence_keys=("${tiny[@]}" checkpoint_period=0 steps=20 gradient_accumulation_steps=2 learning_rate=1e-2
  collective_timeout_s=120)
run() {
  local name=$1 ranks=$2 map=$3 axis=$4 batch=$5 before after
  shift 5
  if [ "$ranks" -eq 1 ]; then
    "$meshtrain" train qwen3-tiny "${equivalence_keys[@]}" per_device_batch_size="$batch" run_dir="$work/$name" \
      >"$work/$name.log" 2>&1 || { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
    return
  fi
  before=$(veth_bytes)
  "${across[@]}" -np "$ranks" --map-by "$map" "$meshtrain" train qwen3-tiny "${equivalence_keys[@]}" \
    per_device_batch_size="$batch" run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
  after=$(veth_bytes)
  # Each host's ranks are each in a 2-rank group of AXIS with a rank on the other host: a host receives at
  # least its ranks' collective_bytes of AXIS (an all-reduce or all-gather of a 2-rank group cannot deliver
  # the other half with less).
  python3 - "$work/$name/metrics.jsonl" "$axis" $((ranks / 2)) $before $after "$name" <<'PY' || status=1
import json, sys
path, axis, per_host = sys.argv[1], sys.argv[2], int(sys.argv[3])
a0, b0, a1, b1 = map(int, sys.argv[4:8])
moved = per_host * sum(json.loads(line)["collective_bytes"][axis] for line in open(path) if line.strip())
sent = {"A to B": a1 - a0, "B to A": b1 - b0}
print(f"{sys.argv[8]}: the veth carried " + ", ".join(f"{v / 1e6:.2f} MB {k}" for k, v in sent.items()) +
      f"; the {axis} collectives of the {per_host} rank(s) a host moved {moved / 1e6:.2f} MB each way")
bad = [k for k, v in sent.items() if v < moved]
if bad or moved <= 0:
    print(f"FAIL: {sys.argv[8]}: fewer bytes on the veth ({', '.join(bad)}) than the collectives moved: "
          "the ranks did not talk over the link")
    sys.exit(1)
PY
}

run single 1 - - 8
run dp2_fsdp2_fsdp_across 4 node fsdp 2 mesh.data=2 mesh.fsdp=2
run dp2_fsdp2_data_across 4 slot data 2 mesh.data=2 mesh.fsdp=2
run tp2_across 2 node tensor 4 mesh.tensor=2
for name in dp2_fsdp2_fsdp_across dp2_fsdp2_data_across tp2_across; do
  python3 "$(dirname "$0")/compare_runs.py" "$work/single" "$work/$name" "$name" || status=1
done

# The link cut mid-run. Rank r is on host r mod 2 (--map-by node), so each fsdp group and the world cross
# the link and each data group stays on one host.
# The cut run's collective_timeout_s is short to keep the test short, yet well above any wait of a healthy
# step on a loaded machine (a spurious timeout before the cut fails the test); the uninterrupted run and the
# resume keep 120 s (the timeout changes nothing else).
timeout_s=10
cut_keys=("${tiny[@]}" mesh.data=2 mesh.fsdp=2 per_device_batch_size=2 learning_rate=1e-2 steps=40
  checkpoint_period=2 enable_checkpointing=true max_num_checkpoints_to_keep=0)
train_across() {  # train_across RUN_DIR TIMEOUT_S [mpirun option ...]: the 4-rank run, appending to RUN_DIR.log
  local run_dir=$1 timeout=$2
  shift 2
  "${across[@]}" -np 4 --map-by node "$@" "$meshtrain" train qwen3-tiny "${cut_keys[@]}" \
    collective_timeout_s="$timeout" run_dir="$run_dir" >>"$run_dir.log" 2>&1
}
ranks_left() {  # ranks_left: the meshtrain processes still in either namespace
  local ns pid
  for ns in "$ns_a" "$ns_b"; do
    for pid in $(ip netns pids "$ns"); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != meshtrain ] || echo "$pid"
    done
  done
}
train_across "$work/base" 120 || { echo "FAIL: the uninterrupted run"; cat "$work/base.log"; exit 1; }
base_losses=$(losses "$work/base/metrics.jsonl")

# Host B's ranks' output reaches mpirun through B's daemon, over the link: once it is down, only files
# written on B hold what they say (--output-filename: a file per rank, written by the rank's own daemon).
# (stderr: the shell's own line about the launcher the test kills below)
train_across "$work/cut" "$timeout_s" --output-filename "$work/cut_output" 2>/dev/null &
launcher=$!
# The cut follows the step-2 checkpoint's commit (the marker appears with the renamed step directory); the
# run has 38 steps to go then. Polled, not slept: the link goes down at a known point however loaded the
# machine is.
while [ ! -e "$work/cut/checkpoints/step_00000002/COMMITTED" ]; do
  kill -0 "$launcher" 2>/dev/null || { echo "FAIL: the run ended before its step-2 checkpoint"; cat "$work/cut.log"; exit 1; }
  sleep 0.05
done
ip -n "$ns_a" link set "$veth_a" down
cut=$(date +%s%N)
echo "link $veth_a down after the step-2 checkpoint was committed"
# Every rank ends by its own collective timeout: a coordinator (group rank 0) that gets no answer within its
# reply grace (collective_timeout_s / 4, clamped to 1..10 s) names the unanswered ranks; a rank whose
# coordinator is cut off waits twice that grace plus 2 s for it and names it. The grace period is that
# wait plus 5 s for a loaded machine (scheduling, the step's remaining compute before its next collective,
# MPI_Abort).
reply_grace=$(python3 -c "print(min(max($timeout_s / 4, 1), 10))")
bound_s=$(python3 -c "print($timeout_s + 2 * $reply_grace + 2 + 5)")
while [ -n "$(ranks_left)" ] && [ $(($(date +%s%N) - cut)) -lt 120000000000 ]; do sleep 0.05; done
ended_ms=$((($(date +%s%N) - cut) / 1000000))
if [ -n "$(ranks_left)" ]; then
  fail "ranks $(ranks_left | tr '\n' ' ')still run 120 s after the cut"
else
  echo "every rank ended ${ended_ms} ms after the cut (bound: collective_timeout_s $timeout_s s + grace $(python3 -c "print($bound_s - $timeout_s)") s)"
  python3 -c "import sys; sys.exit(0 if $ended_ms <= $bound_s * 1000 else 1)" ||
    fail "the ranks ended ${ended_ms} ms after the cut, past the bound of ${bound_s} s"
fi
# Open MPI's launcher learns that host B's daemon is gone only when TCP gives up retransmitting to it
# (net.ipv4.tcp_retries2: about 15 minutes by default), so mpirun and B's orted outlive the ranks; the
# test ends them. (Lowering tcp_retries2 does not do: TCP then gives up on the ranks' own connections
# before the collective timeout and Open MPI ends them with its own message, naming no collective. A new
# namespace starts with the kernel's default, 15, whatever the machine's own namespace has.)
for pid in $(ip netns pids "$ns_a") $(ip netns pids "$ns_b"); do
  echo "still running after the ranks ended: $(cat "/proc/$pid/comm" 2>/dev/null) (pid $pid); ended by the test"
  kill -9 "$pid" 2>/dev/null || true
done
wait "$launcher" && fail "the cut run exited 0"
grep -rh "meshtrain: error" "$work/cut.log" "$work/cut_output" | sort -u || true  # none: the check below says so
# Each host's ranks name the collective, the step (2, after its checkpoint, or later) and the other host's
# ranks.
python3 - "$work/cut.log" "$work/cut_output" <<'PY' || status=1
import os, re, sys
# "at step N" inside a step, "at the boundary before step N" in the stop-request all-reduce between steps
# (the cut can land in either).
line = re.compile(r"meshtrain: error: (?:collective )?(\w+) '([^']+)' #\d+ at (?:the boundary before )?step (\d+) timed "
                  r"out after \S+ s on the "
                  r"(\w+) axis: ranks? ([\d, ]+) did not arrive.*\(reported by rank (\d+)\)$")
reports = {0: [], 1: []}  # host (rank mod 2) of the reporter -> the ranks it names
files = [sys.argv[1]] + [os.path.join(d, f) for d, _, names in os.walk(sys.argv[2]) for f in names]
for text in (text for path in files for text in open(path, errors="replace")):
    match = line.search(text.rstrip("\n"))
    if match and int(match.group(3)) >= 2:
        missing = [int(r) for r in match.group(5).split(",")]
        reports[int(match.group(6)) % 2].append(missing)
for host in (0, 1):
    if not any(missing and all(r % 2 != host for r in missing) for missing in reports[host]):
        print(f"FAIL: no rank on host {'AB'[host]} named the collective, a step from 2 on and the other host's "
              "ranks as missing")
        sys.exit(1)
print("both hosts' ranks named the collective, the step and the other host's ranks")
PY

ip -n "$ns_a" link set "$veth_a" up
wait_for_link
newest=$(newest_committed "$work/cut")
if ! train_across "$work/cut" 120; then
  fail "the resume failed"
  cat "$work/cut.log"
elif ! grep -q "resuming from .*step_0*$newest" "$work/cut.log"; then
  fail "the resume did not start from the newest committed checkpoint (step $newest)"
elif [ "$(losses "$work/cut/metrics.jsonl")" != "$base_losses" ]; then
  fail "losses after the resume differ from the uninterrupted run's"
else
  echo "resumed from step $newest across the hosts to the uninterrupted run's losses (40 steps, bitwise)"
fi
exit $status
