#!/usr/bin/env bash
# Long-context benchmark: training tokens/s of qwen3-0.6b at batch 1 x S (S = 2048, 4096) in bf16 for meshtrain
# and PyTorch 2.x (transformers' Qwen3, bf16 autocast, scaled-dot-product attention), back to back in one run,
# with MFU against the GEMM peaks meshtrain measures in the same run. See bench/long_context/README.md.
#
# Usage: bench/long_context/run.sh [options]
#   --shapes "S ..."     sequence lengths, batch 1 (default "2048 4096")
#   --steps N            steps per run, the first one untimed (default 6)
#   --dtypes "D ..."     bfloat16 and / or float32 (default bfloat16; float32: meshtrain dtype=float32 against
#                        PyTorch eager float32)
#   --model M            a dense Qwen3 preset of configs/models (default qwen3-0.6b; qwen3-tiny for a smoke test)
#   --torch2-python PY   the python of a virtual environment with PyTorch 2.x and transformers from PyPI
#                        (python3 -m venv ~/torch2 && ~/torch2/bin/pip install torch transformers); without it the
#                        PyTorch rows say missing
#   --torch-loss-chunk N PyTorch's loss as a fused linear + cross-entropy over chunks of N tokens
#                        (torch_qwen3.py --loss-chunk: the [S, V] logits never whole, the same FLOPs); default 0,
#                        transformers' logits and F.cross_entropy
#   --recompute R        none (default) or full: meshtrain remat_policy=full (only the residual stream kept, the
#                        rest of each layer recomputed in the backward) against PyTorch with each decoder layer
#                        checkpointed (torch_qwen3.py --checkpoint-layers): the same recomputation on both sides,
#                        which lets PyTorch fit at S = 4096 in 24 GiB (README.md, Memory)
#   --peers "LIST"       a subset of "meshtrain torch2" (default both)
#   --build DIR          meshtrain build directory (default <repo>/build); the binary is not rebuilt
#   --out DIR            logs and results (default /tmp/meshtrain_long_context/<date-time>)
#   --threads N          OMP_NUM_THREADS for both (default 2)
#   --quiet-wait S       before each run wait up to S s for the machine to be < 15% busy (default 60)
#   --retries R          run again (up to R times) when other processes took > 10% of the CPUs meanwhile,
#                        and keep the least disturbed try (default 1)
#   --timeout S          per-run wall-clock limit (default 3600)
#   --no-memory-check    start every run, even one whose memory is over MemAvailable
# A run whose planned (meshtrain: `meshtrain compile`) or estimated (PyTorch: long_context.py memory) memory
# exceeds MemAvailable is not started; its row says so. Always exits 0: a system that is missing or fails is
# a row of the table.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

shapes="2048 4096"
steps=6
dtypes="bfloat16"
model="qwen3-0.6b"
torch2_python=""
torch_loss_chunk=0
recompute=none
peers="meshtrain torch2"
build="$repo/build"
out=""
threads=2
quiet_wait=60
retries=1
timeout_s=3600
memory_check=1

while [ $# -gt 0 ]; do
  case "$1" in
    --shapes) shapes=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --dtypes) dtypes=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --torch2-python) torch2_python=$2; shift 2 ;;
    --torch-loss-chunk) torch_loss_chunk=$2; shift 2 ;;
    --recompute) recompute=$2; shift 2 ;;
    --peers) peers=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --quiet-wait) quiet_wait=$2; shift 2 ;;
    --retries) retries=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --no-memory-check) memory_check=0; shift ;;
    -h|--help) sed -n '2,/^set -u$/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 0 ;;
  esac
done
if ! [ "$steps" -ge 2 ] 2>/dev/null; then echo "run.sh: --steps must be >= 2 (the first is untimed)" >&2; exit 0; fi
for dtype in $dtypes; do
  case "$dtype" in
    bfloat16|float32) ;;
    *) echo "run.sh: --dtypes takes bfloat16 and / or float32, not '$dtype'" >&2; exit 0 ;;
  esac
done
for seq in $shapes; do
  if ! [[ "$seq" =~ ^[1-9][0-9]*$ ]]; then echo "run.sh: --shapes takes sequence lengths, not '$seq'" >&2; exit 0; fi
done
case "$recompute" in
  none) torch_recompute=() ;;
  full) torch_recompute=(--checkpoint-layers) ;;
  *) echo "run.sh: --recompute takes none or full, not '$recompute'" >&2; exit 0 ;;
esac

syspy=/usr/bin/python3
[ -x "$syspy" ] || syspy=$(command -v python3)
lc() { "$syspy" "$here/long_context.py" "$@"; }
peers_run() { "$syspy" "$repo/bench/peers/peers.py" run "$@"; }
if ! shape_line=$(lc shapes --repo "$repo" --model "$model"); then
  exit 0  # long_context.py named the problem (no such preset, not a dense Qwen3)
fi

out=${out:-/tmp/meshtrain_long_context/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"
summary="$out/summary.txt"
runopts=(--results "$results" --timeout "$timeout_s" --quiet-wait "$quiet_wait" --retries "$retries"
  --pass long-context)
has_peer() { case " $peers " in *" $1 "*) return 0 ;; esac; return 1; }
mem_available_gib() { awk '/^MemAvailable:/ {printf "%.1f", $2 / 1048576}' /proc/meminfo; }
# Prints what a run will take beside what is free; sets note and status when it is not to be started.
check_memory() {  # what GiB
  local available
  available=$(mem_available_gib)
  echo "   $1: ${2:-?} GiB; $available GiB available" | tee -a "$summary"
  if [ "$memory_check" = 1 ] && [ -n "$2" ] && awk -v need="$2" -v have="$available" 'BEGIN { exit !(need > have) }'
  then
    note="not run: $1 $2 GiB, $available GiB available" status=skipped
  fi
}
# A row for a run that did not start (note and status say why).
record_not_run() {  # peer
  peers_run --results "$results" --pass long-context --peer "$1" --batch 1 --seq "$seq" --log /dev/null \
    --status "$status" --note "$note"
}

{
  echo "# long-context benchmark, $(date '+%Y-%m-%d %H:%M:%S %Z')"
  echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p'), family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p'), $(nproc) CPUs, bf16 instructions: $(grep -o -w -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "# memory: $(awk '/^MemTotal:/ {printf "%.1f", $2 / 1048576}' /proc/meminfo) GiB, $(mem_available_gib) GiB available; uptime: $(uptime)"
  echo "# meshtrain: tree $(git -C "$repo" rev-parse --short HEAD 2>/dev/null)$(git -C "$repo" diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)'), binary $build/meshtrain built $(date -r "$build/meshtrain" '+%Y-%m-%d %H:%M:%S' 2>/dev/null || echo '(missing)')"
  echo "# $shape_line"
  echo "# batch 1, S: $shapes; dtypes: $dtypes; recompute: $recompute; steps $steps (first untimed); threads $threads; out: $out"
} | tee "$summary"

torch2_note=""
if has_peer torch2; then
  if [ -z "$torch2_python" ] || ! "$torch2_python" -c 'import torch, transformers' 2>/dev/null; then
    torch2_note="no PyTorch 2.x with transformers: pass --torch2-python VENV/bin/python"
    torch2_note+=" (pip install torch transformers)"
  fi
fi
has_bf16=0
grep -q -E -w "avx512_bf16|amx_bf16" /proc/cpuinfo && has_bf16=1

for dtype in $dtypes; do
  if [ "$dtype" = bfloat16 ]; then mesh_peer=meshtrain-bf16; torch_peer=torch2-bf16
  else mesh_peer=meshtrain; torch_peer=torch2-eager; fi
  for seq in $shapes; do
    echo | tee -a "$summary"
    echo "=== S=$seq $dtype" | tee -a "$summary"
    # meshtrain: its plan says what the process takes, before anything is allocated
    if has_peer meshtrain; then
      rd="$out/${mesh_peer}_S${seq}"
      rm -rf "$rd"
      note="" status=missing
      if [ ! -x "$build/meshtrain" ]; then
        note="no $build/meshtrain (cmake --build build --target meshtrain)"
      elif [ "$dtype" = bfloat16 ] && [ "$has_bf16" = 0 ]; then
        note="this CPU has no AVX512-BF16 or AMX-BF16"
      else
        check_memory "meshtrain's plan (meshtrain compile)" "$("$build/meshtrain" compile "$model" \
          per_device_batch_size=1 max_target_length="$seq" dtype="$dtype" remat_policy="$recompute" 2>&1 \
          | sed -n 's/^process arena: .*(\([0-9]*\) bytes)$/\1/p' | awk '{printf "%.1f", $1 / 2^30}')"
      fi
      if [ -n "$note" ]; then
        record_not_run "$mesh_peer"
      else
        # A fresh cache folder: the GEMM peaks in machine.json are measured in this run, not the best of
        # earlier days (the bf16 peak moves by a quarter from day to day on the AMX machine).
        peers_run "${runopts[@]}" --peer "$mesh_peer" --batch 1 --seq "$seq" --log "$out/${mesh_peer}_S${seq}.log" \
          --metrics "$rd/metrics.jsonl" --clean "$rd" -- \
          env XDG_CACHE_HOME="$rd.cache" OMP_NUM_THREADS="$threads" "$build/meshtrain" train "$model" \
          dataset_type=synthetic per_device_batch_size=1 max_target_length="$seq" steps="$steps" \
          enable_checkpointing=false dtype="$dtype" remat_policy="$recompute" run_dir="$rd"
        grep -m1 "^machine:" "$out/${mesh_peer}_S${seq}.log" | sed 's/^/   meshtrain /' | tee -a "$summary" || true
      fi
    fi
    # PyTorch: transformers' Qwen3 of the same shapes
    if has_peer torch2; then
      note="$torch2_note" status=missing
      if [ -z "$note" ]; then
        check_memory "PyTorch's estimate (long_context.py memory)" \
          "$(lc memory --repo "$repo" --model "$model" --seq "$seq" --dtype "$dtype" "${torch_recompute[@]}")"
      fi
      if [ -n "$note" ]; then
        record_not_run "$torch_peer"
      else
        peers_run "${runopts[@]}" --peer "$torch_peer" --batch 1 --seq "$seq" --log "$out/${torch_peer}_S${seq}.log" -- \
          env OMP_NUM_THREADS="$threads" "$torch2_python" "$here/torch_qwen3.py" --repo "$repo" --model "$model" \
          --seq "$seq" --steps "$steps" --threads "$threads" --dtype "$dtype" --loss-chunk "$torch_loss_chunk" \
          "${torch_recompute[@]}"
        grep -E "^(torch |sdpa)" "$out/${torch_peer}_S${seq}.log" | sed 's/^/   PyTorch /' | tee -a "$summary" || true
      fi
    fi
  done
done

{
  echo
  echo "# uptime at end: $(uptime)"
  echo
  lc table --results "$results" --out "$out" --repo "$repo" --model "$model" --dtypes "$dtypes"
} | tee -a "$summary"
echo "(results: $results, logs: $out)"
exit 0
