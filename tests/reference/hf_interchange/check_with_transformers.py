#!/usr/bin/env python3
"""Round trip of every fixture variant through the real meshtrain command line, judged by transformers.

    /work/hf-venv/bin/python tests/reference/hf_interchange/check_with_transformers.py \\
        --meshtrain build/meshtrain --work /tmp/hf-check
    /work/hf-venv/bin/python tests/reference/hf_interchange/check_with_transformers.py --self-test --work /tmp/hf-self

Per variant (see README.md for the exact commands and output formats it assumes):
  a. meshtrain import-hf <variant> --out WORK/<v>/imported                          (exit 0)
  b. meshtrain generate --checkpoint WORK/<v>/imported --prompt PROMPT --max-new-tokens 8 --temperature 0
       --output logits   -> one JSON line {"prompt": [...], "generated": [...], "logits": [[V floats], ...]}
     compared with transformers: prompt ids, greedy ids, logits at every fed position, loss
  c. meshtrain export-hf WORK/<v>/imported --out WORK/<v>/exported [--dtype bfloat16]
     loaded back with AutoModelForCausalLM / AutoTokenizer: state dict, config, tokenizer, logits, greedy ids
  d. train 3 steps from the import (its config.yaml), export the run, and judge the trained model the same way.

Prints one line per check (PASS/FAIL, the measured value and the bound) and exits 1 on any failure.
--self-test replaces meshtrain by a stand-in built on transformers (so the comparison code runs without the
engine): a faithful stand-in must pass every check, and each deliberately perturbed stand-in must fail the
check aimed at it.
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import traceback

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
INDEX = json.load(open(os.path.join(HERE, "golden_index.json")))
PROMPT = INDEX["prompt"]
MAX_NEW_TOKENS = INDEX["max_new_tokens"]
EOS_ID = INDEX["eos_token_id"]

# Tolerances (README.md "Tolerances"): logits within 1e-4 of the largest |logit| (float32 engine vs float32
# transformers: different summation orders, fused kernels, a KV cache; observed errors are ~1e-6 of it, while
# any mapping mistake moves logits by >= 5e-4 of it, see golden_index.json sensitivity_*); the loss within
# twice that (|d CE| <= 2 max |d logit|); ids and exported float32 weights exactly.
LOGITS_REL = 1e-4
LOSS_REL = 2e-4
FIXTURE_REL = 1e-5  # the installed transformers must reproduce the committed golden values this closely
# Variants also exported with --dtype bfloat16 (the bf16 source round-trips losslessly; the float32 source must
# equal torch's round-to-nearest-even of its weights).
BF16_EXPORT = ("qwen3_untied_bf16_sharded", "qwen3_tied")
# Config attributes (as transformers resolves them) that must survive export, per family.
CONFIG_KEYS_COMMON = ["model_type", "vocab_size", "tie_word_embeddings"]
CONFIG_KEYS = {
    "qwen3": ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "attention_bias", "hidden_act"],
    "gpt2": ["n_embd", "n_layer", "n_head", "n_positions", "n_inner", "activation_function",
             "layer_norm_epsilon"],
}
CONFIG_KEYS["qwen3_moe"] = CONFIG_KEYS["qwen3"] + [
    "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
    "mlp_only_layers"]
CONFIG_KEYS["deepseek_v3"] = [
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "rms_norm_eps", "rope_theta", "hidden_act", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok", "n_group", "topk_group",
    "first_k_dense_replace", "n_shared_experts", "routed_scaling_factor", "norm_topk_prob", "rope_interleave",
    "moe_intermediate_size"]

torch.set_num_threads(1)


# ---- reporting -------------------------------------------------------------------------------------------
class Report:
    def __init__(self, quiet=False):
        self.results = []  # (variant, check, ok, detail)
        self.quiet = quiet

    def add(self, variant, check, ok, detail):
        self.results.append((variant, check, bool(ok), detail))
        if not self.quiet:
            print(f"{'PASS' if ok else 'FAIL'}  {variant:27s} {check:37s} {detail}", flush=True)
        return ok

    def failed(self, variant=None):
        return [r for r in self.results if not r[2] and (variant is None or r[0] == variant)]


def fmt(x):
    return f"{x:.3e}" if isinstance(x, float) else str(x)


def within(value, bound):
    return isinstance(value, float) and not math.isnan(value) and value <= bound


# ---- transformers side -----------------------------------------------------------------------------------
def load_reference(folder):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        setattr(model.generation_config, key, None)
    return model


def greedy(model, prompt_ids):
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    config = GenerationConfig(do_sample=False, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=None, pad_token_id=0,
                              bos_token_id=None, num_beams=1, temperature=None, top_k=None, top_p=None)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt_ids):].tolist()


def forward_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], dtype=torch.long)).logits[0].float()


def hf_loss(model, ids):
    """transformers' own loss on `ids`: it shifts labels inside (logits[:-1] vs labels[1:])."""
    t = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        return float(model(input_ids=t, labels=t).loss)


def float_state(model):
    return {k: v.detach().float() for k, v in model.state_dict().items()}


def safetensors_headers(folder):
    """{tensor name: (safetensors dtype, shape)} over every weight file of a folder (headers only)."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if not f.endswith(".safetensors") or f == "golden.safetensors":
            continue
        with open(os.path.join(folder, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        for k, v in header.items():
            out[k] = (v["dtype"], v["shape"])
    return out


def config_value(config, key):
    if key == "rope_theta":
        rp = getattr(config, "rope_parameters", None) or {}
        return rp.get("rope_theta", getattr(config, "rope_theta", None))
    return getattr(config, key, None)


# ---- meshtrain side: the real binary, or the self-test stand-in -------------------------------------------
class Meshtrain:
    """The real command line."""

    def __init__(self, binary):
        self.binary = binary

    def run(self, args):
        p = subprocess.run([self.binary] + args, capture_output=True, text=True)
        return p.returncode, p.stdout, p.stderr

    def import_hf(self, src, out):
        return self.run(["import-hf", src, "--out", out])

    def generate(self, checkpoint):
        return self.run(["generate", "--checkpoint", checkpoint, "--prompt", PROMPT, "--max-new-tokens",
                         str(MAX_NEW_TOKENS), "--temperature", "0", "--output", "logits"])

    def export_hf(self, checkpoint, out, dtype=None):
        return self.run(["export-hf", checkpoint, "--out", out] + (["--dtype", dtype] if dtype else []))


class StandIn(Meshtrain):
    """Self-test: meshtrain's three commands done with transformers (the "checkpoint" is a Hugging Face folder),
    with an optional deliberate fault."""
    FAULTS = ("prompt", "generated", "logits", "logits_shape", "two_lines", "import_exit", "weights",
              "missing_tensor", "bf16_rounding", "config", "tokenizer", "fused_experts")

    def __init__(self, fault=None):
        self.fault = fault

    def import_hf(self, src, out):
        if self.fault == "import_exit":
            return 1, "", "stand-in: import failed on purpose"
        shutil.copytree(src, out)
        os.remove(os.path.join(out, "golden.safetensors"))
        return 0, "", ""

    def generate(self, checkpoint):
        tok = AutoTokenizer.from_pretrained(checkpoint)
        model = load_reference(checkpoint)
        prompt = tok(PROMPT, add_special_tokens=False)["input_ids"]
        generated = greedy(model, prompt)
        logits = forward_logits(model, prompt + generated[:-1])
        if self.fault == "prompt":
            prompt = prompt[:-1] + [prompt[-1] + 1]
        if self.fault == "generated":
            generated = generated[:-1] + [(generated[-1] + 1) % model.config.vocab_size]
        if self.fault == "logits":  # one logit off by 3e-4 of the largest |logit| (bound: 1e-4)
            logits[3, 7] += 3 * LOGITS_REL * float(logits.abs().max())
        rows = logits.tolist()
        if self.fault == "logits_shape":
            rows = rows[:-1]
        # float32 values printed with 9 significant digits (round-trip exact), as the engine should
        line = json.dumps({"prompt": prompt, "generated": generated,
                           "logits": [[float(f"{x:.9g}") for x in r] for r in rows]})
        return 0, (line + "\n" + line + "\n") if self.fault == "two_lines" else line + "\n", ""

    def export_hf(self, checkpoint, out, dtype=None):
        model = load_reference(checkpoint)
        if self.fault == "config":
            if hasattr(model.config, "rms_norm_eps"):
                model.config.rms_norm_eps = 1e-5
            else:
                model.config.layer_norm_epsilon = 1e-6
        with torch.no_grad():
            if self.fault == "weights":  # one element one float32 ulp off
                t = next(v for k, v in model.state_dict().items() if k.endswith("q_proj.weight") or
                         k.endswith("q_a_proj.weight") or k.endswith("c_attn.weight"))
                t.view(-1)[5] = torch.nextafter(t.view(-1)[5], torch.tensor(float("inf")))
            if dtype == "bfloat16":
                model = model.to(torch.bfloat16)
                if self.fault == "bf16_rounding":  # truncation instead of round-to-nearest-even
                    src = load_reference(checkpoint)
                    for k, v in model.state_dict().items():
                        f = src.state_dict()[k].float().contiguous()
                        v.copy_((f.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16))
        model.save_pretrained(out)
        if self.fault == "fused_experts":  # transformers' in-memory layout (experts.gate_up_proj [E, 2F, D])
            path = os.path.join(out, "model.safetensors")
            save_file({k: t.contiguous() for k, t in model.state_dict().items()}, path, metadata={"format": "pt"})
        if self.fault == "missing_tensor":
            path = os.path.join(out, "model.safetensors")
            tensors = load_file(path)
            tensors.pop(sorted(k for k in tensors if k.endswith("post_attention_layernorm.weight") or
                               k.endswith("ln_2.weight"))[0])
            save_file(tensors, path, metadata={"format": "pt"})
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(checkpoint, f), os.path.join(out, f))
        if self.fault == "tokenizer":  # keep only the first 80 merges: the prompt's words encode differently
            path = os.path.join(out, "tokenizer.json")
            tj = json.load(open(path))
            tj["model"]["merges"] = tj["model"]["merges"][:80]
            json.dump(tj, open(path, "w"))
        return 0, "", ""


# ---- the checks ------------------------------------------------------------------------------------------
def parse_generate_output(stdout):
    lines = [line for line in stdout.splitlines() if line.strip()]
    if len(lines) != 1:
        return None, f"expected one JSON line on stdout, got {len(lines)} lines"
    try:
        out = json.loads(lines[0])
    except json.JSONDecodeError as e:
        return None, f"stdout is not JSON ({e}): {lines[0][:120]!r}"
    for key in ("prompt", "generated", "logits"):
        if key not in out:
            return None, f"no \"{key}\" in the JSON line (keys: {sorted(out)})"
    return out, ""


def check_fixture(report, v, ref, tok, golden):
    """The installed transformers reproduces the committed golden values (same model, same tokenizer)."""
    name = v["name"]
    prompt = tok(PROMPT, add_special_tokens=False)["input_ids"]
    report.add(name, "fixture: tokenizer ids", prompt == golden["prompt_ids"].tolist(),
               f"{prompt} vs golden {golden['prompt_ids'].tolist()}")
    seq = golden["sequence"]
    S = seq.shape[1] - 1
    with torch.no_grad():
        logits = ref(input_ids=seq[:, :S]).logits.float()
    scale = float(golden["logits"].abs().max())
    err = float((logits - golden["logits"]).abs().max()) / scale
    report.add(name, "fixture: logits reproduce", within(err, FIXTURE_REL), f"{fmt(err)} of max|logit| (<= {FIXTURE_REL})")
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))
    with torch.no_grad():
        own = float(ref(input_ids=seq, labels=seq).loss)
    d = max(abs(float(loss) - float(golden["loss"])), abs(own - float(golden["loss"])))
    report.add(name, "fixture: loss reproduces", within(d, FIXTURE_REL * scale),
               f"|d| {fmt(d)} (golden {float(golden['loss']):.6f}, transformers' shifted-label loss {own:.6f})")
    gen = greedy(ref, prompt)
    report.add(name, "fixture: greedy ids reproduce", gen == golden["generated_ids"].tolist(), f"{gen}")
    return prompt, gen


def check_generate(report, v, mesh, ref, hf_prompt, hf_generated, checkpoint, label="generate"):
    name = v["name"]
    rc, out, err = mesh.generate(checkpoint)
    if not report.add(name, f"{label}: exit status", rc == 0, f"rc {rc}" + (f": {err.strip()[-300:]}" if rc else "")):
        return
    parsed, why = parse_generate_output(out)
    if not report.add(name, f"{label}: one JSON line", parsed is not None, why or "ok"):
        return
    prompt, generated, logits = parsed["prompt"], parsed["generated"], parsed["logits"]
    report.add(name, f"{label}: prompt ids", prompt == hf_prompt, f"{prompt} vs transformers {hf_prompt}")
    ok = generated == hf_generated
    note = ""
    if not ok and EOS_ID in hf_generated:
        note = " (transformers' greedy ids contain EOS: meshtrain stops there)"
    report.add(name, f"{label}: greedy ids", ok, f"{generated} vs transformers {hf_generated}{note}")
    fed = list(prompt) + list(generated[:-1])
    V = ref.config.vocab_size
    shape_ok = (isinstance(logits, list) and len(logits) == len(fed) and
                all(isinstance(r, list) and len(r) == V for r in logits))
    if not report.add(name, f"{label}: logits shape", shape_ok,
                      f"{len(logits)} rows x {sorted({len(r) for r in logits}) if logits else []} "
                      f"vs {len(fed)} fed tokens x vocab {V}"):
        return
    mine = torch.tensor(logits, dtype=torch.float64)
    theirs = forward_logits(ref, fed).double()  # transformers on exactly the tokens meshtrain fed
    scale = float(theirs.abs().max())
    diff = (mine - theirs).abs()
    max_abs = float(diff.max())
    pos = divmod(int(diff.argmax()), V)
    report.add(name, f"{label}: logits", within(max_abs / scale, LOGITS_REL),
               f"max abs {fmt(max_abs)} at [{pos[0]}, {pos[1]}], relative to max|logit| {scale:.3f}: "
               f"{fmt(max_abs / scale)} (<= {LOGITS_REL})")
    if len(generated) == 0:
        return
    targets = torch.tensor(fed[1:] + [generated[-1]], dtype=torch.long)
    my_loss = float(F.cross_entropy(mine, targets))
    their_loss = hf_loss(ref, fed + [generated[-1]])
    d = abs(my_loss - their_loss)
    report.add(name, f"{label}: loss", within(d, LOSS_REL * scale),
               f"{my_loss:.7f} vs transformers {their_loss:.7f}: |d| {fmt(d)} (<= {LOSS_REL} x {scale:.3f})")


def check_export(report, v, mesh, ref, ref_tok, hf_prompt, hf_generated, checkpoint, out, dtype=None):
    name = v["name"]
    label = f"export {dtype or 'float32'}"
    if os.path.exists(out):
        shutil.rmtree(out)
    rc, _, err = mesh.export_hf(checkpoint, out, dtype)
    if not report.add(name, f"{label}: exit status", rc == 0, f"rc {rc}" + (f": {err.strip()[-300:]}" if rc else "")):
        return
    want = "BF16" if dtype == "bfloat16" else "F32"
    headers = safetensors_headers(out)
    dtypes = {k: d for k, (d, _) in headers.items()}
    bad = sorted(k for k, d in dtypes.items() if d != want)
    report.add(name, f"{label}: file dtypes", dtypes and not bad,
               f"{len(dtypes)} tensors, all {want}" if dtypes and not bad else f"not {want}: {bad[:4]} ({len(bad)})")
    # the file layout of the source (per-expert tensors, GPT-2's Conv1D [in, out], ...): same names and shapes;
    # a tied model may add lm_head.weight
    source = {k: shape for k, (_, shape) in safetensors_headers(os.path.join(HERE, v["dir"])).items()
              }
    mine = {k: shape for k, (_, shape) in headers.items()}
    extra = sorted(set(mine) - set(source) - ({"lm_head.weight"} if v["tied"] else set()))
    missing = sorted(set(source) - set(mine))
    reshaped = sorted(k for k in set(source) & set(mine) if source[k] != mine[k])
    report.add(name, f"{label}: tensor names, shapes", not (extra or missing or reshaped),
               f"{len(mine)} tensors as in the source files" + (" (+ lm_head.weight)" if "lm_head.weight" in mine and
                                                                 "lm_head.weight" not in source else "")
               if not (extra or missing or reshaped) else
               f"extra {extra[:3]} ({len(extra)}), missing {missing[:3]} ({len(missing)}), "
               f"reshaped {[(k, mine[k], source[k]) for k in reshaped[:3]]} ({len(reshaped)})")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                                           output_loading_info=True)
    except Exception as e:  # noqa: BLE001
        report.add(name, f"{label}: from_pretrained", False, f"{type(e).__name__}: {str(e)[:300]}")
        return
    model.eval()
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        setattr(model.generation_config, key, None)
    problems = {k: sorted(vv) if not isinstance(vv, list) else vv for k, vv in info.items()
                if k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs") and vv}
    report.add(name, f"{label}: from_pretrained", not problems, "no missing / unexpected / mismatched tensors"
               if not problems else str(problems)[:400])
    # config
    c0, c1 = ref.config, model.config
    diffs = [f"{k}: {config_value(c1, k)!r} vs {config_value(c0, k)!r}" for k in CONFIG_KEYS_COMMON + CONFIG_KEYS[v["family"]]
             if config_value(c0, k) != config_value(c1, k)]
    diffs += [] if c1.architectures == c0.architectures else [f"architectures {c1.architectures} vs {c0.architectures}"]
    report.add(name, f"{label}: config.json", not diffs, "architecture keys equal" if not diffs else "; ".join(diffs))
    # tokenizer
    try:
        tok = AutoTokenizer.from_pretrained(out)
        ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
        ok = ids == hf_prompt and tok.eos_token == ref_tok.eos_token and len(tok) == len(ref_tok)
        report.add(name, f"{label}: AutoTokenizer", ok, f"prompt {ids}, eos {tok.eos_token!r}, {len(tok)} tokens")
    except Exception as e:  # noqa: BLE001
        report.add(name, f"{label}: AutoTokenizer", False, f"{type(e).__name__}: {str(e)[:300]}")
    # weights
    s0, s1 = float_state(ref), float_state(model)
    if dtype == "bfloat16":
        s0 = {k: t.to(torch.bfloat16).float() for k, t in s0.items()}  # torch: round to nearest even
    keys = sorted(set(s0) | set(s1))
    worst, worst_key, differing = 0.0, None, 0
    for k in keys:
        if k not in s0 or k not in s1 or s0[k].shape != s1[k].shape:
            differing += 1
            worst, worst_key = float("inf"), k
            continue
        d = float((s0[k] - s1[k]).abs().max()) if s0[k].numel() else 0.0
        if d > 0:
            differing += 1
            if d > worst:
                worst, worst_key = d, k
    what = "equal to torch's bf16 rounding of the original" if dtype == "bfloat16" else "equal to the original"
    report.add(name, f"{label}: state dict exact", differing == 0,
               f"{len(keys)} tensors {what}" if differing == 0 else
               f"{differing} tensors differ, worst {worst_key}: max |d| {fmt(worst)}")
    if dtype == "bfloat16":
        return  # the bf16 weights differ from the float32 reference model; equal weights imply equal outputs
    fed = hf_prompt + hf_generated[:-1]
    a, b = forward_logits(ref, fed), forward_logits(model, fed)
    scale = float(a.abs().max())
    d = float((a - b).abs().max())
    report.add(name, f"{label}: logits", within(d / scale, LOGITS_REL), f"max abs {fmt(d)}, relative {fmt(d / scale)}")
    gen = greedy(model, hf_prompt)
    report.add(name, f"{label}: greedy ids", gen == hf_generated, f"{gen}")


TRAIN_TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
              "and darkness was upon the face of the deep.\n") * 40


def train_then_export(report, v, mesh, ref, tok, hf_prompt, work):
    """Continue pre-training from the import (the README's commands), export, and judge the trained model
    with transformers: `meshtrain train <imported>/config.yaml load_parameters_path=<imported> ...` for 3
    steps on a small text, `export-hf` of the run, from_pretrained of the export (no missing / unexpected
    tensors, weights moved from the source), and meshtrain's logits and greedy ids of the trained checkpoint
    against transformers on the exported folder."""
    name = v["name"]
    if not isinstance(mesh, Meshtrain) or isinstance(mesh, StandIn):
        if not report.quiet:
            print(f"SKIP  {name:27s} {'train then export':37s} needs the real binary", flush=True)
        return
    imported = os.path.join(work, "imported")
    texts = os.path.join(work, "texts")
    os.makedirs(texts, exist_ok=True)
    for part in (1, 2):  # a text dataset holds one file out for validation
        with open(os.path.join(texts, f"part{part}.txt"), "w") as f:
            f.write(TRAIN_TEXT)
    run = os.path.join(work, "run")
    rc, _, err = mesh.run(["train", os.path.join(imported, "config.yaml"), "load_parameters_path=" + imported,
                           "dataset_path=" + texts, "run_dir=" + run, "steps=3", "checkpoint_period=3",
                           "per_device_batch_size=2", "max_target_length=16", "eval_interval=0"])
    if not report.add(name, "train 3 steps: exit status", rc == 0, f"rc {rc}" + (f": {err.strip()[-300:]}" if rc else "")):
        return
    out = os.path.join(work, "trained_exported")
    rc, _, err = mesh.export_hf(run, out)
    if not report.add(name, "trained export: exit status", rc == 0, f"rc {rc}" + (f": {err.strip()[-300:]}" if rc else "")):
        return
    trained, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                                         output_loading_info=True)
    trained.eval()
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        setattr(trained.generation_config, key, None)
    problems = {k: val for k, val in info.items() if val}
    report.add(name, "trained export: loads cleanly", not problems, str(problems) or "no missing / unexpected tensors")
    before, after = float_state(ref), float_state(trained)
    moved = max(float((after[k] - before[k]).abs().max()) for k in after if k in before)
    report.add(name, "trained export: weights moved", moved > 0.0, f"largest change {fmt(moved)}")
    check_generate(report, v, mesh, trained, hf_prompt, greedy(trained, hf_prompt), run, label="trained")


def check_variant(report, v, mesh, work):
    name = v["name"]
    src = os.path.join(HERE, v["dir"])
    golden = load_file(os.path.join(src, "golden.safetensors"))
    ref = load_reference(src)
    tok = AutoTokenizer.from_pretrained(src)
    hf_prompt, hf_generated = check_fixture(report, v, ref, tok, golden)

    vwork = os.path.join(work, name)
    if os.path.exists(vwork):
        shutil.rmtree(vwork)
    os.makedirs(vwork)
    imported = os.path.join(vwork, "imported")
    rc, _, err = mesh.import_hf(src, imported)
    if not report.add(name, "import-hf: exit status", rc == 0, f"rc {rc}" + (f": {err.strip()[-300:]}" if rc else "")):
        return
    check_generate(report, v, mesh, ref, hf_prompt, hf_generated, imported)
    check_export(report, v, mesh, ref, tok, hf_prompt, hf_generated, imported, os.path.join(vwork, "exported"))
    if name in BF16_EXPORT:
        check_export(report, v, mesh, ref, tok, hf_prompt, hf_generated, imported,
                     os.path.join(vwork, "exported_bf16"), "bfloat16")
    train_then_export(report, v, mesh, ref, tok, hf_prompt, vwork)


def run_all(mesh, work, variants, quiet=False):
    report = Report(quiet)
    for v in variants:
        try:
            check_variant(report, v, mesh, work)
        except Exception as e:  # noqa: BLE001
            report.add(v["name"], "no exception", False, f"{type(e).__name__}: {e}")
            if not quiet:
                traceback.print_exc()
    return report


# ---- self-test: the comparisons pass a faithful stand-in and catch each perturbed one ----------------------
# fault -> (variant to run it on, the check that must fail)
SELF_TEST_FAULTS = {
    "prompt": ("qwen3_tied", "generate: prompt ids"),
    "generated": ("gpt2", "generate: greedy ids"),
    "logits": ("qwen3_moe", "generate: logits"),
    "logits_shape": ("gpt2", "generate: logits shape"),
    "two_lines": ("qwen3_tied", "generate: one JSON line"),
    "import_exit": ("gpt2", "import-hf: exit status"),
    "weights": ("deepseek_v3", "export float32: state dict exact"),
    "missing_tensor": ("qwen3_tied", "export float32: from_pretrained"),
    "bf16_rounding": ("qwen3_tied", "export bfloat16: state dict exact"),
    "config": ("deepseek_v3", "export float32: config.json"),
    "tokenizer": ("gpt2", "export float32: AutoTokenizer"),
    "fused_experts": ("qwen3_moe", "export float32: tensor names, shapes"),
}


def self_test(work, variants):
    print("== self-test 1: a faithful stand-in (transformers doing meshtrain's commands) must pass everything")
    clean = run_all(StandIn(None), os.path.join(work, "clean"), variants)
    ok = not clean.failed()
    print(f"== {'ok' if ok else 'NOT OK'}: {len(clean.results)} checks, {len(clean.failed())} failed")
    print("== self-test 2: each deliberately perturbed stand-in must fail the check aimed at it")
    by_name = {v["name"]: v for v in INDEX["variants"]}
    for fault, (vname, check) in SELF_TEST_FAULTS.items():
        rep = run_all(StandIn(fault), os.path.join(work, "fault_" + fault), [by_name[vname]], quiet=True)
        failed = rep.failed()
        hit = [r for r in failed if r[1] == check]
        caught = bool(hit)
        ok &= caught
        detail = hit[0][3] if hit else (f"failed instead: {[r[1] for r in failed]}" if failed else "nothing failed")
        print(f"{'PASS' if caught else 'FAIL'}  fault {fault:15s} on {vname:27s} caught by '{check}': {detail[:160]}")
    print("SELF-TEST " + ("PASSED" if ok else "FAILED"))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshtrain", help="path to the meshtrain binary")
    ap.add_argument("--work", required=True, help="scratch folder (imported / exported checkpoints)")
    ap.add_argument("--variants", help="comma-separated subset of golden_index.json's variants")
    ap.add_argument("--self-test", action="store_true", help="check this script with a transformers stand-in")
    args = ap.parse_args()
    variants = INDEX["variants"]
    if args.variants:
        wanted = args.variants.split(",")
        unknown = set(wanted) - {v["name"] for v in variants}
        if unknown:
            ap.error(f"unknown variants {sorted(unknown)}; known: {[v['name'] for v in variants]}")
        variants = [v for v in variants if v["name"] in wanted]
    print(f"transformers {transformers.__version__}, torch {torch.__version__} "
          f"(fixture made with {INDEX['transformers_version']}, {INDEX['torch_version']})")
    os.makedirs(args.work, exist_ok=True)
    if args.self_test:
        sys.exit(0 if self_test(args.work, variants) else 1)
    if not args.meshtrain:
        ap.error("--meshtrain PATH is required (or --self-test)")
    binary = os.path.abspath(args.meshtrain)
    if not os.access(binary, os.X_OK):
        ap.error(f"{binary} is not an executable")
    report = run_all(Meshtrain(binary), os.path.abspath(args.work), variants)
    failed = report.failed()
    print(f"{len(report.results)} checks, {len(failed)} failed" + (
        ": " + ", ".join(f"{r[0]}/{r[1]}" for r in failed) if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
