"""Training data of block drafters: sequences, anchors, batches and the target's tap features.

Sequences come from ``mfd-hub regen`` output (``prompt_ids`` + ``response_ids``); loss is on
response tokens only. Anchors are positions p with p and p+1 both response tokens; the block is
``[token p, mask x (S-1)]`` and block position k predicts token p + k.

The target's tap features are computed ONCE per dataset into a feature store (safetensors shards
keyed by record id, bf16 by default), shared by every run on the same data and target, and grown
incrementally when records are added; ``online`` mode computes them in each step instead, for
datasets whose features do not fit on disk.

Randomness is a pure function of (seed, epoch, record index): data order and anchors do not
depend on the number of ranks or on where a run was resumed.
"""

import array
import json
import os
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from mfd_hub.errors import MfdHubError
from mfd_hub.packed_linear import packed_linears
from mfd_hub.recipes.regen import json_lines

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
META_NAME = "meta.json"
HEAD_NAME = "head.safetensors"


# -- sequences ---------------------------------------------------------------------------------
@dataclass
class Sequence:
    """One training conversation: token ids (prompt then response) and where the response starts."""

    id: str
    ids: list
    prompt_len: int

    @property
    def length(self):
        return len(self.ids)

    @property
    def crc(self):
        return zlib.crc32(array.array("q", self.ids).tobytes())


def load_sequences(path, max_length):
    """Regenerated records -> (sequences, number dropped), from a JSON Lines file, a .jsonl.gz file
    or a regen folder of shards (``mfd_hub.recipes.regen.record_lines``). Sequences are cut to
    ``max_length`` tokens; those left with fewer than 2 response tokens (no anchor) are dropped."""
    path = Path(path)
    if not path.exists():
        raise MfdHubError(f"training data {path} not found (make it with 'mfd-hub regen')")
    sequences, dropped, seen = [], 0, set()
    for _, where, record in json_lines(path):
        try:
            rid, prompt, response = str(record["id"]), record["prompt_ids"], record["response_ids"]
            ids = [int(t) for t in (list(prompt) + list(response))[:max_length]]
        except (KeyError, TypeError, ValueError) as err:
            raise MfdHubError(
                f"{where}: not a regen record with id, prompt_ids and response_ids ({err})"
            ) from None
        if rid in seen:
            raise MfdHubError(f"{where}: duplicate record id {rid!r}")
        seen.add(rid)
        prompt_len = max(1, len(prompt))  # an anchor needs at least one context position
        if len(ids) - prompt_len < 2:
            dropped += 1
            continue
        sequences.append(Sequence(rid, ids, prompt_len))
    if not sequences:
        raise MfdHubError(f"{path} holds no usable sequence (each needs at least 2 response tokens)")
    return sequences, dropped


def data_checksum(sequences):
    """One checksum of every sequence's id and tokens (in order): a resumed run checks it."""
    crc = 0
    for seq in sequences:
        crc = zlib.crc32(f"{seq.id}:{seq.crc}:{seq.prompt_len};".encode(), crc)
    return crc


def response_token_counts(sequences, vocab_size):
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        counts += torch.bincount(torch.tensor(seq.ids[seq.prompt_len :]), minlength=vocab_size)[:vocab_size]
    return counts


def draft_vocabulary(sequences, size, vocab_size):
    """The ``size`` most frequent response tokens (ties: smaller id; only tokens that occur), as
    sorted target ids (converters.draft_vocab.select_draft_vocab over the response counts)."""
    from mfd_hub.converters.draft_vocab import select_draft_vocab

    if size > vocab_size:
        raise MfdHubError(f"draft_vocab_size {size} exceeds the target vocabulary of {vocab_size}")
    return select_draft_vocab(response_token_counts(sequences, vocab_size), size)


# -- order and anchors ---------------------------------------------------------------------------
def _generator(*keys):
    gen = torch.Generator()
    gen.manual_seed(hash(tuple(int(k) for k in keys)) & 0x7FFF_FFFF_FFFF_FFFF)
    return gen


def epoch_order(num_sequences, seed, epoch):
    return torch.randperm(num_sequences, generator=_generator(seed, epoch, -1))


def step_sequences(step, num_sequences, global_batch, seed):
    """(epoch, sequence indices) of a global step; the last incomplete batch of an epoch is dropped."""
    per_epoch = num_sequences // global_batch
    epoch, batch = divmod(step, per_epoch)
    order = epoch_order(num_sequences, seed, epoch)
    return epoch, order[batch * global_batch : (batch + 1) * global_batch].tolist()


def sample_anchors(seq, count, seed, epoch, index):
    """Up to ``count`` distinct anchors p in [prompt_len, length-2], sorted -> (anchors [count],
    valid [count]); missing ones are padding (anchor 0, not valid)."""
    candidates = seq.length - 1 - seq.prompt_len
    take = min(count, candidates)
    chosen = torch.randperm(candidates, generator=_generator(seed, epoch, index))[:take].sort().values + seq.prompt_len
    anchors = torch.zeros(count, dtype=torch.long)
    valid = torch.zeros(count, dtype=torch.bool)
    anchors[:take], valid[:take] = chosen, True
    return anchors, valid


@dataclass
class Batch:
    """A micro-batch: ids [B, L] (0-padded), lengths [B], anchors/block_valid [B, N], taps
    [B, C, n_taps*H] (context positions 0..C-1, C = the largest anchor)."""

    ids: torch.Tensor
    lengths: torch.Tensor
    anchors: torch.Tensor
    block_valid: torch.Tensor
    taps: torch.Tensor

    def to(self, device):
        fields = (self.ids, self.lengths, self.anchors, self.block_valid, self.taps)
        return Batch(*(t.to(device, non_blocking=True) for t in fields))


def make_batch(sequences, indices, anchors, taps):
    """Collate ``sequences[i] for i in indices`` with their anchors ((anchors, valid) pairs from
    ``sample_anchors``) and taps (one [L_i, F] tensor each, on any device)."""
    seqs = [sequences[i] for i in indices]
    block_valid = torch.stack([v for _, v in anchors])
    anchors = torch.stack([a for a, _ in anchors])
    width = max(s.length for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : s.length] = torch.tensor(s.ids)
    # a block sees context strictly before its anchor: nothing at or after the largest anchor is read
    context = max(1, int(anchors.max()))
    feats = taps[0].new_zeros(len(seqs), context, taps[0].shape[-1])
    for row, t in enumerate(taps):
        n = min(context, t.shape[0])
        feats[row, :n] = t[:n]
    lengths = torch.tensor([s.length for s in seqs])
    return Batch(ids, lengths, anchors, block_valid, feats)


# -- the target's tap features ------------------------------------------------------------------
def target_identity(target, spec):
    """What a drafter records about its target (DFlashConfig.target)."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    return {
        "name_or_path": str(spec),
        "model_type": config.model_type,
        "hidden_size": int(config.hidden_size),
        "vocab_size": int(config.vocab_size),
        "num_hidden_layers": int(config.num_hidden_layers),
    }


class TapExtractor:
    """Runs the frozen target over token sequences and returns its tap features: the outputs of
    decoder layers ``layer_ids`` (tap i = hidden_states[i + 1]), concatenated per position."""

    def __init__(self, target, layer_ids, dtype, batch_tokens=16384):
        self.target, self.layer_ids, self.dtype, self.batch_tokens = target, list(layer_ids), dtype, batch_tokens
        self.decoder = target.get_decoder() if hasattr(target, "get_decoder") else target.model
        self.device = next(target.parameters()).device

    @torch.no_grad()
    def __call__(self, id_lists):
        """list of token-id lists -> list of [L_i, n_taps*H] tensors on the CPU (store dtype). An
        fp32 target on CPU multiplies through oneDNN meanwhile (``mfd_hub.packed_linear``: 352
        against 250-284 tokens/s measured on SmolLM2, 2 cores)."""
        with packed_linears(self.target, self.batch_tokens):
            return self._extract(id_lists)

    def _extract(self, id_lists):
        out = [None] * len(id_lists)
        order = sorted(range(len(id_lists)), key=lambda i: len(id_lists[i]))
        start = 0
        while start < len(order):
            stop = start + 1  # grow the batch while the padded size fits the token budget
            while stop < len(order) and (stop + 1 - start) * len(id_lists[order[stop]]) <= self.batch_tokens:
                stop += 1
            rows = order[start:stop]
            width = len(id_lists[rows[-1]])
            ids = torch.zeros(len(rows), width, dtype=torch.long)
            mask = torch.zeros(len(rows), width, dtype=torch.long)
            for r, i in enumerate(rows):  # right padding keeps every real token at its position
                ids[r, : len(id_lists[i])] = torch.tensor(id_lists[i])
                mask[r, : len(id_lists[i])] = 1
            hidden = self.decoder(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device), output_hidden_states=True
            ).hidden_states
            taps = torch.cat([hidden[i + 1] for i in self.layer_ids], dim=-1).to(self.dtype).cpu()
            for r, i in enumerate(rows):
                out[i] = taps[r, : len(id_lists[i])].clone()
            start = stop
        return out


def head_weights(target):
    """(embedding [V, H], LM head [V, H]) of a target, detached."""
    return (target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach())


class FeatureStore:
    """Tap features on disk: ``meta.json`` (what they were computed with), ``head.safetensors``
    (the target's embedding and LM head, so training needs no target once the store is full) and
    shards ``shard-*.safetensors`` holding ``taps/<record id>`` [L, n_taps*H] with each record's
    length and token checksum in the shard metadata. Shards appear by atomic rename only."""

    def __init__(self, root, spec):
        self.root = Path(root)
        self.spec = dict(spec)
        self._index = None  # record id -> (shard path, length, crc)
        self._handles = {}

    def check_meta(self):
        """Refuse a store built with other settings (another target, taps, dtype or length)."""
        meta_path = self.root / META_NAME
        if not meta_path.exists():
            return False
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            raise MfdHubError(f"{meta_path} is not valid JSON; delete the feature store {self.root}") from None
        for key, value in self.spec.items():
            if meta.get(key) != value:
                raise MfdHubError(
                    f"feature store {self.root} was built with {key}={meta.get(key)!r}, this run needs {value!r}: "
                    "delete it or set data.features_dir"
                )
        return True

    def write_meta(self, target_info):
        self.root.mkdir(parents=True, exist_ok=True)
        meta = {**self.spec, "target_info": target_info}
        tmp = self.root / f".{META_NAME}.{os.getpid()}"
        tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.root / META_NAME)

    def target_info(self):
        return json.loads((self.root / META_NAME).read_text(encoding="utf-8"))["target_info"]

    def index(self, refresh=False):
        if self._index is None or refresh:
            from safetensors import safe_open

            self._index = {}
            for shard in sorted(self.root.glob("shard-*.safetensors")):
                with safe_open(str(shard), framework="pt") as handle:
                    records = json.loads((handle.metadata() or {}).get("records", "{}"))
                for rid, (length, crc) in records.items():
                    self._index[rid] = (shard, length, crc)
        return self._index

    def missing(self, sequences):
        """Indices of sequences without stored features; a stored record whose tokens changed is an error."""
        index, todo = self.index(refresh=True), []
        for i, seq in enumerate(sequences):
            entry = index.get(seq.id)
            if entry is None:
                todo.append(i)
            elif entry[1] != seq.length or entry[2] != seq.crc:
                raise MfdHubError(
                    f"feature store {self.root} holds record {seq.id!r} with other tokens than the data: "
                    "delete the store or set data.features_dir"
                )
        return todo

    def has_head(self):
        return (self.root / HEAD_NAME).exists()

    def save_head(self, embed, lm_head):
        from safetensors.torch import save_file

        tmp = self.root / f".{HEAD_NAME}.{os.getpid()}"
        save_file({"embed": embed.cpu().contiguous().clone(), "lm_head": lm_head.cpu().contiguous().clone()}, tmp)
        os.replace(tmp, self.root / HEAD_NAME)

    def load_head(self):
        from safetensors.torch import load_file

        weights = load_file(self.root / HEAD_NAME)
        return weights["embed"], weights["lm_head"]

    def write_shard(self, records):
        """records: list of (sequence, taps) -> one new shard file."""
        from safetensors.torch import save_file

        self.root.mkdir(parents=True, exist_ok=True)
        name = f"shard-{uuid.uuid4().hex[:16]}.safetensors"
        tensors = {f"taps/{seq.id}": taps.contiguous() for seq, taps in records}
        meta = {"records": json.dumps({seq.id: [seq.length, seq.crc] for seq, _ in records})}
        tmp = self.root / f".{name}.tmp"
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, self.root / name)

    def build(self, extractor, sequences, todo, shard_records=256, progress=None):
        """Compute and store the features of ``sequences[i] for i in todo`` (this rank's share)."""
        for start in range(0, len(todo), shard_records):
            chunk = [sequences[i] for i in todo[start : start + shard_records]]
            taps = extractor([seq.ids for seq in chunk])
            self.write_shard(list(zip(chunk, taps)))
            if progress is not None:
                progress(len(chunk))

    def get(self, seq):
        from safetensors import safe_open

        shard = self.index()[seq.id][0]
        handle = self._handles.get(shard)
        if handle is None:
            handle = self._handles[shard] = safe_open(str(shard), framework="pt")
        return handle.get_tensor(f"taps/{seq.id}")
