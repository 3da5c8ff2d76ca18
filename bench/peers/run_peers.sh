#!/usr/bin/env bash
# Peer benchmark: training tokens/s and MFU of GPT-2 124M (fp32, AdamW, 2 threads) for meshtrain, llm.c's CPU
# trainer and PyTorch, measured back to back in one run. See bench/peers/README.md.
#
# Usage: bench/peers/run_peers.sh [options]
#   --llmc DIR          a checkout of karpathy/llm.c; the script builds train_gpt2 there (peer skipped if absent)
#   --steps N           steps per run, the first one untimed (default 6)
#   --shapes "BxT ..."  batch x sequence shapes (default "4x64 8x256")
#   --build DIR         meshtrain build directory (default <repo>/build); the binary is not rebuilt
#   --out DIR           logs and results (default /tmp/meshtrain_peers/<date-time>)
#   --threads N         OMP_NUM_THREADS for every peer (default 2)
#   --peers "LIST"      subset of "meshtrain meshtrain-bf16 llm.c pytorch torch2" (default all five;
#                       meshtrain-bf16 is dtype=bfloat16, run where the CPU has AVX512-BF16 or AMX-BF16)
#   --torch2-python PY  the python of a virtual environment with PyTorch 2.x from PyPI, outside the repository
#                       (python3 -m venv ~/torch2 && ~/torch2/bin/pip install torch); peer "torch2" runs it
#                       three ways: eager fp32, torch.compile fp32, and bf16 autocast (skipped if absent)
#   --torch2-modes "M.." a subset of "eager compile bf16-autocast" (default all three; bf16 autocast on a CPU
#                       without bf16 instructions takes minutes per step)
#   --coretype-unset    add a second pass with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed
#   --only-coretype-unset  run only that second pass
#   --peak-gflops G     the peak the MFU column divides by (default: meshtrain's float32 GEMM peak measured in
#                       this run when its log printed one, else 460, see README)
#   --bf16-peak-gflops G  the same for the bf16 rows (default: meshtrain's measured bf16 GEMM peak when its
#                       bf16 run printed one, else 2x --peak-gflops)
#   --quiet-wait S      before each run wait up to S s for the machine to be < 15% busy (default 60)
#   --retries R         run again (up to R times) when other processes took > 10% of the CPUs meanwhile,
#                       and keep the least disturbed try (default 1)
#   --timeout S         per-run wall-clock limit (default 1800)
# Always exits 0: a peer that is missing or fails is reported in the table.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

llmc=""
steps=6
shapes="4x64 8x256"
build="$repo/build"
out=""
threads=2
peers="meshtrain meshtrain-bf16 llm.c pytorch torch2"
torch2_python=""
torch2_modes="eager compile bf16-autocast"
pass_inherited=1
pass_unset=0
peak=""
bf16_peak=""
quiet_wait=60
timeout_s=1800
retries=1

while [ $# -gt 0 ]; do
  case "$1" in
    --llmc) llmc=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --shapes) shapes=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --peers) peers=$2; shift 2 ;;
    --torch2-python) torch2_python=$2; shift 2 ;;
    --torch2-modes) torch2_modes=$2; shift 2 ;;
    --coretype-unset) pass_unset=1; shift ;;
    --only-coretype-unset) pass_unset=1; pass_inherited=0; shift ;;
    --peak-gflops) peak=$2; shift 2 ;;
    --bf16-peak-gflops) bf16_peak=$2; shift 2 ;;
    --quiet-wait) quiet_wait=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --retries) retries=$2; shift 2 ;;
    -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_peers.sh: unknown argument '$1' (see --help)" >&2; exit 0 ;;
  esac
done
if ! [ "$steps" -ge 2 ] 2>/dev/null; then echo "run_peers.sh: --steps must be >= 2" >&2; exit 0; fi

# Python for the helpers (stdlib only) and for PyTorch/numpy: Debian's, where python3-torch imports.
syspy=/usr/bin/python3
[ -x "$syspy" ] || syspy=$(command -v python3)
helper() { "$syspy" "$here/peers.py" "$@"; }

out=${out:-/tmp/meshtrain_peers/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"
summary="$out/summary.txt"

runopts=(--results "$results" --timeout "$timeout_s" --quiet-wait "$quiet_wait" --retries "$retries")

has_peer() { case " $peers " in *" $1 "*) return 0 ;; esac; return 1; }

{
  echo "# peer benchmark, $(date '+%Y-%m-%d %H:%M:%S %Z')"
  echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')"
  echo "# uptime: $(uptime)"
  echo "# meshtrain: tree $(git -C "$repo" rev-parse --short HEAD 2>/dev/null)$(git -C "$repo" diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)'), binary $build/meshtrain built $(date -r "$build/meshtrain" '+%Y-%m-%d %H:%M:%S' 2>/dev/null || echo '(missing)')"
  echo "# caller env: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-<unset>}"
  echo "# steps $steps (first untimed), shapes: $shapes, threads $threads, out: $out"
} | tee "$summary"

# ---------------------------------------------------------------- llm.c: inputs and per-shape builds
llmc_ok=0
llmc_note=""
if has_peer llm.c; then
  if [ -z "$llmc" ]; then
    llmc_note="no --llmc DIR given"
  elif [ ! -f "$llmc/train_gpt2.c" ] || [ ! -f "$llmc/Makefile" ]; then
    llmc_note="$llmc has no train_gpt2.c/Makefile"
  else
    llmc=$(cd "$llmc" && pwd)
    work="$llmc/peerbench"
    mkdir -p "$work"
    echo "== llm.c: make train_gpt2 in $llmc (OpenMP)"
    if ! (cd "$llmc" && make train_gpt2 > "$work/make_train_gpt2.log" 2>&1); then
      llmc_note="make train_gpt2 failed (see $work/make_train_gpt2.log)"
    elif ! grep -q "OpenMP found" "$work/make_train_gpt2.log" && ! grep -q -- "-fopenmp" "$work/make_train_gpt2.log"; then
      # make printed nothing new when train_gpt2 was up to date: ask it for the command line instead.
      if ! (cd "$llmc" && make -n -B train_gpt2 2>/dev/null | grep -q -- "-fopenmp"); then
        llmc_note="train_gpt2 builds without OpenMP"
      fi
    fi
    if [ -z "$llmc_note" ]; then
      grep -E "OpenMP|^(cc|gcc|clang)" "$work/make_train_gpt2.log" | sed 's/^/   /'
      expect=$(( 256 * 4 + 124475904 * 4 ))
      if [ "$(stat -c %s "$work/gpt2_124M.bin" 2>/dev/null || echo 0)" != "$expect" ] \
         || [ ! -f "$work/dev/data/tinyshakespeare/tiny_shakespeare_val.bin" ]; then
        echo "== llm.c: writing random gpt2_124M.bin and token files into $work"
        "$syspy" "$here/make_llmc_inputs.py" "$work" || llmc_note="make_llmc_inputs.py failed"
      fi
    fi
    if [ -z "$llmc_note" ]; then
      # train_gpt2.c hard-codes B=4, T=64 and 41 steps and takes no flags; build one copy per shape (in
      # $work, never in this repo) with B, T and the step count substituted, 1 validation batch instead
      # of 5 (untimed), and no sampling. Compiled with the Makefile's own CC/CFLAGS/LDLIBS.
      printf '%s\n' 'peerbench/%: peerbench/%.c' \
        "	\$(CC) \$(CFLAGS) \$(INCLUDES) -I. \$(LDFLAGS) \$^ \$(LDLIBS) \$(OUTPUT_FILE)" > "$work/peerbench.mk"
      llmc_ok=1
    fi
  fi
  [ -n "$llmc_note" ] && echo "== llm.c: skipped: $llmc_note"
fi

build_llmc_shape() {  # B T -> prints the binary path, or returns 1
  local b=$1 t=$2 name src
  name="train_gpt2_b${b}_t${t}_s${steps}"
  src="$work/$name.c"
  sed -e "s/^\(\s*\)int B = 4;/\1int B = $b;/" \
      -e "s/^\(\s*\)int T = 64;/\1int T = $t;/" \
      -e "s/step <= 40; step++/step < $steps; step++/" \
      -e "s/int val_num_batches = 5;/int val_num_batches = 1;/" \
      -e "s/if (step > 0 && step % 20 == 0)/if (0)/" \
      "$llmc/train_gpt2.c" > "$src"
  if ! grep -q "int B = $b;" "$src" || ! grep -q "int T = $t;" "$src" || ! grep -q "step < $steps; step++" "$src" \
     || ! grep -q "if (0)" "$src"; then
    echo "   llm.c: train_gpt2.c no longer has the lines this script edits" >&2
    return 1
  fi
  (cd "$llmc" && make -f Makefile -f peerbench/peerbench.mk "peerbench/$name" > "$work/make_$name.log" 2>&1) \
    || { echo "   llm.c: build of $name failed (see $work/make_$name.log)" >&2; return 1; }
  echo "$work/$name"
}

# ---------------------------------------------------------------- PyTorch: which ones import (once)
torch_note=""
if has_peer pytorch && ! "$syspy" -c 'import torch' 2>/dev/null; then
  torch_note="$syspy cannot import torch (apt-get install python3-torch)"
fi
torch2_note=""
if has_peer torch2 && { [ -z "$torch2_python" ] || ! "$torch2_python" -c 'import torch' 2>/dev/null; }; then
  torch2_note="no PyTorch 2.x: pass --torch2-python VENV/bin/python (pip install torch)"
fi

# ---------------------------------------------------------------- one pass
run_pass() {  # pass-name env-prefix...
  local pass=$1; shift
  local envp=("$@") shape b t
  # env(1) with no options still works: `env OMP_NUM_THREADS=2 cmd`.
  echo | tee -a "$summary"
  echo "=== pass '$pass': env ${envp[*]:-as inherited} OMP_NUM_THREADS=$threads" | tee -a "$summary"
  for shape in $shapes; do
    b=${shape%x*}; t=${shape#*x}
    if ! [[ "$b" =~ ^[1-9][0-9]*$ && "$t" =~ ^[1-9][0-9]*$ ]] || [ "$t" -gt 1024 ]; then
      echo "   skipping shape '$shape' (want BxT with T <= 1024)" | tee -a "$summary"
      continue
    fi
    # meshtrain
    if has_peer meshtrain; then
      local rd="$out/meshtrain_${pass}_${shape}"
      rm -rf "$rd"
      if [ ! -x "$build/meshtrain" ]; then
        helper run --results "$results" --pass "$pass" --peer meshtrain --batch "$b" --seq "$t" \
          --log /dev/null --status missing --note "no $build/meshtrain (cmake --build build --target meshtrain)"
      else
        helper run "${runopts[@]}" --pass "$pass" --peer meshtrain --batch "$b" --seq "$t" \
          --log "$out/meshtrain_${pass}_${shape}.log" --metrics "$rd/metrics.jsonl" --clean "$rd" -- \
          env "${envp[@]}" OMP_NUM_THREADS="$threads" "$build/meshtrain" train gpt2-124m dataset_type=synthetic \
          per_device_batch_size="$b" max_target_length="$t" steps="$steps" enable_checkpointing=false run_dir="$rd"
        # Which CPU, GEMM backend and instruction set meshtrain's figure comes from.
        grep -m1 "^machine:" "$out/meshtrain_${pass}_${shape}.log" | sed 's/^/   meshtrain /' | tee -a "$summary" || true
      fi
    fi
    # meshtrain in bf16 (bf16 matmul inputs, f32 accumulation), where the CPU has bf16 instructions
    if has_peer meshtrain-bf16; then
      local rdb="$out/meshtrain-bf16_${pass}_${shape}"
      rm -rf "$rdb"
      if ! grep -q -E -w "avx512_bf16|amx_bf16" /proc/cpuinfo; then
        helper run --results "$results" --pass "$pass" --peer meshtrain-bf16 --batch "$b" --seq "$t" \
          --log /dev/null --status missing --note "this CPU has no AVX512-BF16 or AMX-BF16"
      elif [ -x "$build/meshtrain" ]; then
        helper run "${runopts[@]}" --pass "$pass" --peer meshtrain-bf16 --batch "$b" --seq "$t" \
          --log "$out/meshtrain-bf16_${pass}_${shape}.log" --metrics "$rdb/metrics.jsonl" --clean "$rdb" -- \
          env "${envp[@]}" OMP_NUM_THREADS="$threads" "$build/meshtrain" train gpt2-124m dataset_type=synthetic \
          per_device_batch_size="$b" max_target_length="$t" steps="$steps" enable_checkpointing=false \
          dtype=bfloat16 run_dir="$rdb"
        grep -m1 "^machine:" "$out/meshtrain-bf16_${pass}_${shape}.log" | sed 's/^/   meshtrain-bf16 /' | tee -a "$summary" || true
      fi
    fi
    # llm.c
    if has_peer llm.c; then
      local exe=""
      if [ "$llmc_ok" = 1 ]; then
        exe=$(build_llmc_shape "$b" "$t") || exe=""
      fi
      if [ -z "$exe" ]; then
        local st=missing
        [ "$llmc_ok" = 1 ] && st=failed
        helper run --results "$results" --pass "$pass" --peer llm.c --batch "$b" --seq "$t" --log /dev/null \
          --status "$st" --note "${llmc_note:-build failed, see $work/make_*.log}"
      else
        helper run "${runopts[@]}" --pass "$pass" --peer llm.c --batch "$b" --seq "$t" \
          --log "$out/llmc_${pass}_${shape}.log" -- \
          bash -c 'cd "$1" && shift && exec "$@"' _ "$work" \
          env "${envp[@]}" OMP_NUM_THREADS="$threads" "$exe"
      fi
    fi
    # PyTorch
    if has_peer pytorch; then
      if [ -n "$torch_note" ]; then
        helper run --results "$results" --pass "$pass" --peer pytorch --batch "$b" --seq "$t" --log /dev/null \
          --status missing --note "$torch_note"
      else
        helper run "${runopts[@]}" --pass "$pass" --peer pytorch --batch "$b" --seq "$t" \
          --log "$out/pytorch_${pass}_${shape}.log" -- \
          env "${envp[@]}" OMP_NUM_THREADS="$threads" \
          LD_LIBRARY_PATH="/usr/lib/x86_64-linux-gnu/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
          "$syspy" "$here/torch_gpt2.py" --batch "$b" --seq "$t" --steps "$steps" --threads "$threads"
      fi
    fi
    # PyTorch 2.x from PyPI (its own oneDNN / MKL), eager, torch.compile and bf16 autocast
    if has_peer torch2; then
      for mode in $torch2_modes; do
        name=torch2-${mode%-autocast}
        if [ -n "$torch2_note" ]; then
          helper run --results "$results" --pass "$pass" --peer "$name" --batch "$b" --seq "$t" --log /dev/null \
            --status missing --note "$torch2_note"
        else
          helper run "${runopts[@]}" --pass "$pass" --peer "$name" --batch "$b" --seq "$t" \
            --log "$out/${name}_${pass}_${shape}.log" -- \
            env "${envp[@]}" OMP_NUM_THREADS="$threads" \
            "$torch2_python" "$here/torch_gpt2.py" --batch "$b" --seq "$t" --steps "$steps" \
            --threads "$threads" --mode "$mode"
        fi
      done
    fi
  done
}

if [ "$pass_inherited" = 1 ]; then
  run_pass "env-as-is"
fi
if [ "$pass_unset" = 1 ]; then
  run_pass "coretype-unset" -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
fi

{
  echo
  echo "# uptime at end: $(uptime)"
  echo
  if [ -z "$peak" ]; then  # meshtrain's own measurement: "float32 GEMM peak 447 GFLOP/s"
    peak=$(grep -h -o -E "float32 GEMM peak [0-9]+ GFLOP/s" "$out"/meshtrain_*.log "$out"/meshtrain-bf16_*.log \
      2>/dev/null | head -1 | awk '{print $4}')
    peak=${peak:-460}
  fi
  if [ -z "$bf16_peak" ]; then  # meshtrain's own measurement: "bf16 1487 GFLOP/s"
    bf16_peak=$(grep -h -o -E "bf16 [0-9]+ GFLOP/s" "$out"/meshtrain-bf16_*.log 2>/dev/null | head -1 | awk '{print $2}')
  fi
  helper table --results "$results" --peak-gflops "$peak" ${bf16_peak:+--bf16-peak-gflops "$bf16_peak"}
} | tee -a "$summary"
echo "(results: $results, logs: $out)"
exit 0
