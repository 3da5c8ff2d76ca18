#!/usr/bin/env bash
# Raw sources in train (issue 38): dataset_type=text on JSON Lines (.jsonl.zst / .jsonl.gz) tokenizes them
# with prepare_records before the first step, so a run on the raw files reads, step for step, the token ids
# (batch_crc32c) of a run on `meshtrain prepare --tokenizer`'s shards of the same files, and trains to the same
# losses; a restart reuses the tokenized shards; a two-source JSON Lines mixture (docs/data.md's example) draws
# its rows 3:1 and reads the same batches as the same mixture of prepared shards. No Python: the files come
# from awk and the compression tools.
# Usage: raw_sources.sh BUILD_DIR
set -euo pipefail
meshtrain="$1/meshtrain"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [ -f "$work/log" ] && cat "$work/log"; exit 1; }

mkdir "$work/text"
for i in 1 2 3 4 5 6; do echo "in the beginning was the word $i, and the word was with $i" >"$work/text/$i.txt"; done
"$meshtrain" prepare --out "$work/tokenizer" --vocab-size 270 --corpus "$work/text" >"$work/log" 2>&1 || fail "tokenizer"
# Two sources of short documents (one JSON object per line, the text in column "body").
documents() { awk -v tag="$1" -v n="$2" 'BEGIN { for (i = 0; i < n; ++i) {
  line = tag " " i ":"; for (j = 0; j < (i * 7) % 23 + 3; ++j) line = line " the word " j;
  printf "{\"id\": %d, \"body\": \"%s\"}\n", i, line } }'; }
documents alpha 300 >"$work/a.jsonl"
documents beta 200 >"$work/b.jsonl"
a="$work/a.jsonl" b="$work/b.jsonl"
if command -v zstd >/dev/null; then zstd -q --rm "$a" && a="$a.zst"; fi
if command -v gzip >/dev/null; then gzip -n "$b" && b="$b.gz"; fi
tokenizer="$work/tokenizer/tokenizer.json"
for source in a b; do
  "$meshtrain" prepare --corpus "${!source}" --tokenizer "$tokenizer" --column body --out "$work/prepared_$source" \
    >"$work/log" 2>&1 || fail "prepare $source"
done

model=(qwen3-tiny base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=2 head_dim=16 base_mlp_dim=128
  base_num_decoder_layers=2 max_target_length=32 vocab_size=270 tokenizer_path="$tokenizer" eval_interval=0
  per_device_batch_size=4 train_data_columns=body)
train() { # RUN_NAME STEPS key=value...
  local name=$1 steps=$2
  shift 2
  "$meshtrain" train "${model[@]}" steps="$steps" run_dir="$work/$name" "$@" >"$work/log" 2>&1 || fail "train $name"
}
# One field of every line of a run's metrics.jsonl ("batch_crc32c", "loss", a source's "rows").
field() { grep -o "\"$2\":[^,}]*" "$work/$1/metrics.jsonl" | cut -d: -f2; }

train raw 4 dataset_type=text dataset_path="$a"
train shards 4 dataset_type=tokens dataset_path="$work/prepared_a"
[ "$(field raw batch_crc32c | wc -l)" = 4 ] || fail "4 batch checksums in the raw run's metrics"
[ "$(field raw batch_crc32c)" = "$(field shards batch_crc32c)" ] || fail "raw and prepared runs read other batches"
[ "$(field raw loss)" = "$(field shards loss)" ] || fail "raw and prepared runs trained to other losses"
# The tokenized shards are those prepare wrote (same bytes), and a restart (resuming to step 6) reuses them.
[ -f "$work/raw/data/index.json" ] || fail "the raw run wrote no index"
for shard in "$work/prepared_a"/train/*.tokens; do
  cmp -s "$shard" "$work/raw/data/train/$(basename "$shard")" || fail "shard $(basename "$shard") differs"
done
before=$(stat -c %Y.%s "$work/raw/data/index.json")
sleep 1
train raw 6 dataset_type=text dataset_path="$a"
[ "$(stat -c %Y.%s "$work/raw/data/index.json")" = "$before" ] || fail "the restart tokenized the source again"
echo "raw JSON Lines and its prepared shards: the same 4 batches and losses; the restart reused the shards"

# The JSON Lines mixture: 3:1 by rows, the same batches as the mixture of the prepared shards.
train mixture 4 dataset_type=text "dataset_path=$a,3;$b,1"
train mixture_shards 4 dataset_type=tokens "dataset_path=$work/prepared_a,3;$work/prepared_b,1"
[ "$(field mixture batch_crc32c)" = "$(field mixture_shards batch_crc32c)" ] || fail "the mixtures read other batches"
rows=$(grep -o '"rows":[0-9]*' "$work/mixture/metrics.jsonl" | tail -2 | cut -d: -f2 | tr '\n' ' ')
[ "$rows" = "12 4 " ] || fail "the mixture's 16 rows split 12 / 4, found $rows"
echo "the two-source JSON Lines mixture: rows 12 / 4 after 4 steps, the same batches as its prepared shards"
