#!/usr/bin/env bash
# Tokenizer benchmark: single-thread encode throughput of meshtrain against Hugging Face `tokenizers` on the
# same text (the King James Bible by default), for the Qwen3 and GPT-2 tokenizers, whole text in one call and
# line by line; checks the ids are identical; then trains a byte-level BPE on the text to vocab 8192, times
# it, and checks Hugging Face reads the saved tokenizer.json and encodes the text to the same ids.
#
#   bench/tokenizer/run_encode_bench.sh [TEXT_FILE]
#
# Builds bench_tokenizer.cpp with g++ straight from the sources (no CMake). Needs libpcre2-dev, libicu-dev,
# nlohmann-json3-dev, python3 with `tokenizers` (python3 -m pip install tokenizers), and bible-kjv unless
# TEXT_FILE is given. Environment: MESHTRAIN_SHARED_DIR (default: the repository's ../shared), REPEATS (5),
# BUILD_DIR (/tmp/meshtrain_tokenizer_bench).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
shared="${MESHTRAIN_SHARED_DIR:-$root/../shared}"
assets="$shared/assets/tokenizers"
repeats="${REPEATS:-5}"
build="${BUILD_DIR:-/tmp/meshtrain_tokenizer_bench}"
mkdir -p "$build"

python3 -c "import tokenizers" 2>/dev/null || {
  echo "run_encode_bench: Hugging Face tokenizers is missing (python3 -m pip install tokenizers)" >&2
  exit 1
}
[ -d "$assets" ] || { echo "run_encode_bench: no tokenizer assets at $assets (set MESHTRAIN_SHARED_DIR)" >&2; exit 1; }

text="${1:-}"
if [ -z "$text" ]; then
  command -v bible >/dev/null || { echo "run_encode_bench: install bible-kjv or pass a text file" >&2; exit 1; }
  text="$build/kjv.txt"
  bible -f gen1:1-rev22:21 >"$text"
fi

echo "building bench_tokenizer ..."
g++ -std=c++20 -O2 -march=native -DNDEBUG -I "$root/src" "$here/bench_tokenizer.cpp" \
  "$root"/src/meshtrain/data/tokenizer*.cpp "$root/src/meshtrain/core/error.cpp" \
  -lpcre2-8 -licuuc -o "$build/bench_tokenizer"

field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

bytes=$(stat -c %s "$text")
echo "text: $text ($bytes bytes), single thread, median of $repeats runs"
printf '%-8s %-6s %14s %14s %8s %10s\n' tokenizer mode "meshtrain MB/s" "HF MB/s" ratio identical
for name in qwen3 gpt2; do
  tokenizer="$assets/$name"
  [ "$name" = qwen3 ] && tokenizer="$assets/qwen3/tokenizer.json"
  for mode in whole lines; do
    ours=$("$build/bench_tokenizer" encode "$tokenizer" "$text" "$repeats" "$mode" "$build/ids_${name}_$mode.json")
    theirs=$(python3 "$here/bench_hf.py" encode "$tokenizer" "$text" "$repeats" "$mode" "$build/ids_${name}_$mode.json")
    a=$(field "$ours" mb_per_s)
    b=$(field "$theirs" mb_per_s)
    printf '%-8s %-6s %14.2f %14.2f %7.1fx %10s\n' "$name" "$mode" "$a" "$b" \
      "$(python3 -c "print($a / $b)")" "$(field "$theirs" identical)"
  done
done

echo
echo "training a byte-level BPE to vocab 8192 on the text ..."
trained=$("$build/bench_tokenizer" train "$text" 8192 "$build/trained_tokenizer.json")
echo "meshtrain: $trained"
"$build/bench_tokenizer" encode "$build/trained_tokenizer.json" "$text" 1 whole "$build/ids_trained.json" >/dev/null
check=$(python3 "$here/bench_hf.py" encode "$build/trained_tokenizer.json" "$text" 1 whole "$build/ids_trained.json")
echo "Hugging Face reading the trained tokenizer.json: $check"
