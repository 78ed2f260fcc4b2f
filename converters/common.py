"""What every converter shares: rebuilding a drafter from a config and a state dict, the dtype a
checkpoint's weights are stored in, and the provenance each conversion records."""

import torch

from mfd_hub.version import __version__
from mfd_hub.errors import MfdHubError, UsageError
from mfd_hub.precision import DTYPES
from mfd_hub.remote.modeling_mfd import DFlashDraftModel

_SAFETENSORS_FLOATS = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


def parse_dtype(name):
    """'bfloat16' / 'float16' / 'float32' (or None) -> torch dtype (or None)."""
    if name is None:
        return None
    if name not in DTYPES:
        raise UsageError(f"dtype must be one of {', '.join(sorted(DTYPES))}, not {name!r}")
    return DTYPES[name]


def build_drafter(config, state_dict):
    """A DFlashDraftModel holding exactly ``state_dict`` (every tensor, no random init, no copy)."""
    with torch.device("meta"):
        model = DFlashDraftModel(config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    if missing or unexpected:  # a converter bug, not a user error: say exactly what
        raise MfdHubError(f"internal: rebuilt drafter lacks {sorted(missing)} / has extra {sorted(unexpected)}")
    return model.eval()


def stored_float_dtype(folder, names=None):
    """The floating-point dtype a checkpoint folder's safetensors weights (those in ``names``,
    when given) are stored in."""
    from safetensors import safe_open

    found = set()
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            found.update(handle.get_slice(n).get_dtype() for n in handle.keys() if names is None or n in names)
    floats = sorted({_SAFETENSORS_FLOATS[d] for d in found if d in _SAFETENSORS_FLOATS}, key=str)
    if len(floats) != 1:
        raise MfdHubError(f"{folder}: weights stored in {sorted(found)}, not one floating-point dtype")
    return floats[0]


def record_conversion(config, kind, source, **details):
    """Append this conversion to ``config.mfd_metadata['conversions']`` (oldest first)."""
    metadata = dict(config.mfd_metadata or {})
    entry = {"kind": kind, "source": str(source), "mfd_hub": __version__, **details}
    metadata["conversions"] = [*metadata.get("conversions", []), entry]
    config.mfd_metadata = metadata
    return entry


def copy_config(config, **changes):
    """An independent copy of a DFlashConfig with ``changes`` applied."""
    data = config.to_dict()
    data.update(changes)
    return config.__class__.from_dict(data)
