"""z-lab DFlash drafter -> MFD drafter with K modes (``mfd-hub convert zlab``).

Every z-lab weight is carried over bit for bit (bf16 in, bf16 out); only ``mode_embed`` [K, H]
and ``mode_gate`` (H -> K) are new. The paper does not say how modes start when fine-tuning
from a z-lab base (DESIGN §2); we draw both from N(0, std^2) with a seeded generator, small
enough that every mode starts close to the base drafter yet distinct, so training can split
them. The draw (seed, std, generator) is recorded in ``mfd_metadata['mode_init']``: the same
arguments give the same checkpoint.
"""

import torch

from mfd_hub.checkpoint import load_draft, save_draft
from mfd_hub.checkpoint_config import checkpoint_format, read_config_dict, refuse_released
from mfd_hub.locate import resolve_drafter
from mfd_hub.errors import MfdHubError, UsageError

from mfd_hub.precision import dtype_name

from .common import build_drafter, copy_config, record_conversion, stored_float_dtype


def init_modes(num_modes, hidden_size, seed, mode_std, gate_std):
    """The seeded initial mode_embed [K, H] and mode_gate weight [K, H] (float32)."""
    generator = torch.Generator().manual_seed(seed)
    mode_embed = torch.randn(num_modes, hidden_size, generator=generator) * mode_std
    gate = torch.randn(num_modes, hidden_size, generator=generator) * gate_std
    return mode_embed, gate


def convert_zlab(source, out, num_modes=8, seed=0, mode_std=None, gate_std=None, dtype=torch.bfloat16,
                 max_shard_size="5GB", revision=None, target_name=None, overwrite=False):
    """Convert the z-lab DFlash drafter at ``source`` (folder or Hub id) into an MFD checkpoint.

    mode_std / gate_std default to the config's initializer_range (0.02). Returns a summary dict.
    """
    if num_modes < 0:
        raise UsageError("--modes must be >= 0")
    folder = resolve_drafter(source, revision)
    raw = read_config_dict(folder)
    if checkpoint_format(raw) != "zlab":
        raise MfdHubError(f"{source} is already an mfd-hub checkpoint, not a z-lab DFlash one")
    refuse_released(folder, source, raw)  # fresh random modes would replace its trained ones
    source_dtype = stored_float_dtype(folder)
    base = load_draft(folder, dtype=torch.float32)  # float32 holds bf16/fp16 values exactly
    state = base.state_dict()
    std = base.config.initializer_range
    mode_std, gate_std = std if mode_std is None else mode_std, std if gate_std is None else gate_std
    target = dict(base.config.target)
    if target_name:
        target["name_or_path"] = target_name
    config = copy_config(base.config, num_modes=num_modes, target=target)
    if num_modes:
        state["mode_embed"], state["mode_gate.weight"] = init_modes(num_modes, config.hidden_size, seed, mode_std, gate_std)
        config.mfd_metadata = {
            **config.mfd_metadata,
            "mode_init": {
                "mode_embed": f"normal(0, {mode_std})", "mode_gate": f"normal(0, {gate_std})", "seed": seed,
                "generator": "torch.Generator().manual_seed(seed); mode_embed then mode_gate, randn [K, H] each",
            },
        }
    record_conversion(config, "zlab", source, revision=revision, source_dtype=dtype_name(source_dtype))
    save_draft(build_drafter(config, state), out, dtype=dtype, max_shard_size=max_shard_size, overwrite=overwrite)
    return {
        "out": str(out), "source": str(source), "num_modes": num_modes, "seed": seed, "mode_std": mode_std,
        "gate_std": gate_std, "dtype": dtype_name(dtype), "source_dtype": dtype_name(source_dtype),
        "exact": dtype in (source_dtype, torch.float32), "parameters": sum(t.numel() for t in state.values()),
    }
