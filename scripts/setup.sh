#!/usr/bin/env bash
# Installs what meshtrain needs from Debian's packages (skips apt-get when everything is present).
# Why each: see "Dependencies" in README.md.
set -euo pipefail

packages=(
  g++ cmake make pkg-config
  libopenblas-openmp-dev  # BLAS, OpenMP build: one threading runtime with our kernels
  libyaml-cpp-dev         # YAML configs
  nlohmann-json3-dev      # JSON: safetensors headers, tokenizer.json, metrics
  libgtest-dev libgmock-dev
  libbenchmark-dev libblis-openmp-dev libdnnl-dev  # bench/: the BLAS libraries compared
)

missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
