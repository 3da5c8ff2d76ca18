#!/usr/bin/env bash
# The z-loss (z_loss_multiplier, issue 41) equals one process on every layout that splits its work: tensor
# (the vocabulary split, logsumexp from the ranks' combined statistics; tied table and untied head), context
# (each rank's tokens, with both strategies, and with tensor), data x fsdp (rows) and pipeline stages (only
# the last stage computes it). Each run trains 20 steps with GA 2 on the same global batch as its
# one-process baseline: losses, eval losses and final parameters within equivalence.sh's bounds
# (compare_runs.py), and every step's z_loss and lm_loss within 1e-5 relative, with loss = lm_loss + z_loss.
# The baseline with the z-loss trains other weights than one without it (its gradient is in).
# Usage: z_loss_equivalence.sh BUILD_DIR
source "$(dirname "$0")/common.sh" "$1"
tiny+=(checkpoint_period=0 steps=20 gradient_accumulation_steps=2 learning_rate=1e-2 collective_timeout_s=120
  z_loss_multiplier=0.02)
status=0

compare() {  # compare NAME BASELINE
  python3 "$(dirname "$0")/compare_runs.py" "$work/$2" "$work/$1" "$1" || status=1
  python3 - "$work/$2/metrics.jsonl" "$work/$1/metrics.jsonl" "$1" <<'PY' || status=1
import json, sys
a, b = ([json.loads(line) for line in open(path)] for path in sys.argv[1:3])
worst = max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(a, b) for k in ("z_loss", "lm_loss"))
# The run's own loss is the sum of its parts (a dense model: no balance loss).
parts = max(abs(y["loss"] - (y["lm_loss"] + y["z_loss"])) / y["loss"] for y in b)
print(f"{sys.argv[3]}: z_loss and lm_loss worst relative difference {worst:.2e} (bound 1e-5), "
      f"loss - (lm_loss + z_loss) {parts:.1e}")
sys.exit(0 if worst <= 1e-5 and parts <= 1e-15 else 1)
PY
}

run single 1 8
run single_untied 1 8 logits_via_embedding=false
run single_without 1 8 z_loss_multiplier=0
python3 - "$work/single/metrics.jsonl" "$work/single_without/metrics.jsonl" <<'PY' || status=1
import json, sys
a, b = ([json.loads(line) for line in open(path)] for path in sys.argv[1:3])
# Step 1 trains from the same weights: the same cross-entropy; later steps differ (the z-loss's gradient).
ok = a[0]["lm_loss"] == b[0]["lm_loss"] and all(x["lm_loss"] != y["lm_loss"] for x, y in zip(a[1:], b[1:]))
ok = ok and all(x["z_loss"] > 0 and "z_loss" not in y for x, y in zip(a, b))
print(f"single with and without the z-loss: {'as expected' if ok else 'FAIL: same weights, or z_loss missing'}"
      f" (step 20 lm_loss {a[-1]['lm_loss']:.6f} with, {b[-1]['lm_loss']:.6f} without)")
sys.exit(0 if ok else 1)
PY

cases=(
  "tp2 single 2 4 mesh.tensor=2"
  "tp2_untied single_untied 2 4 mesh.tensor=2 logits_via_embedding=false"
  "tp4 single 4 2 mesh.tensor=4"
  "dp2_fsdp2 single 4 2 mesh.data=2 mesh.fsdp=2"
  "all_gather_cp2 single 2 4 mesh.context=2 context_parallel_strategy=all_gather"
  "ring_cp2 single 2 4 mesh.context=2 context_parallel_strategy=ring"
  "all_gather_cp2_tp2 single 4 2 mesh.context=2 mesh.tensor=2 context_parallel_strategy=all_gather"
  "ring_cp2_tp2_untied single_untied 4 2 mesh.context=2 mesh.tensor=2 context_parallel_strategy=ring logits_via_embedding=false"
  "stage2 single 2 4 mesh.stage=2"
)
for case in "${cases[@]}"; do
  read -r name baseline ranks batch keys <<<"$case"
  read -ra keys <<<"$keys"
  run "$name" "$ranks" "$batch" "${keys[@]}"
  compare "$name" "$baseline"
done
exit $status
