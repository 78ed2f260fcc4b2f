"""``mfd-hub verify``: is a drafter checkpoint sound? A report of named checks.

Each check passes, fails, warns or is skipped with a one-line reason; a checkpoint is sound when
none fails. The checks, in order (``CHECKS``):

- ``files``: no pickle files (``.bin``/``.pt``/...: reported, never loaded), no symbolic link
  leaving the folder (a Hub cache snapshot may link into its own repository's blobs).
- ``safetensors``: every header parsed by hand, without trusting it: length within the file,
  JSON, known dtypes, dtype x shape = byte length, offsets inside the data, no overlap, no gap.
- ``index``: the shard index names existing shards, agrees with their headers, covers them all.
- ``config``: the config schema (required fields, types, consistency; ours or z-lab's).
- ``tensors``: every expected tensor with the expected shape and dtype, nothing unexpected.
- ``finite``: no NaN or infinity.
- ``draft-vocab``: ``d2t``/``t2d`` agree (DESIGN §3) when the drafter has a draft vocabulary.
- ``target-layers`` / ``mask-token`` / ``target``: tap layers within the target's layers, the
  mask token within the vocabulary, hidden and vocabulary sizes equal to the target's (from
  ``target=`` when given, else from the identity the checkpoint records).
- ``remote-code``: the bundled .py files equal the installed mfd-hub's bundle (a different
  mfd-hub version is a warning: it cannot be compared).
- ``auto-model``: in a separate process that cannot import mfd_hub, ``AutoModel.from_pretrained(
  trust_remote_code=True)`` returns ``DFlashDraftModel`` with no missing or unexpected keys. Run
  only when the remote code is byte-identical to ours: verify never executes unvetted code. A
  clean load's outcome is kept in the user's mfd-hub cache under ``loading_key`` (all bytes but
  the weight values, and the versions), so re-verifying a drafter whose weights changed but not
  its shapes, config or code does not load it again; a failed load is always retried.
- ``spec-decoding`` (with a target): speculative decoding is token-identical to the target's
  greedy decoding on a short prompt.
- ``acceptance`` (with a target): the drafter still accepts what its record
  (``acceptance.json``) says it did, or without a record at least a floor (``mfd_hub.acceptance``);
  a failure is followed by a line per cause it can name.
"""

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASS, FAIL, SKIP, WARN = "pass", "fail", "skip", "warn"
CHECKS = (
    "files", "safetensors", "index", "config", "tensors", "finite", "draft-vocab", "target-layers",
    "mask-token", "target", "remote-code", "auto-model", "spec-decoding", "acceptance",
)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# bytes per element of every dtype the safetensors format defines
SAFETENSORS_DTYPES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
FLOAT_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library refuses larger headers too
SPEC_CHECK_TOKENS = 24
AUTO_MODEL_TIMEOUT_S = 600


@dataclass
class CheckResult:
    name: str
    status: str
    reason: str = ""
    details: list = field(default_factory=list)  # lines under the reason (the causes it names)

    def to_dict(self):
        found = asdict(self)
        if not self.details:
            del found["details"]  # most checks have none: their JSON stays as it was
        return found


@dataclass
class VerifyReport:
    path: str
    checks: list = field(default_factory=list)
    listener: object = field(default=None, repr=False, compare=False)

    @property
    def ok(self):
        return not self.failures()

    def failures(self):
        return [c for c in self.checks if c.status == FAIL]

    def add(self, name, status, reason="", details=()):
        result = CheckResult(name, status, " ".join(str(reason).split()), [" ".join(str(d).split()) for d in details])
        self.checks.append(result)
        if self.listener is not None:
            self.listener(result)
        return result

    def to_dict(self):
        return {"path": self.path, "ok": self.ok, "checks": [c.to_dict() for c in self.checks]}


class CheckFailed(Exception):
    """A check's verdict: fail with this one-line reason (and ``details``, a line per cause)."""

    def __init__(self, reason, details=()):
        super().__init__(reason)
        self.details = list(details)


class HeaderError(CheckFailed):
    pass


# ---- safetensors, parsed by hand ------------------------------------------------------------------
def _unique_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise HeaderError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def read_safetensors_header(path):
    """Parse a .safetensors header without trusting it -> {tensor: (dtype, shape, begin, end)}.

    Layout: an 8-byte little-endian header length N, N bytes of JSON, then the data. Raises
    HeaderError (one line) for anything the format forbids or the library would choke on.
    """
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        raise HeaderError(f"{path.name} is {size} bytes long, too short for a safetensors header")
    with path.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if length > MAX_HEADER_BYTES:
            raise HeaderError(f"{path.name}: header length {length:,} is beyond any sane header")
        if 8 + length > size:
            raise HeaderError(f"{path.name}: header length {length:,} runs past the end of the file ({size:,} bytes)")
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeaderError(f"{path.name}: header is not JSON ({type(err).__name__})") from None
    except HeaderError as err:
        raise HeaderError(f"{path.name}: header has a {err}") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{path.name}: header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise HeaderError(f"{path.name}: __metadata__ must map strings to strings")
    data_bytes = size - 8 - length
    entries = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise HeaderError(f"{path.name}: entry {name!r} needs exactly dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in SAFETENSORS_DTYPES:
            raise HeaderError(f"{path.name}: tensor {name} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_natural(d) for d in shape):
            raise HeaderError(f"{path.name}: tensor {name} has an invalid shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(o) for o in offsets)):
            raise HeaderError(f"{path.name}: tensor {name} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        if begin > end or end > data_bytes:
            raise HeaderError(
                f"{path.name}: tensor {name} spans bytes {begin}..{end}, outside the {data_bytes:,} data bytes"
            )
        need = math.prod(shape) * SAFETENSORS_DTYPES[dtype]
        if end - begin != need:
            raise HeaderError(f"{path.name}: tensor {name} is {dtype} x {shape} = {need:,} bytes, offsets hold {end - begin:,}")
        entries[name] = (dtype, tuple(shape), begin, end)
    cursor = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: (item[1][2], item[1][3])):
        if begin < cursor:
            raise HeaderError(f"{path.name}: tensor {name} overlaps the tensor before it (bytes {begin}..{end})")
        if begin > cursor:
            raise HeaderError(f"{path.name}: {begin - cursor} unclaimed bytes before tensor {name}")
        cursor = end
    if cursor != data_bytes:
        raise HeaderError(f"{path.name}: {data_bytes - cursor} bytes after the last tensor belong to none")
    return entries


def _natural(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ---- the checks --------------------------------------------------------------------------------------
class _Checkpoint:
    """What the checks learn about the folder as they go (each check reads what it needs)."""

    def __init__(self, folder, allowed_root, spec=None):
        self.folder = folder
        self.spec = folder if spec is None else spec  # how the user named it, for commands we print
        self.allowed_root = allowed_root
        self.readable = set()  # files inside the folder that are safe to open
        self.headers = {}  # file name -> header entries
        self.tensors = {}  # tensor name -> (file name, dtype, shape) of the weights that load
        self.pickles = []
        self.raw_config = None
        self.format = None
        self.config = None
        self.target_config = None
        self.bundle_identical = False
        self.loaded = None  # (drafter, target, tokenizer) once a check has loaded them, for the next
        self.record_acceptance = False  # verify --record: measure and write acceptance.json


def _allowed_root(folder):
    """Where the folder's symlinks may point: itself, or for a Hub cache snapshot
    (``models--owner--name/snapshots/<commit>``) its repository folder, which holds the blobs."""
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith(("models--", "datasets--")):
        return folder.parent.parent.resolve()
    return folder.resolve()


def check_files(ck):
    escaping, broken = [], []
    for dirpath, dirnames, filenames in os.walk(ck.folder):  # does not follow symlinked folders
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(ck.folder))
            if path.is_symlink():
                resolved = path.resolve()
                if not resolved.is_relative_to(ck.allowed_root):
                    escaping.append(rel)
                    continue
                if not resolved.exists():
                    broken.append(rel)
                    continue
            if name.lower().endswith(PICKLE_SUFFIXES):
                ck.pickles.append(rel)
            if Path(dirpath) == ck.folder and path.is_file():
                ck.readable.add(name)
    if escaping:
        raise CheckFailed(f"symbolic link {escaping[0]} points outside the checkpoint folder")
    if broken:
        raise CheckFailed(f"symbolic link {broken[0]} points to nothing")
    if ck.pickles:
        raise CheckFailed(f"pickle file {ck.pickles[0]} present (not loaded: pickles can run code; use safetensors)")
    return PASS, f"{len(ck.readable)} files, no pickles, no links leaving the folder"


def check_safetensors(ck):
    files = sorted(n for n in ck.readable if n.endswith(".safetensors"))
    if not files:
        raise CheckFailed("no .safetensors weight files")
    for name in files:
        ck.headers[name] = read_safetensors_header(ck.folder / name)
    count = sum(len(h) for h in ck.headers.values())
    return PASS, f"{len(files)} file(s), {count} tensors, headers sound"


def check_index(ck):
    from .checkpoint import SAFE_INDEX, SAFE_WEIGHTS

    if SAFE_INDEX not in ck.readable:
        if set(ck.headers) != {SAFE_WEIGHTS}:
            others = sorted(set(ck.headers) - {SAFE_WEIGHTS})
            if SAFE_WEIGHTS not in ck.headers:
                raise CheckFailed(f"no {SAFE_WEIGHTS} and no {SAFE_INDEX} (found {others[:3]})")
            raise CheckFailed(f"{others[0]} is not part of the checkpoint ({SAFE_WEIGHTS} has no index)")
        ck.tensors = {n: (SAFE_WEIGHTS, d, s) for n, (d, s, _, _) in ck.headers[SAFE_WEIGHTS].items()}
        return SKIP, f"single file {SAFE_WEIGHTS}, no index"
    if SAFE_WEIGHTS in ck.headers:
        raise CheckFailed(f"both {SAFE_WEIGHTS} and {SAFE_INDEX}: which weights load is ambiguous")
    try:
        index = json.loads((ck.folder / SAFE_INDEX).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckFailed(f"{SAFE_INDEX} is not JSON ({type(err).__name__})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckFailed(f"{SAFE_INDEX} has no weight_map of tensor -> shard file")
    for tensor, shard in sorted(weight_map.items()):
        if shard not in ck.headers:
            raise CheckFailed(f"{SAFE_INDEX} maps {tensor} to {shard}, which is not a shard in the folder")
        if tensor not in ck.headers[shard]:
            raise CheckFailed(f"{SAFE_INDEX} maps {tensor} to {shard}, which does not hold it")
    for shard, entries in sorted(ck.headers.items()):
        if shard not in set(weight_map.values()):
            raise CheckFailed(f"{shard} is not named by {SAFE_INDEX}")
        for tensor in entries:
            if weight_map.get(tensor) != shard:
                raise CheckFailed(f"{shard} holds {tensor}, which {SAFE_INDEX} maps elsewhere")
    ck.tensors = {n: (f, *ck.headers[f][n][:2]) for n, f in weight_map.items()}
    stored = sum(e - b for entries in ck.headers.values() for _, _, b, e in entries.values())
    declared = (index.get("metadata") or {}).get("total_size")
    if declared is not None and declared != stored:
        return WARN, f"{len(ck.headers)} shards agree with the index, but its total_size {declared} != {stored} bytes"
    return PASS, f"{len(ck.headers)} shards, {len(weight_map)} tensors, consistent with the index"


def check_config(ck):
    from .checkpoint_config import CONFIG_NAME, checkpoint_format, config_from_zlab, released_refusal
    from .errors import MfdHubError
    from .remote.configuration_mfd import REQUIRED_FIELDS, DFlashConfig, drafter_config_problems

    if CONFIG_NAME not in ck.readable:
        raise CheckFailed(f"{CONFIG_NAME} is missing")
    try:
        raw = json.loads((ck.folder / CONFIG_NAME).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckFailed(f"{CONFIG_NAME} is not JSON ({type(err).__name__})") from None
    if not isinstance(raw, dict):
        raise CheckFailed(f"{CONFIG_NAME} is not a JSON object")
    shapes = {name: (dtype, tuple(shape)) for entries in ck.headers.values()
              for name, (dtype, shape, _, _) in entries.items()}
    released = released_refusal(raw, shapes, ck.spec)
    if released:  # never a generic tensor mismatch: say what the folder is and how to convert it
        raise CheckFailed(released)
    try:
        ck.format = checkpoint_format(raw)
        if ck.format == "mfd":
            missing = [name for name in REQUIRED_FIELDS if raw.get(name) is None]
            if missing:
                raise CheckFailed(f"{CONFIG_NAME} lacks required field(s) {missing}")
            bad = [n for n in REQUIRED_FIELDS if n not in ("target_layer_ids",) and not _natural(raw[n])]
            if bad:
                raise CheckFailed(f"config field {bad[0]} must be a non-negative integer, got {raw[bad[0]]!r}")
            config = DFlashConfig.from_dict(raw)
        else:
            config = config_from_zlab(raw)
    except MfdHubError as err:
        raise CheckFailed(str(err)) from None
    except KeyError as err:
        raise CheckFailed(f"{CONFIG_NAME} lacks field {err.args[0]!r}") from None
    except (ValueError, TypeError) as err:
        raise CheckFailed(f"{CONFIG_NAME}: {err}") from None
    ck.raw_config = raw
    # The checks below own the tap layers, the mask token and the target's sizes.
    owned = ("target_layer_ids", "mask_token_id", "target ")
    problems = [p for p in drafter_config_problems(config) if not p.startswith(owned)]
    if problems:
        raise CheckFailed(problems[0])
    sizes = [config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.num_attention_heads,
             config.num_key_value_heads, config.head_dim, config.vocab_size]
    if min(sizes) < 1:
        raise CheckFailed("hidden, intermediate, layer, head and vocabulary sizes must all be positive")
    ck.config = config
    if ck.format == "zlab":
        return PASS, f"z-lab DFlash drafter, {config.num_hidden_layers} layers (mfd-hub convert zlab makes it ours)"
    from .bundle import AUTO_MAP

    if raw.get("auto_map") != AUTO_MAP:
        raise CheckFailed(f"auto_map {raw.get('auto_map')!r} does not name the bundled classes {AUTO_MAP}")
    extra = f", draft vocabulary {config.draft_vocab_size}" if config.draft_vocab_size else ""
    extra += ", default path" if config.default_path else ""
    return PASS, f"mfd-hub drafter, {config.num_hidden_layers} layers, K={config.num_modes}{extra}"


def _expected_tensors(config):
    import torch

    from .remote.modeling_mfd import DFlashDraftModel

    with torch.device("meta"):
        model = DFlashDraftModel(config)
    return {name: (t.dtype, tuple(t.shape)) for name, t in model.state_dict().items()}


def check_tensors(ck):
    import torch

    expected = _expected_tensors(ck.config)
    missing = sorted(set(expected) - set(ck.tensors))
    unexpected = sorted(set(ck.tensors) - set(expected))
    if missing:
        raise CheckFailed(f"missing tensor(s) {missing[:3]}{' ...' if len(missing) > 3 else ''}")
    if unexpected:
        raise CheckFailed(f"unexpected tensor(s) {unexpected[:3]}{' ...' if len(unexpected) > 3 else ''}")
    for name, (dtype, shape) in sorted(expected.items()):
        if ck.tensors[name][2] != shape:
            raise CheckFailed(f"{name} has shape {list(ck.tensors[name][2])}, expected {list(shape)}")
    float_names = [n for n, (dtype, _) in expected.items() if dtype.is_floating_point]
    stored = {ck.tensors[n][1] for n in float_names}
    if not stored <= set(FLOAT_DTYPES):
        bad = next(n for n in sorted(float_names) if ck.tensors[n][1] not in FLOAT_DTYPES)
        raise CheckFailed(f"{bad} is stored as {ck.tensors[bad][1]}, not a floating-point dtype")
    if len(stored) > 1:
        first = ck.tensors[sorted(float_names)[0]][1]
        odd = next(n for n in sorted(float_names) if ck.tensors[n][1] != first)
        raise CheckFailed(f"mixed weight dtypes: {odd} is {ck.tensors[odd][1]}, others {first}")
    for name, (dtype, _) in sorted(expected.items()):
        if not dtype.is_floating_point:
            want = {torch.int64: "I64", torch.bool: "BOOL"}[dtype]
            if ck.tensors[name][1] != want:
                raise CheckFailed(f"{name} is stored as {ck.tensors[name][1]}, expected {want}")
    weights_dtype = FLOAT_DTYPES[stored.pop()]
    declared = ck.raw_config.get("dtype") or ck.raw_config.get("torch_dtype")
    total = sum(math.prod(s) for _, _, s in ck.tensors.values())
    if declared not in (None, "auto", weights_dtype):
        return WARN, f"{len(expected)} tensors as expected, but they are {weights_dtype} and config.json says {declared}"
    return PASS, f"{len(expected)} tensors as expected ({total:,} values, {weights_dtype})"


def _load_tensor(ck, name):
    from safetensors import safe_open

    with safe_open(str(ck.folder / ck.tensors[name][0]), framework="pt") as handle:
        return handle.get_tensor(name)


def check_finite(ck):
    import torch

    for name in sorted(ck.tensors):
        tensor = _load_tensor(ck, name)
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckFailed(f"{name} holds {bad} non-finite value(s) (NaN or infinity)")
    return PASS, f"all {len(ck.tensors)} tensors finite"


def check_draft_vocab(ck):
    import torch

    config = ck.config
    if not config.draft_vocab_size:
        return SKIP, "no draft vocabulary (drafts over the target's full vocabulary)"
    d2t, t2d = _load_tensor(ck, "d2t"), _load_tensor(ck, "t2d")
    ids = torch.arange(d2t.shape[0]) + d2t
    if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size:
        raise CheckFailed(f"d2t maps draft ids outside the target vocabulary of {config.vocab_size}")
    if torch.unique(ids).numel() != ids.numel():
        raise CheckFailed("d2t maps two draft ids to the same target id")
    if int(t2d.sum()) != ids.numel() or not bool(t2d[ids].all()):
        raise CheckFailed("t2d does not mark exactly the target ids that d2t reaches")
    return PASS, f"{ids.numel()} of {config.vocab_size} target tokens, d2t and t2d agree"


def _target_sizes(ck):
    """(where from, hidden, vocab, layers) of the target: the given one's config, else the
    identity the checkpoint records; None when neither is at hand."""
    if ck.target_config is not None:
        t = ck.target_config
        return "the target", t.get("hidden_size"), t.get("vocab_size"), t.get("num_hidden_layers")
    # a z-lab config names no target: the identity config_from_zlab fills in is the drafter's own
    t = ck.config.target if ck.format == "mfd" else {}
    if any(t.get(k) is not None for k in ("hidden_size", "vocab_size", "num_hidden_layers")):
        return "the recorded target", t.get("hidden_size"), t.get("vocab_size"), t.get("num_hidden_layers")
    return None


def check_target_layers(ck):
    config = ck.config
    ids = config.target_layer_ids
    if not ids or not all(_natural(i) for i in ids):
        raise CheckFailed(f"target_layer_ids {ids!r} must be a non-empty list of layer indices")
    if len(set(ids)) != len(ids):
        raise CheckFailed(f"target_layer_ids {ids} repeats a layer")
    known = _target_sizes(ck)
    if known is not None and known[3] is not None and known[3] != config.num_target_layers:
        raise CheckFailed(f"{known[0]} has {known[3]} layers but num_target_layers is {config.num_target_layers}")
    bad = [i for i in ids if i >= config.num_target_layers]
    if bad:
        raise CheckFailed(f"target_layer_ids {bad} are outside the target's {config.num_target_layers} layers")
    return PASS, f"taps {ids} within {config.num_target_layers} target layers"


def check_mask_token(ck):
    config = ck.config
    known = _target_sizes(ck)
    vocab = known[2] if known is not None and known[2] is not None else config.vocab_size
    if not 0 <= config.mask_token_id < min(vocab, config.vocab_size):
        raise CheckFailed(f"mask_token_id {config.mask_token_id} is outside the vocabulary of {min(vocab, config.vocab_size)}")
    return PASS, f"mask token {config.mask_token_id} < vocabulary {vocab}"


def check_target(ck):
    config = ck.config
    known = _target_sizes(ck)
    if known is None:
        return SKIP, "no target given and the checkpoint records none (pass --target)"
    source, hidden, vocab, _ = known
    if hidden is not None and hidden != config.hidden_size:
        raise CheckFailed(f"{source}'s hidden size {hidden} != the drafter's {config.hidden_size}")
    if vocab is not None and vocab != config.vocab_size:
        raise CheckFailed(f"{source}'s vocabulary {vocab} != the drafter's {config.vocab_size}")
    return PASS, f"hidden {config.hidden_size} and vocabulary {config.vocab_size} match {source}"


def check_remote_code(ck):
    from .version import __version__
    from .bundle import bundle_sources, bundle_version_of

    if ck.format == "zlab":
        return SKIP, "z-lab checkpoint: its own remote code, not mfd-hub's (not executed)"
    ours = bundle_sources()
    missing = sorted(n for n in ours if n not in ck.readable)
    if missing:
        raise CheckFailed(f"bundled file(s) {missing[:3]} missing: AutoModel cannot load the drafter")
    texts = {n: (ck.folder / n).read_text(encoding="utf-8", errors="replace") for n in ours}
    differing = sorted(n for n in ours if texts[n] != ours[n])
    extra = sorted(n for n in ck.readable if n.endswith(".py") and n not in ours)
    if not differing:
        ck.bundle_identical = not extra
        if extra:
            return WARN, f"bundle identical to mfd-hub {__version__}'s, plus unknown file(s) {extra[:3]} (not executed)"
        return PASS, f"{len(ours)} files identical to mfd-hub {__version__}'s bundle"
    versions = {bundle_version_of(texts[n]) for n in differing}
    if versions == {__version__} or None in versions:
        raise CheckFailed(f"{differing[0]} differs from mfd-hub {__version__}'s bundle although it claims that version: edited")
    return WARN, (
        f"version drift: the bundle comes from mfd-hub {sorted(versions)[0]}, this is {__version__}; "
        f"{len(differing)} file(s) differ and cannot be vetted (not executed; re-convert to update)"
    )


# Runs in a fresh interpreter where mfd_hub cannot be imported: what a checkpoint's user has.
AUTO_MODEL_SCRIPT = """
import json, sys
class _NoMfdHub:
    def find_spec(self, name, path=None, target=None):
        if name == "mfd_hub" or name.startswith("mfd_hub."):
            raise ImportError("mfd_hub is not importable here: remote code must stand alone")
sys.meta_path.insert(0, _NoMfdHub())
from transformers import AutoModel
model, info = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True, dtype="auto", output_loading_info=True)
print(json.dumps({
    "class": type(model).__name__, "module": type(model).__module__,
    "missing": sorted(info.get("missing_keys", [])), "unexpected": sorted(info.get("unexpected_keys", [])),
    "mismatched": [str(m) for m in info.get("mismatched_keys", [])],
}))
"""


AUTO_MODEL_CACHE = "auto-model"  # the mfd-hub cache's folder of AutoModel outcomes


def loading_key(folder):
    """The sha256 of everything ``AutoModel.from_pretrained`` of this folder depends on, the weight
    values excepted: the bytes of every file but the weights, each weight file's size and header
    (names, dtypes, shapes, offsets), the AutoModel script and the library versions. Values never
    decide whether a load finds every key, so a drafter that was re-trained (same shapes, other
    numbers) loads exactly as before."""
    import hashlib

    from .cache import file_digest

    entries = []
    for path in sorted(Path(folder).rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(folder).as_posix()
        if path.suffix == ".safetensors":
            with open(path, "rb") as handle:
                length = int.from_bytes(handle.read(8), "little")
                header = handle.read(min(length, 100 << 20))
            entries.append([rel, path.stat().st_size, hashlib.sha256(header).hexdigest()])
        else:
            entries.append([rel, None, file_digest(path)])
    document = {"entries": entries, "script": AUTO_MODEL_SCRIPT, "versions": library_versions()}
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def check_auto_model(ck, failed_before):
    if ck.format == "zlab":
        return SKIP, "z-lab checkpoint: its remote code is not mfd-hub's and is not executed"
    if failed_before:
        return SKIP, "not loaded: earlier checks failed"
    if not ck.bundle_identical:
        return SKIP, "not loaded: the remote code is not byte-identical to the installed bundle"
    from .cache import read_record, write_record

    key = loading_key(ck.folder)
    found = read_record(AUTO_MODEL_CACHE, key)
    if found is None:
        found = _load_with_auto_model(ck)  # raises on a failed load: only a clean one is kept
        write_record(AUTO_MODEL_CACHE, key, found)
    return PASS, f"AutoModel(trust_remote_code=True) -> {found['class']} from {found['module']}, all keys matched"


def _load_with_auto_model(ck):
    """AutoModel.from_pretrained in a fresh process that cannot import mfd_hub -> what it found
    (raises CheckFailed unless it is a DFlashDraftModel with every key matched)."""
    with tempfile.TemporaryDirectory(prefix="mfd-verify-") as scratch:
        env = dict(os.environ)
        # a private HF home: the remote-code module cache starts empty and is thrown away
        env.update(HF_HOME=scratch, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        try:
            done = subprocess.run(
                [sys.executable, "-c", AUTO_MODEL_SCRIPT, str(ck.folder.resolve())], cwd=scratch, env=env,
                capture_output=True, text=True, timeout=AUTO_MODEL_TIMEOUT_S, stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"AutoModel.from_pretrained did not finish in {AUTO_MODEL_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise CheckFailed(f"AutoModel.from_pretrained failed: {lines[-1] if lines else 'exit ' + str(done.returncode)}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if found["class"] != "DFlashDraftModel":
        raise CheckFailed(f"AutoModel returned {found['class']}, not DFlashDraftModel")
    for kind in ("missing", "unexpected", "mismatched"):
        if found[kind]:
            raise CheckFailed(f"AutoModel reports {kind} keys {found[kind][:3]}")
    return found


def _check_prompt(tokenizer, vocab_size):
    import torch

    if tokenizer is not None:
        ids = tokenizer("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.", return_tensors="pt")["input_ids"]
        if ids.shape[1] >= 4 and int(ids.max()) < vocab_size:
            return ids
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (1, 12), generator=generator)


def check_spec_decoding(ck, target, failed_before):
    if target is None:
        return SKIP, "no target given (pass --target to run a short lossless decoding check)"
    if failed_before:
        return SKIP, "not run: earlier checks failed"
    from .pair import load_pair
    from .remote.targets_mfd import UnsupportedTargetError
    from .targets import greedy_decode

    # fp32 and torch's own products on CPU: the check compares with plain greedy decoding token for token
    pair = load_pair(ck.folder, target, dtype="float32", linears="torch", device="cpu")
    ck.loaded = (pair.draft, pair.target, pair.tokenizer)  # the acceptance check reuses them
    ids = _check_prompt(pair.tokenizer, pair.target.config.vocab_size)
    want = greedy_decode(pair.target, ids, SPEC_CHECK_TOKENS)
    method = "mixture" if pair.draft.config.num_modes else "product"
    try:
        out = pair.generate(ids, max_new_tokens=SPEC_CHECK_TOKENS, method=method, tree_budget=16, stop_token_ids=None)
    except UnsupportedTargetError as err:
        return SKIP, str(err)
    if out.new_tokens != want:
        pairs = zip(out.new_tokens, want)
        first = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(out.new_tokens), len(want)))
        raise CheckFailed(f"{method} decoding departs from the target's greedy decoding at token {first}")
    return PASS, f"{method} decoding token-identical to greedy over {len(want)} tokens (tau {out.tau:.2f})"


def check_acceptance(ck, target, failed_before):
    if target is None:
        return SKIP, "no target given (pass --target to compare the drafter's acceptance with its record)"
    if failed_before:
        return SKIP, "not run: earlier checks failed"
    import torch

    from .acceptance import RecordError, assess, record_and_assess
    from .checkpoint import load_draft
    from .remote.targets_mfd import UnsupportedTargetError
    from .targets import load_target

    draft, model, tokenizer = ck.loaded or (None, None, None)
    if draft is None or draft.dtype != torch.float32:
        draft = load_draft(ck.folder)
    if model is None or model.dtype != torch.float32:
        model, tokenizer = load_target(target)
    try:
        measure = record_and_assess if ck.record_acceptance else assess
        result = measure(draft, model, tokenizer, ck.folder, target_spec=target)
    except RecordError as err:
        raise CheckFailed(str(err)) from None
    except UnsupportedTargetError as err:
        return SKIP, str(err)
    if not result.ok:
        raise CheckFailed(result.reason, result.causes)
    return PASS, result.reason


def verify_checkpoint(path, target=None, listener=None, record=False):
    """Run every check on a checkpoint (a folder, a Hub repo id or a shipped drafter's name, whose
    loadable folder is checked: ``resolve_drafter``) -> VerifyReport.

    ``report.ok`` is True when no check failed; ``report.failures()`` lists the failed checks;
    ``report.to_dict()`` is the JSON form. ``target`` (a folder, Hub id or 'smollm2') adds the
    size checks against its config, a short lossless decoding check and the acceptance check;
    ``record`` (with a target) writes the acceptance record of a checkpoint that has none, when
    every check passes. ``listener`` is called
    with each CheckResult as it is decided (progress for long runs). Never raises for a damaged
    checkpoint: every problem becomes a failed check.
    """
    from .locate import resolve_drafter
    from .errors import MfdHubError

    report = VerifyReport(path=str(path), listener=listener)
    try:
        folder = resolve_drafter(path).absolute()
    except MfdHubError as err:
        report.add("files", FAIL, str(err))
        return report
    ck = _Checkpoint(folder, _allowed_root(folder), spec=path)
    ck.record_acceptance = record
    if target is not None:
        from .targets import target_config

        try:
            ck.target_config = target_config(str(target))
        except MfdHubError as err:
            report.add("target", FAIL, f"cannot read the target's config: {err}")
            return report

    blocked = set()  # checks that failed, or could not run because what they need did not pass

    def run(name, check, *args, needs=()):
        unmet = [n for n in needs if n in blocked]
        if unmet:
            blocked.add(name)
            return report.add(name, SKIP, f"not run: {', '.join(unmet)} did not pass")
        details = ()
        try:
            status, reason = check(ck, *args)
        except CheckFailed as err:
            status, reason, details = FAIL, str(err), err.details
        except Exception as err:  # a damaged file must never escape as a traceback
            status, reason = FAIL, f"{type(err).__name__}: {err}"
        if status == FAIL:
            blocked.add(name)
        return report.add(name, status, reason, details)

    run("files", check_files)
    run("safetensors", check_safetensors)
    run("index", check_index, needs=("safetensors",))
    run("config", check_config)
    structure = ("index", "config")
    run("tensors", check_tensors, needs=structure)
    run("finite", check_finite, needs=("tensors",))
    run("draft-vocab", check_draft_vocab, needs=("tensors",))
    run("target-layers", check_target_layers, needs=("config",))
    run("mask-token", check_mask_token, needs=("config",))
    run("target", check_target, needs=("config",))
    run("remote-code", check_remote_code, needs=("config",))
    run("auto-model", check_auto_model, bool(report.failures()), needs=("remote-code",))
    run("spec-decoding", check_spec_decoding, target, bool(report.failures()), needs=("tensors",))
    run("acceptance", check_acceptance, target, bool(report.failures()), needs=("tensors",))
    return report



# -- a verdict reused while nothing it depends on changed ---------------------------------------
VERDICT_CACHE = "verified"  # the mfd-hub cache's folder of verdicts
_VERDICT_PACKAGES = ("torch", "transformers", "safetensors", "huggingface_hub")


def library_versions():
    """The versions a verification's outcome depends on: mfd-hub, Python and the libraries."""
    import platform
    from importlib import metadata

    from .version import __version__

    versions = {"mfd-hub": __version__, "python": platform.python_version()}
    for package in _VERDICT_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def _folder_entries(folder):
    from .cache import file_digest

    folder = Path(folder)
    entries = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        link = os.readlink(path) if path.is_symlink() else None
        digest = file_digest(path) if path.is_file() else None
        entries.append([rel, link, digest, path.is_dir()])
    return entries


def verdict_key(folder, target_folder=None):
    """The sha256 of everything a verification depends on: every path under the folder with its
    bytes (read through links) or, for a link, where it points; the same of the target's folder
    when there is a target; the installed remote-code bundle; the versions of mfd-hub, Python and
    the libraries the checks use."""
    import hashlib

    from .bundle import bundle_sources

    bundle = hashlib.sha256(json.dumps(bundle_sources(), sort_keys=True).encode()).hexdigest()
    found = {"entries": _folder_entries(folder), "bundle": bundle, "versions": library_versions()}
    if target_folder is not None:  # absent without a target: the keys of target-less verdicts stay as they were
        found["target"] = _folder_entries(target_folder)
    return hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()


def verify_checkpoint_once(path, target=None):
    """``verify_checkpoint(path, target)`` whose verdict is kept in the user's mfd-hub cache,
    keyed by ``verdict_key``: asked again about the same bytes under the same versions (and the
    same target's bytes), it answers from the cache in the time of hashing the files, without
    loading anything. ``mfd-hub push`` verifies this way, so a dry run then the push (or a push
    repeated after a failed upload) runs the checks once. -> (VerifyReport, True when it came
    from the cache)."""
    from .cache import read_record, write_record
    from .errors import MfdHubError
    from .locate import resolve_drafter

    try:
        folder = resolve_drafter(path).absolute()
        target_folder = None
        if target is not None:
            from .targets import _target_folder

            target_folder = _target_folder(str(target))
    except MfdHubError:
        return verify_checkpoint(path, target=target), False
    key = verdict_key(folder, target_folder)
    saved = read_record(VERDICT_CACHE, key)
    try:
        return VerifyReport(path=str(path), checks=[CheckResult(**c) for c in saved["checks"]]), True
    except (KeyError, TypeError):
        pass  # not verified yet (or an unreadable entry): verify now
    report = verify_checkpoint(folder, target=target)
    report.path = str(path)
    write_record(VERDICT_CACHE, key, report.to_dict())
    return report, False
