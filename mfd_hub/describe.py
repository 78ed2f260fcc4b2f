"""What a drafter checkpoint is, read from its config and weight headers (no weights loaded):
``mfd-hub info`` prints it and model cards state it."""

import math


def config_summary(config):
    """The shape and identity of a drafter config as a flat dict (what ``info`` and cards show)."""
    return {
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "layer_types": config.layer_types,
        "sliding_window": config.sliding_window,
        "block_size": config.block_size,
        "num_modes": config.num_modes,
        "default_path": config.default_path,
        "target_layer_ids": config.target_layer_ids,
        "num_target_layers": config.num_target_layers,
        "mask_token_id": config.mask_token_id,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "target": config.target,
    }


def checkpoint_config(folder):
    """(format, DFlashConfig) of a checkpoint folder, ours or z-lab's."""
    from .checkpoint_config import checkpoint_format, config_from_zlab, read_config_dict
    from .remote.configuration_mfd import DFlashConfig

    raw = read_config_dict(folder)
    fmt = checkpoint_format(raw)
    return fmt, (config_from_zlab(raw) if fmt == "zlab" else DFlashConfig.from_dict(raw))


def describe_checkpoint(path):
    """A summary dict of a drafter checkpoint (ours or z-lab's), without loading any weights.

    ``path``: a folder, a Hub repo id or a shipped drafter's name (``resolve_drafter``)."""
    from safetensors import safe_open

    from .bundle import bundle_version_of
    from .checkpoint_config import (
        DEFAULT_PATH_NAMES, RELEASED_FORMAT, convert_command, read_config_dict, released_mode_count, tensor_shapes,
    )
    from .locate import resolve_drafter

    folder = resolve_drafter(path)
    fmt, config = checkpoint_config(folder)
    format_name, extra = ("mfd-hub" if fmt == "mfd" else "z-lab DFlash"), {}
    if fmt == "zlab":
        shapes = tensor_shapes(folder)
        k = released_mode_count(read_config_dict(folder), shapes)
        if k is not None:  # z-lab's layout plus trained modes: say so, and how to make it ours
            config.num_modes, config.default_path = k, any(n in shapes for n in DEFAULT_PATH_NAMES)
            format_name, extra = RELEASED_FORMAT, {"convert": convert_command(path)}
    params, dtypes = 0, set()
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                view = handle.get_slice(name)
                params += math.prod(view.get_shape())
                dtypes.add(view.get_dtype())
    config_py = folder / "configuration_mfd.py"
    bundle_version = bundle_version_of(config_py.read_text(encoding="utf-8")) if config_py.exists() else None
    return {
        "path": str(folder),
        "format": format_name,
        **config_summary(config),
        "parameters": params,
        "weight_dtypes": sorted(dtypes),
        "bundle_version": bundle_version,
        **extra,
    }
