"""MFD drafter -> MFD-D drafter (``mfd-hub convert mfd-d``).

MFD-D is the same drafter plus a single-mode default path, ``default_embed`` [H] (K + 1 extra
vectors in all): a serving engine runs the mixture tree over all K modes at small batch sizes
and the one default path from a few requests on (paper §MFD-D). The modes are kept. The
default path starts from one of:

- ``zeros``: the plain DFlash path (no vector added), what a z-lab base drafts;
- ``mode:K``: a copy of mode K (e.g. the mode the gate picks most often on your data);
- ``mean``: the mean of the modes.

The choice is recorded in ``mfd_metadata['default_path_init']``; training then refines it.
"""

import torch

from mfd_hub.checkpoint import load_draft, save_draft
from mfd_hub.checkpoint_config import refuse_released
from mfd_hub.locate import resolve_drafter
from mfd_hub.errors import MfdHubError, UsageError

from mfd_hub.precision import dtype_name

from .common import build_drafter, copy_config, record_conversion, stored_float_dtype


def parse_default_from(text):
    """'zeros' | 'mean' | 'mode:K' (or a bare K) -> ('zeros'|'mean'|'mode', K or None)."""
    text = str(text).strip()
    if text in ("zeros", "mean"):
        return text, None
    index = text.removeprefix("mode:")
    if index.isdigit():
        return "mode", int(index)
    raise UsageError(f"--default-from must be 'zeros', 'mean' or 'mode:K', not {text!r}")


def default_vector(drafter, kind, index):
    """The initial default_embed [H] (float32) for the chosen start."""
    k = drafter.config.num_modes
    if kind == "zeros":
        return torch.zeros(drafter.config.hidden_size)
    if k == 0:
        raise MfdHubError(f"the drafter has no modes: --default-from {kind} needs an MFD drafter (use zeros)")
    if kind == "mean":
        return drafter.mode_embed.detach().float().mean(0)
    if not 0 <= index < k:
        raise UsageError(f"mode {index} does not exist: the drafter has modes 0..{k - 1}")
    return drafter.mode_embed.detach().float()[index].clone()


def convert_mfd_d(source, out, default_from="zeros", dtype=None, max_shard_size="5GB", overwrite=False):
    """Write ``source``'s drafter with a default path (MFD-D) at ``out``; returns a summary dict."""
    kind, index = parse_default_from(default_from)
    folder = resolve_drafter(source)
    refuse_released(folder, source)  # named as the user wrote it, not as its resolved folder
    drafter = load_draft(folder, dtype=torch.float32)
    if drafter.config.default_path:
        raise MfdHubError(f"{source} is already an MFD-D drafter (it has a default path)")
    state = dict(drafter.state_dict())
    state["default_embed"] = default_vector(drafter, kind, index)
    choice = f"mode {index}" if kind == "mode" else kind
    config = copy_config(drafter.config, default_path=True)
    config.mfd_metadata = {**config.mfd_metadata, "default_path_init": choice}
    record_conversion(config, "mfd-d", source, default_path_init=choice)
    out_dtype = dtype or stored_float_dtype(folder)
    save_draft(build_drafter(config, state), out, dtype=out_dtype, max_shard_size=max_shard_size, overwrite=overwrite)
    return {"out": str(out), "source": str(source), "default_path_init": choice, "num_modes": config.num_modes,
            "dtype": dtype_name(out_dtype)}
