#!/usr/bin/env bash
# Runs fuzz targets of a MESHTRAIN_FUZZ build, one after another, each for SECONDS on a copy of its seed
# corpus (corpus/<target>/; the copy grows, the committed seeds do not) and its dictionary when it has one.
#   tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]     (no TARGET: every target built in BUILD_DIR)
# Prints each target's executions, executions per second and coverage; exits 1 when any target found a
# crash, a sanitizer report, a leak, a hang (an input running past -timeout) or an out-of-memory, whose input
# is kept under BUILD_DIR/fuzz-artifacts/<target>/ (reproduce: BUILD_DIR/tests/fuzz/<target> FILE).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
  exit 2
fi
build="$(cd "$1" && pwd)"
seconds="$2"
shift 2
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for binary in "$build"/tests/fuzz/fuzz_*; do
    [ -x "$binary" ] && targets+=("$(basename "$binary")")
  done
fi

# UBSan's reports with the stack that led there (the build makes every report abort).
export UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
failed=()
for target in "${targets[@]}"; do
  binary="$build/tests/fuzz/$target"
  if [ ! -x "$binary" ]; then
    echo "$target: no binary at $binary (build it: cmake --build $build --target $target)" >&2
    failed+=("$target")
    continue
  fi
  corpus="$(mktemp -d)"
  cp -r "$here/corpus/$target/." "$corpus/"
  artifacts="$build/fuzz-artifacts/$target"
  mkdir -p "$artifacts"
  options=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
           -artifact_prefix="$artifacts/")
  case "$target" in
    fuzz_config) options+=(-dict="$here/yaml.dict") ;;
    fuzz_safetensors | fuzz_checkpoint_* | fuzz_tokenizer_json | fuzz_gpt2_bpe | fuzz_plan_file | fuzz_json_lines)
      options+=(-dict="$here/json.dict") ;;
  esac
  log="$artifacts/run.log"
  "$binary" "${options[@]}" "$corpus" >"$log" 2>&1
  status=$?
  rm -rf "$corpus"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  coverage=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ "$status" -ne 0 ]; then
    echo "$target: FAILED (exit $status) after ${runs:-?} runs; log: $log, input under $artifacts/"
    grep -E 'ERROR: |SUMMARY: |runtime error|Test unit written' "$log" | head -20
    failed+=("$target")
  else
    echo "$target: ${runs:-?} runs in ${seconds}s (${speed:-?}/s), ${coverage:-cov: ?}, no crash, leak or hang"
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
