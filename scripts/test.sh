#!/usr/bin/env bash
# The test command: installs what is missing, builds (Release, and the unit tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer), and runs every test with ctest; then builds the libFuzzer
# targets with clang and runs each for 30 seconds (tests/fuzz/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh tests
jobs=$(nproc)

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs")

# The sanitizer build leaves the CUDA backend out: its GPU tests need a GPU, and ASan does not cover device code.
# -Og with line tables only (-g1): a report still names file and line; on a 2-core Zen 1 the build takes
# 874 s against 1444 s at -O1 -g, and its tests 271 s against 249 s at -O1 -g1.
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DMESHTRAIN_SANITIZE=ON -DMESHTRAIN_BENCH=OFF -DMESHTRAIN_CUDA=OFF \
  -DCMAKE_CXX_FLAGS_DEBUG="-Og -g1" >/dev/null
cmake --build build-sanitize -j "$jobs" --target meshtrain_unit_tests
(cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j "$jobs")

# The fuzz targets (clang, ASan + UBSan, libFuzzer): only they and the libraries they link are built, at -O1
# without full debug information (line tables name the lines of a report), and ctest runs each target's smoke.
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ \
  -DMESHTRAIN_FUZZ=ON -DMESHTRAIN_BENCH=OFF -DMESHTRAIN_CUDA=OFF -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" \
  >/dev/null
cmake --build build-fuzz -j "$jobs"
(cd build-fuzz && ctest --output-on-failure -j "$jobs")
