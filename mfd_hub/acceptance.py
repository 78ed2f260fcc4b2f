"""A drafter's recorded acceptance, and the check that it still accepts what it did.

Verification is exact, so a drafter that loads and stays lossless but drafts badly (converted
wrongly, quantized too far, wired to the wrong tap layers) only makes decoding slower; no
structural check can see it. What can: tau, the mean number of tokens a verification round emits,
measured at T = 0 in float32 on a small fixed prompt set (``PROMPTS``, named by the sha256 of their
texts), and compared with the same measurement taken when the drafter was known to be good.

- ``measure_record`` measures tau per method (chain, product tree and, for a drafter with modes,
  mixture tree; ``TREE_BUDGET`` nodes) on all ``PROMPTS`` and returns the record, with per-prompt
  counts so that any leading subset of the prompts can be compared like with like.
- ``write_record`` / ``read_record``: ``acceptance.json`` in the checkpoint folder (format in
  docs/acceptance.md).
- ``assess`` re-measures the chain on the first ``CHECK_PROMPTS`` prompts and compares: below
  ``THRESHOLD`` of the recorded tau (or, without a record, below ``FLOOR``) it fails, with a line
  per cause it can name (``diagnose``).

The threshold comes from ``benchmarks/acceptance_spread.py`` (data/smollm2/acceptance-spread.json):
float32 gives the same tau in every run, at every thread count and with oneDNN's packed products;
fp16-rounded products, bfloat16 and float16 moved tau by at most 4.6% (float16's product tree);
1 - 3 x 4.6%, rounded down to a multiple of 5%, leaves 85%.
"""

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import MfdHubError

RECORD_NAME = "acceptance.json"
RECORD_FORMAT = "mfd-hub acceptance record"
RECORD_VERSION = 1
# Our own prompts (none of HumanEval's, which the benchmark uses), in the chat template when the
# target has one. Changing them changes the fingerprint, and old records stop being comparable.
PROMPTS = (
    "Write a Python class for a stack with push, pop and peek methods.",
    "Write a Python function that counts how often each word occurs in a text.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python function that converts a temperature from Celsius to Fahrenheit.",
    "Write a Python function that reads a CSV file and returns its rows as dictionaries.",
    "Write a Python function that flattens a nested list of lists.",
    "Write a Python function that finds the longest common prefix of a list of strings.",
    "Explain what a Python generator is, with a short example.",
)
NEW_TOKENS = 32
TREE_BUDGET = 16  # nodes of a product or mixture tree; a chain drafts up to block_size - 1
CHECK_METHOD = "chain"  # the cheapest round, and the one whose every token hangs on the drafter's argmax
CHECK_PROMPTS = 4
THRESHOLD = 0.85  # of the recorded tau: 1 - 3 x the largest spread measured (4.6%), rounded down to 5%
# Without a record: a chain round emits its bonus token and then the accepted drafted ones, so
# tau < 1.1 means fewer than one drafted token accepted in ten rounds: speculation that only costs.
FLOOR = 1.1
# A precision loss is named when a weight matrix holds a quarter of the distinct values the
# recorded weights held, or fewer (16-bit weights hold thousands, 3-4 bit rounding 8-16).
PRECISION_LOSS = 4
MEASURE_DTYPE = torch.float32


def prompts_fingerprint(prompts=PROMPTS):
    return hashlib.sha256(json.dumps(list(prompts), ensure_ascii=False).encode("utf-8")).hexdigest()


def methods_of(draft):
    return ("chain", "product", "mixture") if draft.config.num_modes else ("chain", "product")


def prompt_ids(tokenizer, vocab_size, prompts=PROMPTS):
    """Token ids [1, L] of each prompt. A target whose tokenizer cannot spell them (a test model
    over made-up words, or none at all) gets fixed pseudo-random ids, seeded by the prompt."""
    from .targets import encode_prompt

    out = []
    for index, text in enumerate(prompts):
        ids = encode_prompt(tokenizer, text) if tokenizer is not None else None
        if ids is None or len(set(ids[0].tolist())) < 4 or int(ids.max()) >= vocab_size:
            generator = torch.Generator().manual_seed(1000 + index)
            ids = torch.randint(0, vocab_size, (1, 12), generator=generator)
        out.append(ids)
    return out


class _Decided(Exception):
    """Raised from inside a generation once enough rounds are counted for the verdict."""


def count_acceptance(draft, target, prompt_list, method, max_rounds=None):
    """[[tokens emitted by verification rounds, rounds], ...] per prompt: T = 0, ``NEW_TOKENS``.

    Every prompt's rounds emit exactly ``NEW_TOKENS - 1`` tokens (the first comes from the
    prefill, and no round overshoots), so tau over the prompts is that total over the rounds.
    ``max_rounds``: stop as soon as the rounds exceed it; the prompt cut short is counted as far
    as it went, and the list is marked ``stopped``."""
    counts = _Counts()
    for ids in prompt_list:
        counts.append([0, 0])

        def count_round(tree, tokens, logits, path):
            counts[-1][0] += len(path)  # the accepted nodes from the root: drafted tokens + the bonus
            counts[-1][1] += 1
            if max_rounds is not None and sum(r for _, r in counts) > max_rounds:
                raise _Decided

        try:
            draft.spec_generate(target, ids, max_new_tokens=NEW_TOKENS, method=method, tree_budget=TREE_BUDGET,
                                on_round=count_round)
        except _Decided:
            counts.stopped = True
            break
    return counts


class _Counts(list):
    stopped = False


def tau_of(counts):
    rounds = sum(r for _, r in counts)
    return sum(t for t, _ in counts) / max(1, rounds)


# ---- what the record says about the drafter and the target -----------------------------------
def target_identity(target, spec):
    """The target's name and sizes as a record keeps them."""
    from .targets import SMOLLM2_REPO, is_smollm2

    config = target.config
    if spec is None:
        name = getattr(config, "_name_or_path", None) or None
    elif is_smollm2(spec):
        name = SMOLLM2_REPO
    else:
        path = Path(str(spec))
        name = path.resolve().name if path.exists() else str(spec)
    return {
        "name": name,
        "model_type": getattr(config, "model_type", None),
        "hidden_size": getattr(config, "hidden_size", None),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
        "vocab_size": getattr(config, "vocab_size", None),
    }


def weights_fingerprint(draft):
    """sha256 of the drafter's weight values (as loaded, float32), in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(draft.state_dict().items()):
        digest.update(name.encode() + b"\0" + tensor.detach().float().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def _matrices(draft):
    return {n: t.detach() for n, t in draft.state_dict().items()
            if t.is_floating_point() and t.dim() == 2 and t.shape[1] >= 64}


def distinct_values(draft, rows=64):
    """The median over the weight matrices of the number of distinct values among a matrix's first
    ``rows`` rows: thousands for 16-bit weights, at most 2^b for weights rounded to b bits."""
    counts = [torch.unique(t[:rows]).numel() for t in _matrices(draft).values()]
    return int(torch.tensor(counts).float().median()) if counts else None


def stored_dtype(folder):
    """The floating dtype the checkpoint stores its weights in ('bfloat16', ...), or None."""
    from safetensors import safe_open

    names = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                dtype = handle.get_slice(key).get_dtype()
                if dtype in names:
                    return names[dtype]
    return None


def drafter_identity(draft, folder):
    config = draft.config
    return {
        "weights_dtype": stored_dtype(folder) if folder is not None else None,
        "weights_sha256": weights_fingerprint(draft),
        "distinct_values": distinct_values(draft),
        "target_layer_ids": list(config.target_layer_ids),
        "mask_token_id": int(config.mask_token_id),
        "num_modes": int(config.num_modes),
        "block_size": int(config.block_size),
    }


# ---- the record --------------------------------------------------------------------------------
def measure_record(draft, target, tokenizer, target_spec=None, folder=None, methods=None, known=None):
    """Measure the acceptance record of ``draft`` speculating for ``target`` (both float32) -> dict.
    ``known``: {method: counts of the leading prompts} measured already (under the same conditions)."""
    from .version import __version__

    _require_float32(draft, target)
    prompt_list = prompt_ids(tokenizer, target.config.vocab_size)
    known = known or {}
    per_prompt = {m: known.get(m, []) + count_acceptance(draft, target, prompt_list[len(known.get(m, [])):], m)
                  for m in (methods or methods_of(draft))}
    return {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "mfd_hub_version": __version__,
        "measured": {"temperature": 0, "dtype": "float32", "new_tokens": NEW_TOKENS, "tree_budget": TREE_BUDGET},
        "prompts": {"sha256": prompts_fingerprint(), "count": len(PROMPTS)},
        "target": target_identity(target, target_spec),
        "drafter": drafter_identity(draft, folder),
        "tau": {m: round(tau_of(c), 4) for m, c in per_prompt.items()},
        "per_prompt": per_prompt,
    }


def _require_float32(draft, target):
    if draft.dtype != MEASURE_DTYPE or target.dtype != MEASURE_DTYPE:
        raise ValueError(f"acceptance is measured in float32, not drafter {draft.dtype} / target {target.dtype}")


def record_json(record):
    return json.dumps(record, indent=1) + "\n"


def write_record(folder, record):
    """``acceptance.json`` in ``folder``, written all at once -> its Path."""
    from .atomic import atomic_write_text

    path = Path(folder) / RECORD_NAME
    atomic_write_text(path, record_json(record))
    return path


class RecordError(MfdHubError):
    pass


def read_record(folder):
    """The folder's acceptance record (a dict), None when it has none; RecordError when the file
    is there but is not a record this mfd-hub can compare with."""
    path = Path(folder) / RECORD_NAME
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecordError(f"{RECORD_NAME} is not JSON ({type(err).__name__})") from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise RecordError(f"{RECORD_NAME} is not an mfd-hub acceptance record")
    if record.get("version") != RECORD_VERSION:
        raise RecordError(f"{RECORD_NAME} has record version {record.get('version')!r}; this mfd-hub reads {RECORD_VERSION}")
    per_prompt = record.get("per_prompt")
    if not isinstance(per_prompt, dict) or not all(
        isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and x >= 0 for x in p)
                                    for p in v) for v in per_prompt.values()):
        raise RecordError(f"{RECORD_NAME}: per_prompt must map each method to [tokens, rounds] pairs")
    if not isinstance(record.get("drafter"), dict) or not isinstance(record.get("target"), dict):
        raise RecordError(f"{RECORD_NAME}: the drafter and target sections are missing")
    return record


def comparable(record):
    """Why the record cannot be compared with a measurement taken now (None: it can)."""
    prompts = record.get("prompts") or {}
    if prompts.get("sha256") != prompts_fingerprint():
        return "its prompt set is not this mfd-hub's (another fingerprint)"
    measured = record.get("measured") or {}
    if (measured.get("new_tokens"), measured.get("tree_budget")) != (NEW_TOKENS, TREE_BUDGET):
        return f"it was measured at {measured.get('new_tokens')} tokens / budget {measured.get('tree_budget')}"
    if len(record["per_prompt"].get(CHECK_METHOD, [])) < CHECK_PROMPTS:
        return f"it holds no {CHECK_METHOD} counts for the first {CHECK_PROMPTS} prompts"
    return None


# ---- the check ---------------------------------------------------------------------------------
@dataclass
class Assessment:
    ok: bool
    reason: str
    causes: list = field(default_factory=list)
    tau: float = None
    recorded: float = None


def assess(draft, target, tokenizer, folder, target_spec=None, record="read"):
    """The acceptance check on a loaded drafter and target (float32) -> Assessment.

    ``record="read"``: compare with the folder's record (without one, with ``FLOOR``); a dict:
    compare with that record instead."""
    began = time.perf_counter()
    _require_float32(draft, target)
    if record == "read":
        record = read_record(folder)  # RecordError: the caller reports it
    with _check_products(draft, target):
        return _assess(draft, target, tokenizer, folder, target_spec, record, began)


def _check_products(draft, target):
    """The products the check multiplies with: the fastest this CPU has among those that leave tau
    where exact float32 puts it (fp16-rounded weights or oneDNN's packed ones: the spread
    measurement shows neither moves it), so that a check costs seconds, not tens of them."""
    from .packed_linear import packed_for_speculation, speculation_linears

    return packed_for_speculation(draft, target, linears=speculation_linears("auto", target.device))


def _assess(draft, target, tokenizer, folder, target_spec, record, began):
    prompt_list = prompt_ids(tokenizer, target.config.vocab_size)[:CHECK_PROMPTS]
    total = (NEW_TOKENS - 1) * len(prompt_list)  # the tokens the rounds emit, whatever the drafter
    if record is not None and comparable(record) is None:
        recorded = tau_of(record["per_prompt"][CHECK_METHOD][:CHECK_PROMPTS])
        counts = count_acceptance(draft, target, prompt_list, CHECK_METHOD, max_rounds=int(total / (THRESHOLD * recorded)))
        tau = tau_of(counts)
        ratio = tau / recorded if recorded else float("inf")
        seconds = time.perf_counter() - began
        where = (f"tau {_about(counts)}{tau:.2f} on {CHECK_PROMPTS} prompts ({CHECK_METHOD}), recorded {recorded:.2f} "
                 f"({100 * ratio:.0f}%)")
        if ratio >= THRESHOLD and not counts.stopped:
            return Assessment(True, f"{where}; {seconds:.1f} s", tau=tau, recorded=recorded)
        causes = diagnose(draft, target, tokenizer, folder, record, target_spec, prompt_list, recorded, counts)
        return Assessment(False, f"{where}: this drafter accepts far less than it did{_stop_note(counts)} "
                                 f"({seconds:.1f} s)", causes, tau=tau, recorded=recorded)
    counts = count_acceptance(draft, target, prompt_list, CHECK_METHOD, max_rounds=int(total / FLOOR))
    tau = tau_of(counts)
    seconds = time.perf_counter() - began
    why = "no record" if record is None else f"the record is not comparable: {comparable(record)}"
    where = f"tau {_about(counts)}{tau:.2f} on {CHECK_PROMPTS} prompts ({CHECK_METHOD}), {why}"
    if tau >= FLOOR and not counts.stopped:
        return Assessment(True, f"{where} (floor {FLOOR}); {seconds:.1f} s", tau=tau)
    causes = diagnose(draft, target, tokenizer, folder, None, target_spec, prompt_list, None, counts)
    return Assessment(False, f"{where}: below the floor of {FLOOR}, fewer than one drafted token accepted in ten "
                             f"rounds{_stop_note(counts)} ({seconds:.1f} s)", causes, tau=tau)


def _about(counts):
    return "about " if counts.stopped else ""


def _stop_note(counts):
    """Why a measurement stopped early: past that many rounds no drafter can reach the mark."""
    if not counts.stopped:
        return ""
    return f" (measured until the verdict was certain: {sum(r for _, r in counts)} rounds)"


def record_and_assess(draft, target, tokenizer, folder, target_spec=None):
    """``verify --record``: a folder with a record is compared with it and keeps it; one without
    is measured on every prompt and method, checked against ``FLOOR`` on the first prompts (the
    same counts: nothing is measured twice) and given the record when it passes -> Assessment."""
    existing = read_record(folder)
    if existing is not None:
        result = assess(draft, target, tokenizer, folder, target_spec, record=existing)
        result.reason += f"; kept the existing {RECORD_NAME} (delete it to record anew)"
        return result
    began = time.perf_counter()
    # the check's own prompts first: a drafter below the floor is not worth the whole record
    prompt_list = prompt_ids(tokenizer, target.config.vocab_size)[:CHECK_PROMPTS]
    first = count_acceptance(draft, target, prompt_list, CHECK_METHOD)
    tau = tau_of(first)
    if tau < FLOOR:
        causes = diagnose(draft, target, tokenizer, folder, None, target_spec, prompt_list, None, first)
        return Assessment(False, f"tau {tau:.2f} on {CHECK_PROMPTS} prompts ({CHECK_METHOD}), below the floor of "
                                 f"{FLOOR}: not recorded ({time.perf_counter() - began:.1f} s)", causes, tau=tau)
    record = measure_record(draft, target, tokenizer, target_spec, folder, known={CHECK_METHOD: first})
    write_record(folder, record)
    taus = ", ".join(f"{m} {v:.2f}" for m, v in record["tau"].items())
    return Assessment(True, f"recorded tau {taus} on {len(PROMPTS)} prompts in {RECORD_NAME}; "
                            f"{time.perf_counter() - began:.1f} s", tau=tau)


def diagnose(draft, target, tokenizer, folder, record, target_spec, prompt_list, recorded, counts=()):
    """One line per cause of a low acceptance that can be named: the target, the tap layers, the
    mask token, the weights' precision, the weights themselves, a zeroed matrix. ``counts``: the
    check's own, for its first prompts (the tap trials compare with them)."""
    causes = []
    config = draft.config
    kept = (record or {}).get("drafter", {})
    if record is not None:
        then, now = record["target"], target_identity(target, target_spec)
        sizes = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")
        if any(then.get(k) != now.get(k) for k in sizes):
            causes.append(f"target: measured against {_target_text(then)}, this target is {_target_text(now)}")
        elif then.get("name") and now.get("name") and then["name"] != now["name"]:
            causes.append(f"target: recorded against {then['name']}, this target is {now['name']} (same family and size)")
    causes += _tap_causes(draft, target, kept, prompt_list, recorded, counts)
    mask = int(config.mask_token_id)
    if kept.get("mask_token_id") is not None and kept["mask_token_id"] != mask:
        causes.append(f"mask token: {mask}{_token_text(tokenizer, mask)}, not the recorded {kept['mask_token_id']}"
                      f"{_token_text(tokenizer, kept['mask_token_id'])}")
    elif tokenizer is not None and mask not in set(tokenizer.all_special_ids) and not _is_special(tokenizer, mask):
        causes.append(f"mask token: {mask}{_token_text(tokenizer, mask)} is ordinary text to the target's tokenizer")
    distinct = distinct_values(draft)
    if kept.get("distinct_values") and distinct and distinct * PRECISION_LOSS <= kept["distinct_values"]:
        bits = max(1, (distinct - 1).bit_length())
        causes.append(f"precision: a weight matrix holds {distinct} distinct values (median over matrices, first "
                      f"64 rows), the recorded {kept.get('weights_dtype') or 'weights'} held {kept['distinct_values']}: "
                      f"rounded to about {bits} bits")
    elif folder is not None and kept.get("weights_dtype") and stored_dtype(folder) not in (None, kept["weights_dtype"]):
        causes.append(f"precision: the weights are {stored_dtype(folder)}, the record's were {kept['weights_dtype']}")
    zeroed = sorted(n for n, t in _matrices(draft).items() if not bool(t.any()))
    if zeroed:
        causes.append(f"weights: {', '.join(zeroed[:3])} all zeros"
                      + (" (the context projection: the drafter no longer sees the target)" if "fc.weight" in zeroed else ""))
    if kept.get("weights_sha256") and kept["weights_sha256"] != weights_fingerprint(draft) and not zeroed:
        causes.append("weights: not the recorded ones (their fingerprint differs)")
    return causes


def _target_text(identity):
    return (f"{identity.get('name') or 'a target'} ({identity.get('model_type')}, {identity.get('num_hidden_layers')} "
            f"layers, hidden {identity.get('hidden_size')}, vocabulary {identity.get('vocab_size')})")


def _is_special(tokenizer, token_id):
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return token_id in added and getattr(added[token_id], "special", False)


def _token_text(tokenizer, token_id):
    if tokenizer is None:
        return ""
    try:
        return f" ({tokenizer.decode([token_id])!r})"
    except Exception:  # an id the tokenizer cannot spell
        return ""


def _tap_causes(draft, target, kept, prompt_list, recorded, counts=()):
    """When the taps differ from the record's, try the likely mix-ups on two prompts and name the
    order that restores tau. (Without a record nothing says the taps changed, and trying orders
    on a drafter that was never good would only cost time.)"""
    config = draft.config
    taps = list(config.target_layer_ids)
    layers = config.num_target_layers
    recorded_taps = kept.get("target_layer_ids")
    if recorded_taps is None or recorded_taps == taps:
        return []  # measured with these very taps (or unknown): the taps are not what changed
    causes = [f"tap layers: {taps}, the record's are {recorded_taps}"]
    candidates = [(recorded_taps, "the recorded order"), (taps[::-1], "reversed")]
    for shift in (-1, 1):
        moved = [t + shift for t in taps]
        if all(0 <= t < layers for t in moved):
            candidates.append((moved, f"shifted by {shift:+d}"))
    sample = prompt_list[:2]
    finished = counts[:2] if len(counts) > 2 or (len(counts) == 2 and not getattr(counts, "stopped", False)) else None
    baseline = tau_of(finished or count_acceptance(draft, target, sample, CHECK_METHOD))
    want = THRESHOLD * recorded
    for candidate, label in candidates:
        if candidate == taps or len(candidate) != len(taps) or len(set(candidate)) != len(candidate):
            continue
        config.target_layer_ids = list(candidate)
        try:
            tau = tau_of(count_acceptance(draft, target, sample, CHECK_METHOD))
        finally:
            config.target_layer_ids = taps
        if tau >= want:
            causes.append(f"tap layers: {candidate} ({label}) restore tau {tau:.2f} on {len(sample)} prompts "
                          f"(the config's {taps} give {baseline:.2f})")
            break
    return causes


def compare_conversion(source_folder, converted_folder, target_spec):
    """A converted drafter's acceptance against its source's record -> a summary dict.

    The converted drafter is measured on every prompt and method; its chain over all the prompts
    is compared with the source's. At ``THRESHOLD`` or above the measurement becomes the converted
    drafter's own record; below, it gets none (a record must describe a drafter known to be good)."""
    from .checkpoint import load_draft
    from .targets import load_target

    source_record = read_record(source_folder)
    if source_record is None or comparable(source_record) is not None:
        why = "has no acceptance.json" if source_record is None else f"has a record that {comparable(source_record)}"
        return {"compared": False, "reason": f"the source {why}"}
    draft = load_draft(converted_folder)
    target, tokenizer = load_target(target_spec)
    record = measure_record(draft, target, tokenizer, target_spec, converted_folder)
    tau = tau_of(record["per_prompt"][CHECK_METHOD])
    source_tau = tau_of(source_record["per_prompt"][CHECK_METHOD])
    ratio = tau / source_tau if source_tau else float("inf")
    kept = ratio >= THRESHOLD
    if kept:
        write_record(converted_folder, record)
    return {"compared": True, "method": CHECK_METHOD, "prompts": len(PROMPTS), "tau": tau, "source_tau": source_tau,
            "ratio": ratio, "ok": kept, "recorded": kept, "tau_by_method": record["tau"]}


def conversion_line(summary):
    """One line for a person about ``compare_conversion``'s summary."""
    if not summary["compared"]:
        return f"acceptance: not compared ({summary['reason']})"
    line = (f"acceptance: tau {summary['tau']:.2f} on {summary['prompts']} prompts ({summary['method']}), the source "
            f"recorded {summary['source_tau']:.2f} ({100 * summary['ratio']:.0f}%)")
    if summary["ok"]:
        return line + f"; recorded in {RECORD_NAME}"
    return line + f": the converted drafter accepts far less than its source (no {RECORD_NAME} written)"
