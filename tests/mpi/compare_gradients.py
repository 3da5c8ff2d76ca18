#!/usr/bin/env python3
# A multi-rank run's first step against its one-process baseline, gradient by gradient (engram_equivalence.sh):
# after one step a checkpoint's first Adam moment is (1 - b1) x the clipped token-mean gradient, so every
# parameter's gradient is compared. Each tensor within 1e-4 of the larger of its own largest magnitude and
# 1e-4 x the largest gradient entry of the model (a tensor whose gradient is nearly cancelling sums, as mHC's res_beta
# at the first site where every stream is the embedding, is compared in absolute terms); the step's loss and
# gradient norm within 1e-6 relative. Prints the worst figures and exits 1 when a bound is passed.
# The bound: small gradients are nearly cancelling float32 sums over every token, and layouts round the
# activations differently (tensor parallelism's all-reduced partial sums most), which Engram's steep gate
# amplifies: measured up to 6e-5 (mHC's alpha_scales under tensor=2); a wrong reduction is O(1) (FSDP's
# unreduced alpha_scales read 0.46).
# Usage: compare_gradients.py BASELINE_RUN_DIR RUN_DIR NAME
import json, os, sys
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_tensors
def tensors(run):  # the first moments of the step-1 checkpoint, per layer
    moments = checkpoint_tensors.tensors(f"{run}/checkpoints/step_00000001", moments=True)
    return {name[len("adam_m/"):]: t.ravel() for name, t in moments.items() if name.startswith("adam_m/")}
def first_step(run):
    return json.loads(open(f"{run}/metrics.jsonl").readline())
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
largest = max(float(np.max(np.abs(g))) for g in a.values())
errors = {k: float(np.max(np.abs(a[k] - b[k]))) / max(float(np.max(np.abs(a[k]))), 1e-4 * largest) for k in a}
worst = max(errors, key=errors.get)
sa, sb = first_step(sys.argv[1]), first_step(sys.argv[2])
loss = abs(sa["loss"] - sb["loss"]) / abs(sa["loss"])
norm = abs(sa["raw_grad_norm"] - sb["raw_grad_norm"]) / sa["raw_grad_norm"]
print(f"{sys.argv[3]}: step 1, {len(a)} gradients, worst {errors[worst]:.2e} ({worst}; bound 1e-4), "
      f"loss {loss:.2e}, grad norm {norm:.2e} (bound 1e-6)")
sys.exit(0 if errors[worst] <= 1e-4 and loss <= 1e-6 and norm <= 1e-6 else 1)
