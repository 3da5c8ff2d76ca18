#!/usr/bin/env bash
# The main job: installs what is missing, builds, prepares the default corpus (the King James Bible,
# tokenized with a BPE tokenizer trained on it), trains qwen3-tiny on it, and prints a sample.
# Extra arguments are passed to `meshtrain train` as key=value overrides (e.g. steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target meshtrain
run_dir=${RUN_DIR:-runs/qwen3-tiny-kjv}
./build/meshtrain prepare --out data/kjv --vocab-size 8192
./build/meshtrain train qwen3-tiny run_dir="$run_dir" "$@"
./build/meshtrain generate --checkpoint "$run_dir" --prompt "And God said" --max-new-tokens 60 --seed 1
