"""Training recipes: a YAML file per run, read into typed sections and validated.

A recipe has the sections ``drafter``, ``data``, ``loss``, ``train`` and ``output`` plus the
top-level ``name`` and ``target`` (see the published recipes under ``recipes/``, installed as
``mfd_hub.recipes``). Unknown keys, wrong types and out-of-range values are one-line errors that
name the key. ``KEY=VALUE`` overrides (``train.lr=2e-4``) are parsed as YAML scalars.
"""

import dataclasses
import difflib
import importlib.resources
import inspect
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mfd_hub.errors import MfdHubError, UsageError
from mfd_hub.remote.configuration_mfd import DFlashConfig
from mfd_hub.recipes.losses import LOSS_TYPES

SCRATCH = "scratch"
# DFlashConfig fields a scratch recipe may not put in drafter.config: the recipe or the target sets them
SET_ELSEWHERE = ("num_modes", "default_path", "draft_vocab_size", "block_size", "mask_token_id", "target_layer_ids",
                 "vocab_size", "hidden_size", "num_target_layers", "target")


@dataclass
class DrafterSection:
    base: str = ""  # z-lab or MFD checkpoint (folder, Hub id or shipped drafter's name), or "scratch"
    num_modes: int = 0  # K; 0 trains a single-mode (DFlash / D-PACE) drafter
    default_path: bool = False  # MFD-D: also train a single-mode default path
    mode_init_std: float = 0.02  # new mode embeddings ~ N(0, std^2): "small random vectors" (DESIGN §2)
    # "normal": N(0, mode_init_std^2); "token_scale": random directions of norm mode_init_scale x the mask
    # token embedding's norm (the vector they are added to: small random vectors barely move the block)
    mode_init: str = "normal"
    mode_init_scale: float = 1.0
    draft_vocab_size: typing.Optional[int] = None  # at most this many most frequent response tokens; None = all
    train_lm_head: bool = False  # train the draft-vocabulary head (it starts as the target's rows)
    target_layer_ids: typing.Optional[list] = None  # scratch: the taps; a base: checked against it
    mask_token_id: typing.Optional[int] = None  # scratch: required; a base: checked against it
    block_size: typing.Optional[int] = None  # scratch: default 16; a base: checked against it (see resize_block)
    # a base's block may differ from block_size: the drafter is rebuilt to draft blocks of block_size (no
    # weight depends on the block's length; positions beyond the base's own start untrained)
    resize_block: bool = False
    config: dict = field(default_factory=dict)  # scratch: DFlashConfig fields (layers, heads, ...)


@dataclass
class RegenSection:
    """How the training responses were made (provenance; ``mfd-hub regen`` options)."""

    prompts: typing.Optional[str] = None
    num_prompts: typing.Optional[int] = None
    thinking: bool = False
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    max_new_tokens: int = 2048


@dataclass
class DataSection:
    train: str = ""  # regen output (JSON Lines)
    limit: typing.Optional[int] = None  # only the first N usable records (data-scaling runs on one regen output)
    features: str = "cache"  # "cache": tap features computed once into a store; "online": every step
    features_dir: typing.Optional[str] = None  # default: <train>.features/<target>-<taps>-<dtype>-<length>
    features_dtype: str = "bfloat16"
    max_length: int = 3072
    extract_batch_tokens: int = 16384
    regen: RegenSection = field(default_factory=RegenSection)


@dataclass
class LossSection:
    type: str = "mfd"  # dflash | dpace | mfd
    gamma: float = 7.0  # dflash: exp(-(k-1)/gamma)
    alpha: float = 0.5  # dpace / mfd smoothing
    winner_weight: float = 0.9  # mfd: the winner's weight; the others share the rest
    gate_weight: float = 0.1  # mfd: gate cross-entropy weight
    # mfd: what the gate reads: "shared" (the drafter's context feature, so the gate's loss also trains the
    # context projection) or "detached" (the same feature without gradient: the gate's loss trains only the gate)
    gate_input: str = "shared"
    default_weight: float = 1.0  # MFD-D: weight of the default path's D-PACE loss


@dataclass
class TrainSection:
    epochs: int = 3
    max_steps: typing.Optional[int] = None  # overrides epochs (the schedule follows it)
    batch_size: int = 36  # sequences per optimiser step, over all ranks
    micro_batch_size: int = 1  # sequences per forward on one rank (gradient accumulation)
    anchors_per_sequence: int = 64
    lr: float = 1e-4
    min_lr_ratio: float = 0.0
    warmup_ratio: float = 0.04
    schedule: str = "cosine"  # cosine | constant
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    seed: int = 0
    precision: str = "auto"  # auto (bf16 autocast on GPU and on CPUs with native bf16, else fp32) | bf16 | fp32
    parallel: str = "fsdp"  # fsdp | ddp (with several ranks)
    head_chunk: int = 0  # LM-head rows per chunk; 0 = all at once (fast, more memory)
    mode_lr_scale: float = 1.0  # learning rate of mode_embed and mode_gate, as a multiple of lr


@dataclass
class OutputSection:
    dir: typing.Optional[str] = None  # default runs/<name>
    save_every: int = 0  # steps between checkpoints; 0 = only at the end
    keep_last: int = 2
    log_every: int = 1
    export: bool = True  # write the trained drafter as an mfd-hub checkpoint (<dir>/final)
    export_dtype: str = "bfloat16"


@dataclass
class Recipe:
    name: str = ""
    target: str = ""
    description: str = ""
    drafter: DrafterSection = field(default_factory=DrafterSection)
    data: DataSection = field(default_factory=DataSection)
    loss: LossSection = field(default_factory=LossSection)
    train: TrainSection = field(default_factory=TrainSection)
    output: OutputSection = field(default_factory=OutputSection)
    source: str = field(default="", metadata={"internal": True})

    @property
    def run_dir(self):
        return Path(self.output.dir or Path("runs") / self.name)

    def to_dict(self):
        raw = dataclasses.asdict(self)
        raw.pop("source")
        return raw


REQUIRED = ("name", "target", "drafter.base", "data.train")
CHOICES = {
    "loss.type": LOSS_TYPES,
    "loss.gate_input": ("shared", "detached"),
    "drafter.mode_init": ("normal", "token_scale"),
    "data.features": ("cache", "online"),
    "data.features_dtype": ("bfloat16", "float16", "float32"),
    "train.schedule": ("cosine", "constant"),
    "train.precision": ("auto", "bf16", "fp32"),
    "train.parallel": ("fsdp", "ddp"),
    "output.export_dtype": ("bfloat16", "float32"),
}
POSITIVE = ("train.epochs", "train.batch_size", "train.micro_batch_size", "train.anchors_per_sequence", "train.lr",
            "loss.gamma", "data.max_length", "data.extract_batch_tokens", "output.keep_last", "output.log_every",
            "train.max_steps", "drafter.draft_vocab_size", "drafter.block_size", "data.limit", "train.mode_lr_scale",
            "drafter.mode_init_scale")
UNIT_INTERVAL = ("loss.alpha", "loss.winner_weight", "train.warmup_ratio", "train.min_lr_ratio")
NON_NEGATIVE = ("loss.gate_weight", "loss.default_weight", "train.grad_clip", "train.weight_decay", "train.eps",
                "drafter.mode_init_std", "drafter.num_modes", "output.save_every", "train.head_chunk")


def _as_float(value):
    """Numbers as floats; also "1e-4", which YAML 1.1 (PyYAML) reads as a string."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _type_ok(value, hint):
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint):
    if typing.get_origin(hint) is typing.Union:
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    return {type(None): "null", float: "a number", int: "an integer", bool: "true/false", str: "a string",
            list: "a list", dict: "a mapping"}.get(hint, getattr(hint, "__name__", str(hint)))


def _build(cls, raw, where, origin):
    """A dataclass section from a mapping, refusing unknown keys and wrong types."""
    if not isinstance(raw, dict):
        raise MfdHubError(f"{origin}: {where or 'the recipe'} must be a mapping, not {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    values = {}
    for key, value in raw.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            near = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean {(where + '.' if where else '') + near[0]}?)" if near else ""
            raise MfdHubError(f"{origin}: unknown key {path}{hint}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            values[key] = _build(hint, value if value is not None else {}, path, origin)
            continue
        if hint is float or hint == typing.Optional[float]:
            value = _as_float(value)
        if not _type_ok(value, hint):
            raise MfdHubError(f"{origin}: {path} must be {_type_name(hint)}, not {value!r}")
        values[key] = value
    return cls(**values)


def _get(recipe, path):
    node = recipe
    for part in path.split("."):
        node = getattr(node, part)
    return node


def recipe_problems(recipe):
    """Every inconsistency in a recipe, as readable lines (empty when sound)."""
    problems = [f"{path} is required" for path in REQUIRED if not _get(recipe, path)]
    for path, choices in CHOICES.items():
        if _get(recipe, path) not in choices:
            problems.append(f"{path} must be one of {', '.join(choices)}, not {_get(recipe, path)!r}")
    for path in POSITIVE:
        value = _get(recipe, path)
        if value is not None and value <= 0:
            problems.append(f"{path} must be > 0, not {value!r}")
    for path in UNIT_INTERVAL:
        if not 0 <= _get(recipe, path) <= 1:
            problems.append(f"{path} must be in [0, 1], not {_get(recipe, path)!r}")
    for path in NON_NEGATIVE:
        if _get(recipe, path) < 0:
            problems.append(f"{path} must be >= 0, not {_get(recipe, path)!r}")
    d, loss, t = recipe.drafter, recipe.loss, recipe.train
    if loss.type == "mfd" and d.num_modes < 2:
        problems.append(f"loss.type mfd needs drafter.num_modes >= 2, not {d.num_modes}")
    if loss.type != "mfd" and d.num_modes:
        problems.append(f"loss.type {loss.type} trains a single-mode drafter: set drafter.num_modes to 0")
    if d.default_path and loss.type != "mfd":
        problems.append("drafter.default_path (MFD-D) needs loss.type mfd")
    if t.batch_size % t.micro_batch_size:
        problems.append(f"train.batch_size {t.batch_size} is not a multiple of "
                        f"train.micro_batch_size {t.micro_batch_size}")
    if len(t.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in t.betas):
        problems.append(f"train.betas must be two numbers in [0, 1), not {t.betas!r}")
    if d.target_layer_ids is not None and not all(isinstance(i, int) and i >= 0 for i in d.target_layer_ids):
        problems.append(f"drafter.target_layer_ids must be layer indices, not {d.target_layer_ids!r}")
    if d.base == SCRATCH:
        if d.mask_token_id is None:
            problems.append("drafter.mask_token_id is required for a scratch drafter")
        if not d.target_layer_ids:
            problems.append("drafter.target_layer_ids is required for a scratch drafter")
        known = set(inspect.signature(DFlashConfig.__init__).parameters) - {"self", "kwargs"}
        for key in d.config:
            if key in SET_ELSEWHERE:
                problems.append(f"drafter.config.{key} is set by the recipe or the target: remove it")
            elif key not in known:
                near = difflib.get_close_matches(str(key), sorted(known - set(SET_ELSEWHERE)), n=1)
                hint = f" (did you mean drafter.config.{near[0]}?)" if near else ""
                problems.append(f"drafter.config.{key} is not a DFlashConfig field{hint}")
    elif d.config:
        problems.append("drafter.config is only for drafter.base: scratch")
    return problems


def parse_recipe(raw, origin="recipe"):
    recipe = _build(Recipe, raw, "", origin)
    recipe.source = origin
    problems = recipe_problems(recipe)
    if problems:
        raise MfdHubError(f"{origin}: {problems[0]}")
    return recipe


def packaged_recipes():
    """Names of the recipes shipped in mfd_hub.recipes -> their paths."""
    folder = importlib.resources.files("mfd_hub.recipes")
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir() if str(p).endswith(".yaml")}


def resolve_recipe_path(name_or_path):
    """A YAML path as is; otherwise a packaged recipe name (case-insensitive)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.suffix in (".yaml", ".yml") or path.parent != Path("."):
        raise UsageError(f"recipe file {name_or_path} not found")
    shipped = {name.lower(): p for name, p in packaged_recipes().items()}
    found = shipped.get(str(name_or_path).lower())
    if found is None:
        near = difflib.get_close_matches(str(name_or_path), list(packaged_recipes()), n=1)
        hint = f" (did you mean {near[0]}?)" if near else " (mfd-hub train --list shows them)"
        raise UsageError(f"no recipe file or packaged recipe named {name_or_path}{hint}")
    return found


def apply_override(raw, assignment):
    """``section.key=value`` into the raw mapping (value parsed as YAML)."""
    key, sep, text = assignment.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"override {assignment!r} is not KEY=VALUE (e.g. train.lr=2e-4)")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UsageError(f"override {assignment!r}: {part} is not a section")
    node[parts[-1]] = value
    return raw


def load_recipe(name_or_path, overrides=()):
    """A recipe file or packaged name, with overrides, parsed and validated -> Recipe."""
    path = resolve_recipe_path(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise MfdHubError(f"{path}: not valid YAML{where}: {getattr(err, 'problem', None) or err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise MfdHubError(f"cannot read recipe {path}: {err}") from None
    raw = raw if raw is not None else {}
    if not isinstance(raw, dict):
        raise MfdHubError(f"{path}: a recipe must be a YAML mapping")
    for assignment in overrides:
        apply_override(raw, assignment)
    return parse_recipe(raw, origin=str(path))
