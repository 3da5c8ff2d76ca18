#!/usr/bin/env bash
# GEMM library comparison on this machine, all in one window: OpenBLAS, BLIS and oneDNN (fp32 and bf16) at 1 and 2
# threads, then a summary of medians per library and the ratio to OpenBLAS per shape. Always exits 0: it reports
# speed, it never judges it.
#
# usage: bench/run_gemm.sh [build-dir] [shape-substring ...]
#   build-dir        CMake build directory holding bench/bench_gemm_* (default: build)
#   shape-substring  run only shapes whose name contains one of these (default: all)
# environment:
#   MESHTRAIN_BENCH_THREADS   thread counts to run (default "1 2")
#   MESHTRAIN_BENCH_SECONDS   timed seconds per shape and library (default 0.5)
#   MESHTRAIN_BENCH_GHZ, MESHTRAIN_BENCH_FLOP_PER_CYCLE   peak assumption (default 3.6 GHz, 32 FLOP/cycle/core)
#   MESHTRAIN_BENCH_QUIET_WAIT  seconds to wait for other processes to go quiet before each run (default 60)
#   MESHTRAIN_BENCH_LOG       where the raw output goes (default <build-dir>/bench/gemm_results.txt)
#   MESHTRAIN_BENCH_SUMMARIZE=<raw log>  only print the summary of an earlier run's raw output
#
# Library configurations run (each row is labelled library:kernel-set, as the library reports it):
#   openblas:<auto>   OPENBLAS_CORETYPE unset: OpenBLAS picks its kernels by CPUID
#   openblas:<env>    only when the caller's environment sets OPENBLAS_CORETYPE: that forced kernel set
#   blis:<auto>       BLIS_ARCH_TYPE unset: BLIS picks its sub-configuration by CPUID
#   blis:skx          BLIS_ARCH_TYPE=0 (AVX-512 kernels), run when the automatic choice is something else
#   onednn:sgemm, onednn:matmul (f32), onednn:matmul/bf16   oneDNN picks its ISA by CPUID
# Threads: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and BLIS_NUM_THREADS are all set to the same count (all three
# libraries are OpenMP builds on libgomp and follow OMP_NUM_THREADS).

set -u
build_dir=${1:-build}
[ $# -gt 0 ] && shift
filters=("$@")

# Summary: per thread count, the median GFLOP/s of every library configuration per shape, then the ratio to the
# first OpenBLAS configuration (automatic kernels). '*' marks a figure measured while other processes took more
# than 10% of the machine (column "others" of the raw rows): treat it as depressed.
summarize() {
  awk '
    /^#/ || NF < 15 { next }
    {
      lib = $1; if ($2 == "bf16") lib = lib "/bf16";
      t = $3; shape = $4; key = t SUBSEP shape SUBSEP lib;
      med[key] = $9; other = $14; sub(/%$/, "", other); busy[key] = (other + 0 > 10);
      if (!((t, shape) in seen_shape)) { seen_shape[t, shape] = 1; shapes[t, ++nshapes[t]] = shape; dims[shape] = $5 " " $6 "x" $7 "x" $8 }
      if (!((t, lib) in seen_lib)) { seen_lib[t, lib] = 1; libs[t, ++nlibs[t]] = lib }
      if (!(t in seen_t)) { seen_t[t] = 1; ts[++nt] = t }
    }
    END {
      for (ti = 1; ti <= nt; ti++) {
        t = ts[ti]; base = "";
        for (l = 1; l <= nlibs[t]; l++) if (base == "" && libs[t, l] ~ /^openblas/) base = libs[t, l];
        printf "\n=== median GFLOP/s, %d thread(s) (* = measured while other processes were busy)\n", t;
        printf "%-15s %-17s", "shape", "op MxNxK";
        for (l = 1; l <= nlibs[t]; l++) { w[l] = length(libs[t, l]); if (w[l] < 8) w[l] = 8; printf(" %" w[l] "s ", libs[t, l]) }
        printf "\n";
        for (s = 1; s <= nshapes[t]; s++) {
          shape = shapes[t, s]; printf "%-15s %-17s", shape, dims[shape];
          for (l = 1; l <= nlibs[t]; l++) {
            k = t SUBSEP shape SUBSEP libs[t, l];
            if (k in med) printf(" %" w[l] ".1f%s", med[k], busy[k] ? "*" : " "); else printf(" %" w[l] "s ", "-");
          }
          printf "\n";
        }
        # The engine against the best float32 library measured in this run, per shape (issue: >= 0.80).
        engine = "";
        for (l = 1; l <= nlibs[t]; l++) if (libs[t, l] ~ /^meshtrain/) engine = libs[t, l];
        if (engine != "") {
          printf "\n=== %s against the best float32 library of this run, %d thread(s)\n", engine, t;
          printf "%-15s %-17s %10s %22s %8s\n", "shape", "op MxNxK", "engine", "best library", "ratio";
          for (s = 1; s <= nshapes[t]; s++) {
            shape = shapes[t, s]; best = 0; best_lib = "-";
            for (l = 1; l <= nlibs[t]; l++) {
              k = t SUBSEP shape SUBSEP libs[t, l];
              if (libs[t, l] == engine || libs[t, l] ~ /bf16/ || !(k in med)) continue;
              if (med[k] > best) { best = med[k]; best_lib = libs[t, l] }
            }
            ke = t SUBSEP shape SUBSEP engine;
            if ((ke in med) && best > 0)
              printf "%-15s %-17s %10.1f %15s %6.1f %7.2f%s\n", shape, dims[shape], med[ke], best_lib, best, med[ke] / best, busy[ke] ? "*" : "";
          }
        }
        if (base == "") continue;
        printf "\n=== ratio to %s, %d thread(s)\n", base, t;
        printf "%-15s %-17s", "shape", "op MxNxK";
        for (l = 1; l <= nlibs[t]; l++) if (libs[t, l] != base) printf(" %" w[l] "s ", libs[t, l]);
        printf "\n";
        for (s = 1; s <= nshapes[t]; s++) {
          shape = shapes[t, s]; printf "%-15s %-17s", shape, dims[shape];
          kb = t SUBSEP shape SUBSEP base;
          for (l = 1; l <= nlibs[t]; l++) {
            if (libs[t, l] == base) continue;
            k = t SUBSEP shape SUBSEP libs[t, l];
            if ((k in med) && (kb in med) && med[kb] > 0) printf(" %" w[l] ".2f%s", med[k] / med[kb], (busy[k] || busy[kb]) ? "*" : " ");
            else printf(" %" w[l] "s ", "-");
          }
          printf "\n";
        }
      }
    }' "$1"
}

if [ -n "${MESHTRAIN_BENCH_SUMMARIZE:-}" ]; then
  summarize "$MESHTRAIN_BENCH_SUMMARIZE"
  exit 0
fi

find_exe() {
  local name=$1
  for candidate in "$build_dir/bench/$name" "$build_dir/$name"; do
    if [ -x "$candidate" ]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

if [ ! -d "$build_dir" ]; then
  echo "# note: build directory $build_dir does not exist (usage: bench/run_gemm.sh [build-dir] [shape...])"
fi
log=${MESHTRAIN_BENCH_LOG:-$build_dir/bench/gemm_results.txt}
if ! { [ -d "$(dirname "$log")" ] && : >"$log"; } 2>/dev/null; then
  log=$(mktemp)
fi
export MESHTRAIN_BENCH_SECONDS=${MESHTRAIN_BENCH_SECONDS:-0.5}
threads_list=${MESHTRAIN_BENCH_THREADS:-"1 2"}
quiet_wait=${MESHTRAIN_BENCH_QUIET_WAIT:-60}
inherited_coretype=${OPENBLAS_CORETYPE:-}

# Percentage of all CPUs busy over one second (whole system; call it while nothing of ours runs).
system_busy_pct() {
  local a b
  a=$(head -1 /proc/stat)
  sleep 1
  b=$(head -1 /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN {
    split(a, x, " "); split(b, y, " "); total = 0; idle = 0;
    for (i = 2; i <= 9; i++) total += y[i] - x[i];
    idle = (y[5] - x[5]) + (y[6] - x[6]);
    if (total <= 0) { print 0; exit }
    printf "%d\n", 100 * (total - idle) / total }'
}

wait_for_quiet() {
  local waited=0 busy
  while :; do
    busy=$(system_busy_pct)
    if [ "$busy" -lt 15 ]; then
      return 0
    fi
    if [ "$waited" -ge "$quiet_wait" ]; then
      echo "# note: machine still ${busy}% busy after ${waited}s of waiting; measuring anyway" | tee -a "$log"
      return 0
    fi
    waited=$((waited + 1))
  done
}

# run <label-for-messages> <exe-name> [VAR=value ...] [-u VAR ...]: one executable under a given environment.
run_one() {
  local what=$1 exe_name=$2
  shift 2
  local exe
  if ! exe=$(find_exe "$exe_name"); then
    echo "# skipped $what: $exe_name not found under $build_dir (build it: cmake --build $build_dir --target $exe_name)" |
      tee -a "$log"
    return 0
  fi
  wait_for_quiet
  echo "## $what, OMP_NUM_THREADS=$OMP_NUM_THREADS $*" | tee -a "$log"
  env "$@" "$exe" "${filters[@]}" 2>&1 | tee -a "$log"
  return 0
}

blis_auto_arch() {
  local exe
  exe=$(find_exe bench_gemm_blis) || return 0
  env -u BLIS_ARCH_TYPE OMP_NUM_THREADS=1 "$exe" no-such-shape 2>/dev/null |
    sed -n 's/^# BLIS .*sub-configuration \([a-z0-9]*\) .*/\1/p'
}


{
  echo "# run_gemm.sh $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
  echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) CPUs online"
  echo "# caller's OPENBLAS_CORETYPE=${inherited_coretype:-unset} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-unset} BLIS_ARCH_TYPE=${BLIS_ARCH_TYPE:-unset}"
  echo "# MESHTRAIN_BENCH_SECONDS=$MESHTRAIN_BENCH_SECONDS threads: $threads_list"
} | tee -a "$log"

blis_auto=$(blis_auto_arch)

for t in $threads_list; do
  export OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t BLIS_NUM_THREADS=$t
  run_one "OpenBLAS (automatic kernels)" bench_gemm_openblas -u OPENBLAS_CORETYPE
  if [ -n "$inherited_coretype" ]; then
    run_one "OpenBLAS (caller's OPENBLAS_CORETYPE)" bench_gemm_openblas OPENBLAS_CORETYPE="$inherited_coretype"
  fi
  run_one "BLIS (automatic sub-configuration)" bench_gemm_blis -u BLIS_ARCH_TYPE
  if [ -n "$blis_auto" ] && [ "$blis_auto" != "skx" ]; then
    run_one "BLIS (skx forced)" bench_gemm_blis BLIS_ARCH_TYPE=0
  fi
  run_one "oneDNN" bench_gemm_onednn
  run_one "meshtrain (kernels::gemm, as the engine calls it)" bench_gemm_engine
done

summarize "$log" | tee "$log.summary"

echo
echo "# raw output: $log; summary: $log.summary"
exit 0
