#!/usr/bin/env bash
# Parquet read benchmark: one string column of a ~100 MB Parquet file of text, streamed by meshtrain's reader
# (Arrow's C++ library from the pyarrow wheel, parquet-cpp's column reader) against pyarrow's iter_batches on
# the same file, snappy and zstd; best of REPEATS runs each; checks both saw the same documents and bytes.
#
#   bench/parquet/run_read_bench.sh [BUILD_DIR (build)]
#
# Needs a build with Parquet (scripts/setup.sh parquet, then configure: CMake reports "Parquet: Arrow's C++
# library at ...") and build/venv's pyarrow. Environment: REPEATS (5), WORK_DIR (/tmp/meshtrain_parquet_bench).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
python="$root/build/venv/bin/python3"
repeats="${REPEATS:-5}"
work="${WORK_DIR:-/tmp/meshtrain_parquet_bench}"
mkdir -p "$work"

"$python" -c "import pyarrow" 2>/dev/null || { echo "run_read_bench: no pyarrow in $python (scripts/setup.sh parquet)" >&2; exit 1; }
g++ -std=c++20 -O2 -I"$root/src" "$here/bench_parquet_read.cpp" -o "$work/bench_parquet_read" \
  -L"$build" -lmeshtrain_data -lmeshtrain_core -Wl,-rpath,"$build"

best() {  # best LABEL COMMAND...: the line starting with LABEL of the fastest of $repeats runs of COMMAND
  local label=$1 line fastest=""
  shift
  for _ in $(seq "$repeats"); do
    line=$("$@" | grep -F "$label")
    if [ -z "$fastest" ] || awk -v a="$line" -v b="$fastest" \
        'BEGIN { split(a, x, ", "); split(b, y, ", "); exit !(x[3] + 0 < y[3] + 0) }'; then
      fastest=$line
    fi
  done
  echo "$fastest"
}

for compression in snappy zstd; do
  file="$work/text_$compression.parquet"
  [ -f "$file" ] || "$python" "$here/make_text_parquet.py" "$file" 100000000 "$compression"
  ours=$(best "meshtrain" "$work/bench_parquet_read" "$file" text)
  arrow=$(best "pyarrow iter_batches:" "$python" "$here/read_pyarrow.py" "$file" text)
  strs=$("$python" "$here/read_pyarrow.py" "$file" text | grep -F "+ str")
  echo "$compression, $(du -m "$file" | cut -f1) MB file:"
  for line in "$ours" "$arrow" "$strs"; do
    awk -v l="$line" 'BEGIN { split(l, f, ", "); split(f[2], b, " "); printf "  %-60s %6.0f MB/s\n", l, b[1] / f[3] / 1e6 }'
  done
  [ "$(echo "$ours" | cut -d: -f2 | cut -d, -f1-2)" = "$(echo "$arrow" | cut -d: -f2 | cut -d, -f1-2)" ] ||
    { echo "run_read_bench: the readers saw different documents" >&2; exit 1; }
done
