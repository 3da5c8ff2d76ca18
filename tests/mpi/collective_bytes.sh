#!/usr/bin/env bash
# Communication as planned (issue 5): the bytes each communicator moved in a step equal the plan's
# collective bytes per mesh axis (fwd_bwd + (GA-1) x fwd_bwd_accum + update), and the data-axis bytes of a
# step do not depend on gradient accumulation (GA 1, 4, 16), with and without ZeRO-1; FSDP's grow with GA
# by design. Also a many-rank oversubscribed run (8 ranks, data 2 x fsdp 4), and context parallelism
# (mesh.context=2 alone and with data=2, GA 2: the K / V, position and segment-id gathers, the dK / dV
# reduce-scatters and the gradient all-reduces over context; and the ring strategy's passes, C = 2 and 4,
# whose trace shows each pass started before a block's compute and waited for after it), and expert
# parallelism (a small deepseek-tiny: the all_to_all blocks of every MoE layer and the gradient all-reduces
# over expert, dropless and with a capacity, alone and with data x ZeRO-1), and Engram's ShortConv halos
# under context parallelism, and Muon's gathers of sharded matrices (FSDP x tensor, ZeRO-1).
# Usage: collective_bytes.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny+=(enable_checkpointing=false per_device_batch_size=1 steps=2 collective_timeout_s=120)
run() {  # run NAME RANKS [key=value ...]
  local name=$1 ranks=$2
  shift 2
  "${mpirun[@]}" -np "$ranks" "$meshtrain" train qwen3-tiny "${tiny[@]}" run_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
}
for ga in 1 4 16; do
  run "dp_$ga" 2 mesh.data=2 gradient_accumulation_steps=$ga
  run "zero1_$ga" 2 mesh.data=2 shard_optimizer_over_data=true gradient_accumulation_steps=$ga
  run "fsdp_$ga" 2 mesh.fsdp=2 gradient_accumulation_steps=$ga
done
run many 8 mesh.data=2 mesh.fsdp=4 gradient_accumulation_steps=2 shard_optimizer_over_data=true
run tp 4 mesh.data=2 mesh.tensor=2 gradient_accumulation_steps=4 shard_optimizer_over_data=true
run tp4 4 mesh.tensor=4 gradient_accumulation_steps=2
# Muon's gathers of its sharded matrices (issue 41): FSDP x tensor, and ZeRO-1 over data.
run muon_fsdp_tp 4 mesh.fsdp=2 mesh.tensor=2 opt_type=muon gradient_accumulation_steps=2
run muon_zero1 2 mesh.data=2 shard_optimizer_over_data=true opt_type=muon
run cp2 2 mesh.context=2 gradient_accumulation_steps=2
run cp2_dp2 4 mesh.context=2 mesh.data=2 gradient_accumulation_steps=2 shard_optimizer_over_data=true
run cp2_ring 2 mesh.context=2 context_parallel_strategy=ring gradient_accumulation_steps=2
run cp4_ring 4 mesh.context=4 context_parallel_strategy=ring gradient_accumulation_steps=2 remat_policy=full \
  profiler=trace profiler_steps=2
deepseek=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=4 base_mlp_dim=128 base_num_decoder_layers=2
  vocab_size=256 max_target_length=32 kv_lora_rank=24 qk_nope_head_dim=12 qk_rope_head_dim=8 v_head_dim=16
  q_lora_rank=16 num_experts=4 num_experts_per_tok=2 base_moe_mlp_dim=32 dataset_type=synthetic tokenizer_path=
  dataset_path= eval_dataset_path= eval_interval=0 enable_checkpointing=false per_device_batch_size=1 steps=2
  collective_timeout_s=120)
run_deepseek() {  # run_deepseek NAME RANKS [key=value ...]
  local name=$1 ranks=$2
  shift 2
  "${mpirun[@]}" -np "$ranks" "$meshtrain" train deepseek-tiny "${deepseek[@]}" run_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
}
run_deepseek ep2 2 mesh.expert=2 gradient_accumulation_steps=2
run_deepseek ep2_dp2 4 mesh.expert=2 mesh.data=2 gradient_accumulation_steps=2 shard_optimizer_over_data=true
run_deepseek ep4_capacity 4 mesh.expert=4 capacity_factor=1.5 remat_policy=full
# Engram's ShortConv halos (issue 13): under dual_chunk_swap each context rank passes each chunk's last
# (K - 1) x N = 6 inputs of the G D = 256 channels both ways, forward and backward; a plain split one way.
engram=(engram_layers=[0,1] engram_num_heads=2 engram_head_dim=8 engram_vocab_bases=[61,67] engram_kernel_size=3
  mhc_expansion_rate=4)
run_deepseek engram_cp2 2 "${engram[@]}" mesh.context=2 gradient_accumulation_steps=2
run_deepseek engram_cp2_plain 2 "${engram[@]}" mesh.context=2 context_parallel_load_balance=false
# The overlap, by event order in a trace: ZeRO-1 + TP + GA 4, step 2 traced on rank 0.
run overlap 4 mesh.data=2 mesh.tensor=2 gradient_accumulation_steps=4 shard_optimizer_over_data=true \
  profiler=trace profiler_steps=2
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
status = 0
def steps(name):
    return [json.loads(line) for line in open(f"{work}/{name}/metrics.jsonl")]
for name in ["dp_1", "dp_4", "dp_16", "zero1_1", "zero1_4", "zero1_16", "fsdp_1", "fsdp_4", "fsdp_16", "many", "tp", "tp4", "muon_fsdp_tp", "muon_zero1", "cp2", "cp2_dp2", "cp2_ring", "cp4_ring", "ep2", "ep2_dp2", "ep4_capacity", "engram_cp2", "engram_cp2_plain"]:
    for record in steps(name):
        moved, planned = record["collective_bytes"], record["planned_collective_bytes"]
        if moved != planned:
            print(f"FAIL {name} step {record['step']}: moved {moved} != planned {planned}")
            status = 1
    print(f"{name}: moved per step {steps(name)[-1]['collective_bytes']} = planned")
for name in ["cp2", "cp2_dp2", "cp2_ring", "cp4_ring", "engram_cp2", "engram_cp2_plain"]:
    if steps(name)[-1]["collective_bytes"].get("context", 0) <= 0:
        print(f"FAIL {name}: no bytes over the context axis")
        status = 1
for name in ["ep2", "ep2_dp2", "ep4_capacity"]:
    if steps(name)[-1]["collective_bytes"].get("expert", 0) <= 0:
        print(f"FAIL {name}: no bytes over the expert axis")
        status = 1
for layout in ["dp", "zero1"]:
    data = {ga: steps(f"{layout}_{ga}")[-1]["collective_bytes"]["data"] for ga in (1, 4, 16)}
    if len(set(data.values())) != 1:
        print(f"FAIL {layout}: data-axis bytes per step depend on GA: {data}")
        status = 1
    print(f"{layout}: data-axis bytes per step for GA 1, 4, 16: {sorted(set(data.values()))}")
# Reduce-scatters start inside the last micro-batch's backward (after the third micro-batch's last backward
# op, before the fourth's), not in update.
trace = json.load(open(f"{work}/overlap/trace_step2.json"))
events = sorted((e for e in (trace["traceEvents"] if isinstance(trace, dict) else trace) if e.get("ph") == "X"),
                key=lambda e: e["ts"])
names = [e["name"] for e in events]
ends = [i for i, name in enumerate(names) if name == "token_embedder/backward"]
starts = [i for i, name in enumerate(names) if name.startswith("start zero1/reduce_scatter/")]
update = names.index("optimizer/clip")
if len(ends) != 4 or not starts or not (ends[2] < starts[0] < ends[3] < update):
    print(f"FAIL overlap: backward ends {ends}, reduce-scatter starts {starts[:3]}..., clip {update}")
    status = 1
else:
    inside = sum(1 for i in starts if i < ends[3])
    print(f"overlap: {len(starts)} reduce-scatters started during the last micro-batch's backward "
          f"({inside} before its last op), update at event {update}")
# The ring: inside each ring attention op (C = 4: 3 steps with a pass in flight), every wait comes after
# the passes it completes were started, with the block's compute between them.
trace = json.load(open(f"{work}/cp4_ring/trace_step2.json"))
events = [e for e in (trace["traceEvents"] if isinstance(trace, dict) else trace) if e.get("ph") == "X"]
ring_ops = [e for e in events if e["name"].endswith("/ring_attention_forward") and e["cat"] != "collective"]
checked, op_time, wait_time = 0, 0.0, 0.0
for op in ring_ops:
    inside = sorted((e for e in events if e["cat"] == "collective" and e["name"].startswith(op["name"] + "/")
                     and op["ts"] <= e["ts"] <= op["ts"] + op["dur"]), key=lambda e: e["ts"])
    kinds = [e["name"].rsplit("/", 1)[1] for e in inside]
    if kinds != ["pass_kv", "pass_tokens", "wait"] * 3:
        print(f"FAIL ring trace {op['name']}: {kinds}")
        status = 1
    checked += 1
    op_time += op["dur"]
    wait_time += sum(e["dur"] for e in inside if e["name"].endswith("/wait"))
if not ring_ops:
    print("FAIL ring trace: no ring attention op in the trace")
    status = 1
else:
    print(f"ring (C=4): {checked} ring attention forwards traced, passes started before each block's compute "
          f"and waited for after it; waiting {100 * wait_time / op_time:.1f}% of their time")
sys.exit(status)
PY
