#!/usr/bin/env bash
# `meshtrain prepare --tokenizer` under mpirun (issue 38): 2 ranks split the files between them and write,
# bitwise, the shards, file records and index (but its seconds and ranks) that one process writes; a short run
# trains on the result as dataset_type=tokens.
# Usage: prepare.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
mkdir "$work/text" "$work/sources"
for i in 1 2 3 4 5 6; do echo "in the beginning was the word $i, and the word was with $i" >"$work/text/$i.txt"; done
"$meshtrain" prepare --out "$work/tokenizer" --vocab-size 270 --corpus "$work/text" >"$work/log" 2>&1 ||
  { echo "FAIL: tokenizer"; cat "$work/log"; exit 1; }
# Five files of unequal sizes (so the greedy split gives the ranks different files), compressed where the
# tools are there.
python3 - "$work/sources" <<'PY'
import json, sys
for f, count in enumerate([400, 90, 250, 30, 160]):
    with open(f"{sys.argv[1]}/part{f}.jsonl", "w") as out:
        for i in range(count):
            out.write(json.dumps({"text": f"file {f} document {i}: " + "the word " * ((i * 7 + f) % 19)}) + "\n")
PY
if command -v zstd >/dev/null; then zstd -q --rm "$work/sources/part0.jsonl"; fi
if command -v gzip >/dev/null; then gzip -n "$work/sources/part2.jsonl"; fi
prepare=(prepare --corpus "$work/sources" --tokenizer "$work/tokenizer/tokenizer.json" --validation-fraction 0.1)
"$meshtrain" "${prepare[@]}" --out "$work/one" >"$work/log" 2>&1 || { echo "FAIL: one process"; cat "$work/log"; exit 1; }
"${mpirun[@]}" -np 2 "$meshtrain" "${prepare[@]}" --out "$work/two" --threads 1 >"$work/log" 2>&1 ||
  { echo "FAIL: 2 ranks"; cat "$work/log"; exit 1; }
grep -q "on 2 rank(s)" "$work/log" || { echo "FAIL: the 2-rank summary"; cat "$work/log"; exit 1; }
for folder in train validation files; do
  [ "$(ls "$work/one/$folder")" = "$(ls "$work/two/$folder")" ] || { echo "FAIL: $folder lists differ"; exit 1; }
  for file in "$work/one/$folder"/*; do
    cmp -s "$file" "$work/two/$folder/$(basename "$file")" || { echo "FAIL: $folder/$(basename "$file") differs"; exit 1; }
  done
done
python3 - "$work/one/index.json" "$work/two/index.json" <<'PY'
import json, sys
one, two = (json.load(open(path)) for path in sys.argv[1:])
assert (one["ranks"], two["ranks"]) == (1, 2), (one["ranks"], two["ranks"])
for index in (one, two):
    del index["seconds"], index["setup_seconds"], index["ranks"]
assert one == two, "the indexes differ"
print(f"prepare on 1 and 2 ranks: {len(one['train']['shards'])} train and {len(one['validation']['shards'])} "
      f"validation shards, {one['train']['tokens']} train tokens, the same bytes")
PY
"$meshtrain" train qwen3-tiny base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=2 head_dim=16 \
  base_mlp_dim=128 base_num_decoder_layers=2 max_target_length=32 vocab_size=270 dataset_type=tokens dataset_path="$work/two" \
  eval_dataset_path="$work/two" eval_interval=1 tokenizer_path="$work/tokenizer/tokenizer.json" steps=2 \
  per_device_batch_size=2 run_dir="$work/run" >"$work/log" 2>&1 || { echo "FAIL: train on the shards"; cat "$work/log"; exit 1; }
echo "a run trains on the prepared shards"
