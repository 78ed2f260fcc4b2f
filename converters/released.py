"""A released MFD drafter -> an mfd-hub drafter (``mfd-hub convert released``).

The MFD authors publish their drafters as DFlash-format checkpoints with K mode embeddings:
z-lab's config layout plus ``mode_embed`` [K, H], a linear ``mode_gate`` (H -> K, perhaps with a
bias) and, for MFD-D, a single-mode default path. They load only with the authors' own class.
This converter keeps every one of those tensors, bit for bit and in its stored dtype, under our
names (``mfd_hub.checkpoint_config.released_layout`` decides which is which), and writes an
``mfd_dflash`` checkpoint with the remote-code bundle. A tensor it cannot place is an error that
names it; ``--map OLD=NEW`` places it, ``--map OLD=-`` drops it, and the config's metadata
records both.
"""

import torch

from mfd_hub.checkpoint import save_draft
from mfd_hub.checkpoint_config import (
    DROP, GATE_WEIGHT, RELEASED_FORMAT, checkpoint_format, parse_name_map, read_config_dict, released_layout,
    tensor_shapes,
)
from mfd_hub.errors import MfdHubError, UsageError
from mfd_hub.locate import resolve_drafter
from mfd_hub.precision import dtype_name

from .common import build_drafter, record_conversion, stored_float_dtype


def _read_tensors(folder, names):
    """The named tensors of a folder's safetensors files, as stored (dtype and bits untouched)."""
    from safetensors import safe_open

    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            out.update({name: handle.get_tensor(name) for name in handle.keys() if name in names})
    return out


def plan_released(source, raw, shapes, mapping):
    """The ReleasedLayout of a released folder, checked against the drafter it becomes: every kept
    tensor has a place of the right shape, and every place is filled (a missing gate excepted)."""
    from mfd_hub.verify import FLOAT_DTYPES, _expected_tensors  # verify's list of what a drafter holds

    layout = released_layout(raw, shapes, mapping, source=source)
    expected = _expected_tensors(layout.config)
    wrong = sorted(f"{old}={new}" for old, new in mapping.items() if new != DROP and layout.names[old] not in expected)
    if wrong:
        raise UsageError(f"--map {wrong[0]}: {wrong[0].split('=', 1)[1]} is not a tensor of the converted drafter "
                         f"(such as {GATE_WEIGHT} or default_embed)")
    unknown = sorted(old for old, new in layout.names.items() if new not in expected)
    if unknown:
        raise MfdHubError(
            f"{source} holds tensor(s) that match no role of a DFlash/MFD drafter: {unknown}; name each with "
            f"--map OLD=NEW (NEW a drafter tensor such as {GATE_WEIGHT}) or drop it on purpose with --map OLD=-"
        )
    for old, new in sorted(layout.names.items()):
        (want_dtype, want_shape), (have_dtype, have_shape) = expected[new], shapes[old]
        if new != "default_embed" and have_shape != want_shape:
            raise MfdHubError(f"{source}: {old} has shape {list(have_shape)}, expected {list(want_shape)} for {new}")
        stored_kind = "float" if have_dtype in FLOAT_DTYPES else have_dtype
        want_kind = "float" if want_dtype.is_floating_point else {torch.int64: "I64", torch.bool: "BOOL"}[want_dtype]
        if stored_kind != want_kind:
            raise MfdHubError(f"{source}: {old} is stored as {have_dtype}, expected {want_kind} for {new}")
    placed = set(layout.names.values())
    missing = sorted(set(expected) - placed - {GATE_WEIGHT})
    if missing:
        raise MfdHubError(f"{source} lacks tensor(s) {missing[:4]}{' ...' if len(missing) > 4 else ''} (stored under "
                          "another name? --map OLD=NEW places it)")
    return layout


def convert_released(source, out, name_map=(), dtype=None, revision=None, max_shard_size="5GB", overwrite=False):
    """Convert the released MFD drafter at ``source`` (folder or Hub id) into an mfd-hub checkpoint.

    name_map: ``OLD=NEW`` strings (``OLD=-`` drops OLD). dtype: the output's weight dtype (None:
    the source's, so bf16 stays bf16). Returns a summary dict.
    """
    mapping = parse_name_map(name_map)
    folder = resolve_drafter(source, revision)
    raw = read_config_dict(folder)
    if checkpoint_format(raw) != "zlab":
        raise MfdHubError(f"{source} is already an mfd-hub checkpoint, not a {RELEASED_FORMAT} one")
    shapes = tensor_shapes(folder)
    layout = plan_released(source, raw, shapes, mapping)
    source_dtype = stored_float_dtype(folder, names=set(layout.names))  # what --map drops does not count
    stored = _read_tensors(folder, set(layout.names))
    state = {}
    for old, new in layout.names.items():
        tensor = stored[old]
        state[new] = tensor.reshape(-1) if new == "default_embed" else tensor  # [1, H] and [H] hold the same
    config = layout.config
    details = {}
    if GATE_WEIGHT not in state:
        # The gate is trained but unused by every tree; our drafters carry one, so an absent gate
        # becomes zeros (it then picks mode 0), and the metadata says so.
        state[GATE_WEIGHT] = torch.zeros(layout.num_modes, config.hidden_size, dtype=source_dtype)
        details["mode_gate"] = "absent in the source: zeros"
    renamed = {old: new for old, new in sorted(layout.names.items()) if old != new}
    record_conversion(
        config, "released", source, revision=revision, format=RELEASED_FORMAT, num_modes=layout.num_modes,
        default_path=layout.default_path_name, gate_bias=config.mode_gate_bias, k_fields=layout.k_fields,
        source_dtype=dtype_name(source_dtype), renamed=renamed, dropped=layout.dropped, **details,
    )
    out_dtype = dtype or source_dtype
    save_draft(build_drafter(config, state), out, dtype=out_dtype, max_shard_size=max_shard_size, overwrite=overwrite)
    return {
        "out": str(out), "source": str(source), "format": RELEASED_FORMAT, "num_modes": layout.num_modes,
        "default_path": layout.default_path_name, "gate_bias": config.mode_gate_bias, "renamed": renamed,
        "dropped": layout.dropped, "dtype": dtype_name(out_dtype), "source_dtype": dtype_name(source_dtype),
        "exact": out_dtype in (source_dtype, torch.float32), "parameters": sum(t.numel() for t in state.values()),
        **details,
    }
