"""Training checkpoints: the contract between ``mfd-hub train`` and ``mfd-hub convert train-ckpt``.

A training checkpoint is a folder (``RUN/checkpoints/step-000123/``) holding at least:

- ``config.json``: the DFlashConfig of the drafter being trained;
- ``model/``: a ``torch.distributed.checkpoint`` (DCP) of the model's state dict, with the same
  tensor names as ``DFlashDraftModel.state_dict()``; written by every rank together under
  FSDP (sharded), by the one process otherwise. DCP reshards on load, so a single process can
  read a checkpoint written by N ranks.

The trainer adds its own resumption state beside these; converters read only the two above:

- ``optim/``: a DCP of the optimiser state (``get_optimizer_state_dict``, sharded like the model);
- ``rng/rank-N.pt``: each rank's RNG states (torch, CUDA, Python);
- ``trainer_state.json``: the global step (the data position: data order and anchors are a pure
  function of seed, epoch and record), the scheduler state, the recipe it was made with, and the
  mode-diagnostic counters.

A checkpoint is written into ``.step-N.partial`` by every rank and renamed into place by rank 0
when complete, so ``latest_checkpoint`` never sees a half-written one.
"""

import json
import os
import random
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from mfd_hub.errors import MfdHubError
from mfd_hub.remote.configuration_mfd import DFlashConfig
from mfd_hub.remote.modeling_mfd import DFlashDraftModel

MODEL_DIR = "model"
CONFIG_NAME = "config.json"
OPTIM_DIR = "optim"
RNG_DIR = "rng"
STATE_NAME = "trainer_state.json"


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
        with _single_process_quiet():  # reading in one process is the point, not a mistake
            dcp.load(state, checkpoint_id=str(folder / MODEL_DIR))
    except Exception as err:  # DCP raises CheckpointException wrapping per-rank errors
        raise MfdHubError(f"cannot read {folder / MODEL_DIR}: {' '.join(str(err).split())[:300]}") from None
    model.load_state_dict(state)
    return model.to(dtype).eval()


# -- resumable training checkpoints ----------------------------------------------------------
def latest_checkpoint(run_dir):
    found = sorted((run_dir / "checkpoints").glob("step-*"))
    found = [p for p in found if is_train_checkpoint(p) and (p / STATE_NAME).exists()]
    return found[-1] if found else None


def _rng_state():
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _drafter_names(state):
    """Training-module names (``drafter.x``, ``module.drafter.x``) -> DFlashDraftModel's (``x``)."""
    return {k.split("drafter.", 1)[1]: v for k, v in state.items()}


@contextmanager
def _single_process_quiet():
    # DCP warns on every save/load without a process group; one process is the intended case
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_checkpoint(run_dir, step, top, drafter_config, optimizer, scheduler, state, dist, keep_last):
    """``run_dir/checkpoints/step-N``: every rank writes its shards into a staging folder, rank 0
    renames it into place and keeps the newest ``keep_last``. ``top`` is the training module
    (the drafter under ``.drafter``, possibly FSDP/DDP-wrapped); ``dist`` has rank, main, barrier."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    folder = run_dir / "checkpoints" / f"step-{step:07d}"
    staging = folder.with_name(f".{folder.name}.partial")
    if dist.main:
        shutil.rmtree(staging, ignore_errors=True)
        (staging / RNG_DIR).mkdir(parents=True)
        save_train_config(staging, drafter_config)
    dist.barrier()
    with _single_process_quiet():
        save_model_state(staging, _drafter_names(get_model_state_dict(top)))
        dcp.save(get_optimizer_state_dict(top, optimizer), checkpoint_id=str(staging / OPTIM_DIR))
    torch.save(_rng_state(), staging / RNG_DIR / f"rank-{dist.rank}.pt")
    dist.barrier()
    if dist.main:
        state = {**state, "scheduler": scheduler.state_dict()}
        state["scheduler"].pop("lr_lambdas", None)
        (staging / STATE_NAME).write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(staging, folder)
        for old in sorted((run_dir / "checkpoints").glob("step-*"))[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return folder


def load_checkpoint(folder, top, optimizer, scheduler, dist):
    """Restore model, optimiser, scheduler and this rank's RNG from ``folder`` (any world size:
    DCP reshards); returns the trainer state dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    full = get_model_state_dict(top)
    named = _drafter_names(full)
    optim_state = get_optimizer_state_dict(top, optimizer)
    with _single_process_quiet():
        dcp.load(named, checkpoint_id=str(folder / MODEL_DIR))
        dcp.load(optim_state, checkpoint_id=str(folder / OPTIM_DIR))
    set_model_state_dict(top, {k: named[k.split("drafter.", 1)[1]] for k in full})
    set_optimizer_state_dict(top, optimizer, optim_state)
    state = json.loads((folder / STATE_NAME).read_text(encoding="utf-8"))
    scheduler.load_state_dict({**state["scheduler"], "lr_lambdas": [None]})
    rng_file = folder / RNG_DIR / f"rank-{dist.rank}.pt"
    if rng_file.exists():  # a resume with more ranks than before leaves the new ones seeded fresh
        _set_rng_state(torch.load(rng_file, weights_only=True))
    return state
