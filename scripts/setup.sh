#!/usr/bin/env bash
# Installs what meshtrain needs from Debian's packages (skips apt-get when everything is present).
# Why each: see "Dependencies" in README.md.
set -euo pipefail

packages=(
  g++ cmake make pkg-config
  libopenblas-openmp-dev  # BLAS, OpenMP build: one threading runtime with our kernels
  libyaml-cpp-dev         # YAML configs
  nlohmann-json3-dev      # JSON: safetensors headers, tokenizer.json, metrics
  libpcre2-dev            # tokenizer regexes with Unicode classes
  libicu-dev              # NFC normalisation for tokenizers
  bible-kjv bible-kjv-text  # the default corpus
  openmpi-bin libopenmpi-dev  # multi-process training and its tests (mpirun)
  libgtest-dev libgmock-dev
  libbenchmark-dev libblis-openmp-dev libdnnl-dev  # bench/: the BLAS libraries compared
)

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

# Python packages for the independent readers the tests compare against (official TensorBoard reader).
if ! python3 -c "import tensorboard" >/dev/null 2>&1; then
  echo "setup: pip install tensorboard"
  python3 -m pip install --quiet tensorboard
fi
