#!/usr/bin/env bash
# The long tests: what does not fit the test command's 45 minutes on 2 cores (scripts/test.sh runs one case
# of each kind of them): every pipeline combination (tests/mpi/pipeline.sh --long). Set-up and build as
# scripts/test.sh, then only the tests labelled long.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh tests
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_LONG_TESTS=ON >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs" -L long)
