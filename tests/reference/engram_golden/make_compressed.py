"""Golden compressed vocabularies (Engram's compressed tokenizer, shared/specs/engram.md section 1) of the
real Qwen3 and GPT-2 tokenizers in ../shared/assets/tokenizers, computed with Hugging Face `tokenizers`
exactly as DeepSeek's Engram reference builds its CompressedTokenizer: decode each id alone (special tokens
kept); a text holding U+FFFD keys by the raw token string, else by the normalised text (NFKC, NFD,
StripAccents, Lowercase, [ \\t\\r\\n]+ -> " ", a lone " " kept through Strip), or the text itself when that
normalises to empty; new ids in first-seen order.

Writes compressed.json: per tokenizer the vocabulary size, Vc, the FNV-1a 64 of the map as little-endian int32,
and the compressed id of every 997th id plus every id whose key is not its text lowercased with its spaces
collapsed and trimmed (the ids where Unicode normalisation decides), so a mismatch is found and located.

Run (tokenizers from PyPI in a virtual environment outside the repository):
  python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install tokenizers
  /tmp/hfvenv/bin/python tests/reference/engram_golden/make_compressed.py ../shared/assets/tokenizers
"""
import json
import os
import struct
import sys

import re

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

SENTINEL = "\uE000"
NORMALIZER = normalizers.Sequence([
    normalizers.NFKC(),
    normalizers.NFD(),
    normalizers.StripAccents(),
    normalizers.Lowercase(),
    normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
    normalizers.Replace(Regex(r"^ $"), SENTINEL),
    normalizers.Strip(),
    normalizers.Replace(SENTINEL, " "),
])


def compressed_map(tokenizer):
    keys, compress, notable = {}, [], []
    for tid in range(tokenizer.get_vocab_size(with_added_tokens=True)):
        text = tokenizer.decode([tid], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tokenizer.id_to_token(tid)
        else:
            normalized = NORMALIZER.normalize_str(text)
            key = normalized if normalized else text
            # Where Unicode normalisation (not just lowercase and spaces) decides the key.
            plain = re.sub(r"[ \t\r\n]+", " ", text.lower())
            plain = plain if plain == " " else plain.strip(" ")
            if key != plain:
                notable.append(tid)
        compress.append(keys.setdefault(key, len(keys)))
    return compress, len(keys), notable


def main():
    assets = sys.argv[1]
    out = {"producer": "tokenizers " + tokenizers.__version__, "tokenizers": {}}
    for name in ("qwen3", "gpt2"):
        if name == "gpt2":  # encoder.json + vocab.bpe: GPT-2's byte-level BPE
            tokenizer = Tokenizer(models.BPE.from_file(os.path.join(assets, name, "encoder.json"),
                                                       os.path.join(assets, name, "vocab.bpe")))
            tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tokenizer.decoder = decoders.ByteLevel()
        else:
            tokenizer = Tokenizer.from_file(os.path.join(assets, name, "tokenizer.json"))
        compress, size, notable = compressed_map(tokenizer)
        digest = 0xcbf29ce484222325  # FNV-1a 64 over the map as little-endian int32 (the test recomputes it)
        for byte in struct.pack("<%di" % len(compress), *compress):
            digest = ((digest ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
        sampled = sorted(set(range(0, len(compress), 997)) | set(notable))
        out["tokenizers"][name] = {
            "vocab_size": len(compress),
            "compressed_size": size,
            "fnv1a64_int32_le": "%016x" % digest,
            "samples": [[tid, compress[tid]] for tid in sampled],
        }
        print("%s: V %d -> Vc %d (%.2f%% fewer), %d samples" % (
            name, len(compress), size, 100.0 * (1 - size / len(compress)), len(sampled)))
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "compressed.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
