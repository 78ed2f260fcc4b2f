"""Target-regenerated training data: the target answers each prompt itself.

Drafters learn what the target says, so their training responses come from the target, sampled
with the recipe's settings (DESIGN §2: T = 0.7, top-p 0.8, top-k 20). Output is JSON Lines, one
conversation per prompt, appended as each batch finishes: re-running skips the prompts already
done, and a line cut short by a crash is dropped on resume.

Record: ``{"id", "prompt", "response", "prompt_ids", "response_ids", "finish_reason"}``; the
ids are exactly the tokens the target saw and produced (chat template included), so training
needs no re-tokenisation.

Engines: transformers ``generate`` on this machine (the built-in one), or ``OpenAIEngine``, a
thin client of an OpenAI-compatible completions endpoint (a vLLM or SGLang server of the same
target) that sends the locally templated prompt ids and reads back the sampled token ids.
Prompts come from a JSON Lines file or, when online, a Hugging Face dataset (``hf:NAME[:SPLIT]``).
"""

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from mfd_hub.errors import MfdHubError

PROMPT_FIELDS = ("prompt", "instruction", "question", "text")
HF_PREFIX = "hf:"


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
    """Prompts from a JSON Lines file -> list of (id, prompt text). Each line holds one of the
    fields prompt / instruction / question / text, or ``messages`` / ``conversations`` (the first
    user turn); ``id`` defaults to the line number. ``hf:NAME[:SPLIT]`` reads a Hub dataset."""
    if str(path).startswith(HF_PREFIX):
        return read_hf_prompts(str(path)[len(HF_PREFIX) :])
    path = Path(path)
    if not path.is_file():
        raise MfdHubError(f"prompt file {path} not found")
    prompts = []
    for number, record in json_lines(path):
        text = prompt_of(record)
        if not text:
            fields = ", ".join(PROMPT_FIELDS)
            raise MfdHubError(f"{path}:{number}: no prompt field ({fields}, messages or conversations)")
        rid = record.get("id", number) if isinstance(record, dict) else number
        prompts.append((str(rid), text))
    return prompts


def json_lines(path):
    """(line number, record) for every non-blank line of a JSON Lines file; a bad line is an error."""
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as err:
                raise MfdHubError(f"{path}:{number}: not JSON ({err.msg})") from None


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


def finished_ids(out_path):
    """Ids already written to ``out_path``; a truncated last line (a crash mid-write) is removed."""
    out_path = Path(out_path)
    if not out_path.exists():
        return set()
    done, good_bytes = set(), 0
    with out_path.open("rb") as handle:
        for raw in handle:
            try:
                record = json.loads(raw)
            except json.JSONDecodeError:
                break
            if not raw.endswith(b"\n"):
                break
            done.add(str(record["id"]))
            good_bytes += len(raw)
    if good_bytes != out_path.stat().st_size:
        with out_path.open("r+b") as handle:
            handle.truncate(good_bytes)
    return done


class TransformersEngine:
    """Sampling with transformers ``generate`` on this machine (left-padded batches)."""

    def __init__(self, target, stops, pad_id):
        self.target, self.stops, self.pad_id = target, stops, pad_id

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


class OpenAIEngine:
    """A client of an OpenAI-compatible ``/completions`` endpoint (vLLM, SGLang) serving the target.

    Each prompt goes as its token ids (templated here, so the ids match the local path); the
    reply's ``token_ids`` (vLLM's ``return_token_ids``) or ``output_ids`` are the response, else
    its text is re-tokenised. ``concurrency`` requests are in flight at once.
    """

    def __init__(self, endpoint, model, tokenizer, stops, concurrency=16, timeout=600.0):
        self.url = endpoint.rstrip("/") + "/completions"
        self.model, self.tokenizer, self.stops = model, tokenizer, stops
        self.concurrency, self.timeout = concurrency, timeout

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


def regenerate(
    target,
    tokenizer,
    prompts,
    out_path,
    temperature=0.7,
    top_p=0.8,
    top_k=20,
    max_new_tokens=2048,
    batch_size=8,
    seed=0,
    chat=True,
    progress=None,
    thinking=None,
):
    """Answer every (id, prompt) not yet in ``out_path`` with ``target`` (a transformers model or an
    ``OpenAIEngine``); returns how many were written. ``progress`` is called with the number of
    prompts finished after each batch. ``thinking`` (True/False) is passed to the chat template
    as ``enable_thinking`` (Qwen3-style templates); None leaves the template's default."""
    from mfd_hub.targets import stop_ids_of

    done = finished_ids(out_path)
    todo = [(rid, text) for rid, text in prompts if rid not in done]
    if not todo:
        return 0
    if isinstance(target, OpenAIEngine):
        engine = target
    else:
        stops = stop_ids_of(tokenizer, target)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops[0] if stops else 0)
        engine = TransformersEngine(target, stops, pad_id)
    generator_seed = seed + len(done)
    written = 0
    with Path(out_path).open("a", encoding="utf-8") as out:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            encoded = [_encode(tokenizer, text, chat, thinking) for _, text in batch]
            answers = engine.generate(encoded, temperature, top_p, top_k, max_new_tokens, generator_seed + start)
            for (rid, text), ids, (response, reason) in zip(batch, encoded, answers):
                record = {
                    "id": rid,
                    "prompt": text,
                    "response": tokenizer.decode(response, skip_special_tokens=True),
                    "prompt_ids": ids,
                    "response_ids": response,
                    "finish_reason": reason,
                }
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()
            written += len(batch)
            if progress is not None:
                progress(len(batch))
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
