#!/usr/bin/env python3
# A multi-rank run against its one-process baseline (equivalence.sh, deepseek_equivalence.sh): 20 steps'
# losses within 1e-5 relative, eval losses (eval_interval > 0) at the same steps within 1e-5, the final
# checkpoint's parameters within 1e-3 of each tensor's largest magnitude (layer by layer, any format); prints the worst figures and exits 1 when a bound is passed.
# Usage: compare_runs.py BASELINE_RUN_DIR RUN_DIR NAME
import json, os, sys
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_tensors
def metrics(run):
    return [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
def parameters(run):  # the final checkpoint's model tensors (global shapes on every mesh), per layer
    return {name: t.ravel() for name, t in checkpoint_tensors.tensors(f"{run}/checkpoints/step_00000020").items()}
a, b = metrics(sys.argv[1]), metrics(sys.argv[2])
assert len(a) == len(b) == 20, (len(a), len(b))
loss = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
norm = max(abs(x["raw_grad_norm"] - y["raw_grad_norm"]) / x["raw_grad_norm"] for x, y in zip(a, b))
# Eval records (eval_interval > 0): the same steps, the same losses.
eval_a = {x["step"]: x["eval"]["loss"] for x in a if "eval" in x}
eval_b = {x["step"]: x["eval"]["loss"] for x in b if "eval" in x}
assert eval_a.keys() == eval_b.keys(), (sorted(eval_a), sorted(eval_b))
evals = max((abs(eval_a[s] - eval_b[s]) / abs(eval_a[s]) for s in eval_a), default=0.0)
pa, pb = parameters(sys.argv[1]), parameters(sys.argv[2])
assert pa.keys() == pb.keys()
# Relative to each tensor's largest magnitude: Adam's normalised steps amplify rounding differences in
# near-zero gradient components, so parameters drift more than losses over 20 steps.
# A key bias (GPT-2) has an exact gradient of zero (it adds a per-query constant to every score, which the
# softmax cancels), so it holds Adam-normalised rounding noise of size ~1e-5 in any layout: its drift is
# bounded in absolute terms instead.
def scale(k):
    return 1.0 if k.endswith("self_attention/key/bias") else max(float(np.max(np.abs(pa[k]))), 1e-30)
param = max(float(np.max(np.abs(pa[k] - pb[k]))) / scale(k) for k in pa)
eval_text = f", {len(eval_a)} evals {evals:.2e} (bound 1e-5)" if eval_a else ""
print(f"{sys.argv[3]}: 20 steps, worst relative difference: loss {loss:.2e} (bound 1e-5){eval_text}, "
      f"final parameters {param:.2e} (bound 1e-3), grad norm {norm:.2e}")
sys.exit(0 if loss <= 1e-5 and evals <= 1e-5 and param <= 1e-3 else 1)
