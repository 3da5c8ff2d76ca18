#!/usr/bin/env bash
# Installs what meshtrain needs from Debian's packages (apt-get runs only when something is missing).
# Why each package: see "Dependencies" in README.md.
#   scripts/setup.sh            what the main job needs: build, train, generate (no Python)
#   scripts/setup.sh tests      + what the tests need: GoogleTest, Debian's python3 and, in a virtual
#                               environment under build/venv, the official TensorBoard reader from PyPI
#   scripts/setup.sh bench      + what only bench/ needs: the libraries and peers compared against
set -euo pipefail
cd "$(dirname "$0")/.."

main_packages=(
  g++ cmake make pkg-config
  libdnnl-dev             # oneDNN: the GEMM backend (loaded at run time) and, later, bf16 matmuls
  libyaml-cpp-dev         # YAML configs
  nlohmann-json3-dev      # JSON: safetensors headers, tokenizer.json, metrics
  libpcre2-dev            # tokenizer regexes with Unicode classes
  libicu-dev              # NFC normalisation for tokenizers
  zlib1g-dev              # .jsonl.gz sources, decompressed as they are read
  libzstd-dev             # .jsonl.zst sources, decompressed as they are read
  bible-kjv bible-kjv-text  # the default corpus
  openmpi-bin libopenmpi-dev  # multi-process training (mpirun)
)
test_packages=(
  libgtest-dev libgmock-dev
  python3 python3-venv    # the test scripts' checks and the TensorBoard reader's venv
  python3-numpy           # mpi.equivalence compares checkpoint tensors with numpy
  iproute2                # mpi.across_hosts: two hosts as network namespaces joined by a veth (ip netns)
  clang                   # the fuzz targets (tests/fuzz/): libFuzzer is clang's
  libclang-rt-dev         # libFuzzer and clang's ASan / UBSan runtimes (clang alone does not bring them)
  libomp-dev              # OpenMP for clang (libomp: clang's -fopenmp; GCC's libgomp is GCC's own)
  gzip zstd               # the record readers' tests compress their JSON Lines with the real tools
)
bench_packages=(
  libopenblas-openmp-dev libblis-openmp-dev  # bench/run_gemm.sh: the BLAS libraries compared with oneDNN
  python3-torch           # bench/peers: the PyTorch peer (Debian's build, under /usr/bin/python3)
)

packages=("${main_packages[@]}")
want_tests=false
for part in "$@"; do
  case "$part" in
    tests) packages+=("${test_packages[@]}"); want_tests=true ;;
    bench) packages+=("${bench_packages[@]}") ;;
    *) echo "setup: unknown part '$part' (expected: tests, bench)" >&2; exit 2 ;;
  esac
done

missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The official TensorBoard reader the event-file test compares against: only PyPI has it, and Debian's
# Python refuses system-wide pip (PEP 668), so it goes into a virtual environment of Debian's python3.
if $want_tests; then
  venv=build/venv
  if ! "$venv/bin/python3" -c "import tensorboard" >/dev/null 2>&1; then
    echo "setup: tensorboard into $venv (pip)"
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check tensorboard
  fi
fi
