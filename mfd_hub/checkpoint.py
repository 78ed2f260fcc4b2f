"""Drafter checkpoints: read ours and z-lab's DFlash format, write ours.

Our format: ``config.json`` (model_type ``mfd_dflash`` with ``auto_map`` for AutoConfig and
AutoModel), safetensors weights (sharded with an index when large) and the flat remote-code
bundle, so that ``AutoModel.from_pretrained(dir, trust_remote_code=True)`` works with only torch
and transformers installed.

z-lab's format (DESIGN §3): ``model_type: qwen3``, ``architectures: [DFlashDraftModel]``,
``dflash_config: {mask_token_id, target_layer_ids}``, the same weight names. It loads into the
same class with ``num_modes = 0``. The MFD authors' released layout (z-lab's plus mode tensors)
is refused with the command that converts it (``mfd-hub convert released``).
"""

import json
from pathlib import Path

import torch

from .atomic import atomic_directory
from .bundle import AUTO_MAP, write_bundle
from .errors import MfdHubError
from .locate import resolve_drafter
from .checkpoint_config import CONFIG_NAME, checkpoint_format, config_from_zlab, read_config_dict, refuse_released
from .remote.configuration_mfd import DFlashConfig
from .remote.modeling_mfd import DFlashDraftModel

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"


def load_draft(path_or_repo, dtype=torch.float32, device=None, revision=None):
    """Load an MFD or z-lab DFlash drafter as ``DFlashDraftModel`` (z-lab: num_modes = 0).

    ``path_or_repo``: a folder, a Hub repo id or a shipped drafter's name (``resolve_drafter``).
    Missing or unexpected weights are an error, never silently initialised.
    """
    folder = resolve_drafter(path_or_repo, revision)
    raw = read_config_dict(folder)
    fmt = checkpoint_format(raw)
    if fmt == "zlab":
        refuse_released(folder, path_or_repo, raw)  # its modes would be "unexpected" weights: say what it is
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
