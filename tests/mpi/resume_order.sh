#!/usr/bin/env bash
# Order and resume on any mesh (issue 38): a run resumed on another mesh reads, from the next step on, the
# token ids the uninterrupted run read. The uninterrupted run: 4 steps on data 4 (per_device_batch_size 1,
# gradient_accumulation_steps 2: 8 rows a step), saving every 2 steps. Its step-2 checkpoint, copied into a
# fresh run_dir (so the learning-rate schedule of steps=4 is the same on both legs), resumes on data 2, on
# data 2 x fsdp 2, on one process and on context 2, each deriving gradient_accumulation_steps from the saved
# global batch (the config leaves it at 1). Steps 3-4 must have the uninterrupted run's batch_crc32c (the
# CRC-32C of the step's global input ids and targets: bitwise the same tokens) and its losses within 1e-5
# relative. Data: shuffled token shards of packed documents (three shards), then synthetic ids. A process
# count that cannot divide the global batch (3) is refused before anything loads, naming the numbers.
# Usage: resume_order.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
prepare_packed_documents
# Three shards of one byte-level tokenizer: vocabulary 257 has no merges, so every prepare makes the same one.
mkdir "$work/shards" "$work/parts"
for part in 0 1 2; do
  mkdir "$work/parts/$part"
  cp "$work/documents/"*"$part.txt" "$work/parts/$part/"
  "$meshtrain" prepare --out "$work/parts/out_$part" --vocab-size 257 --corpus "$work/parts/$part" \
    >>"$work/prepare.log" 2>&1 || { echo "FAIL: prepare of part $part"; cat "$work/prepare.log"; exit 1; }
  cp "$work/parts/out_$part/train.tokens" "$work/shards/part_$part.tokens"
done
cmp -s "$work/parts/out_0/tokenizer.json" "$work/parts/out_2/tokenizer.json" ||
  { echo "FAIL: the parts' tokenizers differ"; exit 1; }
tokens=(dataset_type=tokens dataset_path="$work/shards" tokenizer_path="$work/parts/out_0/tokenizer.json"
  vocab_size=257 enable_data_shuffling=true)
synthetic=(dataset_type=synthetic tokenizer_path= dataset_path= vocab_size=256)
model=(steps=4 learning_rate=1e-2 collective_timeout_s=120)  # common.sh's tiny model, its data keys given here
for setting in "${tiny[@]}"; do
  case $setting in
    dataset_type=* | dataset_path=* | tokenizer_path=* | vocab_size=*) ;;
    *) model+=("$setting") ;;
  esac
done

train() {  # train RUN_DIR RANKS per_device_batch_size [key=value ...]
  local run=$1 ranks=$2 batch=$3
  shift 3
  local launch=()
  [ "$ranks" -gt 1 ] && launch=("${mpirun[@]}" -np "$ranks")
  "${launch[@]}" "$meshtrain" train qwen3-tiny "${model[@]}" per_device_batch_size="$batch" run_dir="$run" "$@" \
    >"$run.log" 2>&1 || { echo "FAIL: train $run $*"; cat "$run.log"; exit 1; }
}

# same_steps REFERENCE RESUMED: steps 3-4 read the same tokens (batch_crc32c) with losses within 1e-5.
same_steps() {
  python3 - "$@" <<'PY'
import json, os, sys
def steps(run):
    return {m["step"]: m for m in map(json.loads, open(f"{run}/metrics.jsonl"))}
reference, resumed = steps(sys.argv[1]), steps(sys.argv[2])
assert sorted(resumed) == [3, 4], f"{sys.argv[2]}: steps {sorted(resumed)}, expected 3 and 4"
same = all(reference[s]["batch_crc32c"] == resumed[s]["batch_crc32c"] for s in (3, 4))
worst = max(abs(reference[s]["loss"] - resumed[s]["loss"]) / abs(reference[s]["loss"]) for s in (3, 4))
print(f"{os.path.basename(sys.argv[2])}: steps 3-4 batch_crc32c {'equal' if same else 'DIFFERENT'}, "
      f"worst relative loss difference {worst:.2e} (bound 1e-5)")
sys.exit(0 if same and worst <= 1e-5 else 1)
PY
}

status=0
# resume NAME DATA RANKS per_device_batch_size GA [key=value ...]: the reference's step 2 on another mesh.
resume() {
  local name=$1 data=$2 ranks=$3 batch=$4 accumulation=$5
  shift 5
  local run="$work/${data}_$name"
  mkdir -p "$run/checkpoints"
  cp -r "$work/${data}_reference/checkpoints/step_00000002" "$run/checkpoints/"
  train "$run" "$ranks" "$batch" "$@"
  grep -q "gradient_accumulation_steps 1 -> $accumulation, derived to keep the global batch of 8 rows" "$run.log" ||
    { echo "FAIL: $data $name: no line deriving gradient_accumulation_steps=$accumulation"; cat "$run.log"; status=1; }
  grep -q "^gradient_accumulation_steps: \"$accumulation\"" "$run/config.yaml" ||
    { echo "FAIL: $data $name: config.yaml does not hold the derived value"; status=1; }
  same_steps "$work/${data}_reference" "$run" || status=1
}

train "$work/tokens_reference" 4 1 "${tokens[@]}" mesh.data=4 gradient_accumulation_steps=2 checkpoint_period=2
resume data2 tokens 2 1 4 "${tokens[@]}" mesh.data=2
resume data2_fsdp2 tokens 4 1 2 "${tokens[@]}" mesh.data=2 mesh.fsdp=2
resume single tokens 1 2 4 "${tokens[@]}"
resume context2 tokens 2 1 4 "${tokens[@]}" mesh.context=2
# Synthetic ids follow the step alone: the same global batch gives the same rows.
train "$work/synthetic_reference" 4 1 "${synthetic[@]}" mesh.data=4 gradient_accumulation_steps=2 \
  checkpoint_period=2
resume single synthetic 1 4 2 "${synthetic[@]}"
resume data2_fsdp2 synthetic 4 1 2 "${synthetic[@]}" mesh.data=2 mesh.fsdp=2

# 3 processes x per_device_batch_size 1 cannot divide 8 rows: refused before the plan, naming the numbers.
refused="$work/refused"
mkdir -p "$refused/checkpoints"
cp -r "$work/tokens_reference/checkpoints/step_00000002" "$refused/checkpoints/"
if "${mpirun[@]}" -np 3 "$meshtrain" train qwen3-tiny "${model[@]}" "${tokens[@]}" mesh.data=3 \
  per_device_batch_size=1 run_dir="$refused" >"$refused.log" 2>&1; then
  echo "FAIL: 3 processes resumed a global batch of 8 rows"
  status=1
fi
for needle in "step_00000002/metadata.json: data_cursor" "global batch of 8 rows" \
  "per_device_batch_size 1 x 3 processes = 3 rows a micro-batch" "mesh data=3" \
  "whose product divides 8"; do
  grep -qF -- "$needle" "$refused.log" || { echo "FAIL: the refusal does not say '$needle'"; status=1; }
done
[ -e "$refused/metrics.jsonl" ] && { echo "FAIL: the refused run trained"; status=1; }
[ "$status" -eq 0 ] && echo "refused: 3 processes for a global batch of 8 rows"
exit $status
