#!/usr/bin/env bash
# Hugging Face interchange through the command line, as the README's "continue pre-training from a Hugging
# Face model" runs it: every folder of tests/reference/hf_interchange (models made by transformers itself,
# make_fixture.py) imports, and greedy `generate --output ids` gives transformers' own tokens id for id; an
# import's config.yaml names the model and carries its recipe; special_tokens/ (special_tokens.py) exports
# with its config.json's special token ids, null and absent ones included; a Qwen3 import trains a few steps
# on a text file with the config.yaml import-hf wrote, exports (the source's ids still), and the export
# (imported again) generates exactly what the trained checkpoint generates; then bad input exits 1 naming the
# file and leaves nothing behind.
# Usage: hf_interchange.sh BUILD_DIR
set -euo pipefail
meshtrain="$1/meshtrain"
fixtures=$(cd "$(dirname "$0")/../reference/hf_interchange" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python=/usr/bin/python3
index="$fixtures/golden_index.json"
prompt=$($python -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompt"])' "$index")

for variant in $($python -c 'import json,sys; print(" ".join(v["dir"] for v in json.load(open(sys.argv[1]))["variants"]))' "$index"); do
  "$meshtrain" import-hf "$fixtures/$variant" --out "$work/$variant" >"$work/$variant.import.log"
  "$meshtrain" generate --checkpoint "$work/$variant" --prompt "$prompt" --max-new-tokens 8 --temperature 0 \
    --output ids >"$work/$variant.ids.json"
  $python - "$index" "$variant" "$work/$variant.ids.json" <<'PY'
import json, sys
index = json.load(open(sys.argv[1]))
golden = next(v for v in index["variants"] if v["dir"] == sys.argv[2])["golden"]
line = json.load(open(sys.argv[3]))
ok = line["prompt"] == golden["prompt_ids"] and line["generated"] == golden["generated_ids"]
print(f"{sys.argv[2]}: prompt {line['prompt']} generated {line['generated']} "
      f"(transformers: {golden['generated_ids']}) {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
done

# An import says what the model is and carries its own recipe, not the tiny preset's; the user's key wins.
grep -qx 'model_name: "qwen3_moe"' "$work/qwen3_moe/config.yaml" ||
  { echo "FAIL: the Qwen3-MoE import is not named qwen3_moe"; grep model_name "$work/qwen3_moe/config.yaml"; exit 1; }
grep -qx 'routed_bias_update_rate: 0.001' "$work/deepseek_v3/config.yaml" ||
  { echo "FAIL: the DeepSeek-V3 import lacks DeepSeek-V3's bias update rate 0.001"; exit 1; }
"$meshtrain" import-hf "$fixtures/deepseek_v3" --out "$work/deepseek_v3_rate" routed_bias_update_rate=0.002 >/dev/null
grep -qx 'routed_bias_update_rate: 0.002' "$work/deepseek_v3_rate/config.yaml" ||
  { echo "FAIL: routed_bias_update_rate=0.002 given to import-hf did not win"; exit 1; }
echo "model_name qwen3_moe, routed_bias_update_rate 0.001 (0.002 when the import sets it) PASS"

# Special token ids: export-hf writes what the source's config.json said (an id, null, or no key at all), so
# transformers fills in none of its class defaults (special_tokens.py checks that with AutoConfig).
same_special_ids() {  # same_special_ids SOURCE_CONFIG EXPORTED_CONFIG
  $python - "$1" "$2" <<'PY'
import json, sys
keys = ("bos_token_id", "eos_token_id", "pad_token_id")
source, exported = (json.load(open(path)) for path in sys.argv[1:3])
ids = [{key: config.get(key, "absent") for key in keys} for config in (source, exported)]
print(f"{sys.argv[2]}: {ids[1]} (source: {ids[0]}) {'PASS' if ids[0] == ids[1] else 'FAIL'}")
sys.exit(0 if ids[0] == ids[1] else 1)
PY
}
for variant in gpt2_null_ids deepseek_v3_null_ids qwen3_ids_pad_absent; do
  "$meshtrain" import-hf "$fixtures/special_tokens/$variant" --out "$work/$variant" >/dev/null
  "$meshtrain" export-hf "$work/$variant" --out "$work/$variant.hf" >/dev/null
  same_special_ids "$fixtures/special_tokens/$variant/config.json" "$work/$variant.hf/config.json"
done

# Continue pre-training from the import, export the result, and check the export is the trained model.
ckpt="$work/qwen3_tied"
grep -q "^base_emb_dim:" "$ckpt/config.yaml"
mkdir "$work/texts"  # the user's text: two files (one is held out for validation)
for part in 1 2; do
  printf 'In the beginning God created the heaven and the earth. And the earth was without form, and void.\n%.0s' \
    $(seq 40) >"$work/texts/part$part.txt"
done
"$meshtrain" train "$ckpt/config.yaml" load_parameters_path="$ckpt" dataset_path="$work/texts" \
  run_dir="$work/run" steps=3 checkpoint_period=3 per_device_batch_size=2 max_target_length=16 eval_interval=0 \
  >"$work/train.log"
test -f "$work/run/checkpoints/step_00000003/COMMITTED"
"$meshtrain" export-hf "$work/run" --out "$work/exported" --dtype float32 >"$work/export.log"
for file in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
  test -f "$work/exported/$file" || { echo "FAIL: export lacks $file"; exit 1; }
done
"$meshtrain" import-hf "$work/exported" --out "$work/reimported" >/dev/null
"$meshtrain" generate --checkpoint "$work/run" --prompt "$prompt" --max-new-tokens 8 --temperature 0 \
  --output logits >"$work/trained.json"
"$meshtrain" generate --checkpoint "$work/reimported" --prompt "$prompt" --max-new-tokens 8 --temperature 0 \
  --output logits >"$work/reimported.json"
cmp "$work/trained.json" "$work/reimported.json" || { echo "FAIL: the export is not the trained model"; exit 1; }
cmp -s "$work/trained.json" <("$meshtrain" generate --checkpoint "$ckpt" --prompt "$prompt" --max-new-tokens 8 \
  --temperature 0 --output logits) && { echo "FAIL: training changed nothing"; exit 1; }
echo "trained 3 steps on an import, exported, re-imported: identical logits and tokens PASS"
# Training keeps what the import recorded: the model's name and its config.json's special token ids.
$python -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["config"]["model_name"] != "qwen3")' \
  "$work/run/checkpoints/step_00000003/metadata.json" || { echo "FAIL: the trained run is not named qwen3"; exit 1; }
same_special_ids "$fixtures/qwen3_tied/config.json" "$work/exported/config.json"
# The same with stacked layers (scan_layers=true: the per-layer import stacked on load): the stacked run
# generates (through a stacked decode spec) and exports exactly what the per-layer run does.
"$meshtrain" train "$ckpt/config.yaml" load_parameters_path="$ckpt" dataset_path="$work/texts" \
  run_dir="$work/run_stacked" steps=3 checkpoint_period=3 per_device_batch_size=2 max_target_length=16 \
  eval_interval=0 scan_layers=true >"$work/train_stacked.log"
"$meshtrain" generate --checkpoint "$work/run_stacked" --prompt "$prompt" --max-new-tokens 8 --temperature 0 \
  --output logits >"$work/trained_stacked.json"
cmp "$work/trained.json" "$work/trained_stacked.json" || { echo "FAIL: stacked training differs"; exit 1; }
"$meshtrain" export-hf "$work/run_stacked" --out "$work/exported_stacked" --dtype float32 >/dev/null
cmp "$work/exported/model.safetensors" "$work/exported_stacked/model.safetensors" ||
  { echo "FAIL: the stacked run exports other weights"; exit 1; }
echo "the same with scan_layers=true: identical logits, tokens and exported weights PASS"

# Bad input: a clear error, exit 1, nothing half-written left.
expect_error() {  # expect_error TEXT COMMAND...
  local text="$1"; shift
  if "$@" >"$work/out.log" 2>&1; then echo "FAIL: '$*' succeeded"; exit 1; fi
  grep -q -- "$text" "$work/out.log" || { echo "FAIL: '$*' did not name '$text':"; cat "$work/out.log"; exit 1; }
}
expect_error "config.json" "$meshtrain" import-hf "$work/run" --out "$work/bad"
expect_error "already exists" "$meshtrain" export-hf "$work/run" --out "$work/exported"
expect_error "--out" "$meshtrain" import-hf "$fixtures/gpt2"
expect_error "float8" "$meshtrain" export-hf "$work/run" --out "$work/bad" --dtype float8
test ! -e "$work/bad"
ls "$work" | grep -q "tmp-" && { echo "FAIL: a temporary folder was left behind"; exit 1; }
echo "bad input PASS"
