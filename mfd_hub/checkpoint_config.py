"""A drafter checkpoint's config.json, ours or z-lab's, read without loading torch's modeling code:
``info``, ``push`` and ``verify`` learn what a folder is (and refuse a bad one) at the cost of the
config classes alone; ``mfd_hub.checkpoint`` loads and writes the weights."""

import json
from pathlib import Path

from .errors import MfdHubError
from .remote.configuration_mfd import MODEL_TYPE, DFlashConfig

CONFIG_NAME = "config.json"
# z-lab fields this implementation does not model; a checkpoint that sets them is refused.
_ZLAB_UNSUPPORTED = {
    "output_multiplier": 1.0,
    "final_logit_softcapping": None,
    "conv_kernel_size": None,
    "selector_rank": None,
}


def read_config_dict(path):
    path = Path(path) / CONFIG_NAME
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MfdHubError(f"{path} not found: not a checkpoint folder") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise MfdHubError(f"{path} is not valid JSON ({err})") from None


def checkpoint_format(raw):
    """'mfd' for our checkpoints, 'zlab' for z-lab DFlash ones; raises for anything else."""
    if raw.get("model_type") == MODEL_TYPE:
        return "mfd"
    archs = raw.get("architectures") or []
    if "DFlashDraftModel" in archs and ("dflash_config" in raw or "target_layer_ids" in raw):
        return "zlab"
    if "DFlash2DraftModel" in archs:
        raise MfdHubError("DFlash 2 drafters (candidate selector) are not supported")
    raise MfdHubError(
        f"not a DFlash drafter checkpoint (model_type={raw.get('model_type')!r}, architectures={archs})"
    )


def config_from_zlab(raw):
    """A z-lab DFlash config.json (as a dict) -> DFlashConfig with num_modes = 0."""
    dflash = raw.get("dflash_config") or {}

    def value(name, default=None):
        return dflash.get(name, raw.get(name, default))

    for name, neutral in _ZLAB_UNSUPPORTED.items():
        if value(name, neutral) != neutral:
            raise MfdHubError(f"z-lab field {name}={value(name)!r} is not supported by mfd-hub")
    target_layer_ids = value("target_layer_ids")
    mask_token_id = value("mask_token_id")
    if target_layer_ids is None:
        raise MfdHubError("z-lab config lacks dflash_config.target_layer_ids")
    if mask_token_id is None:
        raise MfdHubError("z-lab config lacks dflash_config.mask_token_id")
    n_layers = int(raw["num_hidden_layers"])
    layer_types = raw.get("layer_types") or ["full_attention"] * n_layers
    # Qwen3Config drops the window unless use_sliding_window is set; the public code follows it.
    window = raw.get("sliding_window") if raw.get("use_sliding_window", False) else None
    is_causal = raw.get("is_causal")
    if is_causal is None:
        block_causal = [t == "sliding_attention" for t in layer_types]
    else:
        block_causal = [bool(is_causal)] * n_layers
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_theta = rope.get("rope_theta", raw.get("rope_theta", 1000000.0))
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise MfdHubError(f"z-lab drafter uses RoPE type {rope.get('rope_type')!r}; only default RoPE is supported")
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    num_target_layers = int(value("num_target_layers"))
    try:
        return DFlashConfig(
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim", hidden // heads),
            hidden_act=raw.get("hidden_act", "silu"),
            max_position_embeddings=raw.get("max_position_embeddings", 40960),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            attention_bias=raw.get("attention_bias", False),
            layer_types=layer_types,
            sliding_window=window,
            block_causal=block_causal,
            block_size=value("block_size", 16),
            num_target_layers=num_target_layers,
            target_layer_ids=target_layer_ids,
            mask_token_id=mask_token_id,
            input_embedding_scale=value("input_embedding_scale", 1.0),
            num_modes=0,
            target={"hidden_size": hidden, "vocab_size": raw["vocab_size"], "num_hidden_layers": num_target_layers},
            mfd_metadata={"source_format": "z-lab DFlash"},
        )
    except KeyError as err:
        raise MfdHubError(f"z-lab config lacks field {err.args[0]!r}") from None
