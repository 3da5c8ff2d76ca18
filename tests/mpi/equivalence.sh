#!/usr/bin/env bash
# Distributed training equals one process (issue 5): the same global batch (synthetic tokens are a function
# of (seed, step, global row)) trained for 20 steps with GA 2 on 1 process and on 2 and 4 ranks in data,
# FSDP, ZeRO-1, tensor-parallel and combined layouts. Losses must agree within 1e-5 relative (sums over
# ranks add in another order) and the final parameters (from each run's checkpoint, global tensors) within
# 1e-3 of each tensor's largest magnitude; the same layout run twice must give bitwise-equal losses.
# Context parallelism (issue 11, all_gather): mesh.context=2 with each reorder, with data=2, tensor=2,
# fsdp=2 and ZeRO-1, mesh.context=4, remat minimal and full, and GPT-2 (learned positions) against its own one-process run. Under context the global batch is
# per_device_batch_size x devices rows as for tensor, each row cut over the context ranks.
# Usage: equivalence.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny+=(checkpoint_period=0 steps=20 gradient_accumulation_steps=2 learning_rate=1e-2 collective_timeout_s=120)

preset=qwen3-tiny
run() {  # run NAME RANKS per_device_batch_size [key=value ...]
  local name=$1 ranks=$2 batch=$3
  shift 3
  if [ "$ranks" -eq 1 ]; then
    "$meshtrain" train "$preset" "${tiny[@]}" per_device_batch_size="$batch" run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1
  else
    "${mpirun[@]}" -np "$ranks" "$meshtrain" train "$preset" "${tiny[@]}" per_device_batch_size="$batch" \
      run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1
  fi || { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
}

compare() {  # compare NAME [BASELINE]: losses, grad norms and final parameters against the one-process run
  python3 - "$work/${2:-single}" "$work/$1" "$1" <<'PY'
import json, struct, sys
import numpy as np
def metrics(run):
    return [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
def parameters(run):  # the final checkpoint's model tensors (global shapes on every mesh)
    with open(f"{run}/checkpoints/step_00000020/model.safetensors", "rb") as file:
        size = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(size))
        data = file.read()
    return {name: np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]], np.float32)
            for name, e in header.items() if name != "__metadata__"}
a, b = metrics(sys.argv[1]), metrics(sys.argv[2])
assert len(a) == len(b) == 20, (len(a), len(b))
loss = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
norm = max(abs(x["raw_grad_norm"] - y["raw_grad_norm"]) / x["raw_grad_norm"] for x, y in zip(a, b))
pa, pb = parameters(sys.argv[1]), parameters(sys.argv[2])
assert pa.keys() == pb.keys()
# Relative to each tensor's largest magnitude: Adam's normalised steps amplify rounding differences in
# near-zero gradient components, so parameters drift more than losses over 20 steps.
# A key bias (GPT-2) has an exact gradient of zero (it adds a per-query constant to every score, which the
# softmax cancels), so it holds Adam-normalised rounding noise of size ~1e-5 in any layout: its drift is
# bounded in absolute terms instead.
def scale(k):
    return 1.0 if k.endswith("self_attention/key/bias") else max(float(np.max(np.abs(pa[k]))), 1e-30)
param = max(float(np.max(np.abs(pa[k] - pb[k]))) / scale(k) for k in pa)
print(f"{sys.argv[3]}: 20 steps, worst relative difference: loss {loss:.2e} (bound 1e-5), "
      f"final parameters {param:.2e} (bound 1e-3), grad norm {norm:.2e}")
sys.exit(0 if loss <= 1e-5 and param <= 1e-3 else 1)
PY
}

# One process, global batch 8 rows per micro-batch (per_device_batch_size x devices).
run single 1 8
run dp2 2 4 mesh.data=2
run dp2_again 2 4 mesh.data=2
run fsdp2 2 4 mesh.fsdp=2
run zero1_2 2 4 mesh.data=2 shard_optimizer_over_data=true
run dp4 4 2 mesh.data=4
run dp2_fsdp2 4 2 mesh.data=2 mesh.fsdp=2
run zero1_dp2_fsdp2 4 2 mesh.data=2 mesh.fsdp=2 shard_optimizer_over_data=true
# Tensor parallel: per_device_batch_size x devices rows, replicated over tensor.
run tp2 2 4 mesh.tensor=2
run dp2_tp2 4 2 mesh.data=2 mesh.tensor=2
run fsdp2_tp2 4 2 mesh.fsdp=2 mesh.tensor=2
run zero1_dp2_tp2 4 2 mesh.data=2 mesh.tensor=2 shard_optimizer_over_data=true
run tp4 4 2 mesh.tensor=4  # 4 query heads, 2 kv heads: each kv head replicated on 2 ranks
# Context parallel: every row's 32 tokens cut over 2 ranks (16 each).
run cp2 2 4 mesh.context=2  # dual_chunk_swap, the default
run cp2_striped 2 4 mesh.context=2 context_parallel_reorder=striped
run cp2_plain 2 4 mesh.context=2 context_parallel_load_balance=false
run cp2_dp2 4 2 mesh.context=2 mesh.data=2
run cp2_tp2 4 2 mesh.context=2 mesh.tensor=2
run cp2_fsdp2 4 2 mesh.context=2 mesh.fsdp=2
run cp2_zero1_dp2 4 2 mesh.context=2 mesh.data=2 shard_optimizer_over_data=true
run cp4 4 2 mesh.context=4  # 8 chunks of 4 tokens
# Remat recomputes from activations only: the gathered positions (and under full the gathered K / V) are
# activations so that a recomputed attention sees this layer's whole rows.
run cp2_remat_minimal 2 4 mesh.context=2 remat_policy=minimal
run cp2_remat_full 2 4 mesh.context=2 remat_policy=full
status=0
for name in dp2 fsdp2 zero1_2 dp4 dp2_fsdp2 zero1_dp2_fsdp2 tp2 dp2_tp2 fsdp2_tp2 zero1_dp2_tp2 tp4 \
  cp2 cp2_striped cp2_plain cp2_dp2 cp2_tp2 cp2_fsdp2 cp2_zero1_dp2 cp4 cp2_remat_minimal cp2_remat_full; do
  compare "$name" || status=1
done
# GPT-2 (learned positions, LayerNorm, GELU) under context against its own one-process run.
preset=gpt2-124m
tiny=("${tiny[@]/base_num_kv_heads=2/base_num_kv_heads=4}" max_position_embeddings=32)  # GPT-2: MHA
run gpt2_single 1 8
run gpt2_cp2 2 4 mesh.context=2
compare gpt2_cp2 gpt2_single || status=1
# The same layout twice: bitwise-equal losses.
python3 - "$work/dp2/metrics.jsonl" "$work/dp2_again/metrics.jsonl" <<'PY' || status=1
import json, sys
a = [json.loads(line)["loss"] for line in open(sys.argv[1])]
b = [json.loads(line)["loss"] for line in open(sys.argv[2])]
print("dp2 twice: losses bitwise equal" if a == b else f"FAIL: dp2 twice differs: {a} vs {b}")
sys.exit(0 if a == b else 1)
PY
exit $status
