"""Training checkpoint -> Hub-ready drafter (``mfd-hub convert train-ckpt``).

Reads the contract of ``mfd_hub.recipes.train_checkpoint``: ``config.json`` + a torch.distributed
checkpoint ``model/``, written by one process or sharded by several ranks (DCP reassembles the
full tensors in one process). DCP's ``.metadata`` file is a pickle, so convert only training
checkpoints you (or your trainer) wrote; ``mfd-hub verify`` never reads them.
"""

import re
from pathlib import Path

import torch

from mfd_hub.checkpoint import save_draft
from mfd_hub.errors import MfdHubError
from mfd_hub.recipes.train_checkpoint import MODEL_DIR, is_train_checkpoint, load_train_checkpoint

from mfd_hub.precision import dtype_name

from .common import record_conversion

_STEP = re.compile(r"^step-(\d+)$")


def find_train_checkpoint(path):
    """``path`` itself when it is a training checkpoint, else the newest ``checkpoints/step-N``
    (or ``step-N``) inside it: a run folder names its last checkpoint."""
    path = Path(path)
    if is_train_checkpoint(path):
        return path
    for folder in (path / "checkpoints", path):
        steps = [(int(m.group(1)), p) for p in folder.glob("step-*") if (m := _STEP.match(p.name))]
        steps = [(n, p) for n, p in steps if is_train_checkpoint(p)]
        if steps:
            return max(steps)[1]
    raise MfdHubError(f"{path} is neither a training checkpoint (config.json + {MODEL_DIR}/.metadata) nor a run folder holding one")


def stored_dcp_dtype(folder):
    """The floating-point dtype the checkpoint's model tensors were saved in."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(Path(folder) / MODEL_DIR)).read_metadata()
    dtypes = {
        getattr(entry.properties, "dtype", None)
        for entry in metadata.state_dict_metadata.values()
        if getattr(entry, "properties", None) is not None
    }
    floats = sorted((d for d in dtypes if d is not None and d.is_floating_point), key=str)
    return floats[0] if len(floats) == 1 else torch.float32


def convert_train_checkpoint(source, out, dtype=None, max_shard_size="5GB", overwrite=False):
    """Write the drafter of training checkpoint ``source`` as a Hub-ready checkpoint at ``out``.

    dtype: the weights' dtype in the output; None keeps the dtype the trainer saved.
    """
    folder = find_train_checkpoint(source)
    saved_dtype = stored_dcp_dtype(folder)
    model = load_train_checkpoint(folder, dtype=torch.float32)
    try:
        model.config.validate_drafter()
    except ValueError as err:
        raise MfdHubError(f"{folder / 'config.json'}: {err}") from None
    out_dtype = dtype or saved_dtype
    record_conversion(model.config, "train-ckpt", folder, saved_dtype=dtype_name(saved_dtype))
    save_draft(model, out, dtype=out_dtype, max_shard_size=max_shard_size, overwrite=overwrite)
    return {
        "out": str(out), "source": str(folder), "saved_dtype": dtype_name(saved_dtype), "dtype": dtype_name(out_dtype),
        "num_modes": model.config.num_modes, "parameters": sum(p.numel() for p in model.parameters()),
    }
