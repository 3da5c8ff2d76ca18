#!/usr/bin/env bash
# The plan is the run, per pipeline stage (issue 39, item 3): `meshtrain compile plan_out=STEM` writes every
# stage rank's plan (STEM_stage<s>_<kernel>.json); a training run on those ranks verifies each rank's own
# stage's files (plan_in), and each stage's first rank writes the plan its engine executes and allocates
# (run_dir/plan_stage<s>_<kernel>.json, memory.process_arena the arena it holds): equal byte for byte to
# compile's, for GPipe and 1F1B, P = 2 (M = P and 2P) and P = 4, an uneven split, stage x data. The figures
# compile prints per stage (arena, bytes sent) are the files' and the programs'; the bytes rank 0 (stage 0)
# moved each step equal its plan's; interleaved 1F1B (V = 2) too, whose ranks have a forward, backward and eval
# file per chunk. A plan_in made for another micro-batch count or for one stage is refused.
# Usage: pipeline_plan_live.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny=("${tiny[@]/eval_interval=0/eval_interval=2}" topology=cpu enable_checkpointing=false per_device_batch_size=1
  steps=2 eval_steps=1 collective_timeout_s=120)
check() {  # check NAME RANKS [key=value ...]: compile, train with plan_in, compare every stage's files
  local name=$1 ranks=$2 base=() entry override keep
  shift 2
  for entry in "${tiny[@]}"; do  # the case's keys replace tiny's
    keep=1
    for override in "$@"; do [ "${override%%=*}" != "${entry%%=*}" ] || keep=0; done
    [ "$keep" = 0 ] || base+=("$entry")
  done
  "$meshtrain" compile qwen3-tiny "${base[@]}" "$@" plan_out="$work/$name/aot/plan" >"$work/$name.compile.log" ||
    { echo "FAIL: compile $name"; cat "$work/$name.compile.log"; exit 1; }
  "${mpirun[@]}" -np "$ranks" "$meshtrain" train qwen3-tiny "${base[@]}" "$@" plan_in="$work/$name/aot/plan" \
    run_dir="$work/$name/live" >"$work/$name.train.log" 2>&1 ||
    { echo "FAIL: train $name"; cat "$work/$name.train.log"; exit 1; }
  python3 - "$work/$name" <<'PY' || exit 1
import filecmp, glob, json, os, re, sys
run = sys.argv[1]
name = os.path.basename(run)
log = open(f"{run}.compile.log").read()
stages = int(re.search(r"\bstage=(\d+)", log).group(1))
micro_batches = int(re.search(r"over gradient_accumulation_steps (\d+) micro-batches", log).group(1))
sent_by_stage, tied_sum_by_stage = [], []
blocks = re.split(r"\n(?=stage \d+: )", log.split("\npipeline step:")[0])[1:]
assert len(blocks) == stages, (name, len(blocks))
for stage, block in enumerate(blocks):
    aot = sorted(glob.glob(f"{run}/aot/plan_stage{stage}_*.json"))
    live = sorted(glob.glob(f"{run}/live/plan_stage{stage}_*.json"))
    names = [os.path.basename(p)[len("plan"):] for p in aot]
    assert names and names == [os.path.basename(p)[len("plan"):] for p in live], (name, stage, aot, live)
    for a, l in zip(aot, live):
        if not filecmp.cmp(a, l, shallow=False):
            sys.exit(f"FAIL {name} stage {stage}: {l} differs from compile's {a}")
    plan = json.load(open(f"{run}/live/plan_stage{stage}_forward.json"))
    arena = plan["memory"]["process_arena"]
    printed = int(re.search(r"process arena: .* \((\d+) bytes\)", block).group(1))
    if printed != arena:
        sys.exit(f"FAIL {name} stage {stage}: compile printed an arena of {printed}, the run holds {arena}")
    # Bytes sent a step: each micro-batch's activation to the next chunk's rank (pipeline/output[_k], which
    # a chunk's forward fills) and its input gradient to the previous one's (pipeline/input_gradient[_k],
    # which its backward fills), over the rank's chunks (plan_stage<s>_forward_chunk<k>.json for k > 0).
    def boundary_bytes(kernel, buffer):
        total = 0
        for path in glob.glob(f"{run}/live/plan_stage{stage}_{kernel}.json") + \
                glob.glob(f"{run}/live/plan_stage{stage}_{kernel}_chunk*.json"):
            total += sum(b["bytes"] for b in json.load(open(path))["buffers"]
                         if re.fullmatch(re.escape(buffer) + r"(_\d+)?", b["name"]))
        return total
    expected = micro_batches * (boundary_bytes("forward", "pipeline/output") +
                                boundary_bytes("backward", "pipeline/input_gradient"))
    sent = int(re.search(r"point-to-point +[\d.]+ GiB \((\d+) bytes\) sent a step", block).group(1))
    if sent != expected or sent == 0:
        sys.exit(f"FAIL {name} stage {stage}: compile printed {sent} bytes sent a step, the boundaries make {expected}")
    sent_by_stage.append(sent)
    tied_sum_by_stage.append(json.load(open(f"{run}/live/plan_stage{stage}_update.json"))["cost"]["collective_bytes"].get("stage", 0))
    print(f"{name} stage {stage}: {len(aot)} plan files as compiled, arena {arena} bytes, {sent} bytes sent a step")
records = [json.loads(line) for line in open(f"{run}/live/metrics.jsonl")]
for record in records:
    if record["collective_bytes"] != record["planned_collective_bytes"]:
        sys.exit(f"FAIL {name} step {record['step']}: moved {record['collective_bytes']} != planned {record['planned_collective_bytes']}")
# Stage 0 (rank 0) moves its sends and the tied embedding table's sum with the last stage (its update's).
moved = records[-1]["collective_bytes"]["stage"]
printed = re.search(r"bytes per step +(?:\S+ [\d.]+ GiB \(\d+ bytes\), )*stage [\d.]+ GiB \((\d+) bytes\)", blocks[0]).group(1)
if not float(printed) == moved == sent_by_stage[0] + tied_sum_by_stage[0]:
    sys.exit(f"FAIL {name}: stage 0 moved {moved} stage bytes a step, compile printed {printed}, "
             f"sends {sent_by_stage[0]} + the tied table's sum {tied_sum_by_stage[0]}")
print(f"{name}: stage 0 moved {moved} stage bytes a step = sends {sent_by_stage[0]} + tied sum "
      f"{tied_sum_by_stage[0]}, as planned and printed")
PY
}
check gpipe_p2_m2 2 mesh.stage=2 pipeline_schedule=gpipe gradient_accumulation_steps=2
check 1f1b_p2_m4 2 mesh.stage=2 pipeline_schedule=1f1b gradient_accumulation_steps=4
check 1f1b_p4_m4 4 mesh.stage=4 pipeline_schedule=1f1b gradient_accumulation_steps=4 base_num_decoder_layers=4
check uneven_gpipe 2 mesh.stage=2 pipeline_schedule=gpipe gradient_accumulation_steps=2 base_num_decoder_layers=3
check stage_x_data 4 mesh.data=2 mesh.stage=2 pipeline_schedule=1f1b gradient_accumulation_steps=2
check interleaved_p2_v2 2 mesh.stage=2 pipeline_schedule=interleaved_1f1b num_pipeline_repeats=2 \
  gradient_accumulation_steps=2 base_num_decoder_layers=4

# A plan for another micro-batch count is refused naming the key; one made for one stage has no stage files.
expect_refused() {  # expect_refused NAME NEEDLE COMMAND...
  local name=$1 needle=$2
  shift 2
  if "$@" >"$work/$name.log" 2>&1; then echo "FAIL: $name was accepted"; exit 1; fi
  grep -qF -- "$needle" "$work/$name.log" || { echo "FAIL: $name: no '$needle'"; cat "$work/$name.log"; exit 1; }
  test ! -f "$work/$name/metrics.jsonl" || { echo "FAIL: $name trained"; exit 1; }
}
expect_refused other_batch "gradient_accumulation_steps" "${mpirun[@]}" -np 2 "$meshtrain" train qwen3-tiny \
  "${tiny[@]}" mesh.stage=2 pipeline_schedule=1f1b gradient_accumulation_steps=2 \
  plan_in="$work/1f1b_p2_m4/aot/plan" run_dir="$work/other_batch"
"$meshtrain" compile qwen3-tiny "${tiny[@]}" gradient_accumulation_steps=2 plan_out="$work/one/plan" >/dev/null
expect_refused one_stage "$work/one/plan_stage0_zero_gradients.json" "${mpirun[@]}" -np 2 "$meshtrain" train \
  qwen3-tiny "${tiny[@]}" mesh.stage=2 gradient_accumulation_steps=2 plan_in="$work/one/plan" \
  run_dir="$work/one_stage"
echo "pipeline_plan_live: OK"
