"""Target-regenerated training data: the target answers each prompt itself.

Drafters learn what the target says, so their training responses come from the target, sampled
with the recipe's settings (DESIGN §2: T = 0.7, top-p 0.8, top-k 20). One record per prompt:
``{"id", "prompt", "response", "prompt_ids", "response_ids", "finish_reason"}``; the ids are
exactly the tokens the target saw and produced (chat template included, the stop token kept when
it stopped), so training needs no re-tokenisation. Records are written in prompt order.

Output (``RegenOutput``) is a JSON Lines file, appended as answers finish, or a folder of shards:
complete shards ``part-NNNNN.jsonl.gz`` (N records each, written once, atomically: safe to commit)
and the shard in progress ``.part-NNNNN.jsonl`` (appended, hidden: git ignores it). A rerun skips
the ids already written; a line cut short by a crash is dropped on resume. A sidecar (``regen.json``
in the folder, ``FILE.regen.json`` beside a file) records which engine, dtype and sampling settings
wrote the records from which position on. ``record_lines`` is the one reader of all three forms
(a .jsonl file, a .jsonl.gz file, a folder) for everything that reads regen output.

Engines: ``ContinuousEngine`` (the default on this machine: continuous batching over a
preallocated KV cache, a finished row takes the next prompt at once), ``TransformersEngine``
(transformers ``generate`` over left-padded static batches, the original engine), or
``OpenAIEngine``, a thin client of an OpenAI-compatible completions endpoint (a vLLM or SGLang
server of the same target) that sends the locally templated prompt ids and reads back the sampled
token ids. Prompts come from JSON Lines (a file or a folder, as above) or, when online, a Hugging
Face dataset (``hf:NAME[:SPLIT]``).
"""

import gzip
import hashlib
import json
import os
import re
import urllib.error
import urllib.request
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from mfd_hub.errors import MfdHubError, UsageError
from mfd_hub.packed_linear import LINEARS, linears_label, packed_for_speculation, packed_linears_available
from mfd_hub.precision import dtype_name
from mfd_hub.remote.sampling_mfd import next_tokens

PROMPT_FIELDS = ("prompt", "instruction", "question", "text")
HF_PREFIX = "hf:"
SHARD_SIZE = 500  # records per complete shard of a folder output
META_NAME = "regen.json"  # the sidecar inside a folder output
_SHARD = re.compile(r"part-(\d{5,})\.jsonl\.gz")
_PARTIAL = re.compile(r"\.part-(\d{5,})\.jsonl")
_CHUNK = 4096  # prompts templated and handed to an engine at a time


def prompt_of(record):
    """The prompt text of one record: a string, one of PROMPT_FIELDS, or the first user turn of
    ``messages`` (role/content) or ``conversations`` (ShareGPT from/value); None if none."""
    if isinstance(record, str):
        return record
    if not isinstance(record, dict):
        return None
    text = next((record[f] for f in PROMPT_FIELDS if isinstance(record.get(f), str)), None)
    if text is None and isinstance(record.get("messages"), list):
        text = next((m.get("content") for m in record["messages"] if m.get("role") == "user"), None)
    if text is None and isinstance(record.get("conversations"), list):
        text = next((m.get("value") for m in record["conversations"] if m.get("from") in ("human", "user")), None)
    return text


def read_prompts(path):
    """Prompts from JSON Lines (a file, a .jsonl.gz file or a regen output folder) -> list of (id,
    prompt text). Each record holds one of the fields prompt / instruction / question / text, or
    ``messages`` / ``conversations`` (the first user turn); ``id`` defaults to the line number.
    ``hf:NAME[:SPLIT]`` reads a Hub dataset."""
    if str(path).startswith(HF_PREFIX):
        return read_hf_prompts(str(path)[len(HF_PREFIX) :])
    path = Path(path)
    if not path.exists():
        raise MfdHubError(f"prompt file {path} not found")
    prompts = []
    for number, where, record in json_lines(path):
        text = prompt_of(record)
        if not text:
            fields = ", ".join(PROMPT_FIELDS)
            raise MfdHubError(f"{where}: no prompt field ({fields}, messages or conversations)")
        rid = record.get("id", number) if isinstance(record, dict) else number
        prompts.append((str(rid), text))
    return prompts


# -- reading regen output: one place for a .jsonl file, a .jsonl.gz file and a folder of shards ---
def _folder_parts(folder):
    """({index: complete shard}, {index: shard in progress}) of a regen output folder."""
    shards, partials = {}, {}
    for entry in Path(folder).iterdir():
        if match := _SHARD.fullmatch(entry.name):
            shards[int(match[1])] = entry
        elif match := _PARTIAL.fullmatch(entry.name):
            partials[int(match[1])] = entry
    return shards, partials


def regen_files(path):
    """The files holding the records at ``path``, in reading order -> list of (file, in progress?).

    A file (``.jsonl``, or gzip-compressed ``.jsonl.gz``) is itself; a folder gives its complete
    shards ``part-NNNNN.jsonl.gz`` by number, then its hidden shard in progress
    ``.part-NNNNN.jsonl`` (one left over beside its complete shard, by a crash, is passed over)."""
    path = Path(path)
    if path.is_dir():
        shards, partials = _folder_parts(path)
        files = [(shards[i], False) for i in sorted(shards)]
        files += [(partials[i], True) for i in sorted(partials) if i not in shards]
        if not files:
            raise MfdHubError(f"{path} is a folder without regen shards (part-NNNNN.jsonl.gz or .part-NNNNN.jsonl)")
        return files
    if not path.is_file():
        raise MfdHubError(f"{path} not found")
    return [(path, False)]


def record_lines(path):
    """Every line of the regen output (or any JSON Lines) at ``path`` -> (number, where, raw bytes).

    ``path`` is a JSON Lines file, a ``.jsonl.gz`` file or a folder of shards (``regen_files``).
    ``number`` counts lines from 1 across all files (a file's own line numbers, for one file);
    ``where`` is ``FILE:LINE`` for messages. The last line of a shard in progress is left out when
    it has no newline yet (being written, or cut by a crash)."""
    number = 0
    for file, in_progress in regen_files(path):
        opener = gzip.open if file.name.endswith(".gz") else open
        try:
            with opener(file, "rb") as handle:
                for line, raw in enumerate(handle, 1):
                    if in_progress and not raw.endswith(b"\n"):
                        break
                    number += 1
                    yield number, f"{file}:{line}", raw
        except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
            raise MfdHubError(f"{file}: cannot read it ({err})") from None


def json_lines(path):
    """(number, where, record) for every non-blank line of ``record_lines(path)``; a line that is
    not JSON is an error."""
    for number, where, raw in record_lines(path):
        if not raw.strip():
            continue
        try:
            yield number, where, json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise MfdHubError(f"{where}: not JSON ({getattr(err, 'msg', err)})") from None


def files_digest(path):
    """sha256 (hex) of the bytes of the files at ``path`` in reading order (for one file: of it)."""
    digest = hashlib.sha256()
    for file, _ in regen_files(path):
        with open(file, "rb") as handle:
            while block := handle.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()


def read_hf_prompts(spec):
    """``NAME[:SPLIT]`` of a Hugging Face dataset -> list of (id, prompt). Needs the optional
    ``datasets`` package and a connection (or its local cache); ids are ``NAME:SPLIT:row``."""
    name, _, split = spec.partition(":")
    split = split or "train"
    try:
        import datasets
    except ImportError:
        raise MfdHubError("reading prompts from the Hub needs the datasets package: pip install datasets") from None
    try:
        rows = datasets.load_dataset(name, split=split)
    except Exception as err:  # network, missing dataset or split: all one line for the user
        raise MfdHubError(f"cannot load dataset {name} ({split}): {' '.join(str(err).split())[:200]}") from None
    prompts = []
    for row_number, row in enumerate(rows):
        text = prompt_of(row)
        if not text:
            raise MfdHubError(f"dataset {name} row {row_number}: no prompt field ({', '.join(PROMPT_FIELDS)}, "
                              "messages or conversations)")
        prompts.append((str(row.get("id", f"{name}:{split}:{row_number}")), text))
    return prompts


# -- writing regen output ------------------------------------------------------------------------
def is_folder_output(path):
    """Whether ``--out`` names a folder of shards: an existing folder, a path ending in a slash, or
    a new path without a suffix (``data/regen``); anything else is one JSON Lines file."""
    text, path = str(path), Path(path)
    return path.is_dir() or text.endswith(("/", os.sep)) or (not path.exists() and not path.suffix)


def _good_lines(file):
    """Ids of a JSON Lines file being appended to, cutting off a last line a crash left unfinished
    or unparsable -> (ids in order)."""
    ids, good_bytes = [], 0
    with file.open("rb") as handle:
        for raw in handle:
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                break
            if not raw.endswith(b"\n"):
                break
            ids.append(str(record["id"]))
            good_bytes += len(raw)
    if good_bytes != file.stat().st_size:
        with file.open("r+b") as handle:
            handle.truncate(good_bytes)
    return ids


class RegenOutput:
    """Where regen writes: one JSON Lines file, appended, or a folder of shards.

    In a folder, records go to the hidden shard in progress ``.part-NNNNN.jsonl`` (appended and
    flushed as answers finish); when it holds ``shard_size`` records it is compressed to
    ``part-NNNNN.jsonl.gz`` (written beside under a temporary name, synced, renamed into place)
    and removed, and the next number starts; when every prompt is answered the last one is
    completed too, however short (``seal``). Complete shards are never changed again. Opening
    repairs what a crash can leave: a cut last line is dropped, a shard in progress whose complete
    shard exists is removed. ``done`` holds the ids already written; ``count`` how many records.
    """

    def __init__(self, path, shard_size=SHARD_SIZE):
        self.path, self.shard_size = Path(path), shard_size
        self.folder = is_folder_output(path)
        self._handle = None
        if not self.folder:
            if self.path.name.endswith(".gz"):
                raise UsageError(f"{path}: regen appends as it goes and cannot append to gzip; "
                                 "write a folder of shards (gzip shards) or a .jsonl file")
            ids = _good_lines(self.path) if self.path.exists() else []
            self.meta_path = self.path.with_name(self.path.name + ".regen.json")
        else:
            ids = self._open_folder()
            self.meta_path = self.path / META_NAME
        self.done, self.count = set(ids), len(ids)

    def _open_folder(self):
        folder = self.path
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(".part-*.tmp"):  # a shard whose writing a crash interrupted
            stale.unlink()
        shards, partials = _folder_parts(folder)
        self.index = max(shards) + 1 if shards else 0
        for number, file in partials.items():
            if number in shards:  # left over between writing its complete shard and removing it
                file.unlink()
            elif number != self.index:
                raise MfdHubError(f"{file}: a shard in progress out of sequence (the next shard is number {self.index})")
        ids = [str(record["id"]) for i in sorted(shards) for _, _, record in json_lines(shards[i])]
        self.partial = folder / f".part-{self.index:05d}.jsonl"
        in_progress = _good_lines(self.partial) if self.partial.exists() else []
        self.in_partial = len(in_progress)
        if self.in_partial >= self.shard_size:
            self._complete_shard()
        return ids + in_progress

    def record_run(self, settings):
        """Note in the sidecar that the records from position ``count`` on come from ``settings``
        (engine, dtype, sampling, ...); entries of runs whose records are all lost are dropped."""
        runs = []
        if self.meta_path.exists():
            try:
                runs = json.loads(self.meta_path.read_text(encoding="utf-8")).get("runs", [])
            except (json.JSONDecodeError, AttributeError):
                raise MfdHubError(f"{self.meta_path}: not a regen sidecar (JSON with runs); move it away") from None
        runs = [run for run in runs if run.get("first_record", 0) < self.count]
        runs.append({"first_record": self.count, **settings})
        text = json.dumps({"format": "mfd-hub-regen-1", "runs": runs}, indent=2, ensure_ascii=False) + "\n"
        temporary = self.meta_path.with_name(f".{self.meta_path.name}.tmp")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, self.meta_path)

    def write(self, record):
        if self._handle is None:
            self._handle = (self.partial if self.folder else self.path).open("a", encoding="utf-8")
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.done.add(str(record["id"]))
        self.count += 1
        if self.folder:
            self.in_partial += 1
            if self.in_partial >= self.shard_size:
                self._complete_shard()

    def _complete_shard(self):
        self.close()
        shard = self.path / f"part-{self.index:05d}.jsonl.gz"
        temporary = self.path / f".part-{self.index:05d}.jsonl.gz.tmp"
        with temporary.open("wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed:  # same bytes every time
                packed.write(self.partial.read_bytes())
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(temporary, shard)
        self.partial.unlink()
        self.index += 1
        self.partial = self.path / f".part-{self.index:05d}.jsonl"
        self.in_partial = 0

    def seal(self):
        """Make the shard in progress a complete shard, however short. Called once every prompt is
        answered, so that a finished regeneration lies wholly in files that are safe to commit; a
        later run with more prompts starts the next shard."""
        if self.folder and self.in_partial:
            self._complete_shard()

    def flush(self):
        if self._handle is not None:
            self._handle.flush()

    def close(self):
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def finished_ids(out_path):
    """Ids already written to ``out_path`` (a file or a folder of shards), after repairing what a
    crash may have left there (see ``RegenOutput``)."""
    return RegenOutput(out_path).done


# -- engines -------------------------------------------------------------------------------------
class _Batches:
    """An engine that answers a batch at a time: ``stream`` runs ``generate`` over consecutive
    batches of ``batch_size`` prompts (batch ``b`` seeded ``seed + its first index``)."""

    def stream(self, encoded, temperature, top_p, top_k, max_new_tokens, seed, batch_size=None):
        size = batch_size or self.batch_size
        for first in range(0, len(encoded), size):
            answers = self.generate(encoded[first : first + size], temperature, top_p, top_k, max_new_tokens,
                                    seed + first)
            yield from enumerate(answers, first)


class TransformersEngine(_Batches):
    """Sampling with transformers ``generate`` on this machine: left-padded static batches, each
    running until its longest answer ends (``--engine generate``, the original engine)."""

    name = "generate"

    def __init__(self, target, stops, pad_id, batch_size=8):
        self.target, self.stops, self.pad_id, self.batch_size = target, stops, pad_id, batch_size

    def describe(self):
        return {"engine": self.name, "dtype": dtype_name(self.target.dtype), "batch_size": self.batch_size,
                "device": str(self.target.device)}

    def generate(self, encoded, temperature, top_p, top_k, max_new_tokens, seed):
        width = max(len(ids) for ids in encoded)
        input_ids = torch.full((len(encoded), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, ids in enumerate(encoded):  # left padding: every answer starts at column `width`
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        torch.manual_seed(seed)
        target = self.target
        with torch.inference_mode():
            sampled = target.generate(
                input_ids.to(target.device), attention_mask=attention.to(target.device),
                do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                top_p=top_p if temperature > 0 else None, top_k=top_k if temperature > 0 else None,
                max_new_tokens=max_new_tokens, eos_token_id=self.stops or None, pad_token_id=self.pad_id,
            )
        return [_cut_at_stop(row, self.stops, max_new_tokens) for row in sampled[:, width:].tolist()]


def _room_layer_class():
    from transformers.cache_utils import DynamicLayer

    class RoomLayer(DynamicLayer):
        """One layer's KV cache with its room allocated once, [rows, heads, room, dim]: a new token
        is written in place (transformers' DynamicLayer concatenates, copying the whole cache at
        every token) and attention sees a view of the filled columns."""

        def __init__(self, like, rows, room, length):
            super().__init__()
            self.room_keys = like.keys.new_zeros((rows, like.keys.shape[1], room, like.keys.shape[3]))
            self.room_values = like.values.new_zeros((rows, like.values.shape[1], room, like.values.shape[3]))
            self.device, self.is_initialized = like.keys.device, True
            self._fill(length)

        def _fill(self, length):
            self.length = length
            self.keys, self.values = self.room_keys[:, :, :length], self.room_values[:, :, :length]

        def update(self, key_states, value_states, *args, **kwargs):
            end = self.length + key_states.shape[-2]
            self.room_keys[:, :, self.length : end] = key_states
            self.room_values[:, :, self.length : end] = value_states
            self._fill(end)
            return self.keys, self.values

        def get_seq_length(self):
            return self.length

        def place(self, rows, first, keys, values):
            """Copy a prefill's keys/values [n, heads, width, dim] into ``rows`` at columns from ``first``."""
            self.room_keys[rows, :, first : first + keys.shape[2]] = keys
            self.room_values[rows, :, first : first + values.shape[2]] = values

        def shift(self, columns):
            """Drop the first ``columns`` columns of every row (the rest moves left)."""
            kept = self.length - columns
            self.room_keys[:, :, :kept] = self.room_keys[:, :, columns : self.length].clone()
            self.room_values[:, :, :kept] = self.room_values[:, :, columns : self.length].clone()
            self._fill(kept)

        def keep_rows(self, rows):
            self.room_keys, self.room_values = self.room_keys[rows], self.room_values[rows]
            self._fill(self.length)

    return RoomLayer


class ContinuousEngine:
    """Sampling on this machine with continuous batching (``--engine continuous``, the default).

    ``batch_size`` rows decode together, one token each per forward pass, and a row whose answer
    has ended takes the next waiting prompt at once, so no row idles until the longest answer of
    its batch ends. All rows write the same column of a KV cache allocated once: a prompt is
    prefilled (with others admitted at the same time) and placed so that it ends at that column,
    its positions count from its own first token, and the attention mask hides the columns before
    it. When the column reaches the end of the room, every row shifts left past the oldest row's
    first column; once no prompt waits, finished rows are dropped from the batch.

    Tokens are drawn by ``next_tokens`` (transformers' temperature / top-k / top-p distribution, as
    speculative decoding's target samples)
    from one seeded generator; the answer is exactly the sampled tokens, up to and including a
    stop token. Needs a target whose every layer is full attention (a plain transformers
    DynamicCache layer); hybrid or sliding-window targets take ``--engine generate``.
    """

    name = "continuous"
    slack = 64  # room beyond the longest prompt and answer: the cache shifts at most once in `slack` steps
    prefill_tokens = 8192  # prompt tokens per prefill pass (bounds its memory)

    def __init__(self, target, stops, pad_id, batch_size=128, linears="auto"):
        if linears not in LINEARS:
            raise UsageError(f"unknown linears {linears!r}; choose {', '.join(LINEARS)}")
        self.target, self.stops, self.pad_id, self.batch_size = target, list(stops), pad_id, batch_size
        self.linears = linears
        self.packed = linears == "auto" and packed_linears_available(target)

    def describe(self):
        return {"engine": self.name, "dtype": dtype_name(self.target.dtype), "batch_size": self.batch_size,
                "device": str(self.target.device), "linears": linears_label(self.packed, models=[self.target])}

    def stream(self, encoded, temperature, top_p, top_k, max_new_tokens, seed, batch_size=None):
        """Answer every prompt of ``encoded`` (token id lists) -> yields (index, (response ids,
        "stop" | "length")) as each answer ends. With ``linears="auto"``, an fp32 target on CPU
        multiplies through oneDNN with packed weights meanwhile (``mfd_hub.packed_linear``)."""
        if not encoded:
            return
        rows = max(1, min(batch_size or self.batch_size, len(encoded)))
        with packed_for_speculation(self.target, linears=self.linears, rows=rows):
            yield from self._stream(encoded, temperature, top_p, top_k, max_new_tokens, seed, rows)

    def _stream(self, encoded, temperature, top_p, top_k, max_new_tokens, seed, rows):
        device = self.target.device
        generator = torch.Generator(device=device).manual_seed(seed)
        stops = set(self.stops)
        longest = max(len(ids) for ids in encoded)
        self._rows = rows
        self._room = longest + max_new_tokens + self.slack
        self._cache, self._column = None, longest  # every row writes its next token at this column
        self._jobs = [None] * self._rows  # the prompt index each row answers, None when free
        self._answers = [[] for _ in range(self._rows)]
        self._start = torch.zeros(self._rows, dtype=torch.long)  # each row's first (prompt) column
        waiting = deque(range(len(encoded)))

        def take(rows, logits):
            """Sample the next token of ``rows``; yield the answers that end with it."""
            for row, token in zip(rows, next_tokens(logits, temperature, top_k, top_p, generator).tolist()):
                answer = self._answers[row]
                answer.append(token)
                if token in stops or len(answer) >= max_new_tokens:
                    yield self._jobs[row], (answer, "stop" if token in stops else "length")
                    self._jobs[row], self._answers[row] = None, []

        with torch.inference_mode():
            while True:
                free = [row for row, job in enumerate(self._jobs) if job is None]
                if waiting and len(free) >= max(1, min(len(self._jobs) // 16, len(waiting))):
                    admitted = [(row, waiting.popleft()) for row in free[: len(waiting)]]
                    for group in self._prefill_groups(admitted, encoded):
                        rows = [row for row, _ in group]
                        yield from take(rows, self._prefill(group, encoded))
                    continue  # answers that ended at once freed their rows
                busy = [row for row, job in enumerate(self._jobs) if job is not None]
                if not busy:
                    return
                if not waiting and len(free) >= max(1, len(self._jobs) // 4):
                    self._keep_rows(busy)
                    busy = list(range(len(busy)))
                if self._column == self._room:
                    self._shift(longest)
                yield from take(busy, self._decode()[busy])

    def _prefill_groups(self, admitted, encoded):
        width = max(len(encoded[index]) for _, index in admitted)
        per_pass = max(1, self.prefill_tokens // width)
        return [admitted[i : i + per_pass] for i in range(0, len(admitted), per_pass)]

    def _prefill(self, group, encoded):
        """Prefill the prompts of ``group`` ((row, prompt index) pairs) together, left-padded, and
        place their KV so that each ends at the write column -> their next-token logits [n, V]."""
        from transformers import DynamicCache
        from transformers.cache_utils import Cache, DynamicLayer

        device = self.target.device
        prompts = [encoded[index] for _, index in group]
        width = max(len(ids) for ids in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for n, prompt in enumerate(prompts):
            ids[n, width - len(prompt) :] = torch.tensor(prompt)
            mask[n, width - len(prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        fresh = DynamicCache(config=self.target.config)
        out = self.target(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                          cache=fresh, use_cache=True, logits_to_keep=1)
        if self._cache is None:
            if any(type(layer) is not DynamicLayer for layer in fresh.layers):
                raise MfdHubError(f"the continuous engine needs a target whose layers are all full attention "
                                  f"({type(self.target).__name__} is not); use --engine generate")
            RoomLayer = _room_layer_class()
            self._cache = Cache(layers=[RoomLayer(layer, self._rows, self._room, self._column)
                                        for layer in fresh.layers])
        rows = torch.tensor([row for row, _ in group], device=device)
        for room, layer in zip(self._cache.layers, fresh.layers):
            room.place(rows, self._column - width, layer.keys, layer.values)
        for (row, index), prompt in zip(group, prompts):
            self._jobs[row], self._answers[row] = index, []
            self._start[row] = self._column - len(prompt)
        return out.logits[:, -1]

    def _decode(self):
        """One forward pass: every row's last token at the write column -> logits [rows, V]."""
        device = self.target.device
        column = self._column
        tokens = torch.full((len(self._jobs), 1), self.pad_id, dtype=torch.long)
        for row, job in enumerate(self._jobs):
            if job is None:
                self._start[row] = column  # a free row sees only its own column
            else:
                tokens[row, 0] = self._answers[row][-1]
        mask = (torch.arange(column + 1)[None, :] >= self._start[:, None]).long()
        positions = (column - self._start)[:, None]
        out = self.target(input_ids=tokens.to(device), attention_mask=mask.to(device),
                          position_ids=positions.to(device), cache=self._cache, use_cache=True)
        self._column += 1
        return out.logits[:, -1]

    def _shift(self, longest):
        """Free room at the end: move every row left past the oldest row's first column (keeping
        room for the longest prompt before the write column)."""
        busy = [row for row, job in enumerate(self._jobs) if job is not None]
        columns = min(int(self._start[busy].min()), self._column - longest)
        for layer in self._cache.layers:
            layer.shift(columns)
        self._start -= columns
        self._column -= columns

    def _keep_rows(self, rows):
        """Drop the other rows from the batch (once no prompt waits, finished rows only cost time)."""
        index = torch.tensor(rows, device=self.target.device)
        for layer in self._cache.layers:
            layer.keep_rows(index)
        self._jobs = [self._jobs[row] for row in rows]
        self._answers = [self._answers[row] for row in rows]
        self._start = self._start[torch.tensor(rows)]


class OpenAIEngine(_Batches):
    """A client of an OpenAI-compatible ``/completions`` endpoint (vLLM, SGLang) serving the target.

    Each prompt goes as its token ids (templated here, so the ids match the local path); the
    reply's ``token_ids`` (vLLM's ``return_token_ids``) or ``output_ids`` are the response, else
    its text is re-tokenised. ``concurrency`` requests are in flight at once; the records of
    ``batch_size`` prompts are written together.
    """

    name = "openai"

    def __init__(self, endpoint, model, tokenizer, stops, concurrency=16, timeout=600.0, batch_size=8):
        self.url = endpoint.rstrip("/") + "/completions"
        self.model, self.tokenizer, self.stops = model, tokenizer, stops
        self.concurrency, self.timeout, self.batch_size = concurrency, timeout, batch_size

    def describe(self):
        return {"engine": self.name, "endpoint": self.url, "served_model": self.model, "concurrency": self.concurrency}

    def _post(self, body):
        request = urllib.request.Request(self.url, data=json.dumps(body).encode("utf-8"),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                return json.loads(reply.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            detail = " ".join(err.read().decode("utf-8", "replace").split())[:200]
            raise MfdHubError(f"{self.url} answered HTTP {err.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as err:
            raise MfdHubError(f"cannot reach {self.url}: {getattr(err, 'reason', err)}") from None
        except json.JSONDecodeError:
            raise MfdHubError(f"{self.url} did not answer JSON: is it an OpenAI-compatible server?") from None

    def _one(self, ids, temperature, top_p, top_k, max_new_tokens, seed):
        body = {"model": self.model, "prompt": ids, "max_tokens": max_new_tokens, "temperature": temperature,
                "seed": seed, "return_token_ids": True, "skip_special_tokens": False}
        if temperature > 0:
            body.update(top_p=top_p, top_k=top_k)
        reply = self._post(body)
        try:
            choice = reply["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise MfdHubError(f"{self.url} answered without choices: {str(reply)[:200]}") from None
        response = choice.get("token_ids") or choice.get("output_ids")
        if response is None:
            response = self.tokenizer.encode(choice.get("text", ""), add_special_tokens=False)
        response = [int(t) for t in response][:max_new_tokens]
        reason = "stop" if choice.get("finish_reason") == "stop" else "length"
        if reason == "stop" and self.stops and (not response or response[-1] not in self.stops):
            # engines stop at the end-of-sequence token without returning it; the record keeps it
            matched = choice.get("matched_stop", choice.get("stop_reason"))
            response.append(matched if matched in self.stops else self.stops[0])
        return response, reason

    def generate(self, encoded, temperature, top_p, top_k, max_new_tokens, seed):
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            jobs = [pool.submit(self._one, ids, temperature, top_p, top_k, max_new_tokens, seed + i)
                    for i, ids in enumerate(encoded)]
            return [job.result() for job in jobs]


ENGINES = {"continuous": ContinuousEngine, "generate": TransformersEngine}
DEFAULT_BATCH = {"continuous": 128, "generate": 8, "openai": 8}
# A bf16 target on a CPU with native bf16 multiplies faster the more rows it has (AMX tiles):
# SmolLM2 on 2 cores of an AMX Xeon, 16 prompts side by side with the original engine, 128 / 256
# / 384 rows gave 799 / 831-858 / 926 tok/s (docs/training.md, "regen's speed"). The rows' KV
# room is allocated up front, so they are taken only while it fits in NATIVE_BF16_CACHE_BYTES.
NATIVE_BF16_ROWS = 384
NATIVE_BF16_CACHE_BYTES = 6 << 30  # 128 rows of 2,048-token answers took 6.5 GB before


def kv_room_bytes(target, rows, columns):
    """Bytes of a KV cache of ``rows`` x ``columns`` positions for every layer of ``target``."""
    cfg = target.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * rows * columns * cfg.num_hidden_layers * heads * head_dim * target.dtype.itemsize


def default_batch(engine, target=None, max_new_tokens=None, prompt_tokens=256):
    """``--batch-size`` when none is given: ``DEFAULT_BATCH``, except for the continuous engine with
    a bf16 ``target`` on a CPU with native bf16: ``NATIVE_BF16_ROWS`` when their cache room (for
    ``prompt_tokens`` + ``max_new_tokens`` + the engine's slack) fits in NATIVE_BF16_CACHE_BYTES."""
    from mfd_hub.precision import cpu_has_native_bf16

    if (engine == "continuous" and target is not None and target.dtype == torch.bfloat16
            and target.device.type == "cpu" and cpu_has_native_bf16()):
        columns = prompt_tokens + (max_new_tokens or 2048) + ContinuousEngine.slack
        if kv_room_bytes(target, NATIVE_BF16_ROWS, columns) <= NATIVE_BF16_CACHE_BYTES:
            return NATIVE_BF16_ROWS
    return DEFAULT_BATCH[engine]


def local_engine(target, tokenizer, engine="continuous", batch_size=None, linears="auto", max_new_tokens=None):
    """The engine ``engine`` (``continuous`` or ``generate``) over a transformers ``target``;
    ``linears`` (continuous only): ``auto`` (packed oneDNN products where they run) or ``torch``;
    without ``batch_size``, ``default_batch`` for answers of at most ``max_new_tokens``."""
    from mfd_hub.targets import stop_ids_of

    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; choose {', '.join(ENGINES)}")
    stops = stop_ids_of(tokenizer, target)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops[0] if stops else 0)
    options = {"linears": linears} if engine == "continuous" else {}
    return ENGINES[engine](target, stops, pad_id, batch_size or default_batch(engine, target, max_new_tokens),
                           **options)


def regenerate(
    target,
    tokenizer,
    prompts,
    out_path,
    temperature=0.7,
    top_p=0.8,
    top_k=20,
    max_new_tokens=2048,
    batch_size=None,
    seed=0,
    chat=True,
    progress=None,
    thinking=None,
    engine="continuous",
    shard_size=SHARD_SIZE,
    provenance=None,
    linears="auto",
):
    """Answer every (id, prompt) not yet in ``out_path`` (a .jsonl file or a folder of shards, see
    ``RegenOutput``); returns how many were written. ``target`` is a transformers model, answered
    by the local engine ``engine`` (``continuous`` or ``generate``), or an engine object such as
    ``OpenAIEngine``. ``batch_size``: rows decoding together (continuous), prompts per generate
    call or per write (default: the engine's). Records are written in prompt order as soon as all
    earlier ones are. ``progress`` is called with the number of records each write added.
    ``thinking`` (True/False) is passed to the chat template as ``enable_thinking`` (Qwen3-style
    templates); None leaves the template's default. ``provenance`` (a dict, e.g. the target's
    name) joins the engine's settings in the output's sidecar. ``linears``: see ``local_engine``."""
    out = RegenOutput(out_path, shard_size)
    todo = [(rid, text) for rid, text in prompts if rid not in out.done]
    if not todo:
        out.seal()
        return 0
    if not hasattr(target, "stream"):
        target = local_engine(target, tokenizer, engine, batch_size, linears, max_new_tokens)
    batch_size = batch_size or target.batch_size
    out.record_run({**target.describe(), "batch_size": batch_size, "temperature": temperature, "top_p": top_p,
                    "top_k": top_k, "max_new_tokens": max_new_tokens, "seed": seed, "chat_template": chat,
                    "thinking": thinking, **(provenance or {})})
    base_seed = seed + len(out.done)
    written = 0
    try:
        for first in range(0, len(todo), _CHUNK):
            chunk = todo[first : first + _CHUNK]
            encoded = [_encode(tokenizer, text, chat, thinking) for _, text in chunk]
            ready, next_index = {}, 0
            answers = target.stream(encoded, temperature, top_p, top_k, max_new_tokens, base_seed + first, batch_size)
            for index, answer in answers:
                ready[index] = answer
                added = 0
                while next_index in ready:  # in prompt order
                    (rid, text), ids = chunk[next_index], encoded[next_index]
                    response, reason = ready.pop(next_index)
                    out.write({
                        "id": rid,
                        "prompt": text,
                        "response": tokenizer.decode(response, skip_special_tokens=True),
                        "prompt_ids": ids,
                        "response_ids": response,
                        "finish_reason": reason,
                    })
                    next_index, added = next_index + 1, added + 1
                if added:
                    out.flush()
                    written += added
                    if progress is not None:
                        progress(added)
        out.seal()
    finally:
        out.close()
    return written


def _encode(tokenizer, text, chat, thinking=None):
    from mfd_hub.targets import encode_prompt

    options = {} if thinking is None else {"enable_thinking": bool(thinking)}
    return encode_prompt(tokenizer, text, chat=chat, template_kwargs=options)[0].tolist()


def _cut_at_stop(row, stops, max_new_tokens):
    """A generated row (padded after its end) -> (tokens up to and including the stop, reason)."""
    for i, token in enumerate(row):
        if token in stops:
            return row[: i + 1], "stop"
    return row[:max_new_tokens], "length"
