"""Training checkpoints: the contract between ``mfd-hub train`` and ``mfd-hub convert train-ckpt``.

A training checkpoint is a folder (``RUN/checkpoints/step-000123/``) holding at least:

- ``config.json``: the DFlashConfig of the drafter being trained;
- ``model/``: a ``torch.distributed.checkpoint`` (DCP) of the model's state dict, with the same
  tensor names as ``DFlashDraftModel.state_dict()``; written by every rank together under
  FSDP (sharded), by the one process otherwise. DCP reshards on load, so a single process can
  read a checkpoint written by N ranks.

The trainer adds its own resumption state beside these (optimiser, scheduler, RNG, data
position); converters read only the two above.
"""

import json
import warnings
from pathlib import Path

import torch

from .errors import MfdHubError
from .remote.configuration_mfd import DFlashConfig
from .remote.modeling_mfd import DFlashDraftModel

MODEL_DIR = "model"
CONFIG_NAME = "config.json"


def is_train_checkpoint(folder):
    folder = Path(folder)
    return (folder / CONFIG_NAME).is_file() and (folder / MODEL_DIR / ".metadata").is_file()


def save_train_config(folder, config):
    """Write the drafter config of a training checkpoint (rank 0 only)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / CONFIG_NAME).write_text(config.to_json_string(use_diff=False), encoding="utf-8")


def save_model_state(folder, state_dict):
    """Write ``state_dict`` (plain tensors, or DTensors under FSDP) as the checkpoint's model/.

    Under torch.distributed every rank must call this with its own shards."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state_dict, checkpoint_id=str(Path(folder) / MODEL_DIR))


def load_train_checkpoint(folder, dtype=torch.float32):
    """A training checkpoint folder -> DFlashDraftModel with its trained weights (one process)."""
    import torch.distributed.checkpoint as dcp

    folder = Path(folder)
    if not is_train_checkpoint(folder):
        raise MfdHubError(f"{folder} is not a training checkpoint (needs {CONFIG_NAME} and {MODEL_DIR}/.metadata)")
    try:
        config = DFlashConfig.from_dict(json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8")))
    except (json.JSONDecodeError, ValueError, TypeError) as err:
        raise MfdHubError(f"{folder / CONFIG_NAME}: {err}") from None
    model = DFlashDraftModel(config).to(torch.float32)
    state = model.state_dict()
    try:
        with warnings.catch_warnings():  # reading in one process is the point, not a mistake
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=str(folder / MODEL_DIR))
    except Exception as err:  # DCP raises CheckpointException wrapping per-rank errors
        raise MfdHubError(f"cannot read {folder / MODEL_DIR}: {' '.join(str(err).split())[:300]}") from None
    model.load_state_dict(state)
    return model.to(dtype).eval()
