#!/usr/bin/env bash
# Makes what tests/gpu/run.sh needs on a GPU machine that has the CUDA runtime but none of meshtrain's Debian
# libraries: a Release build with the CUDA backend for any x86-64-v3 host (build-gpu/), its shared libraries
# and the Debian ones it links (yaml-cpp, ICU, PCRE2, OpenMPI, ...), and the cpu baseline runs the GPU runs
# are compared with, packed as .gpu-bundle.tar.xz (ignored by git) in the repository root. With LLMC=FILE (llm.c's
# train_gpt2cu, built from a public checkout kept outside the project with `make train_gpt2cu USE_CUDNN=0
# NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90`), the peer and random GPT-2 token files in its
# format go in too.
# Usage: [LLMC=path/to/train_gpt2cu] tests/gpu/bundle.sh    then, on the GPU machine:
#        tests/gpu/run.sh .gpu-bundle.tar.xz
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
# OpenMPI's launcher for the runs of ranks sharing the GPU (the GPU machine may have none, or another MPI's):
# orterun (as mpirun), OpenMPI's and PMIx's plugins and help texts in Debian's layout under mpi/, and the
# libraries they link; run.sh points OpenMPI and PMIx at them (OPAL_PREFIX and friends). Tried here with the
# system's OpenMPI and PMIx hidden (bind mounts over their folders and libraries): 2 ranks ran.
mkdir -p "$stage/mpi/bin" "$stage/mpi/lib/x86_64-linux-gnu" "$stage/mpi/share" "$stage/mpi/etc"
cp -L "$(readlink -f "$(command -v mpirun)")" "$stage/mpi/bin/mpirun"
cp -rL /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 "$stage/mpi/lib/x86_64-linux-gnu/"
rm -rf "$stage/mpi/lib/x86_64-linux-gnu/openmpi/include" "$stage/mpi/lib/x86_64-linux-gnu/openmpi/lib/"*.a
cp -r /usr/share/openmpi "$stage/mpi/share/"
[ -d /usr/share/pmix ] && cp -r /usr/share/pmix "$stage/mpi/share/"
{ find "$stage/mpi/bin" "$stage/mpi/lib" -name '*.so*' -o -type f -perm -u+x | xargs ldd 2>/dev/null || true; } |
  awk '/=> \// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+)\.so|libcuda|libcudart|libcublas|meshtrain' |
  xargs -r cp -Ln -t "$stage/lib/"
# The cpu baselines of the equivalence checks: qwen3-tiny as tests/mpi/equivalence.sh trains it, 20 steps,
# the same with Engram and mHC, and deepseek-custom-tiny, 20 steps (tiny.sh).
source tests/gpu/tiny.sh
build-gpu/meshtrain train qwen3-tiny "${tiny[@]}" run_dir="$stage/reference/qwen3_tiny_cpu" >"$stage/reference/qwen3_tiny_cpu.log" 2>&1 ||
  { cat "$stage/reference/qwen3_tiny_cpu.log"; exit 1; }
# The same in bfloat16, where this CPU computes it (AVX512-BF16 or AMX): the peer of the GPU's bf16 path.
build-gpu/meshtrain train qwen3-tiny "${tiny[@]}" dtype=bfloat16 run_dir="$stage/reference/qwen3_tiny_cpu_bf16" \
  >"$stage/reference/qwen3_tiny_cpu_bf16.log" 2>&1 ||
  { echo "no bfloat16 cpu baseline: $(tail -1 "$stage/reference/qwen3_tiny_cpu_bf16.log")"; rm -rf "$stage/reference/qwen3_tiny_cpu_bf16"; }
build-gpu/meshtrain train qwen3-tiny "${tiny[@]}" "${engram_mhc[@]}" run_dir="$stage/reference/qwen3_tiny_engram_mhc_cpu" \
  >"$stage/reference/qwen3_tiny_engram_mhc_cpu.log" 2>&1 || { cat "$stage/reference/qwen3_tiny_engram_mhc_cpu.log"; exit 1; }
build-gpu/meshtrain train deepseek-custom-tiny "${deepseek[@]}" run_dir="$stage/reference/deepseek_tiny_cpu" \
  >"$stage/reference/deepseek_tiny_cpu.log" 2>&1 || { cat "$stage/reference/deepseek_tiny_cpu.log"; exit 1; }
if [ -n "${LLMC:-}" ]; then
  mkdir -p "$stage/llmc"
  cp "$LLMC" "$stage/llmc/train_gpt2cu"
  # Token files as llm.c's data loader reads them: int32 header[256] (magic 20240520, version 1, count), then
  # uint16 tokens, uniform over GPT-2's 50,257 ids (the values do not matter for speed).
  /usr/bin/python3 - "$stage/llmc" <<'PY'
import sys
import numpy as np
for name, count in (("train.bin", 1 << 20), ("val.bin", 1 << 16)):
    header = np.zeros(256, np.int32)
    header[:3] = (20240520, 1, count)
    tokens = np.random.default_rng(len(name)).integers(0, 50257, count, dtype=np.uint16)
    with open(f"{sys.argv[1]}/{name}", "wb") as out:
        out.write(header.tobytes() + tokens.tobytes())
PY
fi
tar -C "$stage" -cJf "$root/.gpu-bundle.tar.xz" .
ls -la "$root/.gpu-bundle.tar.xz"
