#!/usr/bin/env bash
# Installs what meshtrain needs from Debian's packages (apt-get runs only when something is missing).
# Why each package: see "Dependencies" in README.md.
#   scripts/setup.sh            what the main job needs: build, train, generate (no Python)
#   scripts/setup.sh tests      + what the tests need: GoogleTest, Debian's python3 and, in a virtual
#                               environment under build/venv, the official TensorBoard reader from PyPI
#   scripts/setup.sh bench      + what only bench/ needs: the libraries and peers compared against
#   scripts/setup.sh parquet    + Parquet sources: Arrow's C++ library (libparquet, libarrow) as PyPI's pyarrow
#                               wheel ships it, in the same virtual environment (docs/parquet.md says why);
#                               reconfigure the build afterwards so CMake finds it
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
  slurmctld slurmd slurm-client  # slurm.cluster: a two-node SLURM cluster on this machine (tests/slurm/)
  clang                   # the fuzz targets (tests/fuzz/): libFuzzer is clang's
  libclang-rt-dev         # libFuzzer and clang's ASan / UBSan runtimes (clang alone does not bring them)
  libomp-dev              # OpenMP for clang (libomp: clang's -fopenmp; GCC's libgomp is GCC's own)
  gzip zstd               # the record readers' tests compress their JSON Lines with the real tools
)
bench_packages=(
  libopenblas-openmp-dev libblis-openmp-dev  # bench/run_gemm.sh: the BLAS libraries compared with oneDNN
  python3-torch           # bench/peers: the PyTorch peer (Debian's build, under /usr/bin/python3)
)

parquet_packages=(
  python3 python3-venv    # the virtual environment the pyarrow wheel goes into
)

packages=("${main_packages[@]}")
want_tests=false
want_parquet=false
for part in "$@"; do
  case "$part" in
    tests) packages+=("${test_packages[@]}"); want_tests=true ;;
    bench) packages+=("${bench_packages[@]}") ;;
    parquet) packages+=("${parquet_packages[@]}"); want_parquet=true ;;
    *) echo "setup: unknown part '$part' (expected: tests, bench, parquet)" >&2; exit 2 ;;
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

# PyPI packages go into one virtual environment of Debian's python3 (Debian's Python refuses system-wide pip,
# PEP 668): a venv whose Python no longer runs (Debian's python3 replaced) is made anew.
venv=build/venv
venv_install() {  # venv_install MODULE REQUIREMENT: pip-installs REQUIREMENT unless MODULE imports
  if ! "$venv/bin/python3" -c "pass" >/dev/null 2>&1; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
  fi
  if ! "$venv/bin/python3" -c "import $1" >/dev/null 2>&1; then
    echo "setup: $2 into $venv (pip)"
    "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check "$2"
  fi
}
# The official TensorBoard reader the event-file test compares against: only PyPI has it.
if $want_tests; then
  venv_install tensorboard tensorboard
fi
# Arrow's C++ headers and libraries as the pyarrow wheel ships them (Debian 12 has no Arrow C++). The major
# version is pinned: Arrow's C++ API and the libraries' sonames (libparquet.so.2600) change with it, and a build
# links the soname it found. The unversioned libparquet.so / libarrow.so links that a linker looks for are
# made by pyarrow's own create_library_symlinks().
if $want_parquet; then
  venv_install pyarrow "pyarrow==26.*"
  "$venv/bin/python3" -c "import pyarrow; pyarrow.create_library_symlinks()"
fi
