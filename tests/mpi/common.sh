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
