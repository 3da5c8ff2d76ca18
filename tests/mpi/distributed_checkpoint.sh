#!/usr/bin/env bash
# Distributed checkpoints (issue 16): every rank writes the elements it holds one replica of, and nothing
# else. 4 ranks under fsdp 4 each write a shard file, none more than half of the state; 2 ranks under data 2
# hold the same replicas, so rank 0 writes everything and rank 1 an empty shard; tensor 2 x fsdp 2 splits
# both ways. In every case the shards' chunks together hold exactly parameters + both moments (12 bytes per
# parameter), index.json lists every file, and the checkpoint loads on one process with the losses of the
# 1-process run after it (2 more steps, 1e-5 relative).
# Usage: distributed_checkpoint.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny+=(collective_timeout_s=120)
run() {  # run NAME RANKS per_device_batch_size [key=value ...]
  local name=$1 ranks=$2 batch=$3
  shift 3
  local launch=()
  [ "$ranks" -gt 1 ] && launch=("${mpirun[@]}" -np "$ranks")
  "${launch[@]}" "$meshtrain" train qwen3-tiny "${tiny[@]}" per_device_batch_size="$batch" run_dir="$work/$name" \
    "$@" >"$work/$name.log" 2>&1 || { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
}
run single 1 8 steps=4
status=0
for layout in "fsdp4 4 2 mesh.fsdp=4" "data2 2 4 mesh.data=2" "tensor2_fsdp2 4 2 mesh.tensor=2 mesh.fsdp=2"; do
  read -r name ranks batch keys <<<"$layout"
  # shellcheck disable=SC2086  # the mesh's words are separate arguments
  run "$name" "$ranks" "$batch" steps=4 checkpoint_period=2 $keys  # the same schedule as the 4-step run
  grep -q "checkpoint step 2: [0-9.]* GiB from $ranks rank(s) in" "$work/$name.log" ||
    { echo "FAIL: $name: no save line"; cat "$work/$name.log"; exit 1; }
  run "${name}_resumed" 1 8 steps=4 load_full_state_path="$work/$name/checkpoints/step_00000002"
  python3 - "$work/$name/checkpoints/step_00000002" "$ranks" "$name" "$work/single" "$work/${name}_resumed" \
    <<'PY' || status=1
import json, os, sys
checkpoint, ranks, name, single, resumed = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
metadata = json.load(open(f"{checkpoint}/metadata.json"))
index = json.load(open(f"{checkpoint}/index.json"))
files = [f"shards/rank_{r:05d}.safetensors" for r in range(ranks)]
listed = {f: e["bytes"] for f, e in index["files"].items()}
ok = listed == {f: os.path.getsize(f"{checkpoint}/{f}") for f in files}
# Bytes of chunk data each rank wrote (the files add a safetensors header).
sizes = [0] * ranks
for tensor in index["tensors"].values():
    for chunk in tensor["chunks"]:
        count = 1
        for d in chunk["dims"]:
            count *= d
        sizes[files.index(chunk["file"])] += 4 * count
expected = 12 * metadata["model"]["parameter_count"]
ok &= sum(sizes) == expected
if name == "data2":
    ok &= sizes[1] == 0  # replicas of rank 0's elements: nothing to save
else:
    ok &= min(sizes) > 0 and max(sizes) <= expected / 2
ok &= sorted(os.listdir(f"{checkpoint}/shards")) == [f.split("/")[1] for f in files]  # lists merged
loss = lambda run: {m["step"]: m["loss"] for m in map(json.loads, open(f"{run}/metrics.jsonl"))}
a, b = loss(single), loss(resumed)
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in (3, 4))
ok &= sorted(b) == [3, 4] and worst <= 1e-5
print(f"{name}: chunk bytes per rank {sizes} (sum {sum(sizes)}, 12 x parameters = {expected}); resumed on 1 "
      f"process: steps 3-4 worst relative loss difference {worst:.2e} (bound 1e-5){'' if ok else ' FAIL'}")
sys.exit(0 if ok else 1)
PY
done
exit $status
