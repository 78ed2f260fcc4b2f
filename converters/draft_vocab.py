"""Full-vocabulary drafter -> reduced draft vocabulary (``mfd-hub convert draft-vocab``).

The drafter's LM head over the target's whole vocabulary costs more than the drafter itself on
small hardware (DESIGN §4). A draft vocabulary keeps the N tokens the target actually writes
most often (counted over a response corpus) and gives the drafter its own ``lm_head``: those N
rows of the target's LM head, so the drafter's distribution over them is unchanged up to
normalisation. ``d2t`` (int64, target id = i + d2t[i]) maps the draft ids back and ``t2d``
(bool over the target vocabulary) marks them, as serving engines expect (DESIGN §3). Drafting
happens over the N tokens; verification stays over the full vocabulary, so decoding is still
lossless: a token outside the draft vocabulary is simply never proposed.

Choices: draft ids are in ascending target-id order (d2t >= 0, monotone); ties in frequency go
to the smaller id; the target's end-of-sequence tokens are always kept (so a drafted block can
end a response); the mask token is an input-side token (embedded with the target's full
embedding) and gets no slot unless the corpus really contains it.
"""

import json
from pathlib import Path

import torch

from mfd_hub.checkpoint import load_draft, save_draft
from mfd_hub.locate import resolve_drafter
from mfd_hub.errors import MfdHubError, UsageError

from mfd_hub.precision import dtype_name

from .common import build_drafter, copy_config, record_conversion, stored_float_dtype

ID_FIELDS = ("response_ids", "token_ids", "input_ids", "ids")
TEXT_FIELDS = ("response", "text", "completion")
_FLUSH_TOKENS = 1 << 20  # ids buffered before a bincount


def _record_tokens(record, field, tokenizer, where):
    """One JSON Lines record -> its token ids (a list of ints)."""
    if isinstance(record, dict):
        names = (field,) if field else ID_FIELDS + TEXT_FIELDS
        value = next((record[n] for n in names if n in record), None)
        if value is None:
            raise MfdHubError(f"{where}: no field {' / '.join(names)}")
    else:
        value = record
    if isinstance(value, str):
        if tokenizer is None:
            raise MfdHubError(f"{where}: a text record needs a tokenizer (the target has none; pass --tokenizer)")
        return tokenizer(value, add_special_tokens=False)["input_ids"]
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    raise MfdHubError(f"{where}: expected a list of token ids or a text, got {type(value).__name__}")


def count_token_frequencies(corpus, vocab_size, field=None, tokenizer=None, progress=None):
    """Token counts over a JSON Lines response corpus -> (counts int64 [V], number of records).

    The corpus is a JSON Lines file, a .jsonl.gz file or a regen folder of shards (read by
    ``mfd_hub.recipes.regen.record_lines``). A record is a JSON object (its ``field``, else the
    first of response_ids / token_ids / input_ids / ids, or a text field response / text /
    completion tokenised with ``tokenizer``), a bare list of ids, or a bare string. ``progress``
    is called with bytes read (uncompressed).
    """
    from mfd_hub.recipes.regen import record_lines

    corpus = Path(corpus)
    if not corpus.exists():
        raise MfdHubError(f"corpus {corpus} not found")
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    buffer, records = [], 0

    def flush():
        if buffer:
            counts.add_(torch.bincount(torch.tensor(buffer, dtype=torch.int64), minlength=vocab_size))
            buffer.clear()

    for _, where, raw in record_lines(corpus):
        if progress is not None:
            progress(len(raw))
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise MfdHubError(f"{where}: not a JSON line") from None
        ids = _record_tokens(record, field, tokenizer, where)
        if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
            raise MfdHubError(f"{where}: token id {max(ids) if max(ids) >= vocab_size else min(ids)} is outside the vocabulary of {vocab_size}")
        buffer.extend(ids)
        records += 1
        if len(buffer) >= _FLUSH_TOKENS:
            flush()
    flush()
    if records == 0 or int(counts.sum()) == 0:
        raise MfdHubError(f"corpus {corpus} holds no tokens")
    return counts, records


def select_draft_vocab(counts, size, keep=()):
    """The draft vocabulary: ``keep`` plus the most frequent seen tokens, ``size`` in all (fewer
    when the corpus has fewer distinct tokens) -> target ids, ascending (int64)."""
    vocab_size = counts.shape[0]
    keep = sorted({int(t) for t in keep})
    if not 0 < size <= vocab_size:
        raise UsageError(f"--size must be in 1..{vocab_size} (the target's vocabulary)")
    if len(keep) > size:
        raise UsageError(f"--size {size} cannot hold the {len(keep)} end-of-sequence tokens that are always kept")
    if any(not 0 <= t < vocab_size for t in keep):
        raise MfdHubError(f"end-of-sequence id(s) {keep} outside the vocabulary of {vocab_size}")
    # most frequent first, ties to the smaller id: a stable sort of ids by descending count
    order = torch.sort(counts, descending=True, stable=True).indices
    seen = order[counts[order] > 0]
    chosen = set(keep)
    for token in seen.tolist():
        if len(chosen) >= size:
            break
        chosen.add(token)
    return torch.tensor(sorted(chosen), dtype=torch.int64)


def reduce_vocabulary(drafter, lm_head_weight, keep_ids):
    """A copy of ``drafter`` drafting over ``keep_ids`` (ascending target ids): its own lm_head
    (those rows of the target's LM head), draft_vocab_size, d2t and t2d."""
    config = drafter.config
    if config.draft_vocab_size:
        raise MfdHubError(
            f"the drafter already has a draft vocabulary of {config.draft_vocab_size}; start from its full-vocabulary form"
        )
    if tuple(lm_head_weight.shape) != (config.vocab_size, config.hidden_size):
        raise MfdHubError(
            f"the target's LM head is {list(lm_head_weight.shape)}, the drafter needs "
            f"[{config.vocab_size}, {config.hidden_size}] (is this the drafter's target?)"
        )
    keep_ids = torch.as_tensor(keep_ids, dtype=torch.int64)
    if not bool((keep_ids[1:] > keep_ids[:-1]).all()):
        raise MfdHubError("draft vocabulary ids must be strictly ascending")
    state = dict(drafter.state_dict())
    state["lm_head.weight"] = lm_head_weight[keep_ids].to(torch.float32).clone()
    state["d2t"] = keep_ids - torch.arange(keep_ids.numel())
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
    t2d[keep_ids] = True
    state["t2d"] = t2d
    return build_drafter(copy_config(config, draft_vocab_size=int(keep_ids.numel())), state)


def convert_draft_vocab(source, out, target, corpus, size, field=None, tokenizer=None, dtype=None,
                        max_shard_size="5GB", overwrite=False, progress=None, log=None):
    """Write ``source``'s drafter with a ``size``-token draft vocabulary counted over ``corpus``.

    target: the drafter's target (folder, Hub id or 'smollm2'): its LM-head rows, its stop
    tokens and (for text corpora) its tokenizer. tokenizer: another tokenizer folder for text.
    dtype: the output's weight dtype (None: the source's). Returns a summary dict.
    """
    from mfd_hub.recipes.regen import files_digest
    from mfd_hub.targets import target_config, target_lm_head, target_tokenizer_and_stops

    log = log or (lambda message: None)
    folder = resolve_drafter(source)
    drafter = load_draft(folder, dtype=torch.float32)
    config = drafter.config
    tconfig = target_config(str(target))
    if (tconfig.get("vocab_size"), tconfig.get("hidden_size")) != (config.vocab_size, config.hidden_size):
        raise MfdHubError(
            f"target {target} (vocabulary {tconfig.get('vocab_size')}, hidden {tconfig.get('hidden_size')}) does not "
            f"match the drafter (vocabulary {config.vocab_size}, hidden {config.hidden_size})"
        )
    target_tok, stops = target_tokenizer_and_stops(str(target))
    if tokenizer is not None:
        from transformers import AutoTokenizer

        try:
            target_tok = AutoTokenizer.from_pretrained(str(tokenizer))
        except (OSError, ValueError) as err:
            raise MfdHubError(f"cannot load tokenizer {tokenizer}: {' '.join(str(err).split())[:200]}") from None
    log(f"counting tokens in {corpus} ...")
    counts, records = count_token_frequencies(corpus, config.vocab_size, field, target_tok, progress)
    keep = select_draft_vocab(counts, size, keep=stops)
    total = int(counts.sum())
    coverage = float(counts[keep].sum()) / total
    log(f"reading the target's LM head ({target}) ...")
    reduced = reduce_vocabulary(drafter, target_lm_head(str(target)), keep)
    out_dtype = dtype or stored_float_dtype(folder)
    digest = files_digest(corpus)  # of the corpus file itself; of its shards in order for a folder
    summary = {
        "draft_vocab_size": int(keep.numel()), "requested_size": size, "corpus": str(corpus), "corpus_sha256": digest,
        "records": records, "tokens": total, "distinct_tokens": int((counts > 0).sum()), "coverage": round(coverage, 6),
        "always_kept": stops, "mask_token_in_draft_vocab": bool(reduced.t2d[config.mask_token_id]),
        "target": str(target),
    }
    record_conversion(reduced.config, "draft-vocab", source, **summary)
    save_draft(reduced, out, dtype=out_dtype, max_shard_size=max_shard_size, overwrite=overwrite)
    return {"out": str(out), "source": str(source), "dtype": dtype_name(out_dtype), **summary}
