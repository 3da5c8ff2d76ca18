#!/usr/bin/env python3
"""Write the inputs that llm.c's CPU trainer `train_gpt2` reads, without the internet.

llm.c's own scripts download OpenAI's GPT-2 124M weights and tokenised datasets. For a speed benchmark the
values do not matter, only the formats and shapes, so this writes:

  OUT/gpt2_124M.bin
      int32 header[256]: magic 20240326, version 3, max_seq_len 1024, vocab_size 50257, num_layers 12,
      num_heads 12, channels 768, padded_vocab_size 50304; then float32 parameters in llm.c's order
      (train_gpt2.c, fill_in_parameter_sizes):
        wte[Vp,C] wpe[maxT,C] ln1w[L,C] ln1b[L,C] qkvw[L,3C,C] qkvb[L,3C] attprojw[L,C,C] attprojb[L,C]
        ln2w[L,C] ln2b[L,C] fcw[L,4C,C] fcb[L,4C] fcprojw[L,C,4C] fcprojb[L,C] lnfw[C] lnfb[C]
      Matrices and embeddings ~ N(0, 0.02) (the padded wte rows V..Vp are zero, as llm.c writes them),
      LayerNorm weights 1, biases 0. The initial loss is then about ln(50257) = 10.8-10.9.
  OUT/dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin
      int32 header[256]: magic 20240520, version 1, number of tokens; then uint16 tokens, uniform in [0, 50257).
      train_gpt2 looks for these paths relative to its working directory.

Usage: make_llmc_inputs.py OUT_DIR [--tokens N] [--seed S]
Needs numpy (Debian's python3-numpy under /usr/bin/python3 is enough).
"""
import argparse
import os
import sys

import numpy as np

MAGIC_MODEL, VERSION_MODEL = 20240326, 3
MAGIC_DATA, VERSION_DATA = 20240520, 1
MAX_T, V, VP, L, NH, C = 1024, 50257, 50304, 12, 12, 768


def param_shapes():
    # (name, numel, kind) in llm.c's order; kind: "w" ~ N(0, 0.02), "one", "zero".
    return [
        ("wte", VP * C, "wte"),
        ("wpe", MAX_T * C, "w"),
        ("ln1w", L * C, "one"),
        ("ln1b", L * C, "zero"),
        ("qkvw", L * 3 * C * C, "w"),
        ("qkvb", L * 3 * C, "zero"),
        ("attprojw", L * C * C, "w"),
        ("attprojb", L * C, "zero"),
        ("ln2w", L * C, "one"),
        ("ln2b", L * C, "zero"),
        ("fcw", L * 4 * C * C, "w"),
        ("fcb", L * 4 * C, "zero"),
        ("fcprojw", L * C * 4 * C, "w"),
        ("fcprojb", L * C, "zero"),
        ("lnfw", C, "one"),
        ("lnfb", C, "zero"),
    ]


def write_checkpoint(path, rng):
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [MAGIC_MODEL, VERSION_MODEL, MAX_T, V, L, NH, C, VP]
    total = 0
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        for _name, n, kind in param_shapes():
            total += n
            if kind == "one":
                f.write(np.ones(n, dtype=np.float32).tobytes())
            elif kind == "zero":
                f.write(np.zeros(n, dtype=np.float32).tobytes())
            else:
                chunk = 1 << 22
                rows_real = V * C if kind == "wte" else n
                done = 0
                while done < n:
                    m = min(chunk, n - done)
                    a = (rng.standard_normal(m, dtype=np.float32) * np.float32(0.02)).astype(np.float32)
                    if kind == "wte":  # zero the padded rows [V, Vp)
                        lo = max(0, rows_real - done)
                        if lo < m:
                            a[lo:] = 0.0
                    f.write(a.tobytes())
                    done += m
    os.replace(tmp, path)
    return total


def write_tokens(path, ntok, rng):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [MAGIC_DATA, VERSION_DATA, ntok]
    toks = rng.integers(0, V, size=ntok, dtype=np.int64).astype(np.uint16)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.tobytes())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--tokens", type=int, default=(1 << 18) + 1,
                    help="tokens per file (default 262145: 128 batches of 8x256)")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    ckpt = os.path.join(args.out_dir, "gpt2_124M.bin")
    n = write_checkpoint(ckpt, rng)
    expected = 256 * 4 + n * 4
    if os.path.getsize(ckpt) != expected:
        sys.exit(f"error: {ckpt} has {os.path.getsize(ckpt)} bytes, expected {expected}")
    data_dir = os.path.join(args.out_dir, "dev", "data", "tinyshakespeare")
    os.makedirs(data_dir, exist_ok=True)
    for split in ("train", "val"):
        write_tokens(os.path.join(data_dir, f"tiny_shakespeare_{split}.bin"), args.tokens, rng)
    print(f"wrote {ckpt} ({n} parameters) and {args.tokens} tokens per split under {data_dir}")


if __name__ == "__main__":
    main()
