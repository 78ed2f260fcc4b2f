"""Copies of the shipped MFD drafter that load, run and stay lossless, but accept far less: the
damage users meet after converting or quantizing a drafter. Each copy keeps the shipped folder's
acceptance record, so the acceptance check compares it with what the drafter did before."""

import json
import shutil

import torch
from safetensors.torch import load_file, save_file

SHIPPED = "MFD-SmolLM2-135M"


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def _edit_matrices(folder, edit):
    """``edit(name, fp32 matrix) -> fp32 matrix`` on every floating 2-D weight, stored back in its dtype."""
    path = folder / "model.safetensors"
    weights = load_file(path)
    for name, tensor in weights.items():
        if tensor.is_floating_point() and tensor.dim() == 2:
            weights[name] = edit(name, tensor.float()).to(tensor.dtype)
    save_file(weights, path, metadata={"format": "pt"})


def add_noise(folder, scale=1.0):
    generator = torch.Generator().manual_seed(0)
    _edit_matrices(folder, lambda _, w: w + scale * w.std() * torch.randn(w.shape, generator=generator))


def reverse_taps(folder):
    taps = json.loads((folder / "config.json").read_text())["target_layer_ids"]
    _edit_config(folder, target_layer_ids=taps[::-1])


def shift_taps(folder, by=1):
    taps = json.loads((folder / "config.json").read_text())["target_layer_ids"]
    _edit_config(folder, target_layer_ids=[t + by for t in taps])


def other_mask_token(folder, token=198):  # '\n' to SmolLM2's tokenizer
    _edit_config(folder, mask_token_id=token)


def round_to_bits(folder, bits=3):
    """Each matrix rounded to 2^bits evenly spaced levels between its own minimum and maximum."""
    levels = 2**bits - 1

    def rounded(_, w):
        low, high = w.min(), w.max()
        step = (high - low) / levels
        return low + torch.round((w - low) / step) * step

    _edit_matrices(folder, rounded)


def zero_fc(folder):
    _edit_matrices(folder, lambda name, w: torch.zeros_like(w) if name == "fc.weight" else w)


USELESS = {
    "noise": add_noise,
    "taps-reversed": reverse_taps,
    "mask-198": other_mask_token,
    "3-bit": round_to_bits,
    "fc-zeroed": zero_fc,
}


def build(root, names=tuple(USELESS), source=None):
    """Copy the shipped drafter's loadable folder to ``root/NAME`` and damage each copy -> {name: folder}."""
    from mfd_hub.zoo.shipped import shipped_drafter_dir

    source = source or shipped_drafter_dir(SHIPPED)
    made = {}
    for name in names:
        folder = root / name
        shutil.copytree(source, folder)
        USELESS[name](folder)
        made[name] = folder
    return made
