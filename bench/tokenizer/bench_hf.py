#!/usr/bin/env python3
"""Hugging Face `tokenizers` side of run_encode_bench.sh: single-thread encode throughput on a text file, and
a check that meshtrain's ids (written by bench_tokenizer) are identical.

  bench_hf.py encode TOKENIZER TEXT REPEATS whole|lines [MESHTRAIN_IDS]   -> {"mb_per_s": ..., "identical": ...}
  bench_hf.py mixed OUT_TEXT   writes a deterministic stress text: many scripts, combining marks, digits,
                               Unicode spaces, emoji, chat markers, code; one line per sample

`whole` encodes the file in one call; `lines` encodes each line (newline included) with encode_batch, which
runs sequentially with TOKENIZERS_PARALLELISM=false.

TOKENIZER is a tokenizer.json, or a folder with encoder.json + vocab.bpe (GPT-2's files, read as plain
byte-level BPE without special tokens, as meshtrain reads them).
"""
import json
import os
import statistics
import sys
import time

# One thread: encode() of one string is sequential anyway; this also keeps rayon from spinning up a pool.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
except ImportError:
    sys.exit("bench_hf.py: Hugging Face tokenizers is missing (python3 -m pip install tokenizers)")


def load(path):
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "tokenizer.json")):
        tokenizer = Tokenizer(models.BPE.from_file(os.path.join(path, "encoder.json"), os.path.join(path, "vocab.bpe")))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        return tokenizer
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    return Tokenizer.from_file(path)


def write_mixed_text(path, lines=20000):
    import random

    rng = random.Random(1)
    pieces = [
        "Hello", "world", "naïve", "café", "e\u0301", "A\u030a", "\u1100\u1161", "日本語", "中文分词", "한국어",
        "Ελληνικά", "русский", "עברית", "العربية", "हिन्दी", "ไทย", "🙂", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷",
        "12345", "3.14159", "1e-6", "0x1F", "٣٤٥", "Ⅻ", "½", "$1,234.56", "50%", "!!!", "...", "—", "'s", "'LL",
        "I'm", "they've", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "def f(x):", "x**2", "{'k': None}",
        " ", "  ", "\t", "\r\n", "\r", "\u00a0", "\u2028", "\u3000", "\u180e", "\u0085", "\u200b", "\ufeff",
        "\u2009", "\x0b", "\x0c", "\x1c", "\x00",
    ]
    with open(path, "w", encoding="utf-8", newline="") as file:
        for _ in range(lines):
            file.write("".join(rng.choice(pieces) + rng.choice(["", " ", ""]) for _ in range(rng.randint(1, 30))))
            file.write("\n")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "mixed":
        write_mixed_text(sys.argv[2])
        return
    if len(sys.argv) < 6 or sys.argv[1] != "encode" or sys.argv[5] not in ("whole", "lines"):
        sys.exit(__doc__)
    tokenizer = load(sys.argv[2])
    with open(sys.argv[3], "rb") as file:
        data = file.read()
    text = data.decode("utf-8")
    repeats = int(sys.argv[4])
    # Lines end at "\n" only, as in bench_tokenizer (splitlines() would also cut at \r, U+2028, ...).
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    if not lines[-1]:
        lines.pop()
    rates = []
    ids = None
    for _ in range(repeats):
        start = time.perf_counter()
        if sys.argv[5] == "lines":
            ids = [i for encoding in tokenizer.encode_batch(lines, add_special_tokens=False) for i in encoding.ids]
        else:
            ids = tokenizer.encode(text, add_special_tokens=False).ids
        rates.append(len(data) / 1e6 / (time.perf_counter() - start))
    result = {"mb_per_s": round(statistics.median(rates), 3), "tokens": len(ids)}
    if len(sys.argv) > 6:
        with open(sys.argv[6]) as file:
            theirs = json.load(file)
        result["identical"] = theirs == ids
        if theirs != ids:
            first = next((i for i, (a, b) in enumerate(zip(theirs, ids)) if a != b), min(len(theirs), len(ids)))
            result["first_difference"] = first
    print(json.dumps(result))


if __name__ == "__main__":
    main()
