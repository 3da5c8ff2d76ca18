#!/usr/bin/env python3
"""Special token ids through import-hf and export-hf: three tiny random models made by transformers itself.

`make` writes special_tokens/<variant>/ (config.json, generation_config.json, model.safetensors, as
save_pretrained writes them) and special_tokens/expected.json: what each config.json says about
bos_token_id, eos_token_id and pad_token_id (an id, null, or "absent"), what transformers' AutoConfig makes of
the folder, and what it would make of it if those keys were dropped (the class defaults an export must not let
in). `check` runs meshtrain import-hf then export-hf on each variant and asserts that the exported config.json
has the source's keys and values (null and absent included) and that AutoConfig on the export gives the
source's ids. The ctest checks (tests/e2e/hf_interchange.sh, HfInterchange.*) compare the JSON without Python
packages; this script is the check against the real library.

    /work/hf-venv/bin/python tests/reference/hf_interchange/special_tokens.py make
    /work/hf-venv/bin/python tests/reference/hf_interchange/special_tokens.py check --meshtrain build/meshtrain
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, DeepseekV3Config, GPT2Config, Qwen3Config  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "special_tokens")
KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
VOCAB = 64

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


def variants():
    """(folder, config, keys removed from the saved config.json, why)."""
    return [
        ("gpt2_null_ids",
         GPT2Config(vocab_size=VOCAB, n_embd=8, n_layer=1, n_head=2, n_positions=16,
                    bos_token_id=None, eos_token_id=None, pad_token_id=None),
         (), "every id null: without the keys GPT2Config fills in 50256, outside the 64-token vocabulary"),
        ("deepseek_v3_null_ids",
         DeepseekV3Config(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None,
                          kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4,
                          n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
                          topk_group=1, first_k_dense_replace=1, max_position_embeddings=32,
                          bos_token_id=None, eos_token_id=None, pad_token_id=None),
         (), "every id null: without the keys DeepseekV3Config fills in bos 0 and eos 1"),
        ("qwen3_ids_pad_absent",
         Qwen3Config(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=32,
                     tie_word_embeddings=True, bos_token_id=3, eos_token_id=5),
         ("pad_token_id",), "ids 3 and 5, and no pad_token_id key at all (removed from the saved file)"),
    ]


def ids_in_file(config_json):
    return {key: config_json[key] if key in config_json else "absent" for key in KEYS}


def ids_of_autoconfig(folder):
    config = AutoConfig.from_pretrained(folder)
    return {key: getattr(config, key, None) for key in KEYS}


def make():
    if os.path.isdir(HERE):
        shutil.rmtree(HERE)
    expected = {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
                "variants": {}}
    for seed, (name, config, removed, why) in enumerate(variants()):
        folder = os.path.join(HERE, name)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        model.save_pretrained(folder)
        path = os.path.join(folder, "config.json")
        with open(path) as f:
            saved = json.load(f)
        for key in removed:
            del saved[key]
        with open(path, "w") as f:
            json.dump(saved, f, indent=2, sort_keys=True)
            f.write("\n")
        dropped = tempfile.mkdtemp()
        with open(os.path.join(dropped, "config.json"), "w") as f:
            json.dump({k: v for k, v in saved.items() if k not in KEYS}, f)
        expected["variants"][name] = {"why": why, "config_json": ids_in_file(saved),
                                      "autoconfig": ids_of_autoconfig(folder),
                                      "autoconfig_without_the_keys": ids_of_autoconfig(dropped)}
        shutil.rmtree(dropped)
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    print(json.dumps(expected, indent=2))


def check(meshtrain):
    with open(os.path.join(HERE, "expected.json")) as f:
        expected = json.load(f)
    failed = 0
    work = tempfile.mkdtemp()
    for name, want in expected["variants"].items():
        source = os.path.join(HERE, name)
        subprocess.run([meshtrain, "import-hf", source, "--out", f"{work}/{name}"], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([meshtrain, "export-hf", f"{work}/{name}", "--out", f"{work}/{name}.hf"], check=True,
                       stdout=subprocess.DEVNULL)
        with open(f"{work}/{name}.hf/config.json") as f:
            exported = ids_in_file(json.load(f))
        for what, found, wanted in (("config.json", exported, want["config_json"]),
                                    ("AutoConfig", ids_of_autoconfig(f"{work}/{name}.hf"), want["autoconfig"])):
            ok = found == wanted
            failed += not ok
            print(f"{name}: export's {what} {found} (source: {wanted}) {'PASS' if ok else 'FAIL'}")
    shutil.rmtree(work)
    print(f"{3 * 2 - failed} passed, {failed} failed")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["make", "check"])
    parser.add_argument("--meshtrain", default="build/meshtrain")
    args = parser.parse_args()
    if args.mode == "make":
        make()
        return 0
    return check(args.meshtrain)


if __name__ == "__main__":
    sys.exit(main())
