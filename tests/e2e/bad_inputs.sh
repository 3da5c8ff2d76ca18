#!/usr/bin/env bash
# The bad-input catalogue (issue 16): one case per kind of user-facing error, by category (config, mesh,
# data, tokenizer, checkpoint, plan, command line). Each must end with exit status 1 or 2 (an error, never a
# signal or an internal error's 3), print "meshtrain: error: ", and name the file, key or flag to fix, with
# what was expected. A case that passes prints nothing; the summary counts the cases per category.
# Usage: bad_inputs.sh BUILD_DIR
set -uo pipefail
meshtrain="$(cd "$1" && pwd)/meshtrain"
hf_fixture="$(cd "$(dirname "$0")/../reference/hf_interchange/special_tokens" && pwd)/gpt2_null_ids"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
model=(dataset_type=synthetic tokenizer_path= dataset_path= eval_dataset_path= eval_interval=0
  max_target_length=16 base_emb_dim=32 base_num_query_heads=4 base_num_kv_heads=2 head_dim=8 base_mlp_dim=48
  base_num_decoder_layers=2 vocab_size=64)
tiny=("${model[@]}" per_device_batch_size=2 steps=1)
resume=("${model[@]}" per_device_batch_size=2 steps=2)  # from the fixture's step 1
status=0
declare -A cases=()

# expect CATEGORY "NEEDLE" ["NEEDLE" ...] -- COMMAND...: the command fails cleanly and says every needle.
expect() {
  local category=$1 needles=()
  shift
  while [ "$1" != "--" ]; do needles+=("$1"); shift; done
  shift
  local output rc
  output=$("$@" </dev/null 2>&1)
  rc=$?
  cases[$category]=$((${cases[$category]:-0} + 1))
  local problem=""
  [ "$rc" -eq 1 ] || [ "$rc" -eq 2 ] || problem="exit status $rc (expected 1 or 2)"
  grep -q "meshtrain: error: " <<<"$output" || problem+="${problem:+; }no 'meshtrain: error: ' line"
  for needle in "${needles[@]}"; do
    grep -qF -- "$needle" <<<"$output" || problem+="${problem:+; }missing '$needle'"
  done
  if [ -n "$problem" ]; then
    echo "FAIL [$category] $*: $problem"
    echo "$output" | tail -3 | sed 's/^/    /'
    status=1
  fi
}

# --- fixtures: a committed checkpoint, a plan of another batch, broken files -----------------------------
"$meshtrain" train qwen3-tiny "${tiny[@]}" run_dir="$work/run" >"$work/run.log" 2>&1 ||
  { echo "FAIL: fixture run"; cat "$work/run.log"; exit 1; }
checkpoint="$work/run/checkpoints/step_00000001"
"$meshtrain" compile qwen3-tiny "${model[@]}" per_device_batch_size=4 plan_out="$work/plan4" >/dev/null 2>&1 ||
  { echo "FAIL: fixture plan"; exit 1; }
mkdir "$work/documents" && for i in 1 2 3 4 5 6; do echo "in the beginning $i" >"$work/documents/$i.txt"; done
"$meshtrain" prepare --out "$work/prepared" --vocab-size 257 --corpus "$work/documents" >/dev/null 2>&1 ||
  { echo "FAIL: fixture prepare"; exit 1; }
# Two tokenizers of one vocabulary size that differ in their merges, and a checkpoint trained with the first.
mkdir "$work/other_documents" &&
  for i in 1 2 3 4 5 6; do echo "zebra quartz fjord $i" >"$work/other_documents/$i.txt"; done
for corpus in documents other_documents; do
  "$meshtrain" prepare --out "$work/tok_$corpus" --vocab-size 260 --corpus "$work/$corpus" >/dev/null 2>&1 ||
    { echo "FAIL: fixture prepare of $corpus"; exit 1; }
done
# Token shards and text mixtures trained with the fixture's tokenizer (vocab 257).
prepared_model=(dataset_type=tokens tokenizer_path="$work/prepared/tokenizer.json" eval_dataset_path=
  eval_interval=0 max_target_length=16 base_emb_dim=32 base_num_query_heads=4 base_num_kv_heads=2 head_dim=8
  base_mlp_dim=48 base_num_decoder_layers=2 vocab_size=257 per_device_batch_size=2)
mixture_model=("${prepared_model[@]/dataset_type=tokens/dataset_type=text}")
for corpus in mix_a mix_b; do
  mkdir "$work/$corpus" &&
    for i in 1 2 3 4 5 6; do
      for line in $(seq 20); do echo "in the beginning $line was the word of $corpus $i"; done >"$work/$corpus/$i.txt"
    done
done
identity_of() { grep -o '"tokenizer_identity": "[0-9a-f]*"' "$1/prepare.json" | cut -d'"' -f4; }
tokens_model=()  # the fixture model, on prepared tokens of a 260-id tokenizer
for setting in "${tiny[@]}"; do
  case $setting in
    dataset_type=* | dataset_path=* | tokenizer_path=* | vocab_size=*) ;;
    *) tokens_model+=("$setting") ;;
  esac
done
tokens_model+=(dataset_type=tokens vocab_size=260)
"$meshtrain" train qwen3-tiny "${tokens_model[@]}" dataset_path="$work/tok_documents" \
  tokenizer_path="$work/tok_documents/tokenizer.json" run_dir="$work/run_a" >"$work/run_a.log" 2>&1 ||
  { echo "FAIL: fixture run on tokens"; cat "$work/run_a.log"; exit 1; }
checkpoint_a="$work/run_a/checkpoints/step_00000001"
printf 'steps: [1,\n' >"$work/broken.yaml"
printf '{"model": {"type": "BPE", "vocab": ' >"$work/tokenizer.json"
head -c 1000 /dev/urandom >"$work/noise.tokens"
corrupt() {  # corrupt NAME: a copy of the checkpoint with one flipped byte in its shard
  cp -r "$checkpoint" "$work/$1"
  local shard="$work/$1/shards/rank_00000.safetensors"
  printf '\x7f' | dd of="$shard" bs=1 seek=$(($(stat -c %s "$shard") - 100)) conv=notrunc status=none
}
corrupt flipped
hf_config_with() {  # hf_config_with NAME KEY JSON: a copy of a Hugging Face folder whose config.json sets KEY
  cp -r "$hf_fixture" "$work/$1"
  python3 -c 'import json,sys; p=sys.argv[1]; c=json.load(open(p)); c[sys.argv[2]]=json.loads(sys.argv[3]); json.dump(c, open(p, "w"))' \
    "$work/$1/config.json" "$2" "$3"
}
hf_config_with hf_bos_string bos_token_id '"0"'
hf_config_with hf_eos_outside eos_token_id 64
cp -r "$checkpoint" "$work/truncated" && truncate -s -10 "$work/truncated/shards/rank_00000.safetensors"
cp -r "$checkpoint" "$work/unmarked" && rm "$work/unmarked/COMMITTED"
cp -r "$checkpoint" "$work/chunkless" && rm "$work/chunkless/shards/rank_00000.safetensors"

# --- config ----------------------------------------------------------------------------------------------
expect config "config key 'stepz'" "did you mean 'steps'" -- "$meshtrain" train qwen3-tiny "${tiny[@]}" stepz=3
expect config "config key 'steps'" "expected an integer" -- "$meshtrain" train qwen3-tiny "${model[@]}" steps=abc
expect config "config key 'remat_policy'" "none, minimal or full" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" remat_policy=sometimes
if grep -q -E -w "avx512_bf16|amx_bf16" /proc/cpuinfo; then  # bf16 compute runs here: storage dtypes do not
  expect config "config key 'weight_dtype'" "set weight_dtype=float32" -- \
    "$meshtrain" train qwen3-tiny "${tiny[@]}" weight_dtype=bfloat16
else
  expect config "config key 'dtype'" "AVX512-BF16" -- "$meshtrain" train qwen3-tiny "${tiny[@]}" dtype=bfloat16
fi
expect config "MESHTRAIN_GEMM_BACKEND" "onednn or reference" "'blas'" -- \
  env MESHTRAIN_GEMM_BACKEND=blas "$meshtrain" train qwen3-tiny "${tiny[@]}"
expect config "$work/none.yaml" "no such file" -- "$meshtrain" train "$work/none.yaml"
expect config "$work/broken.yaml" "YAML" -- "$meshtrain" train "$work/broken.yaml"
expect config "meshtrain train" "a preset name" -- "$meshtrain" train
expect config "config key 'enable_data_shuffling'" "true or false" "'maybe'" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" enable_data_shuffling=maybe
expect config "config key 'hf_eos_token_id'" "a token id in [0, vocab_size = 8192), null, absent" -- \
  "$meshtrain" info qwen3-tiny hf_eos_token_id=8192
expect config "config key 'z_loss_multiplier'" "0 (no z-loss) or a positive finite multiplier" "-0.001" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" z_loss_multiplier=-1e-3
expect config "config key 'adamw_mask'" "'layers_0/mlp/w0'" "matches none" "decoder/layers_0/mlp/wo/kernel" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" 'adamw_mask=[layers_0/mlp/w0]'
expect config "config key 'adamw_mask_include'" "regular expressions" "'norm('" -- \
  "$meshtrain" info qwen3-tiny 'adamw_mask_include=[norm(]'
expect config "config key 'adamw_mask'" "at most 256 characters" "one of 300" -- \
  "$meshtrain" info qwen3-tiny "adamw_mask=[$(printf 'n%.0s' $(seq 300))]"
expect config "config key 'opt_type'" "adamw or muon" "did you mean 'muon'" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" opt_type=moun
expect config "config key 'opt_type'" "base_num_kv_heads=2" "set mesh.tensor to at most base_num_kv_heads" -- \
  "$meshtrain" compile qwen3-tiny "${tiny[@]}" opt_type=muon mesh.tensor=4 mesh.data=1
expect config "config key 'muon_consistent_rms'" "a positive number, or null" -- \
  "$meshtrain" info qwen3-tiny muon_consistent_rms=-1
expect config "config key 'train_data_columns'" "the name of the column" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]/dataset_type=synthetic/dataset_type=text}" train_data_columns=
# The learning-rate schedule and spike skipping (issue 41): names, fractions, lengths, the final fraction's two
# names, the spike statistic's window and factor; refused before the run directory exists.
expect config "config key 'lr_schedule_type'" "cosine, wsd or constant" "did you mean 'wsd'" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" lr_schedule_type=wds run_dir="$work/schedule_run"
[ ! -e "$work/schedule_run" ] || { echo "FAIL [config] lr_schedule_type: the run directory was made"; status=1; }
expect config "config key 'wsd_decay_style'" "linear, cosine or 1-sqrt" "did you mean '1-sqrt'" -- \
  "$meshtrain" info qwen3-tiny lr_schedule_type=wsd wsd_decay_style=sqrt
expect config "config key 'warmup_steps_fraction'" "a fraction in [0, 1]" "found 1.5" -- \
  "$meshtrain" info qwen3-tiny warmup_steps_fraction=1.5
expect config "config key 'learning_rate_final_fraction'" "a fraction in [0, 1]" "found -0.1" -- \
  "$meshtrain" info qwen3-tiny learning_rate_final_fraction=-0.1
expect config "config key 'cosine_learning_rate_final_fraction'" "a fraction in [0, 1]" -- \
  "$meshtrain" info qwen3-tiny cosine_learning_rate_final_fraction=2
expect config "config key 'wsd_decay_steps_fraction'" "a fraction in [0, 1]" -- \
  "$meshtrain" info qwen3-tiny wsd_decay_steps_fraction=1.2
expect config "'warmup_steps_fraction' + 'wsd_decay_steps_fraction'" "at most 1" "0.5 + 0.6" -- \
  "$meshtrain" info qwen3-tiny lr_schedule_type=wsd warmup_steps_fraction=0.5 wsd_decay_steps_fraction=0.6
for schedule_steps in -2 0; do
  expect config "config key 'learning_rate_schedule_steps'" "-1 (the run's steps) or a positive number" -- \
    "$meshtrain" info qwen3-tiny learning_rate_schedule_steps=$schedule_steps
done
expect config "'learning_rate_final_fraction' / 'cosine_learning_rate_final_fraction'" "0.2 / 0.3" -- \
  "$meshtrain" info qwen3-tiny learning_rate_final_fraction=0.2 cosine_learning_rate_final_fraction=0.3
expect config "config key 'skip_step_interval'" "at least 2" -- "$meshtrain" info qwen3-tiny skip_step_interval=1
expect config "config key 'skip_step_scaling_factor'" "a positive number" -- \
  "$meshtrain" info qwen3-tiny skip_step_scaling_factor=0
expect config "config key 'skip_step_max_consecutive'" "0 (no limit)" -- \
  "$meshtrain" info qwen3-tiny skip_step_max_consecutive=-1
# --- mesh ------------------------------------------------------------------------------------------------
expect mesh "config key 'mesh'" "product of 1" -- "$meshtrain" train qwen3-tiny "${tiny[@]}" mesh.fsdp=3
expect mesh "config key 'base_num_query_heads'" "tensor degree 8" -- \
  "$meshtrain" compile qwen3-tiny "${tiny[@]}" topology=h100x8 mesh.tensor=8
expect mesh "config key 'topology'" "h100xN" -- "$meshtrain" compile qwen3-tiny topology=h1000x8
# A GPU run: what the cuda kernels do not run yet, whatever the machine; no GPU here (CI), or no CUDA build.
expect mesh "config key 'z_loss_multiplier'" "set z_loss_multiplier=0" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" topology=h200x1 z_loss_multiplier=1e-4
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  expect mesh "config key 'topology'" "NVIDIA GPU" -- "$meshtrain" train qwen3-tiny "${tiny[@]}" topology=h200x1
  # MoE and MLA have cuda kernels: only the missing GPU stops deepseek-tiny.
  expect mesh "config key 'topology'" "NVIDIA GPU" -- "$meshtrain" train deepseek-tiny topology=h200x1 steps=1 \
    dataset_type=synthetic tokenizer_path= dataset_path= eval_dataset_path=
fi
# Sharing GPUs between processes is an NVIDIA topology's mode only.
expect mesh "config key 'share_gpus'" "set share_gpus=false" -- "$meshtrain" train qwen3-tiny "${tiny[@]}" share_gpus=true
# Pipeline stages: the placement's rules (on one stage too), the schedule's, a stage degree that does not
# divide the devices, and scan_layers over a stage's non-contiguous chunks (train under mpirun:
# tests/mpi/failures.sh; a stage's plan_in: tests/mpi/pipeline_plan_live.sh).
expect mesh "config key 'pipeline_layers_per_chunk'" "a sum of 3 ([3])" "base_num_decoder_layers = 2" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" pipeline_layers_per_chunk=[3] run_dir="$work/r_split"
expect mesh "config key 'num_pipeline_repeats'" "found 0" "set num_pipeline_repeats=1" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" num_pipeline_repeats=0 run_dir="$work/r_repeats"
expect mesh "config keys 'mesh.stage' / 'num_pipeline_repeats'" "at most base_num_decoder_layers = 2 chunks" \
  "mesh.stage x num_pipeline_repeats = 4 x 1 = 4 chunks" -- "$meshtrain" compile qwen3-tiny "${tiny[@]}" mesh.stage=4
expect mesh "gradient_accumulation_steps" "at least mesh.stage=2 micro-batches with pipeline_schedule=1f1b" -- \
  "$meshtrain" compile qwen3-tiny "${tiny[@]}" mesh.stage=2
expect mesh "config key 'scan_layers'" "false with num_pipeline_repeats > 1" "set scan_layers=false" -- \
  "$meshtrain" compile qwen3-tiny "${tiny[@]/base_num_decoder_layers=2/base_num_decoder_layers=4}" mesh.stage=2 \
  num_pipeline_repeats=2 pipeline_schedule=interleaved_1f1b scan_layers=true gradient_accumulation_steps=2
expect mesh "config key 'mesh'" "divides the 8 devices of topology h100x8" "data=-1 stage=3" -- \
  "$meshtrain" compile qwen3-tiny "${tiny[@]}" topology=h100x8 mesh.data=-1 mesh.stage=3 gradient_accumulation_steps=3
expect mesh "config key 'mesh'" "a product of 8" "stage=3" -- \
  "$meshtrain" compile qwen3-tiny "${tiny[@]}" topology=h100x8 mesh.stage=3 gradient_accumulation_steps=3
# zero_bubble runs (each backward split into B_input and W) with 1F1B's rule: at least mesh.stage micro-batches.
expect mesh "gradient_accumulation_steps" "at least mesh.stage=2 micro-batches with pipeline_schedule=zero_bubble" \
  "set gradient_accumulation_steps=2" -- "$meshtrain" compile qwen3-tiny "${tiny[@]}" mesh.stage=2 \
  pipeline_schedule=zero_bubble
# srun starting several tasks without an MPI plugin: each would train alone into the same run_dir.
expect mesh "SLURM_STEP_NUM_TASKS" "an MPI launcher for the 2 tasks srun started" "srun --mpi=pmix" -- \
  env SLURM_STEP_NUM_TASKS=2 SLURM_STEP_ID=0 SLURM_PROCID=1 "$meshtrain" train qwen3-tiny "${tiny[@]}"
# The launcher's variables against MPI's answer: a rank SLURM states that MPI does not see.
expect mesh "environment variable SLURM_PROCID" "expected the rank 0 (as MPI reports it), found 2" -- \
  env SLURM_STEP_NUM_TASKS=1 SLURM_STEP_ID=0 SLURM_PROCID=2 SLURM_JOB_ID=5 "$meshtrain" train qwen3-tiny "${tiny[@]}"
# meshtrain launch checks the mesh against --nodes x --tasks-per-node before writing or starting anything.
expect mesh "config key 'mesh'" "2 nodes x 1 task per node = 2 ranks" "launch 4 ranks" -- \
  "$meshtrain" launch qwen3-tiny "${tiny[@]}" mesh.data=4 --nodes 2 --sbatch "$work/mesh.sbatch"
# --- data ------------------------------------------------------------------------------------------------
expect data "$work/none.tokens" "nothing readable" -- \
  "$meshtrain" train qwen3-tiny dataset_type=tokens dataset_path="$work/none.tokens" tokenizer_path= \
  eval_dataset_path= eval_interval=0 steps=1
expect data "$work/noise.tokens" -- \
  "$meshtrain" train qwen3-tiny dataset_type=tokens dataset_path="$work/noise.tokens" \
  tokenizer_path="$work/prepared/tokenizer.json" eval_dataset_path= eval_interval=0 steps=1
expect data "config key 'dataset_type'" -- "$meshtrain" train qwen3-tiny "${tiny[@]}" dataset_type=parquet
# dataset_type=text holds out 5% of the files: one file cannot be split, and the hint names train's key.
expect data "$work/documents/1.txt" "point dataset_path at a folder of at least 2 text files" -- \
  "$meshtrain" train qwen3-tiny dataset_type=text dataset_path="$work/documents/1.txt" eval_interval=0 \
  tokenizer_path="$work/prepared/tokenizer.json" vocab_size=257 max_target_length=16 base_emb_dim=32 \
  base_num_query_heads=4 base_num_kv_heads=2 head_dim=8 base_mlp_dim=48 base_num_decoder_layers=2 \
  per_device_batch_size=2 steps=1 run_dir="$work/r-text"
# A mixture in dataset_path (data/mixture.h): a weight that is not positive, a glob that matches nothing and a
# source without a single row each name the entry, before training starts.
expect data "config key 'dataset_path', entry 1 of 2 ('a,0')" "a positive finite number as the weight" -- \
  "$meshtrain" train qwen3-tiny dataset_type=tokens "dataset_path=a,0;b,1" tokenizer_path= eval_dataset_path= \
  eval_interval=0 steps=1
expect data "config key 'dataset_path', entry 2 of 2 ('$work/none*.tokens')" "a glob matching .tokens shards" \
  "no match" -- \
  "$meshtrain" train qwen3-tiny "${prepared_model[@]}" "dataset_path=$work/prepared,1;$work/none*.tokens,1" steps=1
mkdir "$work/tiny" && echo "a" >"$work/tiny/1.txt" && echo "b" >"$work/tiny/2.txt"
expect data "config key 'dataset_path', entry 2 of 2 ('$work/tiny')" "at least max_target_length + 1 = 17 tokens" -- \
  "$meshtrain" train qwen3-tiny "${mixture_model[@]}" "dataset_path=$work/mix_a,1;$work/tiny,1" steps=1 \
  run_dir="$work/r-tiny"
# prepare --tokenizer on raw sources (data/prepare_records.h): each bad file names itself (and its line or byte
# offset), and a stopped prepare leaves no index.json.
mkdir "$work/raw" && printf '{"text": "fine"}\n{"text": "fine"}\n' >"$work/raw/good.jsonl"
printf '{"text": "fine"}\n{"text": broken}\n' >"$work/raw/malformed.jsonl"
printf '{"text": "fine"}\n{"content": "x"}\n' >"$work/raw/no_column.jsonl"
printf '{"text": 42}\n' >"$work/raw/number.jsonl"
printf '{"text": "caf\xe9"}\n' >"$work/raw/latin1.jsonl"
: >"$work/raw/empty.jsonl"
mkdir "$work/raw/empty_folder"
raw_prepare=(prepare --tokenizer "$work/prepared/tokenizer.json" --out "$work/raw_out" --corpus)
expect data "$work/raw/malformed.jsonl:2" "malformed JSON" -- "$meshtrain" "${raw_prepare[@]}" "$work/raw/malformed.jsonl"
expect data "$work/raw/no_column.jsonl:2" "no such column; the line's columns: 'content'" "--column=COLUMN" -- \
  "$meshtrain" "${raw_prepare[@]}" "$work/raw/no_column.jsonl"
expect data "$work/raw/number.jsonl:1" "a string column 'text'" "a number: 42" -- \
  "$meshtrain" "${raw_prepare[@]}" "$work/raw/number.jsonl"
expect data "$work/raw/latin1.jsonl:1" "invalid UTF-8 at byte offset 13" -- \
  "$meshtrain" "${raw_prepare[@]}" "$work/raw/latin1.jsonl"
expect data "$work/raw/empty.jsonl" "at least one document" -- "$meshtrain" "${raw_prepare[@]}" "$work/raw/empty.jsonl"
expect data "$work/raw/empty_folder" "at least one data file" -- \
  "$meshtrain" "${raw_prepare[@]}" "$work/raw/empty_folder"
expect data "$work/raw/*.parquet" "no match" -- "$meshtrain" "${raw_prepare[@]}" "$work/raw/*.parquet"
# Not Parquet at all: refused as damaged by a build that reads Parquet, as unreadable by one that does not.
echo "not parquet" >"$work/raw/bad.parquet"
expect data "$work/raw/bad.parquet" "Parquet" -- "$meshtrain" "${raw_prepare[@]}" "$work/raw/bad.parquet"
for tool in "gzip -n:gz" "zstd -q:zst"; do
  if command -v "${tool%% *}" >/dev/null; then
    ${tool%:*} -c "$work/raw/good.jsonl" >"$work/raw/cut.jsonl.${tool#*:}"
    truncate -s -4 "$work/raw/cut.jsonl.${tool#*:}"
    expect data "$work/raw/cut.jsonl.${tool#*:}" "the file ends inside it at byte offset" -- \
      "$meshtrain" "${raw_prepare[@]}" "$work/raw/cut.jsonl.${tool#*:}"
  fi
done
[ -e "$work/raw_out/index.json" ] && { echo "FAIL [data] a failed prepare left $work/raw_out/index.json"; status=1; }
expect data "meshtrain prepare --corpus" "JSON Lines, Parquet or a glob" "add --tokenizer PATH" -- \
  "$meshtrain" prepare --corpus "$work/raw/good.jsonl" --out "$work/raw_out"
# The same reader in train (dataset_type=text on JSON Lines): its hints name the config keys.
expect data "$work/raw/no_column.jsonl:2" "no such column" "train_data_columns=COLUMN" -- \
  "$meshtrain" train qwen3-tiny "${mixture_model[@]}" dataset_path="$work/raw/no_column.jsonl" steps=1 \
  run_dir="$work/r-raw"
expect data "$work/raw/none*.jsonl" "no match" "dataset_path" -- \
  "$meshtrain" train qwen3-tiny "${mixture_model[@]}" "dataset_path=$work/raw/none*.jsonl" steps=1 \
  run_dir="$work/r-raw-glob"
# --- tokenizer -------------------------------------------------------------------------------------------
expect tokenizer "$work/none.json" "tokenizer.json" -- "$meshtrain" tokenize --tokenizer "$work/none.json"
expect tokenizer "$work/tokenizer.json" -- "$meshtrain" tokenize --tokenizer "$work/tokenizer.json"
expect tokenizer "$work/tokenizer.json" -- \
  "$meshtrain" train qwen3-tiny dataset_type=text tokenizer_path="$work/tokenizer.json" eval_dataset_path= \
  eval_interval=0 steps=1
sed 's/<|endoftext|>/<|unused|>/g' "$work/prepared/tokenizer.json" >"$work/no_eos_tokenizer.json"
expect tokenizer "$work/no_eos_tokenizer.json" "an end-of-text token (<|endoftext|>)" -- \
  "$meshtrain" prepare --corpus "$work/raw/good.jsonl" --tokenizer "$work/no_eos_tokenizer.json" --out "$work/raw_out"
# A vocabulary the loader's fast scanner does not take (a fractional id): the full parse's error, naming it.
sed 's/"vocab": {/&"zz": 1.5, /' "$work/prepared/tokenizer.json" >"$work/fraction_tokenizer.json"
expect tokenizer "$work/fraction_tokenizer.json: model.vocab" "integer token ids" "'zz': 1.5" -- \
  "$meshtrain" tokenize --tokenizer "$work/fraction_tokenizer.json"
# --- checkpoint ------------------------------------------------------------------------------------------
expect checkpoint "$work/none" "no such directory" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" load_full_state_path="$work/none" run_dir="$work/r1"
expect checkpoint "shards/rank_00000.safetensors" "CRC-32C" "corrupted" -- \
  "$meshtrain" train qwen3-tiny "${resume[@]}" load_full_state_path="$work/flipped" run_dir="$work/r2"
expect checkpoint "shards/rank_00000.safetensors" "truncated" -- \
  "$meshtrain" train qwen3-tiny "${resume[@]}" load_full_state_path="$work/truncated" run_dir="$work/r3"
expect checkpoint "COMMITTED" "commit marker" -- \
  "$meshtrain" train qwen3-tiny "${resume[@]}" load_full_state_path="$work/unmarked" run_dir="$work/r4"
expect checkpoint "shards/rank_00000.safetensors" "the shard file index.json lists" -- \
  "$meshtrain" train qwen3-tiny "${resume[@]}" load_full_state_path="$work/chunkless" run_dir="$work/r5"
expect checkpoint "index.json: tensor '" "base_emb_dim 32 in the checkpoint, 64 here" -- \
  "$meshtrain" train qwen3-tiny "${resume[@]/base_emb_dim=32/base_emb_dim=64}" load_full_state_path="$checkpoint" \
  run_dir="$work/r6"
expect checkpoint "--checkpoint $work/none" -- "$meshtrain" generate --checkpoint "$work/none" --prompt hi
expect checkpoint "export-hf" -- "$meshtrain" export-hf "$work/none" --out "$work/exported"
# A run on token shards saved with shuffled rows, resumed with enable_data_shuffling=false.
shuffled=(dataset_type=tokens dataset_path="$work/prepared" tokenizer_path="$work/prepared/tokenizer.json"
  eval_dataset_path= eval_interval=0 max_target_length=16 base_emb_dim=32 base_num_query_heads=4
  base_num_kv_heads=2 head_dim=8 base_mlp_dim=48 base_num_decoder_layers=2 vocab_size=257
  per_device_batch_size=2 run_dir="$work/shuffled")
"$meshtrain" train qwen3-tiny "${shuffled[@]}" steps=1 >"$work/shuffled.log" 2>&1 ||
  { echo "FAIL: fixture run on token shards"; cat "$work/shuffled.log"; exit 1; }
expect checkpoint "enable_data_shuffling=false (this run)" \
  "enable_data_shuffling=true (when the checkpoint was saved)" "resume with enable_data_shuffling=true" -- \
  "$meshtrain" train qwen3-tiny "${shuffled[@]}" steps=2 enable_data_shuffling=false
# A run feeding another tokenizer than the checkpoint's, or none (synthetic ids): both sides named.
identity_a=$(identity_of "$work/tok_documents") identity_b=$(identity_of "$work/tok_other_documents")
expect checkpoint "$checkpoint_a/metadata.json: tokenizer" "identity $identity_a" "$checkpoint_a/tokenizer.json" \
  "tokenizer_path=$work/tok_other_documents/tokenizer.json" "identity $identity_b" "allow_tokenizer_change=true" -- \
  "$meshtrain" train qwen3-tiny "${tokens_model[@]}" dataset_path="$work/tok_other_documents" \
  tokenizer_path="$work/tok_other_documents/tokenizer.json" load_parameters_path="$checkpoint_a" run_dir="$work/r_b"
expect checkpoint "$checkpoint_a/metadata.json: tokenizer" "no tokenizer (dataset_type=synthetic" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]/vocab_size=64/vocab_size=260}" load_parameters_path="$checkpoint_a" \
  run_dir="$work/r_none"
# Its counterpart: allow_tokenizer_change=true trains, warns naming both, and records the new tokenizer.
"$meshtrain" train qwen3-tiny "${tokens_model[@]}" dataset_path="$work/tok_other_documents" \
  tokenizer_path="$work/tok_other_documents/tokenizer.json" load_parameters_path="$checkpoint_a" \
  allow_tokenizer_change=true run_dir="$work/r_allowed" >"$work/r_allowed.log" 2>&1 &&
  grep -q "warning: allow_tokenizer_change=true: .*identity $identity_a.*identity $identity_b" "$work/r_allowed.log" &&
  grep -q "\"identity\": \"$identity_b\"" "$work/r_allowed/checkpoints/step_00000001/metadata.json" ||
  { echo "FAIL: allow_tokenizer_change=true did not train with a warning into a checkpoint of the new tokenizer"
    tail -3 "$work/r_allowed.log" | sed 's/^/    /'; status=1; }
# A text mixture's checkpoint resumed with other weights names the entry and both shares; allow_data_change=true
# continues on the new weights.
"$meshtrain" train qwen3-tiny "${mixture_model[@]}" "dataset_path=$work/mix_a,3;$work/mix_b,1" steps=1 \
  run_dir="$work/mixed" >"$work/mixed.log" 2>&1 || { echo "FAIL: fixture mixture run"; cat "$work/mixed.log"; exit 1; }
expect checkpoint "config key 'dataset_path', entry 1 of 2 ('$work/mix_a')" "share = 0.5 (this run's data)" \
  "0.75 (when the checkpoint was saved)" "allow_data_change=true" -- \
  "$meshtrain" train qwen3-tiny "${mixture_model[@]}" "dataset_path=$work/mix_a,1;$work/mix_b,1" steps=2 \
  run_dir="$work/mixed"
"$meshtrain" train qwen3-tiny "${mixture_model[@]}" "dataset_path=$work/mix_a,1;$work/mix_b,1" steps=2 \
  allow_data_change=true run_dir="$work/mixed" >"$work/mixed2.log" 2>&1 &&
  grep -q '"source0":{[^}]*"rows":3,.*"source1":{[^}]*"rows":1,.*"step":2,' "$work/mixed/metrics.jsonl" ||
  { echo "FAIL: allow_data_change=true did not continue the mixture on the new weights"
    tail -3 "$work/mixed2.log" | sed 's/^/    /'; status=1; }
expect checkpoint "hf_bos_string/config.json: key 'bos_token_id'" "a token id in [0, vocab_size = 64) or null" \
  '"0"' -- "$meshtrain" import-hf "$work/hf_bos_string" --out "$work/imported"
expect checkpoint "hf_eos_outside/config.json: key 'eos_token_id'" "a token id in [0, vocab_size = 64) or null" \
  "found 64" -- "$meshtrain" import-hf "$work/hf_eos_outside" --out "$work/imported"
# A full state resumes with its global batch (2 rows): per_device_batch_size x devices must divide it.
expect checkpoint "$checkpoint/metadata.json: data_cursor" "global batch of 2 rows" \
  "per_device_batch_size 3 x 1 process = 3 rows a micro-batch" "whose product divides 2" -- \
  "$meshtrain" train qwen3-tiny "${resume[@]/per_device_batch_size=2/per_device_batch_size=3}" \
  load_full_state_path="$checkpoint" run_dir="$work/r_batch"
# --- plan ------------------------------------------------------------------------------------------------
expect plan "$work/none_fwd_bwd.json" "meshtrain compile" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" plan_in="$work/none" run_dir="$work/r7"
expect plan "$work/plan4_fwd_bwd.json" -- \
  "$meshtrain" train qwen3-tiny "${tiny[@]}" plan_in="$work/plan4" run_dir="$work/r8"
expect plan "config key 'kernels'" "did you mean 'update'" -- "$meshtrain" compile qwen3-tiny kernels=fwd_bwd,updat
# --- command line ----------------------------------------------------------------------------------------
expect command "--memory-budget" "a size of at least one byte" -- \
  "$meshtrain" compile qwen3-tiny --search --memory-budget=lots
expect command "--memory-budget" "together with --search" -- "$meshtrain" compile qwen3-tiny --memory-budget=8GiB
expect command "measure-machine --name" -- "$meshtrain" measure-machine --name h100xN
expect command "meshtrain compile" "--explain" -- "$meshtrain" compile qwen3-tiny --explian
expect command "meshtrain generate argument '--promt'" "did you mean '--prompt'?" "meshtrain generate --help" -- \
  "$meshtrain" generate --checkpoint "$checkpoint" --promt hi
expect command "meshtrain command 'genrate'" "did you mean 'generate'?" -- "$meshtrain" help genrate
expect command "meshtrain train argument '--steps=3'" "write steps=3" -- "$meshtrain" train qwen3-tiny --steps=3
expect command "meshtrain train argument '--stesp=3'" "did you mean the config key steps=VALUE?" -- \
  "$meshtrain" train qwen3-tiny --stesp=3
expect command "meshtrain info argument '--verbose'" "takes no flags" -- "$meshtrain" info qwen3-tiny --verbose
expect command "meshtrain prepare --column" "--column with --tokenizer" -- "$meshtrain" prepare --column text
expect command "meshtrain prepare --vocab-size" "no --vocab-size with --tokenizer" -- \
  "$meshtrain" prepare --corpus "$work/raw/good.jsonl" --tokenizer "$work/prepared/tokenizer.json" \
  --out "$work/raw_out" --vocab-size 300
expect command "--validation-fraction" "a share in [0, 1)" -- \
  "$meshtrain" prepare --corpus "$work/raw/good.jsonl" --tokenizer "$work/prepared/tokenizer.json" \
  --out "$work/raw_out" --validation-fraction 1
# generate --prompt-ids (the fixture checkpoint, trained on synthetic data, has no tokenizer and vocab_size 64)
expect command "generate --prompt-ids" "'x' at position 1" -- "$meshtrain" generate --checkpoint "$checkpoint" \
  --prompt-ids 1,x
expect command "generate --prompt-ids" "'-3' at position 0" -- "$meshtrain" generate --checkpoint "$checkpoint" \
  --prompt-ids -3
expect command "generate --prompt-ids" "id 64 at position 2" "vocab_size is 64" -- \
  "$meshtrain" generate --checkpoint "$checkpoint" --prompt-ids 1,2,64
expect command "generate --prompt / --prompt-ids" "found both" -- "$meshtrain" generate --checkpoint "$checkpoint" \
  --prompt hi --prompt-ids 1
expect command "generate --prompt / --prompt-ids" "found neither" -- "$meshtrain" generate --checkpoint "$checkpoint"
expect command "generate --output text" "--output ids" -- "$meshtrain" generate --checkpoint "$checkpoint" \
  --prompt-ids 1 --output text
expect command "$checkpoint" "tokenizer copy" "--prompt-ids" -- "$meshtrain" generate --checkpoint "$checkpoint" \
  --prompt hi
# meshtrain launch: hostfile hosts that do not resolve (RFC 6761's .invalid), that refuse the ssh port (a
# loopback address other than this machine's, on a port found free) or give too few slots; --srun outside an
# allocation; two modes; a time limit SLURM would refuse.
printf 'localhost slots=2\n# the second node\nnode7.invalid slots=2\n' >"$work/hosts_unresolved"
expect command "hostfile $work/hosts_unresolved line 3 host 'node7.invalid'" "a host name that resolves" \
  "add it to /etc/hosts" -- "$meshtrain" launch qwen3-tiny "${tiny[@]}" mesh.data=-1 --nodes 2 --mpirun \
  --hostfile "$work/hosts_unresolved" --print-only
free_port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.2", 0)); print(s.getsockname()[1])')
echo "127.0.0.2 slots=2" >"$work/hosts_refused"
expect command "hostfile $work/hosts_refused line 1 host '127.0.0.2'" "TCP port $free_port of 127.0.0.2" \
  "start sshd on 127.0.0.2" -- "$meshtrain" launch qwen3-tiny "${tiny[@]}" mesh.data=-1 --nodes 1 \
  --tasks-per-node 2 --mpirun --hostfile "$work/hosts_refused" --ssh-port "$free_port" --print-only
echo "localhost slots=1" >"$work/hosts_small"
expect command "hostfile $work/hosts_small line 1 host 'localhost'" "at least --tasks-per-node = 2 slots" \
  "found slots=1" -- "$meshtrain" launch qwen3-tiny "${tiny[@]}" mesh.data=-1 --nodes 1 --tasks-per-node 2 \
  --mpirun --hostfile "$work/hosts_small" --print-only
expect command "meshtrain launch --srun" "SLURM_JOB_ID is not set" "salloc -N 1 --ntasks-per-node 1" -- \
  env -u SLURM_JOB_ID "$meshtrain" launch qwen3-tiny "${tiny[@]}" --nodes 1 --srun
expect command "meshtrain launch" "exactly one mode" "found --sbatch and --srun" -- \
  "$meshtrain" launch qwen3-tiny "${tiny[@]}" --nodes 1 --sbatch "$work/two.sbatch" --srun
expect command "meshtrain launch --time" "a SLURM time limit" "'1:75'" -- \
  "$meshtrain" launch qwen3-tiny "${tiny[@]}" --nodes 1 --sbatch "$work/time.sbatch" --time 1:75
[ -e "$work/mesh.sbatch" ] || [ -e "$work/two.sbatch" ] || [ -e "$work/time.sbatch" ] &&
  { echo "FAIL [command] a refused meshtrain launch wrote its script"; status=1; }
summary=""
for category in config mesh data tokenizer checkpoint plan command; do
  summary+="${summary:+, }$category ${cases[$category]:-0}"
done
echo "bad inputs: $summary cases$([ $status -eq 0 ] && echo ', each a clean error naming what to fix')"
exit $status
