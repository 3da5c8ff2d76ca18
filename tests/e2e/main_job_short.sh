#!/usr/bin/env bash
# A short version of the main job through the real command line: prepare the King James Bible, train
# qwen3-tiny for a few steps, resume it, sample from the checkpoint; then the errors a user meets first.
# Usage: main_job_short.sh BUILD_DIR
set -euo pipefail
meshtrain="$1/meshtrain"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! command -v bible >/dev/null; then
  echo "SKIP: the default corpus needs Debian's bible-kjv (scripts/setup.sh installs it)"
  exit 0
fi
cd "$(dirname "$0")/../.."

"$meshtrain" prepare --out "$work/kjv" --vocab-size 2048 | tee "$work/prepare.log"
grep -q "validation unigram cross-entropy" "$work/prepare.log"
short=(dataset_path="$work/kjv" eval_dataset_path="$work/kjv" tokenizer_path="$work/kjv/tokenizer.json"
  vocab_size=2048 per_device_batch_size=4 max_target_length=64 eval_interval=2 eval_steps=2 run_dir="$work/run")
"$meshtrain" train qwen3-tiny "${short[@]}" steps=4 checkpoint_period=2 | tee "$work/train.log"
test "$(wc -l <"$work/run/metrics.jsonl")" -eq 4
test -f "$work/run/checkpoints/step_00000004/COMMITTED"
ls "$work"/run/events.out.tfevents.* >/dev/null
# A longer run in the same run_dir resumes from step 4.
"$meshtrain" train qwen3-tiny "${short[@]}" steps=6 | tee "$work/resume.log"
grep -q "resuming from .*step_00000004" "$work/resume.log"
test "$(wc -l <"$work/run/metrics.jsonl")" -eq 6
"$meshtrain" generate --checkpoint "$work/run" --prompt "And God said" --max-new-tokens 8 --seed 1 | tee "$work/sample.txt"
grep -q "^And God said" "$work/sample.txt"
# dataset_type=text: the user's own text files, tokenized at start with the given tokenizer.
mkdir -p "$work/texts"
for book in gen exo lev num; do bible -f "${book}1:1-${book}3:10" | cut -d' ' -f2- >"$work/texts/$book.txt"; done
"$meshtrain" train qwen3-tiny dataset_type=text dataset_path="$work/texts" eval_dataset_path= \
  tokenizer_path="$work/kjv/tokenizer.json" vocab_size=2048 per_device_batch_size=4 max_target_length=64 \
  eval_interval=0 run_dir="$work/textrun" steps=2 | tee "$work/text.log"
test -f "$work/textrun/data/train.tokens"
test "$(wc -l <"$work/textrun/metrics.jsonl")" -eq 2
# Round trip through the trained tokenizer.
printf 'In the beginning God created the heaven and the earth.' >"$work/text"
"$meshtrain" tokenize --tokenizer "$work/kjv/tokenizer.json" <"$work/text" >"$work/ids.json"
"$meshtrain" tokenize --tokenizer "$work/kjv/tokenizer.json" --decode <"$work/ids.json" >"$work/decoded"
cmp "$work/text" "$work/decoded"

# Bad input: each names the problem and exits non-zero.
expect_error() {  # expect_error PATTERN COMMAND...
  local pattern=$1
  shift
  if "$@" >"$work/out" 2>&1; then echo "expected failure: $*"; exit 1; fi
  grep -q -- "$pattern" "$work/out" || { echo "expected '$pattern' in:"; cat "$work/out"; exit 1; }
}
expect_error "did you mean 'train'" "$meshtrain" trian qwen3-tiny
expect_error "did you mean 'per_device_batch_size'" "$meshtrain" info qwen3-tiny per_device_batchsize=2
expect_error "did you mean 'qwen3-0.6b'" "$meshtrain" info qwen3-0.6
expect_error "a divisor of base_num_query_heads" "$meshtrain" info qwen3-tiny base_num_kv_heads=4
expect_error "vocab_size" "$meshtrain" train qwen3-tiny "${short[@]}" vocab_size=4096 run_dir="$work/bad"
expect_error "empty" "$meshtrain" prepare --out "$work/empty_out" --corpus /dev/null
echo "main job (short): all checks passed"
