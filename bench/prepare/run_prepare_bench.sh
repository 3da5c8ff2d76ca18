#!/usr/bin/env bash
# Prepare benchmark (issue 38): `meshtrain prepare --tokenizer` end to end (a .jsonl.zst in, token shards and
# index.json out) on 1 and 2 cores (taskset: the process pinned to the first N cores with N encoding threads;
# its reading, decompressing and appending threads share those cores), against the tokenizer's own
# single-thread throughput on the same documents (bench/tokenizer/bench_tokenizer.cpp, one call per document,
# in a fresh process, as each prepare is one) times the cores, and against Hugging Face `tokenizers`'
# encode_batch on the first HF_MB (24) MB of the same documents on the same cores (RAYON_NUM_THREADS, pinned
# alike), checking the shards start with exactly HF's ids with the EOS id after each document; for Qwen3's
# tokenizer.json and the GPT-2 files. Goals: prepare keeps at least 80% of the tokenizer's own throughput on
# as many cores, and 2 cores reach 1.8x of 1. Prints medians and ratios and the CPU; never fails for being
# slow (only for ids that differ or a step that fails).
#
#   bench/prepare/run_prepare_bench.sh [TEXT_FILE]
#
# TEXT_FILE (default: the King James Bible from bible-kjv) is cut into paragraphs (chapters for the KJV),
# repeated to TARGET_MB (192) MB of text, so that the set-up (resolving the files, loading Qwen3's large
# tokenizer.json) is a small share as in a real corpus of gigabytes, and compressed with the zstd tool. Needs
# a build of meshtrain (BUILD_DIR, default build/; bench_tokenizer is linked to its libraries), zstd, taskset
# (util-linux), and a python with `tokenizers` (PYTHON, default python3; python3 -m pip install tokenizers).
# Environment: REPEATS (3), CORES ("1 2"), HF_MB (24), MESHTRAIN_SHARED_DIR (default ../shared), WORK_DIR
# (/tmp/meshtrain_prepare_bench).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
meshtrain="$(cd "${BUILD_DIR:-$root/build}" && pwd)/meshtrain"
assets="${MESHTRAIN_SHARED_DIR:-$root/../shared}/assets/tokenizers"
python="${PYTHON:-python3}"
repeats="${REPEATS:-3}"
cores="${CORES:-1 2}"
work="${WORK_DIR:-/tmp/meshtrain_prepare_bench}"
mkdir -p "$work"

[ -x "$meshtrain" ] || { echo "run_prepare_bench: no meshtrain at $meshtrain (set BUILD_DIR)" >&2; exit 1; }
command -v zstd >/dev/null || { echo "run_prepare_bench: the zstd tool is missing (apt-get install zstd)" >&2; exit 1; }
"$python" -c "import tokenizers" 2>/dev/null ||
  { echo "run_prepare_bench: $python has no Hugging Face tokenizers (pip install tokenizers; set PYTHON)" >&2; exit 1; }
[ -d "$assets" ] || { echo "run_prepare_bench: no tokenizer assets at $assets (set MESHTRAIN_SHARED_DIR)" >&2; exit 1; }

text="${1:-}"
if [ -z "$text" ]; then
  command -v bible >/dev/null || { echo "run_prepare_bench: install bible-kjv or pass a text file" >&2; exit 1; }
  text="$work/kjv.txt"
  bible -f gen1:1-rev22:21 >"$text"
fi
made=$("$python" "$here/make_documents.py" "$text" "${TARGET_MB:-192}" "$work/documents.jsonl" "$work/documents.txt")
zstd -q -f "$work/documents.jsonl" -o "$work/documents.jsonl.zst"

# Against the build's own libraries: the very tokenizer code prepare runs.
echo "building bench_tokenizer ..."
build="$(dirname "$meshtrain")"
g++ -std=c++20 -O2 -march=native -DNDEBUG -I "$root/src" "$root/bench/tokenizer/bench_tokenizer.cpp" \
  -L "$build" -Wl,-rpath,"$build" -lmeshtrain_data -lmeshtrain_core -o "$work/bench_tokenizer"

field() { "$python" -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

# prepare_rates TOKENIZER CORES: median MB/s of text as the index times it, end to end (files resolved and
# fingerprinted, tokenizer loaded, read, encoded, written) and past the set-up (without the tokenizer's load,
# which the tokenizer's own rate leaves out too); the last output stays in $work/out.
prepare_rates() {
  local whole=() past=() run
  for ((run = 0; run < repeats; run++)); do
    rm -rf "$work/out"
    taskset -c "0-$(($2 - 1))" "$meshtrain" prepare --corpus "$work/documents.jsonl.zst" --tokenizer "$1" \
      --out "$work/out" --threads "$2" --validation-fraction 0 >"$work/prepare.log" 2>&1 || { cat "$work/prepare.log"; exit 1; }
    read -r a b < <("$python" -c 'import json,sys; i=json.load(open(sys.argv[1])); t=i["train"]["text_bytes"]/1e6
print(t/i["seconds"], t/(i["seconds"]-i["setup_seconds"]))' "$work/out/index.json")
    whole+=("$a")
    past+=("$b")
  done
  echo "$(median "${whole[@]}") $(median "${past[@]}")"
}

echo "documents: $made ($(stat -c %s "$work/documents.jsonl.zst") bytes as .jsonl.zst); median of $repeats runs"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load before: $(uptime | sed 's/.*load average: //')"
printf '%-9s %7s %8s %10s %9s %9s %8s %7s %7s %7s %7s %9s\n' tokenizer cores prepare "past setup" "own cold" \
  "own warm" "vs own" "(past)" "vs 1" HF "vs HF" identical
status=0
for name in qwen3 gpt2; do
  tokenizer="$assets/$name"
  [ "$name" = qwen3 ] && tokenizer="$assets/qwen3/tokenizer.json"
  # A fresh process's first pass (its BPE cache cold, as each prepare run starts) and the median of the warm
  # repeats after it.
  own_run=$("$work/bench_tokenizer" encode "$tokenizer" "$work/documents.txt" "$repeats" lines)
  own=$(field "$own_run" mb_per_s_first)
  warm=$(field "$own_run" mb_per_s)
  one=""
  for count in $cores; do
    read -r rate past < <(prepare_rates "$tokenizer" "$count")
    [ -z "$one" ] && one=$rate
    hf=$(RAYON_NUM_THREADS=$count taskset -c "0-$((count - 1))" "$python" "$here/bench_hf_batch.py" "$tokenizer" "$work/documents.jsonl" \
      "$repeats" "$work/out" "${HF_MB:-24}")
    identical=$(field "$hf" identical)
    [ "$identical" = True ] || status=1
    hf_rate=$(field "$hf" mb_per_s)
    printf '%-9s %7s %8.2f %10.2f %9.2f %9.2f %7.0f%% %6.0f%% %6.2fx %7.2f %6.2fx %9s\n' "$name" "$count" \
      "$rate" "$past" "$own" "$warm" "$("$python" -c "print(100 * $rate / ($own * $count))")" \
      "$("$python" -c "print(100 * $past / ($own * $count))")" "$("$python" -c "print($rate / $one)")" "$hf_rate" \
      "$("$python" -c "print($rate / $hf_rate)")" "$identical"
  done
done
echo "load after: $(uptime | sed 's/.*load average: //')"
echo "MB/s of text. prepare: end to end; past setup: without resolving the files and loading the tokenizer;"
echo "own: the tokenizer's single-thread rate, one call per document (bench_tokenizer ... lines), in a fresh"
echo "process (cold, as prepare runs) and warm; vs own: prepare / (own cold x cores) (past: past setup); HF:"
echo "encode_batch on as many cores. goals: 'vs own' >= 80%, 'vs 1' >= 1.8x on 2 cores; the figures are only as"
echo "steady as the machine is quiet (see the load)."
exit $status
