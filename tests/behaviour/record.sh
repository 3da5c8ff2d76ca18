#!/usr/bin/env bash
# What a restructuring must not change, written to one text file so two commits can be compared with diff:
# the losses and gradient norms of 20 steps (qwen3 and gpt2 tiny models on one process; under mpirun data=2,
# fsdp=2, tensor=2, ZeRO-1 with GA 2; a DeepSeek-style model with MoE, MLA, Engram and mHC on one process and
# under mpirun context=2 and expert=2; qwen3 in bf16 where the CPU has AVX512-BF16), every plan file
# `meshtrain compile` writes for six configurations (each section's sha256 over its canonical JSON, the
# step's `program` section left out: a restructuring may add it), and generate's output for fixed seeds. Losses are bitwise only for the same CPU and GEMM backend: compare
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
losses() {  # NAME RUN_DIR: two lines, every step's loss and eval loss, then its gradient norms, as JSON wrote them
  python3 - "$1" "$2/metrics.jsonl" >>"$out" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[2])]
print("losses", sys.argv[1], " ".join(repr(r["loss"]) for r in rows),
      "eval", " ".join(repr(r["eval"]["loss"]) for r in rows if "eval" in r))
print("grad_norms", sys.argv[1], " ".join(repr(r["grad_norm"]) + "/" + repr(r["raw_grad_norm"]) for r in rows))
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
# DeepSeek-style: MLA, a dense first layer then a routed MoE layer (4 experts top-2, one shared, the selection
# bias), Engram on both layers and mHC with 4 streams.
deepseek=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=4 base_mlp_dim=128 base_num_decoder_layers=2
  kv_lora_rank=24 qk_nope_head_dim=12 qk_rope_head_dim=8 v_head_dim=16 q_lora_rank=16
  num_experts=4 num_experts_per_tok=2 base_moe_mlp_dim=32 first_num_dense_layers=1 shared_experts=1
  engram_layers=[0,1] engram_num_heads=2 engram_head_dim=8 engram_vocab_bases=[61,67] engram_kernel_size=3
  mhc_expansion_rate=4)
run deepseek_single 1 deepseek-custom-tiny "${deepseek[@]}"
run deepseek_context2 2 deepseek-custom-tiny "${deepseek[@]}" mesh.context=2
run deepseek_expert2 2 deepseek-custom-tiny "${deepseek[@]}" mesh.expert=2
if grep -qw avx512_bf16 /proc/cpuinfo || grep -qw amx_bf16 /proc/cpuinfo; then
  run qwen3_bf16 1 qwen3-tiny "${qwen3[@]}" dtype=bfloat16
else
  echo "losses qwen3_bf16 skipped: this CPU has no AVX512-BF16" >>"$out"
fi

compile() {  # NAME CONFIG [key=value ...]
  local name=$1
  shift
  "$meshtrain" compile "$@" plan_out="$work/plan_$name" >"$work/compile_$name.log" 2>&1 ||
    { echo "record: compile $name failed:"; tail -5 "$work/compile_$name.log"; exit 1; }
  for file in "$work/plan_${name}"_*.json; do
    python3 - "$name" "$(basename "$file" | sed "s/^plan_${name}_//")" "$file" >>"$out" <<'PY'
import hashlib, json, sys
name, kernel, path = sys.argv[1:]
plan = json.load(open(path))
plan.pop("program", None)  # the step's program: new with the planned program, compared by the tests instead
for section in sorted(plan):
    text = json.dumps(plan[section], sort_keys=True, separators=(",", ":"))
    print("plan", name, kernel, section, hashlib.sha256(text.encode()).hexdigest())
PY
  done
}
compile qwen3_8b_fsdp8 qwen3-8b topology=h100x8 mesh.fsdp=8
compile qwen3_0_6b_v6e qwen3-0.6b topology=v6e-4 mesh.fsdp=4
compile dense_70b bench/configs/dense-70b.yaml topology=h100x1024 mesh.data=16 mesh.fsdp=32 mesh.tensor=2 remat_policy=full
compile gpt2_tensor2 gpt2-124m topology=a100x2 mesh.tensor=2 gradient_accumulation_steps=4
compile qwen3_tiny_cpu qwen3-tiny topology=cpu per_device_batch_size=4 remat_policy=minimal
compile deepseek_cp2_ep2 deepseek-custom-tiny topology=cpu mesh.context=2 mesh.expert=2 per_device_batch_size=4

for seed in 1 2; do
  for name in qwen3_single gpt2_single deepseek_single; do
    text=$("$meshtrain" generate --checkpoint "$work/$name" --prompt "And God said" --max-new-tokens 16 --seed "$seed" \
      --temperature 0.8 --top-k 40)
    echo "generate $name seed $seed $(printf '%s' "$text" | tr '\n' ' ')" >>"$out"
  done
done
echo "record: $(wc -l <"$out") lines in $out"
