"""Target-regenerated training data: the target answers each prompt itself.

Drafters learn what the target says, so their training responses come from the target, sampled
with the recipe's settings (DESIGN §2: T = 0.7, top-p 0.8, top-k 20). Output is JSON Lines, one
conversation per prompt, appended as each batch finishes: re-running skips the prompts already
done, and a line cut short by a crash is dropped on resume.

Record: ``{"id", "prompt", "response", "prompt_ids", "response_ids", "finish_reason"}``; the
ids are exactly the tokens the target saw and produced (chat template included), so training
needs no re-tokenisation.
"""

import json
from pathlib import Path

import torch

from .errors import MfdHubError

PROMPT_FIELDS = ("prompt", "instruction", "question", "text")


def read_prompts(path):
    """Prompts from a JSON Lines file -> list of (id, prompt text). Each line holds one of the
    fields prompt / instruction / question / text, or ``messages`` (the first user turn);
    ``id`` defaults to the line number."""
    path = Path(path)
    if not path.is_file():
        raise MfdHubError(f"prompt file {path} not found")
    prompts = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise MfdHubError(f"{path}:{number}: not JSON ({err.msg})") from None
            if isinstance(record, str):
                text = record
            elif isinstance(record, dict):
                text = next((record[f] for f in PROMPT_FIELDS if isinstance(record.get(f), str)), None)
                if text is None and isinstance(record.get("messages"), list):
                    text = next((m.get("content") for m in record["messages"] if m.get("role") == "user"), None)
            else:
                text = None
            if not text:
                raise MfdHubError(f"{path}:{number}: no prompt field ({', '.join(PROMPT_FIELDS)} or messages)")
            rid = record.get("id", number) if isinstance(record, dict) else number
            prompts.append((str(rid), text))
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
):
    """Answer every (id, prompt) not yet in ``out_path`` with ``target``; returns how many were
    written. ``progress`` is called with the number of prompts finished after each batch."""
    from .targets import stop_ids_of

    done = finished_ids(out_path)
    todo = [(rid, text) for rid, text in prompts if rid not in done]
    if not todo:
        return 0
    stops = stop_ids_of(tokenizer, target)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops[0] if stops else 0)
    generator_seed = seed + len(done)
    written = 0
    with Path(out_path).open("a", encoding="utf-8") as out:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            encoded = [_encode(tokenizer, text, chat) for _, text in batch]
            width = max(len(ids) for ids in encoded)
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            attention = torch.zeros_like(input_ids)
            for row, ids in enumerate(encoded):  # left padding: every answer starts at column `width`
                input_ids[row, width - len(ids) :] = torch.tensor(ids)
                attention[row, width - len(ids) :] = 1
            torch.manual_seed(generator_seed + start)
            with torch.inference_mode():
                sampled = target.generate(
                    input_ids.to(target.device), attention_mask=attention.to(target.device),
                    do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                    top_p=top_p if temperature > 0 else None, top_k=top_k if temperature > 0 else None,
                    max_new_tokens=max_new_tokens, eos_token_id=stops or None, pad_token_id=pad_id,
                )
            for (rid, text), ids, row in zip(batch, encoded, sampled[:, width:].tolist()):
                response, reason = _cut_at_stop(row, stops, max_new_tokens)
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


def _encode(tokenizer, text, chat):
    from .targets import encode_prompt

    return encode_prompt(tokenizer, text, chat=chat)[0].tolist()


def _cut_at_stop(row, stops, max_new_tokens):
    """A generated row (padded after its end) -> (tokens up to and including the stop, reason)."""
    for i, token in enumerate(row):
        if token in stops:
            return row[: i + 1], "stop"
    return row[:max_new_tokens], "length"
