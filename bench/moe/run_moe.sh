#!/usr/bin/env bash
# Mixture of experts against dense on this machine (issue 12): deepseek-tiny (MLA, a dense first layer,
# then 8 routed experts top-2 + 1 shared of width 256) and the same model with every layer dense at the
# same activated FLOPs per token (base_mlp_dim 768 = (2 routed + 1 shared) x 256; the router's 2 D E
# FLOPs a token are left out, 2% of an expert's), synthetic tokens, one process. Prints the median
# tokens/s of steps 3.., the ratio MoE / dense, and from a traced step the GFLOP/s of the routed experts'
# grouped matmuls against the dense model's MLP matmuls (the grouped-matmul efficiency), with the share
# of the MoE step spent routing (router, route plan, gather, combine). Then expert parallelism against data
# parallelism on 2 MPI ranks (1 thread each, the same global batch): tokens/s, the all-to-all share of the
# step (rank 0's traced step: time in the all_to_all ops / step time) and the bytes moved per step over the
# expert axis, dropless (worst-case blocks) and with capacity_factor 1.25. Always exits 0.
# Usage: bench/moe/run_moe.sh [BUILD_DIR] [STEPS]
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../../build}
steps=${2:-8}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(dataset_type=synthetic tokenizer_path= dataset_path= eval_dataset_path= eval_interval=0
  enable_checkpointing=false steps="$steps" profiler=trace profiler_steps="$steps")
run() {  # run NAME [key=value ...]
  local name=$1
  shift
  "$build/meshtrain" train deepseek-tiny "${common[@]}" per_device_batch_size=16 run_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 ||
    echo "# $name failed: $(grep -m1 error "$work/$name.log" || tail -1 "$work/$name.log")"
}
run_ranks() {  # run_ranks NAME [key=value ...]: 2 MPI ranks, 8 rows each
  local name=$1
  shift
  mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 "$build/meshtrain" train deepseek-tiny \
    "${common[@]}" per_device_batch_size=8 run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    echo "# $name failed: $(grep -m1 error "$work/$name.log" || tail -1 "$work/$name.log")"
}
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, deepseek-tiny, 16 x 128 tokens a step, $steps steps"
run moe
run dense num_experts=0 base_mlp_dim=768
run_ranks data2 mesh.data=2
run_ranks expert2 mesh.expert=2
run_ranks expert2_capacity mesh.expert=2 capacity_factor=1.25
python3 - "$work" "$steps" <<'PY'
import json, os, statistics, sys
work, steps = sys.argv[1], int(sys.argv[2])
B, S, D, k, F_expert, F_dense = 16, 128, 384, 2, 256, 768
N = B * S
def run(name):
    path = f"{work}/{name}/metrics.jsonl"
    if not os.path.exists(path):
        return None
    records = [json.loads(line) for line in open(path)]
    rates = [r["tokens_per_s"] for r in records[2:]] or [r["tokens_per_s"] for r in records]
    trace = json.load(open(f"{work}/{name}/trace_step{steps}.json"))
    events = [e for e in (trace["traceEvents"] if isinstance(trace, dict) else trace)
              if e.get("ph") == "X" and e.get("cat") in ("op", "recompute", "collective")]
    return statistics.median(rates), min(rates), max(rates), events
moe, dense = run("moe"), run("dense")
if not moe or not dense:
    sys.exit(0)
print(f"{'model':<34} {'tok/s median':>12} {'[min-max]':>17}")
for label, (median, low, high, _) in (("deepseek-tiny (MoE 8 top-2 + 1)", moe), ("dense, same activated FLOPs", dense)):
    print(f"{label:<34} {median:>12.0f} {f'[{low:.0f}-{high:.0f}]':>17}")
print(f"MoE / dense tokens/s: {moe[0] / dense[0]:.2f}")
def seconds(events, suffixes):
    return sum(e["dur"] for e in events if any(e["name"].endswith(s) for s in suffixes)) / 1e6
# FLOPs per step of the timed ops (forward and backward), over the 5 MoE layers / 5 dense MLP layers that
# replace them (layer 0 is dense in both).
M = N * k
grouped = seconds(moe[3], ["/expert_in_forward", "/expert_out_forward", "/expert_in_backward",
                           "/expert_out_backward"])
grouped_flops = 5 * 3 * (3 * 2 * M * D * F_expert)  # 3 matmuls, forward + 2x backward
mlp_names = [f"decoder/layers_{l}/mlp/{w}/{p}" for l in range(1, 6) for w in ("wi_0", "wi_1", "wo")
             for p in ("forward", "backward_input", "backward_weight")]
mlp = sum(e["dur"] for e in dense[3] if e["name"] in mlp_names) / 1e6
mlp_flops = 5 * 3 * (3 * 2 * N * D * F_dense)
routing = seconds(moe[3], ["/gate/forward", "/gate/backward_input", "/gate/backward_weight", "/router_forward",
                           "/router_backward", "/route_plan", "/gather_forward", "/gather_backward", "/combine_forward",
                           "/combine_backward"])
step = sum(e["dur"] for e in moe[3]) / 1e6
if grouped > 0 and mlp > 0:
    print(f"routed experts' grouped matmuls: {grouped_flops / grouped / 1e9:.1f} GFLOP/s; dense MLP matmuls: "
          f"{mlp_flops / mlp / 1e9:.1f} GFLOP/s; efficiency {grouped_flops / grouped / (mlp_flops / mlp):.2f}")
print(f"routing (router, plan, gather, combine): {100 * routing / step:.1f}% of the MoE step's op time")
print(f"\n{'2 ranks':<34} {'tok/s median':>12} {'[min-max]':>17} {'vs data 2':>9} {'all-to-all':>10} {'expert bytes/step':>17}")
base = None
for name, label in (("data2", "data 2"), ("expert2", "expert 2 (dropless)"),
                    ("expert2_capacity", "expert 2 (capacity_factor 1.25)")):
    result = run(name)
    if not result:
        print(f"{label:<34} {'failed':>12}")
        continue
    median, low, high, events = result
    base = base or median
    step_time = sum(e["dur"] for e in events) / 1e6
    exchange = seconds(events, ["_all_to_all", "_all_to_all_backward"])
    moved = [json.loads(line) for line in open(f"{work}/{name}/metrics.jsonl")][-1]["collective_bytes"]
    print(f"{label:<34} {median:>12.0f} {f'[{low:.0f}-{high:.0f}]':>17} {median / base:>9.2f} "
          f"{100 * exchange / step_time:>9.1f}% {moved.get('expert', 0):>17.0f}")
PY
exit 0
