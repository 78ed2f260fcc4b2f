"""``mfd-hub info``: what a drafter checkpoint is, read from its config and weight headers."""

import math
from pathlib import Path

import click

from ..cli import emit_json, examples


def describe_checkpoint(path):
    """A summary dict of a checkpoint folder (ours or z-lab's), without loading any weights."""
    from safetensors import safe_open

    from ..bundle import bundle_version_of
    from ..checkpoint import checkpoint_format, config_from_zlab, read_config_dict, resolve_checkpoint_dir
    from ..remote.configuration_mfd import DFlashConfig

    folder = resolve_checkpoint_dir(str(path))
    raw = read_config_dict(folder)
    fmt = checkpoint_format(raw)
    config = config_from_zlab(raw) if fmt == "zlab" else DFlashConfig.from_dict(raw)
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
        "format": "mfd-hub" if fmt == "mfd" else "z-lab DFlash",
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "layer_types": config.layer_types,
        "block_size": config.block_size,
        "num_modes": config.num_modes,
        "default_path": config.default_path,
        "target_layer_ids": config.target_layer_ids,
        "num_target_layers": config.num_target_layers,
        "mask_token_id": config.mask_token_id,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "target": config.target,
        "parameters": params,
        "weight_dtypes": sorted(dtypes),
        "bundle_version": bundle_version,
    }


@click.command(
    epilog=examples(
        "mfd-hub info ./MFD-Qwen3-8B",
        "mfd-hub info z-lab/Qwen3-8B-DFlash-b16 --json",
    )
)
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
def info(path, as_json):
    """Describe a drafter checkpoint (a folder or a Hub repo id): format, shape, modes, target."""
    summary = describe_checkpoint(Path(path) if Path(path).exists() else path)
    if as_json:
        emit_json(summary)
        return
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        click.echo(f"{key:<{width}}  {value}")
