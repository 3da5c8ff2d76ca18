#!/usr/bin/env bash
# What a restructuring must not change, written to one text file so two commits can be compared with diff:
# the losses of 20 steps (qwen3 and gpt2 tiny models on one process; under mpirun data=2, fsdp=2, tensor=2,
# ZeRO-1 with GA 2), the sha256 of every plan file `meshtrain compile` writes for five configurations, and
# generate's output for fixed seeds. Losses are bitwise only for the same CPU and GEMM backend: compare
# records made on one machine (tests/behaviour/compare.sh builds both commits and does that).
#   usage: tests/behaviour/record.sh BUILD_DIR OUT_FILE
set -euo pipefail
meshtrain="$(cd "$1" && pwd)/meshtrain"
out=$2
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
: >"$out"

"$meshtrain" prepare --out "$work/kjv" --vocab-size 512 >/dev/null
data=(dataset_type=tokens dataset_path="$work/kjv" eval_dataset_path="$work/kjv" tokenizer_path="$work/kjv/tokenizer.json"
  vocab_size=512 eval_interval=10 eval_steps=2 steps=20 checkpoint_period=0 learning_rate=1e-2
  per_device_batch_size=4 max_target_length=32)
qwen3=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=2 head_dim=16 base_mlp_dim=128 base_num_decoder_layers=2)
gpt2=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=4 head_dim=16 base_mlp_dim=256 base_num_decoder_layers=2
  max_position_embeddings=64)
losses() {  # NAME RUN_DIR: one line, every step's loss and eval loss as JSON wrote them
  python3 - "$1" "$2/metrics.jsonl" >>"$out" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[2])]
print("losses", sys.argv[1], " ".join(repr(r["loss"]) for r in rows),
      "eval", " ".join(repr(r["eval"]["loss"]) for r in rows if "eval" in r))
PY
}
run() {  # NAME RANKS MODEL [key=value ...]
  local name=$1 ranks=$2 model=$3
  shift 3
  local launch=()
  [ "$ranks" -gt 1 ] && launch=("${mpirun[@]}" -np "$ranks")
  "${launch[@]}" "$meshtrain" train "$model" "${data[@]}" run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    { echo "record: $name failed:"; tail -5 "$work/$name.log"; exit 1; }
  losses "$name" "$work/$name"
}
run qwen3_single 1 qwen3-tiny "${qwen3[@]}"
run gpt2_single 1 gpt2-124m "${gpt2[@]}"
run qwen3_data2 2 qwen3-tiny "${qwen3[@]}" mesh.data=2
run qwen3_fsdp2 2 qwen3-tiny "${qwen3[@]}" mesh.fsdp=2
run qwen3_tensor2 2 qwen3-tiny "${qwen3[@]}" mesh.tensor=2
run qwen3_zero1_ga2 2 qwen3-tiny "${qwen3[@]}" mesh.data=2 shard_optimizer_over_data=true gradient_accumulation_steps=2
run gpt2_data2 2 gpt2-124m "${gpt2[@]}" mesh.data=2

compile() {  # NAME CONFIG [key=value ...]
  local name=$1
  shift
  "$meshtrain" compile "$@" plan_out="$work/plan_$name" >"$work/compile_$name.log" 2>&1 ||
    { echo "record: compile $name failed:"; tail -5 "$work/compile_$name.log"; exit 1; }
  for file in "$work/plan_${name}"_*.json; do
    echo "plan $name $(basename "$file" | sed "s/^plan_${name}_//") $(sha256sum <"$file" | cut -c1-64)" >>"$out"
  done
}
compile qwen3_8b_fsdp8 qwen3-8b topology=h100x8 mesh.fsdp=8
compile qwen3_0_6b_v6e qwen3-0.6b topology=v6e-4 mesh.fsdp=4
compile dense_70b bench/configs/dense-70b.yaml topology=h100x1024 mesh.data=16 mesh.fsdp=32 mesh.tensor=2 remat_policy=full
compile gpt2_tensor2 gpt2-124m topology=a100x2 mesh.tensor=2 gradient_accumulation_steps=4
compile qwen3_tiny_cpu qwen3-tiny topology=cpu per_device_batch_size=4 remat_policy=minimal

for seed in 1 2; do
  for name in qwen3_single gpt2_single; do
    text=$("$meshtrain" generate --checkpoint "$work/$name" --prompt "And God said" --max-new-tokens 16 --seed "$seed" \
      --temperature 0.8 --top-k 40)
    echo "generate $name seed $seed $(printf '%s' "$text" | tr '\n' ' ')" >>"$out"
  done
done
echo "record: $(wc -l <"$out") lines in $out"
