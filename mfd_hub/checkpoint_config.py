"""A drafter checkpoint's config.json, ours or z-lab's, read without loading torch's modeling code:
``info``, ``push`` and ``verify`` learn what a folder is (and refuse a bad one) at the cost of the
config classes alone; ``mfd_hub.checkpoint`` loads and writes the weights.

It also recognises the layout the MFD authors release their drafters in: z-lab's config plus the
mode tensors (``mode_embed`` [K, H], a ``mode_gate`` and, for MFD-D, a default-path vector),
which only the authors' own class loads. Such a folder is read from its config and safetensors
headers (``released_layout``); ``mfd-hub convert released`` turns it into ours.
"""

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from .errors import MfdHubError, UsageError
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


# ---- the released MFD layout ----------------------------------------------------------------------
RELEASED_FORMAT = "released MFD (DFlash format with modes)"
# The authors do not publish which config field states K: every plausible spelling, at the
# top level or inside one of these sections, is cross-checked against mode_embed's shape.
K_FIELDS = ("num_modes", "num_mode_embeddings", "n_modes", "mfd_num_modes", "num_futures", "K")
K_SECTIONS = ("dflash_config", "mfd_config")
# The mode tensors' released names -> ours. The default path's name is not public either.
MODE_EMBED_NAMES = ("mode_embed", "mode_embed.weight")
GATE_WEIGHT, GATE_BIAS = "mode_gate.weight", "mode_gate.bias"
DEFAULT_PATH_NAMES = ("default_embed", "default_mode_embed", "default_mode_embed.weight", "default_path_embed",
                      "mode_default", "default_mode")
DROP = "-"  # --map OLD=- drops OLD on purpose
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # owner/name, in the characters the Hub allows


def tensor_shapes(folder):
    """{tensor name: (safetensors dtype, shape)} over a folder's .safetensors headers (no weights
    read, no torch; a file whose header does not parse is left to the loaders, which report it)."""
    from safetensors import SafetensorError, safe_open

    shapes = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="numpy") as handle:
                for name in handle.keys():
                    view = handle.get_slice(name)
                    shapes[name] = (view.get_dtype(), tuple(view.get_shape()))
        except (SafetensorError, OSError):
            continue
    return shapes


def released_mode_count(raw, shapes):
    """K when ``raw`` (a config dict) and ``shapes`` are a released MFD drafter's, else None."""
    if raw.get("model_type") == MODEL_TYPE:
        return None
    name = next((n for n in MODE_EMBED_NAMES if n in shapes), None)
    if name is None:
        return None
    try:
        if checkpoint_format(raw) != "zlab":
            return None
    except MfdHubError:
        return None
    shape = shapes[name][1]
    return int(shape[0]) if shape else 0


def convert_command(spec):
    """The command that converts the released drafter the user named ``spec``, written with the
    user's own spelling (a Hub id converts into ./NAME-mfd)."""
    spec = str(spec).rstrip("/") or str(spec)
    out = f"./{spec.split('/')[-1]}-mfd" if _looks_like_hub_id(spec) else f"{spec}-mfd"
    return f"mfd-hub convert released {shlex.quote(spec)} {shlex.quote(out)}"


def _looks_like_hub_id(spec):
    return bool(_HUB_ID.match(spec)) and not spec.startswith(".") and not Path(spec).exists()


def released_refusal(raw, shapes, spec):
    """The one line that refuses a released MFD folder where mfd-hub needs its own format (None
    when the folder is not one)."""
    k = released_mode_count(raw, shapes)
    if k is None:
        return None
    kind = "MFD-D" if any(n in shapes for n in DEFAULT_PATH_NAMES) else "MFD"
    return (f"{spec} is a released {kind} drafter (DFlash format with K={k} mode embeddings), which mfd-hub "
            f"loads only once converted: {convert_command(spec)}")


def refuse_released(folder, spec, raw=None):
    """Raise the refusal line when ``folder`` (named ``spec`` by the user) is a released MFD drafter."""
    raw = read_config_dict(folder) if raw is None else raw
    line = released_refusal(raw, tensor_shapes(folder), spec)
    if line:
        raise MfdHubError(line)


@dataclass
class ReleasedLayout:
    """How a released folder's tensors become ours: ``names`` maps each tensor it keeps (source
    name -> our name), ``dropped`` lists those ``--map OLD=-`` drops."""

    num_modes: int
    config: object  # the DFlashConfig of the converted drafter
    names: dict
    dropped: list = field(default_factory=list)
    default_path_name: str = None
    k_fields: dict = field(default_factory=dict)  # where the config states K, and what it says


def parse_name_map(items):
    """``--map OLD=NEW`` values -> {OLD: NEW} (NEW ``-`` drops OLD)."""
    mapping = {}
    for item in items or ():
        old, sep, new = str(item).partition("=")
        old, new = old.strip(), new.strip()
        if not sep or not old or not new:
            raise UsageError(f"--map takes OLD=NEW (or OLD=- to drop OLD), not {item!r}")
        if old in mapping:
            raise UsageError(f"--map names {old} twice")
        mapping[old] = new
    return mapping


def _stated_k(raw):
    found = {}
    for section in (None, *K_SECTIONS):
        holder = raw if section is None else raw.get(section)
        if not isinstance(holder, dict):
            continue
        for name in K_FIELDS:
            if holder.get(name) is not None:
                found[name if section is None else f"{section}.{name}"] = holder[name]
    return found


def released_layout(raw, shapes, mapping=None, source="the checkpoint"):
    """Read a released MFD folder (config dict + tensor shapes) -> ReleasedLayout, or raise one
    MfdHubError line for the first thing that does not fit: K stated otherwise by the config, a
    mode tensor of the wrong shape, a --map naming a tensor that is not there. Tensors outside the
    mode roles keep their names; the caller checks those against the drafter's own."""
    mapping = dict(mapping or {})
    absent = sorted(old for old in mapping if old not in shapes)
    if absent:
        raise UsageError(f"--map names {absent} but {source} holds no such tensor")
    renamed = {old: new for old, new in mapping.items() if new != DROP}
    dropped = sorted(old for old, new in mapping.items() if new == DROP)
    names = {}
    for name in shapes:
        if name in dropped:
            continue
        new = renamed.get(name, name)
        if new in MODE_EMBED_NAMES:
            new = "mode_embed"
        elif new in DEFAULT_PATH_NAMES:
            new = "default_embed"
        names[name] = new
    targets = list(names.values())
    twice = sorted({n for n in targets if targets.count(n) > 1})
    if twice:
        sources = sorted(old for old, new in names.items() if new in twice)
        raise MfdHubError(f"{source}: {sources} would all become {twice}; keep one (--map OLD=- drops a tensor)")
    by_role = {new: old for old, new in names.items()}
    if "mode_embed" not in by_role:
        raise MfdHubError(f"{source} has no mode_embed: not a {RELEASED_FORMAT} drafter")
    config = config_from_zlab(raw)
    hidden = config.hidden_size
    embed_shape = shapes[by_role["mode_embed"]][1]
    if len(embed_shape) != 2 or embed_shape[1] != hidden or embed_shape[0] < 1:
        raise MfdHubError(f"{source}: {by_role['mode_embed']} has shape {list(embed_shape)}, expected [K, {hidden}]")
    k = int(embed_shape[0])
    stated = _stated_k(raw)
    disagree = {where: value for where, value in stated.items() if str(value).strip() != str(k)}  # "8" states 8 too
    if disagree:
        where, value = next(iter(disagree.items()))
        raise MfdHubError(f"{source}: config field {where} says K={value!r}, but {by_role['mode_embed']} holds "
                          f"{k} modes {list(embed_shape)}")
    expected = {GATE_WEIGHT: (k, hidden), GATE_BIAS: (k,)}
    for role, want in expected.items():
        if role in by_role and shapes[by_role[role]][1] != want:
            raise MfdHubError(f"{source}: {by_role[role]} has shape {list(shapes[by_role[role]][1])}, expected "
                              f"{list(want)} for K={k} modes of width {hidden}")
    if GATE_BIAS in by_role and GATE_WEIGHT not in by_role:
        raise MfdHubError(f"{source} has {by_role[GATE_BIAS]} but no {GATE_WEIGHT}")
    default_name = by_role.get("default_embed")
    if default_name is not None and shapes[default_name][1] not in ((hidden,), (1, hidden)):
        raise MfdHubError(f"{source}: {default_name} (the default path) has shape "
                          f"{list(shapes[default_name][1])}, expected [{hidden}]")
    if "d2t" in by_role:  # a reduced draft vocabulary (d2t / t2d, DESIGN §3): its size is d2t's length
        d2t_shape = shapes[by_role["d2t"]][1]
        if len(d2t_shape) != 1 or not 0 < d2t_shape[0] <= config.vocab_size:
            raise MfdHubError(f"{source}: {by_role['d2t']} has shape {list(d2t_shape)}, expected [N] with N <= "
                              f"{config.vocab_size}")
        config.draft_vocab_size = int(d2t_shape[0])
    config.num_modes = k
    config.default_path = default_name is not None
    config.mode_gate_bias = GATE_BIAS in by_role
    config.mfd_metadata = {"source_format": RELEASED_FORMAT}
    return ReleasedLayout(num_modes=k, config=config, names=names, dropped=dropped, default_path_name=default_name,
                          k_fields=stated)
