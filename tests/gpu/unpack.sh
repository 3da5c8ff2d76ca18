# Sourced by run.sh and inspect.sh with the script's arguments (BUNDLE [OUT_DIR]): unpacks the bundle of
# bundle.sh into $b, makes $out (OUT_DIR, else $OUT, else ./gpu-results), sets $here (tests/gpu), and puts
# the bundle's libraries, then CUDA's runtime and cuBLAS where this machine keeps them (the toolkit, or the
# pip wheels' folders), on LD_LIBRARY_PATH.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bundle=$(realpath "$1")
out=${2:-${OUT:-gpu-results}}
mkdir -p "$out"
out=$(realpath "$out")
b=$(mktemp -d)
tar -C "$b" -xJf "$bundle"
export LD_LIBRARY_PATH="$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for library in libcudart.so.13 libcublasLt.so.13 libcublas.so.13; do
  if ldd "$b/lib/libmeshtrain_kernels_cuda.so" | grep -q "$library => not found"; then
    found=$(find /usr/local/cuda*/ /usr/lib /opt /usr/local/lib -name "$library*" 2>/dev/null | head -1)
    [ -n "$found" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
  fi
done
