"""Drafter checkpoints: read ours and z-lab's DFlash format, write ours.

Our format: ``config.json`` (model_type ``mfd_dflash`` with ``auto_map`` for AutoConfig and
AutoModel), safetensors weights (sharded with an index when large) and the flat remote-code
bundle, so that ``AutoModel.from_pretrained(dir, trust_remote_code=True)`` works with only torch
and transformers installed.

z-lab's format (DESIGN §3): ``model_type: qwen3``, ``architectures: [DFlashDraftModel]``,
``dflash_config: {mask_token_id, target_layer_ids}``, the same weight names. It loads into the
same class with ``num_modes = 0``.
"""

import json
from pathlib import Path

import torch

from .atomic import atomic_directory
from .bundle import AUTO_MAP, write_bundle
from .errors import MfdHubError
from .locate import resolve_drafter
from .remote.configuration_mfd import MODEL_TYPE, DFlashConfig
from .remote.modeling_mfd import DFlashDraftModel

CONFIG_NAME = "config.json"
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
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


def load_draft(path_or_repo, dtype=torch.float32, device=None, revision=None):
    """Load an MFD or z-lab DFlash drafter as ``DFlashDraftModel`` (z-lab: num_modes = 0).

    ``path_or_repo``: a folder, a Hub repo id or a shipped drafter's name (``resolve_drafter``).
    Missing or unexpected weights are an error, never silently initialised.
    """
    folder = resolve_drafter(path_or_repo, revision)
    raw = read_config_dict(folder)
    fmt = checkpoint_format(raw)
    if fmt == "zlab":
        config = config_from_zlab(raw)
    else:
        try:
            config = DFlashConfig.from_pretrained(folder)
        except (ValueError, TypeError) as err:
            raise MfdHubError(f"{folder / CONFIG_NAME}: {err}") from None
    try:
        config.validate_drafter()
    except ValueError as err:
        raise MfdHubError(f"{folder / CONFIG_NAME}: {err}") from None
    if not (folder / SAFE_WEIGHTS).exists() and not (folder / SAFE_INDEX).exists():
        raise MfdHubError(f"{folder} has no safetensors weights ({SAFE_WEIGHTS} or {SAFE_INDEX})")
    model, info = DFlashDraftModel.from_pretrained(folder, config=config, dtype=dtype, output_loading_info=True)
    missing, unexpected = sorted(info.get("missing_keys", [])), sorted(info.get("unexpected_keys", []))
    if missing or unexpected:
        raise MfdHubError(f"{folder}: weights do not match the config (missing {missing}, unexpected {unexpected})")
    if device is not None:
        model = model.to(device)
    return model.eval()


def save_draft(model, out_dir, dtype=None, max_shard_size="5GB", overwrite=False, extra_files=None):
    """Write ``model`` as an mfd-hub checkpoint folder, atomically.

    Floating-point weights are cast to ``dtype`` when given (integer/bool buffers such as d2t/t2d
    keep theirs); shards follow huggingface_hub's size rule with an index when there are several.
    ``extra_files`` maps file names to text written beside the weights (a card, a report).
    """
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    state = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        state[name] = tensor.cpu().contiguous()
    split = split_torch_state_dict_into_shards(
        state, max_shard_size=max_shard_size, filename_pattern="model{suffix}.safetensors"
    )
    with atomic_directory(out_dir, overwrite=overwrite) as staging:
        for filename, names in split.filename_to_tensors.items():
            save_file({n: state[n] for n in names}, staging / filename, metadata={"format": "pt"})
        if split.is_sharded:
            index = {"metadata": {**split.metadata}, "weight_map": dict(sorted(split.tensor_to_filename.items()))}
            (staging / SAFE_INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        config = model.config.__class__.from_dict(model.config.to_dict())
        config.auto_map = dict(AUTO_MAP)
        config.architectures = ["DFlashDraftModel"]
        if dtype is not None:
            config.dtype = dtype
        config.save_pretrained(staging)
        write_bundle(staging)
        for name, text in (extra_files or {}).items():
            (staging / name).write_text(text, encoding="utf-8")
    return Path(out_dir)
