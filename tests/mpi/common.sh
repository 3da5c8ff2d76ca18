# Shared by the multi-process test scripts: `source common.sh BUILD_DIR` sets meshtrain (the binary), work
# (a temporary folder removed at exit), mpirun (the launcher as CI runs it: as root, more ranks than cores)
# and tiny (a small qwen3 on synthetic tokens, which every mesh reads as the same global batch).
set -euo pipefail
meshtrain="$1/meshtrain"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
# Debian's python3, where scripts/setup.sh installed numpy (the python3 first on PATH may be another install).
python3() { /usr/bin/python3 "$@"; }
tiny=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=2 head_dim=16 base_mlp_dim=128
  base_num_decoder_layers=2 vocab_size=256 max_target_length=32 dataset_type=synthetic tokenizer_path=
  dataset_path= eval_dataset_path= eval_interval=0)

# Packed short documents in $work/packed: one file per document of 3..7 letters (a fixed formula), a
# byte-level tokenizer with no merges (vocab 256 bytes + EOS), so every letter is one token and each
# document plus its EOS is 4..8 tokens.
prepare_packed_documents() {
  python3 - "$work/documents" <<'PY'
import os, sys
os.mkdir(sys.argv[1])
for i in range(1000):
    text = "".join(chr(97 + (i * 13 + j * 7 + i * j) % 26) for j in range(3 + (i * 7 + i // 5) % 5))
    open(os.path.join(sys.argv[1], f"{i:04d}.txt"), "w").write(text)
PY
  "$meshtrain" prepare --out "$work/packed" --vocab-size 257 --corpus "$work/documents" \
    >"$work/prepare.log" 2>&1 || { echo "FAIL: prepare"; cat "$work/prepare.log"; exit 1; }
  python3 - "$work/packed/prepare.json" <<'PY'
import json, sys
split = json.load(open(sys.argv[1]))["train"]
assert split["document_tokens"] == split["text_bytes"], split  # one token per letter
print(f"packed documents: {split['documents']} of 3..7 tokens, {split['tokens']} tokens with EOS")
PY
}

# What the fault tests compare: a run's losses in order (exact reprs) and its newest committed checkpoint.
losses() { python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if l.strip()))' "$1"; }
newest_committed() {  # newest_committed RUN_DIR: the step of the newest step_N/ holding COMMITTED, or none
  local newest=none marker
  for marker in "$1"/checkpoints/step_*/COMMITTED; do
    [ -e "$marker" ] || continue
    newest=$((10#$(basename "$(dirname "$marker")" | sed 's/^step_//')))
  done
  echo "$newest"
}

# Trains `preset` (qwen3-tiny unless the script sets it) on the tiny keys: the script's own runs, each in
# $work/NAME with its log beside it; a failed run prints its log and ends the script.
preset=qwen3-tiny
run() {  # run NAME RANKS per_device_batch_size [key=value ...]: the keys replace tiny's keys of that name
  local name=$1 ranks=$2 batch=$3 keys=() key given
  shift 3
  for key in "${tiny[@]}"; do
    for given in "$@"; do [ "${key%%=*}" != "${given%%=*}" ] || continue 2; done
    keys+=("$key")
  done
  keys+=(per_device_batch_size="$batch" run_dir="$work/$name" "$@")
  if [ "$ranks" -eq 1 ]; then
    "$meshtrain" train "$preset" "${keys[@]}" >"$work/$name.log" 2>&1
  else
    "${mpirun[@]}" -np "$ranks" "$meshtrain" train "$preset" "${keys[@]}" >"$work/$name.log" 2>&1
  fi || { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
}
