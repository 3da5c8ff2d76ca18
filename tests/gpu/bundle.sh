#!/usr/bin/env bash
# Makes what tests/gpu/run.sh needs on a GPU machine that has the CUDA runtime but none of meshtrain's Debian
# libraries: a Release build with the CUDA backend for any x86-64-v3 host (build-gpu/), its shared libraries
# and the Debian ones it links (yaml-cpp, ICU, PCRE2, OpenMPI, ...), and the cpu baseline runs the GPU runs
# are compared with, packed as .gpu-bundle.tar.xz (git-ignored) in the repository root.
# Usage: tests/gpu/bundle.sh            then, on the GPU machine: tests/gpu/run.sh .gpu-bundle.tar.xz
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
jobs=$(nproc)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_CUDA=ON -DMESHTRAIN_MARCH=x86-64-v3 \
  -DMESHTRAIN_BENCH=OFF >/dev/null
cmake --build build-gpu -j "$jobs" --target meshtrain meshtrain_gpu_tests
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/reference"
cp build-gpu/meshtrain build-gpu/meshtrain_gpu_tests "$stage/bin/"
cp build-gpu/libmeshtrain_*.so "$stage/lib/"
# The Debian libraries the binaries link, but not the C runtime and not CUDA's (the GPU machine has its own
# driver-matched CUDA runtime and cuBLAS).
ldd build-gpu/meshtrain build-gpu/meshtrain_gpu_tests build-gpu/libmeshtrain_*.so | awk '/=> \// {print $3}' |
  sort -u | grep -vE '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+)\.so|libcuda|libcudart|libcublas|meshtrain' |
  xargs -r cp -L -t "$stage/lib/"
# The cpu baseline of the equivalence check: qwen3-tiny as tests/mpi/equivalence.sh trains it, 20 steps.
source tests/gpu/tiny.sh
build/meshtrain train qwen3-tiny "${tiny[@]}" run_dir="$stage/reference/qwen3_tiny_cpu" >"$stage/reference/qwen3_tiny_cpu.log" 2>&1 ||
  { cat "$stage/reference/qwen3_tiny_cpu.log"; exit 1; }
tar -C "$stage" -cJf "$root/.gpu-bundle.tar.xz" .
grep -qx '/.gpu-bundle.tar.xz' .git/info/exclude 2>/dev/null || echo '/.gpu-bundle.tar.xz' >>.git/info/exclude
grep -qx '/build-gpu/' .git/info/exclude 2>/dev/null || echo '/build-gpu/' >>.git/info/exclude
ls -la "$root/.gpu-bundle.tar.xz"
