#!/usr/bin/env bash
# Every command's help (issue 37): `meshtrain CMD --help`, `CMD -h` and `help CMD` exit 0 and print the same
# text with "usage: meshtrain CMD" and an example to stdout, for each command `meshtrain help` lists; then
# generate's ids round trip: the ids a text prompt encodes to, given back with --prompt-ids, give the same
# JSON line, and a checkpoint without a tokenizer generates from ids.
# Usage: command_help.sh BUILD_DIR
set -uo pipefail
meshtrain="$(cd "$1" && pwd)/meshtrain"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
status=0
problem() {
  echo "FAIL: $*"
  status=1
}

"$meshtrain" help >"$work/overview" 2>"$work/overview.err" || problem "meshtrain help exits $?"
commands=$(sed -n '/^commands:/,/^a config/{s/^  \([a-z-]*\) .*/\1/p}' "$work/overview")
[ "$(echo "$commands" | wc -w)" -eq 10 ] || problem "meshtrain help lists $(echo "$commands" | wc -w) commands, not 10"
for command in $commands; do
  "$meshtrain" "$command" --help >"$work/help" 2>"$work/help.err" || problem "$command --help exits $?"
  [ -s "$work/help.err" ] && problem "$command --help writes to stderr: $(head -1 "$work/help.err")"
  grep -q "^usage: meshtrain $command" "$work/help" || problem "$command --help: no 'usage: meshtrain $command'"
  grep -q "^examples\?:$" "$work/help" || problem "$command --help: no example"
  grep -q "^  meshtrain $command \|| meshtrain $command " "$work/help" || problem "$command --help: no example line"
  for spelling in "$command -h" "help $command"; do
    # shellcheck disable=SC2086  # the spelling is two words
    "$meshtrain" $spelling 2>/dev/null | cmp -s - "$work/help" || problem "'$spelling' differs from --help"
  done
done
"$meshtrain" generate >/dev/null 2>&1 && problem "generate without flags exits 0"

# ids in = ids out, with a tokenizer trained here and a checkpoint of a short run on its shards.
mkdir "$work/documents" && for i in 1 2 3 4 5 6; do echo "in the beginning was the word $i" >"$work/documents/$i.txt"; done
"$meshtrain" prepare --out "$work/data" --vocab-size 270 --corpus "$work/documents" >/dev/null 2>&1 ||
  { echo "FAIL: prepare"; exit 1; }
shape=(eval_interval=0 vocab_size=270 max_target_length=8 base_emb_dim=32 base_num_query_heads=4
  base_num_kv_heads=2 head_dim=8 base_mlp_dim=48 base_num_decoder_layers=2 per_device_batch_size=2 steps=1)
model=("${shape[@]}" dataset_type=tokens dataset_path="$work/data" eval_dataset_path=
  tokenizer_path="$work/data/tokenizer.json")
"$meshtrain" train qwen3-tiny "${model[@]}" run_dir="$work/run" >"$work/train.log" 2>&1 ||
  { echo "FAIL: train"; tail -3 "$work/train.log"; exit 1; }
greedy=(--max-new-tokens 6 --temperature 0)
from_text=$("$meshtrain" generate --checkpoint "$work/run" --prompt "in the beginning" "${greedy[@]}" --output ids)
ids=$(printf 'in the beginning' | "$meshtrain" tokenize --tokenizer "$work/data/tokenizer.json")
[[ "$from_text" == "{\"generated\":"*",\"prompt\":$ids}" ]] || problem "prompt ids $ids not in $from_text"
listed=$(tr -d '[]' <<<"$ids")
from_ids=$("$meshtrain" generate --checkpoint "$work/run" --prompt-ids "$listed" "${greedy[@]}")
[ "$from_ids" == "$from_text" ] || problem "--prompt-ids $listed gives $from_ids, --prompt gives $from_text"
echo "$ids" >"$work/prompt.json"
from_file=$("$meshtrain" generate --checkpoint "$work/run" --prompt-ids @"$work/prompt.json" "${greedy[@]}")
[ "$from_file" == "$from_text" ] || problem "--prompt-ids @FILE gives $from_file, --prompt gives $from_text"
"$meshtrain" train qwen3-tiny "${shape[@]}" dataset_type=synthetic tokenizer_path= run_dir="$work/bare" \
  >"$work/bare.log" 2>&1 || { echo "FAIL: train on synthetic data"; tail -3 "$work/bare.log"; exit 1; }
bare=$("$meshtrain" generate --checkpoint "$work/bare" --prompt-ids "$listed" "${greedy[@]}")
[[ "$bare" == "{\"generated\":["*"],\"prompt\":$ids}" ]] || problem "no-tokenizer generate gives '$bare'"

# Engram hashes fed ids with the tokenizer's compressed vocabulary; without a tokenizer, generate hashes as
# the synthetic run trained (the identity), which loading the checkpoint checks.
engram=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=4 base_mlp_dim=128 base_num_decoder_layers=2
  kv_lora_rank=24 qk_nope_head_dim=12 qk_rope_head_dim=8 v_head_dim=16 q_lora_rank=16 num_experts=0
  engram_layers=[0,1] engram_num_heads=2 engram_head_dim=8 engram_vocab_bases=[61,67] engram_kernel_size=3
  vocab_size=270 max_target_length=8 per_device_batch_size=2 steps=1 eval_interval=0 dataset_type=synthetic
  tokenizer_path=)
"$meshtrain" train deepseek-custom-tiny "${engram[@]}" run_dir="$work/engram" >"$work/engram.log" 2>&1 ||
  { echo "FAIL: train with Engram"; tail -3 "$work/engram.log"; exit 1; }
engram_line=$("$meshtrain" generate --checkpoint "$work/engram" --prompt-ids "$listed,269" "${greedy[@]}")
[[ "$engram_line" == "{\"generated\":["*"],\"prompt\":${ids%]},269]}" ]] || problem "Engram generate gives '$engram_line'"

[ $status -eq 0 ] && echo "command help: $(echo "$commands" | wc -w) commands, each with usage and an example;" \
  "generate: --prompt-ids gives the same line as its text, and runs without a tokenizer"
exit $status
