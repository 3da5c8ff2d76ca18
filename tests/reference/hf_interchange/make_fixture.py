#!/usr/bin/env python3
"""Builds the Hugging Face interchange fixture: tiny random causal LMs made by transformers itself.

For every variant (Qwen3 tied / untied-bf16-sharded, Qwen3-MoE fp16, DeepSeek-V3, GPT-2) this writes a
complete Hugging Face model folder (config.json, generation_config.json, safetensors weights, tokenizer.json,
tokenizer_config.json) with `save_pretrained`, and beside it `golden.safetensors` with transformers' own
logits, loss and greedy generation. One byte-level BPE tokenizer, trained here with the `tokenizers` library on
Genesis 1-2 of the King James Bible, is shared by all variants. `golden_index.json` lists the variants.

Run with the venv of requirements.txt (see README.md):

    /work/hf-venv/bin/python tests/reference/hf_interchange/make_fixture.py            # (re)write everything
    /work/hf-venv/bin/python tests/reference/hf_interchange/make_fixture.py --check    # rebuild in a temp dir,
                                                                                      # compare byte for byte
Deterministic: the same versions give bit-identical files.
"""
import argparse
import filecmp
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import safetensors  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file, load_file  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (AutoModelForCausalLM, DeepseekV3Config, GenerationConfig, GPT2Config,  # noqa: E402
                          Qwen3Config, Qwen3MoeConfig)

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- fixed choices ---------------------------------------------------------------------------------------
VOCAB = 512
EOS = "<|endoftext|>"          # the one special token: id 0
BATCH, SEQ = 2, 8              # golden `sequence` is [BATCH, SEQ + 1]
SEQUENCE_SEED = 1234           # the token ids of `sequence`
MAX_NEW_TOKENS = 8
PROMPT = "And God said, Let there be light"
CORPUS_VERSES = "gen1:1-gen2:25"   # `bible -f` range the tokenizer is trained on (Genesis 1-2, ~7 KB)
INIT_RANGE = 0.1               # initializer_range: N(0, 0.1^2) weights, so logits are O(1), not O(0.1)
# Routing is piecewise constant: a top-k choice closer than this to a tie could flip under another float32
# summation order (the engine's), so seeds with a closer call are skipped.
MIN_ROUTING_MARGIN = 1e-4
# Greedy decoding: top-1 minus top-2 logit at every generated position must exceed this fraction of the
# largest |logit| (10x the logits tolerance of check_with_transformers.py, 1e-4), so a result within tolerance
# cannot pick another token.
MIN_GREEDY_MARGIN = 1e-3
SEEDS_TO_TRY = 50

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


def log(*args):
    print(*args, flush=True)


# ---- tokenizer -------------------------------------------------------------------------------------------
def corpus_lines():
    """Genesis 1-2 (KJV), one verse per line, verse references stripped (as `meshtrain prepare` does)."""
    out = subprocess.run(["bible", "-f", CORPUS_VERSES], capture_output=True, text=True, check=True).stdout
    lines = []
    for line in out.splitlines():
        m = re.match(r"^\S+?\d+:\d+ (.*)$", line)
        if not m:
            raise SystemExit(f"unexpected `bible -f` line: {line!r}")
        lines.append(m.group(1))
    return lines


def build_tokenizer(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex + byte alphabet
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    assert tok.token_to_id(EOS) == 0
    return tok


TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": EOS,
    "eos_token": EOS,
    "unk_token": None,
    "pad_token": None,
    "model_max_length": 64,
    "clean_up_tokenization_spaces": False,
    "add_bos_token": False,
    "add_eos_token": False,
}


# ---- variants --------------------------------------------------------------------------------------------
def qwen3_config(tied, hidden):
    return Qwen3Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                       rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                       tie_word_embeddings=tied, initializer_range=INIT_RANGE, bos_token_id=0, eos_token_id=0,
                       attention_bias=False)


def qwen3_moe_config():
    return Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                          mlp_only_layers=[0], max_position_embeddings=64, rms_norm_eps=1e-6,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                          tie_word_embeddings=False, initializer_range=INIT_RANGE, bos_token_id=0,
                          eos_token_id=0, output_router_logits=False)


def deepseek_v3_config():
    # 8 experts in 4 groups of 2, top-2 groups, top-2 experts: both the group limit and the expert top-k
    # decide something (with 4 experts in 2 groups and topk_group 1, top-2 would always take both experts of
    # the kept group). v_head_dim 12 differs from qk_nope_head_dim 8 (engine: v <= nope + rope = 16).
    return DeepseekV3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                            q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                            v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
                            first_k_dense_replace=1, n_shared_experts=1, routed_scaling_factor=2.5,
                            norm_topk_prob=True, max_position_embeddings=64, rms_norm_eps=1e-6,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                            rope_interleave=True, tie_word_embeddings=False, initializer_range=INIT_RANGE,
                            bos_token_id=0, eos_token_id=0)


def gpt2_config():
    return GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                      activation_function="gelu_new", layer_norm_epsilon=1e-5, initializer_range=INIT_RANGE,
                      bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)


VARIANTS = [
    dict(name="qwen3_tied", family="qwen3", make_config=lambda: qwen3_config(True, 32), dtype="float32",
         max_shard_size=None, first_seed=1000,
         covers=["Qwen3 dense", "tie_word_embeddings true (no lm_head.weight in the file)", "float32 on disk",
                 "one model.safetensors", "GQA 4 query / 2 kv heads, head_dim 16 (q_proj [64, 32])",
                 "rope_theta 1e6 inside rope_parameters", "q_norm / k_norm"]),
    dict(name="qwen3_untied_bf16_sharded", family="qwen3", make_config=lambda: qwen3_config(False, 48),
         dtype="bfloat16", max_shard_size=90000, first_seed=2000,
         covers=["Qwen3 dense", "untied lm_head.weight", "bfloat16 on disk (engine converts to float32)",
                 "sharded: model-0000k-of-0000n.safetensors + model.safetensors.index.json",
                 "hidden 48, head_dim 16 (q_proj [64, 48])"]),
    dict(name="qwen3_moe", family="qwen3_moe", make_config=qwen3_moe_config, dtype="float16",
         max_shard_size=None, first_seed=3000,
         covers=["Qwen3-MoE", "float16 on disk", "4 experts, top-2, softmax router, norm_topk_prob",
                 "mlp_only_layers [0]: layer 0 dense, layers 1-2 MoE (per-expert tensors in the file)",
                 "config.json spells the expert count num_local_experts (transformers 5 attribute map)"]),
    dict(name="deepseek_v3", family="deepseek_v3", make_config=deepseek_v3_config, dtype="float32",
         max_shard_size=None, first_seed=4000,
         covers=["DeepSeek-V3", "MLA: q_lora_rank 24, kv_lora_rank 16, rope 8, nope 8, v_head_dim 12",
                 "rope_interleave true", "first_k_dense_replace 1", "8 experts, 4 groups, topk_group 2, top-2",
                 "sigmoid router with random nonzero e_score_correction_bias", "routed_scaling_factor 2.5",
                 "1 shared expert", "float32 on disk"]),
    dict(name="gpt2", family="gpt2", make_config=gpt2_config, dtype="float32", max_shard_size=None,
         first_seed=5000,
         covers=["GPT-2", "Conv1D [in, out] weights, fused c_attn with bias", "learned positions (n_positions 64)",
                 "gelu_new", "LayerNorm with bias", "tied lm_head (no lm_head.weight in the file)",
                 "float32 on disk"]),
]
TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---- model construction ----------------------------------------------------------------------------------
def build_model(variant, seed):
    torch.manual_seed(seed)
    config = variant["make_config"]()
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        # transformers initialises norms to 1, biases and the selection bias to 0: make them random so that a
        # wrong mapping of any of them shows in the logits.
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            if name.endswith("e_score_correction_bias"):
                t.copy_((torch.rand(t.shape, generator=gen) * 0.2 - 0.1).to(t.dtype))
            elif t.numel() > 1 and bool((t == 1).all()):
                t.copy_((1 + 0.1 * torch.randn(t.shape, generator=gen)).to(t.dtype))
            elif t.numel() > 1 and bool((t == 0).all()):
                t.copy_((0.05 * torch.randn(t.shape, generator=gen)).to(t.dtype))
        # Weights saved in bfloat16 / float16: compute the golden values from the float32 model whose weights
        # are the rounded values, i.e. exactly what the file holds, converted back to float32.
        if variant["dtype"] != "float32":
            disk = TORCH_DTYPE[variant["dtype"]]
            for t in model.state_dict().values():
                if t.is_floating_point():
                    t.copy_(t.to(disk).to(torch.float32))
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def greedy_config():
    return GenerationConfig(do_sample=False, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=None,
                            pad_token_id=0, bos_token_id=None, num_beams=1, temperature=None, top_k=None,
                            top_p=None)


def greedy(model, prompt_ids):
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=greedy_config())
    return out[0, len(prompt_ids):].tolist()


# ---- routing margins (hooks on the router modules) -------------------------------------------------------
class RoutingProbe:
    def __init__(self, model, family):
        self.family = family
        self.inputs = []
        self.handles = []
        self.config = model.config
        for name, module in model.named_modules():
            if name.endswith("mlp.gate") and hasattr(module, "weight") and module.weight.dim() == 2 and \
                    family in ("qwen3_moe", "deepseek_v3"):
                self.handles.append(module.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def hook(module, args, output):
            self.inputs.append((name, module, args[0].detach().reshape(-1, args[0].shape[-1]).clone()))
        return hook

    def close(self):
        for h in self.handles:
            h.remove()

    def margins(self):
        """Smallest gap between the last chosen and the first rejected candidate, over every token seen."""
        c = self.config
        expert_margin, group_margin = float("inf"), float("inf")
        chosen = {}
        for name, module, x in self.inputs:
            with torch.no_grad():
                logits = F.linear(x.float(), module.weight.float())
            if self.family == "qwen3_moe":
                probs = torch.softmax(logits, dim=-1)
                top = probs.sort(dim=-1, descending=True).values
                k = c.num_experts_per_tok
                expert_margin = min(expert_margin, float((top[:, k - 1] - top[:, k]).min()))
                idx = probs.topk(k, dim=-1).indices
            else:
                scores = logits.sigmoid()
                choice = scores + module.e_score_correction_bias.float()
                ng, per = c.n_group, c.n_routed_experts // c.n_group
                gs = choice.view(-1, ng, per).topk(2, dim=-1).values.sum(-1)
                gsort = gs.sort(dim=-1, descending=True).values
                group_margin = min(group_margin, float((gsort[:, c.topk_group - 1] - gsort[:, c.topk_group]).min()))
                keep = torch.zeros_like(gs).scatter_(1, gs.topk(c.topk_group, dim=-1).indices, 1.0)
                mask = keep.unsqueeze(-1).expand(-1, ng, per).reshape(-1, c.n_routed_experts).bool()
                masked = choice.masked_fill(~mask, float("-inf"))
                top = masked.sort(dim=-1, descending=True).values
                k = c.num_experts_per_tok
                expert_margin = min(expert_margin, float((top[:, k - 1] - top[:, k]).min()))
                idx = masked.topk(k, dim=-1).indices
            chosen.setdefault(name, set()).update(idx.flatten().tolist())
        return expert_margin, group_margin, chosen


# ---- golden values ---------------------------------------------------------------------------------------
def golden_values(model, variant, prompt_ids):
    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(SEQUENCE_SEED)
    sequence = torch.randint(1, V, (BATCH, SEQ + 1), generator=gen, dtype=torch.long)
    probe = RoutingProbe(model, variant["family"])
    with torch.no_grad():
        logits = model(input_ids=sequence[:, :SEQ]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, V), sequence[:, 1:].reshape(-1))
        # transformers' own loss: labels are shifted inside the model (logits[:, :-1] vs labels[:, 1:]), so
        # feeding all S + 1 tokens with labels = the same ids gives the mean over the B * S next-token targets.
        hf = model(input_ids=sequence, labels=sequence)
    hf_loss = float(hf.loss)
    prefix_diff = float((hf.logits[:, :SEQ].float() - logits).abs().max())
    assert abs(hf_loss - float(loss)) <= 1e-6 * max(1.0, float(loss)), (hf_loss, float(loss))
    assert prefix_diff <= 1e-5, prefix_diff

    probe.inputs.clear()  # generation's routing is checked on the full forward below (same decisions)
    generated = greedy(model, prompt_ids)
    probe.inputs.clear()
    full = torch.tensor([prompt_ids + generated], dtype=torch.long)
    with torch.no_grad():
        sequence_again = model(input_ids=sequence).logits  # routing of the golden sequence
        fed = full[:, :-1]
        gen_out = model(input_ids=fed, labels=full[:, :-1].clone())
        gen_logits = gen_out.logits[0].float()
        gen_loss = F.cross_entropy(gen_logits, full[0, 1:])
        hf_gen_loss = float(model(input_ids=full, labels=full).loss)
    del sequence_again
    assert abs(hf_gen_loss - float(gen_loss)) <= 1e-6 * max(1.0, float(gen_loss))
    expert_margin, group_margin, chosen = probe.margins()
    probe.close()

    P = len(prompt_ids)
    # greedy consistency: each generated id is the argmax of the full forward at the position before it
    step_logits = gen_logits[P - 1:]
    argmax = step_logits.argmax(-1).tolist()
    top2 = step_logits.topk(2, dim=-1).values
    greedy_margin = float((top2[:, 0] - top2[:, 1]).min()) / float(gen_logits.abs().max())
    info = dict(loss=float(loss), hf_loss=hf_loss, prefix_diff=prefix_diff, generated=generated,
                argmax_matches=(argmax == generated), greedy_margin=greedy_margin,
                expert_margin=expert_margin, group_margin=group_margin, eos_generated=(0 in generated),
                experts_chosen={k: sorted(v) for k, v in chosen.items()}, gen_loss=float(gen_loss),
                num_experts=getattr(model.config, "num_local_experts", 0) or 0,
                max_abs_logit=float(logits.abs().max()))
    tensors = {
        "sequence": sequence.contiguous(),
        "logits": logits.contiguous(),
        "loss": loss.reshape([]).float().contiguous(),
        "prompt_ids": torch.tensor(prompt_ids, dtype=torch.long),
        "generated_ids": torch.tensor(generated, dtype=torch.long),
        "generation_logits": gen_logits.contiguous(),
        "generation_loss": gen_loss.reshape([]).float().contiguous(),
    }
    return tensors, info


def acceptable(variant, info):
    why = []
    if not info["argmax_matches"]:
        why.append("generate() disagrees with the full forward's argmax")
    if info["eos_generated"]:
        why.append("greedy generation produced <|endoftext|> (meshtrain would stop there)")
    if info["greedy_margin"] < MIN_GREEDY_MARGIN:
        why.append(f"greedy margin {info['greedy_margin']:.2e} < {MIN_GREEDY_MARGIN}")
    if variant["family"] in ("qwen3_moe", "deepseek_v3") and info["expert_margin"] < MIN_ROUTING_MARGIN:
        why.append(f"expert margin {info['expert_margin']:.2e} < {MIN_ROUTING_MARGIN}")
    if variant["family"] == "deepseek_v3" and info["group_margin"] < MIN_ROUTING_MARGIN:
        why.append(f"group margin {info['group_margin']:.2e} < {MIN_ROUTING_MARGIN}")
    # every routed expert of every MoE layer chosen by some token, so every expert's mapping shows in the logits
    for layer, experts in info["experts_chosen"].items():
        if len(experts) != info["num_experts"]:
            why.append(f"{layer} never chooses experts {sorted(set(range(info['num_experts'])) - set(experts))}")
    return why


# ---- sensitivity: how much the features the fixture covers move the logits -------------------------------
def sensitivity(variant, model, sequence):
    base_sd = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        ref = model(input_ids=sequence[:, :SEQ]).logits

    def variant_logits(change_config=None, change_state=None):
        cfg = model.config.__class__.from_dict(model.config.to_dict())
        cfg._attn_implementation = "eager"
        if change_config:
            change_config(cfg)
        m = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
        sd = {k: v.clone() for k, v in base_sd.items()}
        if change_state:
            change_state(sd)
        m.load_state_dict(sd, strict=False)
        if getattr(cfg, "tie_word_embeddings", False):
            m.tie_weights()
        with torch.no_grad():
            return float((m(input_ids=sequence[:, :SEQ]).logits - ref).abs().max())

    out = {}
    fam = variant["family"]
    if fam in ("qwen3", "qwen3_moe"):
        def theta(cfg):
            cfg.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
        out["rope_theta 1e4 instead of 1e6"] = variant_logits(theta)

        def no_qk_norm(sd):
            for k in sd:
                if k.endswith("q_norm.weight") or k.endswith("k_norm.weight"):
                    sd[k] = torch.ones_like(sd[k])
        out["q_norm / k_norm weights read as 1"] = variant_logits(change_state=no_qk_norm)
    if fam == "qwen3_moe":
        def no_renorm(cfg):
            cfg.norm_topk_prob = False
        out["norm_topk_prob false"] = variant_logits(no_renorm)
    if fam == "deepseek_v3":
        def no_interleave(cfg):
            cfg.rope_interleave = False
        out["rope_interleave false"] = variant_logits(no_interleave)

        def no_bias(sd):
            for k in sd:
                if k.endswith("e_score_correction_bias"):
                    sd[k] = torch.zeros_like(sd[k])
        out["e_score_correction_bias read as 0"] = variant_logits(change_state=no_bias)

        def no_group(cfg):
            cfg.topk_group = cfg.n_group
        out["group limit ignored"] = variant_logits(no_group)

        def no_scale(cfg):
            cfg.routed_scaling_factor = 1.0
        out["routed_scaling_factor 1"] = variant_logits(no_scale)
    if fam == "gpt2":
        def exact_gelu(cfg):
            cfg.activation_function = "gelu"
        out["exact gelu instead of gelu_new (tanh)"] = variant_logits(exact_gelu)

        def no_bias(sd):
            for k in sd:
                if k.endswith(".bias") and "attn.bias" != k[-9:]:
                    sd[k] = torch.zeros_like(sd[k])
        out["all biases read as 0"] = variant_logits(change_state=no_bias)
    out["__max_abs_logit"] = float(ref.abs().max())
    return out


# ---- writing ---------------------------------------------------------------------------------------------
def write_variant(variant, out_dir, tok_dir, prompt_ids):
    name = variant["name"]
    seed = variant["first_seed"]
    for attempt in range(SEEDS_TO_TRY):
        model = build_model(variant, seed)
        tensors, info = golden_values(model, variant, prompt_ids)
        why = acceptable(variant, info)
        if not why:
            break
        log(f"  {name}: seed {seed} rejected: {'; '.join(why)}")
        seed += 1
    else:
        raise SystemExit(f"{name}: no acceptable seed in {SEEDS_TO_TRY} tries")
    sens = sensitivity(variant, model, tensors["sequence"])

    folder = os.path.join(out_dir, name)
    if os.path.exists(folder):
        shutil.rmtree(folder)
    disk = TORCH_DTYPE[variant["dtype"]]
    to_save = model.to(disk) if disk != torch.float32 else model
    kwargs = {}
    if variant["max_shard_size"]:
        kwargs["max_shard_size"] = variant["max_shard_size"]
    to_save.save_pretrained(folder, **kwargs)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok_dir, f), os.path.join(folder, f))

    metadata = {
        "variant": name,
        "family": variant["family"],
        "dtype_on_disk": variant["dtype"],
        "weight_seed": str(seed),
        "weight_seed_first_tried": str(variant["first_seed"]),
        "sequence_seed": str(SEQUENCE_SEED),
        "prompt": PROMPT,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "tokenizers_version": tokenizers.__version__,
        "safetensors_version": safetensors.__version__,
        "loss": repr(info["loss"]),
        "transformers_loss": repr(info["hf_loss"]),
        "greedy_margin_relative": f"{info['greedy_margin']:.6g}",
        "routing_expert_margin": f"{info['expert_margin']:.6g}" if info["expert_margin"] != float("inf") else "n/a",
        "routing_group_margin": f"{info['group_margin']:.6g}" if info["group_margin"] != float("inf") else "n/a",
        "notes": ("sequence: tokens = sequence[:, :S], targets = sequence[:, 1:]; logits = model(tokens); "
                  "loss = mean CE of logits vs targets over B*S; prompt_ids = tokenizer(prompt); generated_ids = "
                  "greedy generate, 8 new tokens, no EOS stop; generation_logits = model(prompt + generated[:-1]) "
                  "logits at every fed position; generation_loss = their mean CE vs (prompt + generated)[1:]"),
    }
    save_file(tensors, os.path.join(folder, "golden.safetensors"), metadata=metadata)
    canonicalize_file(os.path.join(folder, "golden.safetensors"))

    shards = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors") and f != "golden.safetensors")
    log(f"  {name}: seed {seed} (first tried {variant['first_seed']}), loss {info['loss']:.6f} "
        f"(transformers' {info['hf_loss']:.6f}), prompt {prompt_ids} -> {info['generated']}")
    log(f"    greedy margin {info['greedy_margin']:.3e} x max|logit|, routing margins: expert "
        f"{info['expert_margin']:.3e}, group {info['group_margin']:.3e}; experts chosen {info['experts_chosen']}")
    log(f"    sensitivity (max |d logit|, max |logit| {sens.pop('__max_abs_logit'):.3f}): " +
        ", ".join(f"{k}: {v:.3g}" for k, v in sens.items()))
    cfg = json.load(open(os.path.join(folder, "config.json")))
    entry = {
        "name": name,
        "dir": name,
        "family": variant["family"],
        "architecture": cfg["architectures"][0],
        "model_type": cfg["model_type"],
        "dtype_on_disk": variant["dtype"],
        "sharded": len(shards) > 1,
        "weight_files": shards,
        "tied": bool(cfg.get("tie_word_embeddings", False)),
        "hidden_size": cfg.get("hidden_size", cfg.get("n_embd")),
        "num_hidden_layers": cfg.get("num_hidden_layers", cfg.get("n_layer")),
        "vocab_size": cfg["vocab_size"],
        "weight_seed": seed,
        "covers": variant["covers"],
        "golden": {"loss": info["loss"], "prompt_ids": prompt_ids, "generated_ids": info["generated"],
                   "greedy_margin_relative": info["greedy_margin"],
                   "routing_expert_margin": None if info["expert_margin"] == float("inf") else info["expert_margin"],
                   "routing_group_margin": None if info["group_margin"] == float("inf") else info["group_margin"]},
        "sensitivity_max_abs_logit_change": {k: round(v, 6) for k, v in sens.items()},
    }
    return entry


def canonicalize_file(path):
    """Rewrites a safetensors file with its `__metadata__` keys sorted (same tensors in the same order, same
    data bytes): the `safetensors` writer emits the metadata map in a random order on every run. (The weight
    files save_pretrained writes carry only {"format": "pt"}, so they are stable as written.)"""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    names = sorted(header, key=lambda k: (header[k]["data_offsets"][0], k))
    new_data = bytearray()
    out = {}
    if meta is not None:
        out["__metadata__"] = dict(sorted(meta.items()))
    for k in names:
        b, e = header[k]["data_offsets"]
        out[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"],
                  "data_offsets": [len(new_data), len(new_data) + (e - b)]}
        new_data += data[b:e]
    text = json.dumps(out, separators=(",", ":"), sort_keys=False).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(new_data)


def build(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, tokenizers {tokenizers.__version__}, "
        f"safetensors {safetensors.__version__}")
    lines = corpus_lines()
    tok = build_tokenizer(lines)
    tok_dir = os.path.join(out_dir, "_tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    tok.save(os.path.join(tok_dir, "tokenizer.json"))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump(TOKENIZER_CONFIG, f, indent=2)
        f.write("\n")
    # The prompt's ids from the tokenizer as transformers loads it (and the raw tokenizers object: same ids).
    auto = transformers.AutoTokenizer.from_pretrained(tok_dir)
    prompt_ids = auto(PROMPT, add_special_tokens=False)["input_ids"]
    assert prompt_ids == auto(PROMPT)["input_ids"] == tok.encode(PROMPT).ids, prompt_ids
    assert auto.eos_token_id == 0
    log(f"tokenizer: vocab {tok.get_vocab_size()}, {len(json.load(open(os.path.join(tok_dir, 'tokenizer.json')))['model']['merges'])} "
        f"merges, trained on {sum(len(l.encode()) + 1 for l in lines) - 1} bytes ({CORPUS_VERSES}); "
        f"prompt {PROMPT!r} -> {prompt_ids} {tok.encode(PROMPT).tokens}")

    entries = [write_variant(v, out_dir, tok_dir, prompt_ids) for v in VARIANTS]
    shutil.rmtree(tok_dir)
    index = {
        "what": "Hugging Face interchange fixture: tiny random models made and saved by transformers "
                "(make_fixture.py); golden.safetensors in each folder holds transformers' outputs",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "tokenizers_version": tokenizers.__version__,
        "prompt": PROMPT,
        "prompt_ids": prompt_ids,
        "eos_token": EOS,
        "eos_token_id": 0,
        "batch": BATCH,
        "seq": SEQ,
        "max_new_tokens": MAX_NEW_TOKENS,
        "golden_tensors": {
            "sequence": "I64 [B, S+1]; tokens = sequence[:, :S], targets = sequence[:, 1:]",
            "logits": "F32 [B, S, V] = model(tokens).logits",
            "loss": "F32 [] mean cross-entropy of logits vs targets over the B*S positions",
            "prompt_ids": "I64 [P] the tokenizer's ids of `prompt`",
            "generated_ids": "I64 [G] greedy generation, G = max_new_tokens, no EOS stop",
            "generation_logits": "F32 [P+G-1, V] model(prompt + generated[:-1]).logits",
            "generation_loss": "F32 [] mean CE of generation_logits vs (prompt + generated)[1:]",
        },
        "tolerances": {
            "logits_max_abs_over_max_abs_logit": 1e-4,
            "loss_abs_over_max_abs_logit": 2e-4,
            "ids": "exact",
            "weights_float32_export": "exact",
        },
        "variants": entries,
    }
    with open(os.path.join(out_dir, "golden_index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    for entry in FIXTURE_FILES:  # safetensors writes 0600; make the fixture readable like the rest of the tree
        path = os.path.join(out_dir, entry)
        for p in ([path] if os.path.isfile(path) else [os.path.join(path, f) for f in os.listdir(path)]):
            os.chmod(p, 0o644)


FIXTURE_FILES = ["golden_index.json"] + [v["name"] for v in VARIANTS]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=HERE, help="where to write (default: this folder)")
    ap.add_argument("--check", action="store_true",
                    help="rebuild in a temporary folder and compare with the committed files byte for byte")
    args = ap.parse_args()
    if not args.check:
        build(args.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        build(tmp)
        bad = []
        for entry in FIXTURE_FILES:
            a, b = os.path.join(HERE, entry), os.path.join(tmp, entry)
            if os.path.isdir(b):
                cmp = filecmp.dircmp(a, b)
                names = sorted(set(os.listdir(a)) | set(os.listdir(b)))
                for n in names:
                    pa, pb = os.path.join(a, n), os.path.join(b, n)
                    if not (os.path.exists(pa) and os.path.exists(pb) and sha256(pa) == sha256(pb)):
                        bad.append(os.path.join(entry, n))
                del cmp
            elif not (os.path.exists(a) and sha256(a) == sha256(b)):
                bad.append(entry)
        if bad:
            log("DIFFERENT: " + ", ".join(bad))
            sys.exit(1)
        log("all fixture files are bit-identical to a fresh build")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


if __name__ == "__main__":
    main()
