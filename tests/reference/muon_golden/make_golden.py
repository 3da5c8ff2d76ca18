"""Golden Muon steps (optax.contrib.muon's definition, MaxText's opt_type=muon) computed with PyTorch in
float64, independently of meshtrain: a few steps of a set of small matrices (wide, tall, square, and a
batch of two "expert" matrices stepped one at a time), each with its own update scale (muon_consistent_rms
unset: sqrt(max(1, fan_out / fan_in)); set to 0.2: 0.2 sqrt(max(fan_in, fan_out))), and a vector stepped
by the AdamW beside Muon (optax.adamw with nesterov=True, optax.contrib.muon's default).

Per step t (1-based), for a matrix [fan_in, fan_out]:
  g = grad * gradient_scale
  mu = beta mu + (1 - beta) g
  mu_hat = beta mu / (1 - beta^(t+1)) + (1 - beta) g / (1 - beta^t)
  X = mu_hat (transposed when fan_in > fan_out), X /= ||X||_F + eps
  5 times: A = X X^T; B = b A + c A A; X = a X + B X        (a, b, c) = (3.4445, -4.7750, 2.0315)
  param -= lr (scale X (transposed back) + weight_decay param)
and for the vector (AdamW, Nesterov):
  m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
  m_hat = b1 m / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t); v_hat = v / (1 - b2^t)
  param -= lr (m_hat / (sqrt(v_hat) + eps) + weight_decay param)

Inputs are a fixed formula (no random generator), written to golden.json with the results after each step.
Run with Debian's torch: /usr/bin/python3 tests/reference/muon_golden/make_golden.py
"""
import json
import math
import os

import torch

torch.set_default_dtype(torch.float64)

STEPS = 3
LR, BETA, EPS, WD, GRAD_SCALE = 0.02, 0.95, 1e-8, 0.1, 0.5
B1, B2, ADAM_WD = 0.9, 0.95, 0.1
NS = (3.4445, -4.7750, 2.0315)


def values(count, seed, scale=1.0):
    """A deterministic pseudo-random sequence in (-scale, scale): the fractional part of a scaled sine (the
    shader hash), so the matrices have full rank."""
    out = []
    for i in range(count):
        x = math.sin(12.9898 * (i + 1) + 78.233 * seed) * 43758.5453
        out.append(scale * (2.0 * (x - math.floor(x)) - 1.0))
    return out


def orthogonalize(x):
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    x = x / (torch.linalg.norm(x) + EPS)
    a, b, c = NS
    for _ in range(5):
        A = x @ x.T
        B = b * A + c * A @ A
        x = a * x + B @ x
    return x.T if transposed else x


def muon_case(name, batch, rows, cols, consistent_rms, seed):
    shape = (batch, rows, cols)
    param = torch.tensor(values(batch * rows * cols, seed)).reshape(shape)
    mu = torch.zeros(shape)
    case = {"name": name, "batch": batch, "rows": rows, "cols": cols,
            "consistent_rms": consistent_rms, "param": param.flatten().tolist(), "grads": [], "params": [],
            "momenta": []}
    scale = (math.sqrt(max(1.0, cols / rows)) if consistent_rms is None
             else consistent_rms * math.sqrt(max(rows, cols)))
    case["update_scale"] = scale
    for t in range(1, STEPS + 1):
        grad = torch.tensor(values(batch * rows * cols, seed + 10 * t, 3.0)).reshape(shape)
        case["grads"].append(grad.flatten().tolist())
        g = grad * GRAD_SCALE
        mu = BETA * mu + (1 - BETA) * g
        mu_hat = BETA * mu / (1 - BETA ** (t + 1)) + (1 - BETA) * g / (1 - BETA ** t)
        update = torch.stack([orthogonalize(mu_hat[e]) for e in range(batch)])
        param = param - LR * (scale * update + WD * param)
        case["params"].append(param.flatten().tolist())
        case["momenta"].append(mu.flatten().tolist())
    return case


def adamw_case(count, seed):
    param = torch.tensor(values(count, seed))
    m = torch.zeros(count)
    v = torch.zeros(count)
    case = {"count": count, "param": param.tolist(), "grads": [], "params": []}
    for t in range(1, STEPS + 1):
        grad = torch.tensor(values(count, seed + 10 * t, 3.0))
        case["grads"].append(grad.tolist())
        g = grad * GRAD_SCALE
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        m_hat = B1 * m / (1 - B1 ** (t + 1)) + (1 - B1) * g / (1 - B1 ** t)
        v_hat = v / (1 - B2 ** t)
        param = param - LR * (m_hat / (torch.sqrt(v_hat) + EPS) + ADAM_WD * param)
        case["params"].append(param.tolist())
    return case


golden = {
    "steps": STEPS, "learning_rate": LR, "beta": BETA, "epsilon": EPS, "weight_decay": WD,
    "gradient_scale": GRAD_SCALE, "adam_b1": B1, "adam_b2": B2, "adam_weight_decay": ADAM_WD,
    "muon": [
        muon_case("wide", 1, 3, 5, None, 1),
        muon_case("tall", 1, 6, 4, None, 2),
        muon_case("square_consistent_rms", 1, 4, 4, 0.2, 3),
        muon_case("experts_tall_consistent_rms", 2, 5, 3, 0.2, 4),
    ],
    "adamw_nesterov": adamw_case(7, 5),
    "torch": torch.__version__,
}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json"), "w") as out:
    json.dump(golden, out)
    out.write("\n")
