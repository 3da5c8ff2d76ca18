#!/usr/bin/env python3
# A checkpoint's tensors as numpy float32 arrays with their global shapes, per layer under their canonical
# names ("decoder/layers_3/mlp/wo/kernel", moments "adam_m/..." and "adam_v/..."), whatever its format:
# format 3's index.json and per-rank shards (each tensor assembled from its chunks), or formats 1 and 2's
# model.safetensors and optimizer.safetensors; a stacked tensor (scan_layers) split into its layers. The multi-rank
# tests compare checkpoints saved on different meshes and in either layout through it.
# As a tool: checkpoint_tensors.py --same CKPT_A CKPT_B   exits 1 unless both hold the same tensors, bitwise.
import json, struct, sys
import numpy as np


def _safetensors(path):
    with open(path, "rb") as file:
        size = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(size))
        data = file.read()
    return {name: np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]], np.float32).reshape(e["shape"])
            for name, e in header.items() if name != "__metadata__"}


def tensors(checkpoint, moments=False):
    """name -> array: the parameters, or (moments=True) the Adam moments."""
    metadata = json.load(open(f"{checkpoint}/metadata.json"))
    if "index.json" in metadata["files"]:
        index = json.load(open(f"{checkpoint}/index.json"))
        raw = {}
        for name, tensor in index["tensors"].items():
            if name.startswith(("adam_m/", "adam_v/")) != moments:
                continue
            whole = np.empty(tensor["dims"], np.float32)
            for chunk in tensor["chunks"]:
                count = int(np.prod(chunk["dims"], dtype=np.int64))
                with open(f"{checkpoint}/{chunk['file']}", "rb") as file:
                    file.seek(chunk["offset"])
                    block = np.frombuffer(file.read(4 * count), np.float32).reshape(chunk["dims"])
                whole[tuple(slice(s, s + d) for s, d in zip(chunk["start"], chunk["dims"]))] = block
            raw[name] = whole
    else:
        raw = _safetensors(f"{checkpoint}/{'optimizer' if moments else 'model'}.safetensors")
    if not metadata.get("scan_layers", False):
        return raw
    # Stacked: "[adam_m/]decoder/layers/<rest>" [.., L at param_scan_axis, ..] is layer i's
    # "[adam_m/]decoder/layers_<i>/<rest>" (a one-group decoder: the layers of these tests' models).
    per_layer = {}
    for name, tensor in raw.items():
        if "decoder/layers/" not in name:
            per_layer[name] = tensor
            continue
        axis = min(metadata["param_scan_axis"], tensor.ndim - 1)
        for i in range(tensor.shape[axis]):
            per_layer[name.replace("decoder/layers/", f"decoder/layers_{i}/", 1)] = np.take(tensor, i, axis)
    return per_layer


def same(a, b):
    """Both checkpoints hold the same parameters and moments, bitwise; prints the first difference."""
    for moments in (False, True):
        ta, tb = tensors(a, moments), tensors(b, moments)
        if ta.keys() != tb.keys():
            print(f"different tensors: {sorted(set(ta) ^ set(tb))[:5]}")
            return False
        for name in ta:
            if ta[name].shape != tb[name].shape or ta[name].tobytes() != tb[name].tobytes():
                print(f"{name}: differs between {a} and {b}")
                return False
    return True


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "--same":
        sys.exit("usage: checkpoint_tensors.py --same CKPT_A CKPT_B")
    sys.exit(0 if same(sys.argv[2], sys.argv[3]) else 1)
