#!/usr/bin/env python3
"""Hugging Face `tokenizers` side of run_prepare_bench.sh: encode_batch of the first documents of a JSON Lines
file, about HF_MB MB of text (HF runs 10 to 15 times slower than prepare, so not the whole large input), on
RAYON_NUM_THREADS threads (median MB/s of text over REPEATS runs), and a check that the token shards
`meshtrain prepare` wrote (PREPARED: its --out, prepared with --validation-fraction 0) start with exactly
those ids, each document followed by the index's EOS id.

  bench_hf_batch.py TOKENIZER DOCUMENTS_JSONL REPEATS PREPARED HF_MB   -> {"mb_per_s": ..., "identical": ...}
"""
import json
import os
import statistics
import struct
import sys
import time

os.environ["TOKENIZERS_PARALLELISM"] = "true"  # encode_batch runs on RAYON_NUM_THREADS threads
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tokenizer"))
from bench_hf import load  # noqa: E402  (GPT-2's folder read as meshtrain reads it)


def shard_ids(path, limit):
    """The shard's first `limit` ids (all when it holds fewer)."""
    with open(path, "rb") as file:
        width, count = struct.unpack_from("<IQ", file.read(32), 12)
        count = min(count, limit)
        data = file.read(count * width)
    return list(struct.unpack_from(f"<{count}{'H' if width == 2 else 'I'}", data))


tokenizer_path, documents_path, repeats, prepared = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
hf_bytes = float(sys.argv[5]) * 1e6
documents, text_bytes = [], 0
with open(documents_path, encoding="utf-8") as file:
    for line in file:
        if text_bytes >= hf_bytes:
            break
        documents.append(json.loads(line)["text"])
        text_bytes += len(documents[-1].encode("utf-8"))
tokenizer = load(tokenizer_path)
rates, encodings = [], None
for _ in range(repeats):
    start = time.perf_counter()
    encodings = tokenizer.encode_batch(documents, add_special_tokens=False)
    rates.append(text_bytes / 1e6 / (time.perf_counter() - start))

with open(os.path.join(prepared, "index.json")) as file:
    index = json.load(file)
eos = index["tokenizer"]["eos_id"]
theirs = [i for encoding in encodings for i in encoding.ids + [eos]]
ours = []
for shard in index["train"]["shards"]:
    if len(ours) < len(theirs):
        ours += shard_ids(os.path.join(prepared, shard["path"]), len(theirs) - len(ours))
result = {"mb_per_s": round(statistics.median(rates), 3), "documents": len(documents), "tokens": len(theirs),
          "identical": ours == theirs}
if ours != theirs:
    result["first_difference"] = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                                      min(len(ours), len(theirs)))
print(json.dumps(result))
