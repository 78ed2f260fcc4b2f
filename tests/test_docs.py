"""The documentation runs: every ``mfd-hub`` command it shows is executed here.

Collected: the commands in the shell code blocks of README.md and of every page under ``docs/``
(``docs/**/*.md``: a new page is covered as soon as it exists), in every command's ``--help`` examples
(the ``examples(...)`` epilogs) and in the generated model cards -- ``mfd-hub card NAME`` of every
registry drafter and the shipped miniature cards ``zoo/*/README.md`` (code blocks and inline
code spans). Each collected command must be accounted for in exactly one table below:

- ``RUN_AS_WRITTEN``: runs exactly as written;
- ``SHRUNK``: would run for minutes as written; runs with only its size reduced (``--limit``,
  ``--max-new-tokens``, ...), the shrunk form being the documented one plus size options;
- ``CANNOT_RUN_HERE``: needs the network, a GPU-sized model, a Hub upload, a server or torchrun;
  listed with the reason and run in its offline form where one exists (``--dry-run``,
  ``--check``, or ``HF_HUB_OFFLINE=1`` on a Hugging Face cache this test seeds with tiny random
  stand-ins under the documented repo ids);
- ``PARSE_ONLY``: costs as much as a command that does run but differs from it only in a value
  (another shipped drafter, budget, output format); its whole command line is parsed by the
  real click command (every option and type checked, drafter names resolved), the run is left
  to the command named beside it, to keep this file within its time budget.

A command nobody accounted for (a new example) fails ``test_every_documented_command_is_accounted_for``;
a table entry whose command is no longer documented fails it too.

How they run: every command gets a fresh workspace, a copy of the fixtures folder (tiny real
checkpoints under the names the documentation uses: ``./MFD-Qwen3-8B``, ``./ckpt``,
``runs/mfd-qwen3-8b``, ``my-recipe.yaml``, ...; ``build_fixtures``), where a ``convert``
command's OUT is absent, as convert refuses an existing OUT; ``AFTER`` names the one command that
continues in the workspace of another. ``IN_A_PROCESS_OF_ITS_OWN`` commands (the issue's commands
on the shipped drafters) run as real ``mfd-hub`` console-script subprocesses. All others run in
ONE worker subprocess, in-process through ``mfd_hub.cli.main``, the console script's own entry
point (not click's CliRunner, which would bypass main's error formatting and exit codes), with
stdout and stderr captured: a process per command would pay the ~6 s import of torch and
transformers some 50 times. The worker runs with ``HF_HUB_OFFLINE=1`` and the seeded
``HF_HOME``; the user's mfd-hub cache (the shipped drafters' loadable folders, the converted
SmolLM2 target) is shared with the rest of the suite. A run passes with exit code 0 and a
non-empty result: output on stdout, or a file written or changed in its workspace (and a JSON
document on stdout for ``--json``). Identical command lines run once.

``test_a_broken_example_is_reported`` feeds the same machinery a README snippet with a wrong
option and a misspelt shipped name: the collector finds both, the accounting reports them, and
the runner (``run_items``, the worker's own loop, here in the test's process) reports their
failures.

Budget: this file must stay under ~90 s of one core (CI has 10 minutes for everything on 2).
The SmolLM2 commands dominate even shrunk (``verify --target smollm2`` 12 s, a ``demo`` 8 s, a
``bench`` 6-14 s depending on the prompt), as does every ``verify`` or ``push`` with its
AutoModel subprocess (6 s), which is why ``PARSE_ONLY`` exists; the worker prints the costliest
runs (``pytest -s``).
"""

import functools
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

import fork_server
from conftest import REPO, run_cli

# ---- collecting ---------------------------------------------------------------------------------
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
SEPARATORS = {"&&", "||", ";", "|", "&"}


def invocations(line):
    """The mfd-hub commands in one shell line, each in its ``shlex.join`` form: every segment
    between ``&&``, ``;`` and ``|`` whose program is mfd-hub (or ``python -m mfd_hub``, or
    ``torchrun ... -m mfd_hub``); comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segments, current = [], []
    for token in lexer:
        if token in SEPARATORS:
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    found = []
    for words in segments:
        if not words:
            continue
        as_module = (words[0].startswith(("python", "torchrun")) and "-m" in words
                     and words[words.index("-m") + 1:words.index("-m") + 2] == ["mfd_hub"])
        if words[0] == "mfd-hub" or as_module:
            found.append(shlex.join(words))
    return found


def commands_in_markdown(text, inline=False):
    """The mfd-hub commands of a markdown text: in its shell code blocks (continuations joined,
    ``$`` prompts dropped) and, with ``inline``, in its code spans that start with 'mfd-hub '."""
    found = []
    for lang, block in FENCE.findall(text):
        if lang.lower() in SHELL_FENCES:
            for line in block.replace("\\\n", " ").splitlines():
                if line.strip():
                    found += invocations(line.strip().removeprefix("$ "))
    if inline:
        prose = FENCE.sub("", text)
        found += [c for span in INLINE.findall(prose) if span.startswith("mfd-hub ") for c in invocations(span)]
    return found


def commands_in_help():
    """{'mfd-hub CMD --help': [its example commands]} for every command and subcommand."""
    import click

    from mfd_hub.cli import cli

    out = {}

    def walk(command, path):
        epilog = command.epilog or ""
        if "Examples:" in epilog:
            lines = epilog.split("Examples:", 1)[1].splitlines()
            out[" ".join(path) + " --help"] = [c for line in lines if line.strip() for c in invocations(line.strip())]
        if isinstance(command, click.Group):
            for name, sub in sorted(command.commands.items()):
                walk(sub, (*path, name))

    walk(cli, ("mfd-hub",))
    return out


README_MAX_LINES = 300  # the README is a front door; the rest lives in docs/


def documentation_pages(root=REPO):
    """The markdown pages whose shell blocks are documentation: README.md, then every
    ``docs/**/*.md`` in path order (a page added under docs/ is collected without listing it)."""
    root = Path(root)
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


@functools.lru_cache(maxsize=4)
def collect(readme=None):
    """{command: set of the places that show it} over README.md (or the ``readme`` text given in
    its place), every page under docs/, every --help and every card."""
    from mfd_hub.cards.model_card import render_card
    from mfd_hub.cards.registry import load_registry
    from mfd_hub.zoo.shipped import CARD, SHIPPED_DRAFTERS, zoo_dir

    found = {}

    def add(commands, place):
        for command in commands:
            found.setdefault(command, set()).add(place)

    for page in documentation_pages():
        place = page.relative_to(REPO).as_posix()
        text = readme if place == "README.md" and readme is not None else page.read_text(encoding="utf-8")
        add(commands_in_markdown(text), place)
    for place, commands in commands_in_help().items():
        add(commands, place)
    registry = load_registry()
    for name, drafter in registry.drafters.items():
        add(commands_in_markdown(render_card(drafter, registry=registry), inline=True), f"mfd-hub card {name}")
    for name in SHIPPED_DRAFTERS:
        add(commands_in_markdown((zoo_dir() / name / CARD).read_text(encoding="utf-8"), inline=True),
            f"zoo/{name}/{CARD}")
    return found


# ---- accounting ---------------------------------------------------------------------------------
# Commands in their shlex.join form (as the collector writes them).
RUN_AS_WRITTEN = {
    "mfd-hub info MFD-SmolLM2-135M",
    "mfd-hub info ./MFD-drafter --json",
    "mfd-hub info ./MFD-Qwen3-8B",
    "mfd-hub info ./MFD-Qwen3-8B --json",
    "mfd-hub verify MFD-SmolLM2-135M --target smollm2",
    "mfd-hub convert train-ckpt runs/mfd-smollm2/checkpoints/step-000600 ./MFD-SmolLM2",
    "mfd-hub convert train-ckpt runs/mfd-qwen3-8b ./MFD-Qwen3-8B --dtype bfloat16",
    "mfd-hub convert train-ckpt runs/mfd-qwen3-8b ./MFD-Qwen3-8B --dtype bfloat16 --json",
    "mfd-hub convert draft-vocab ./MFD-SmolLM2 ./MFD-SmolLM2-dv8k --target smollm2 --corpus regen.jsonl --size 8192",
    "mfd-hub convert mfd-d ./MFD-Qwen3-8B ./MFD-D-Qwen3-8B-init --default-from mode:0",
    "mfd-hub convert mfd-d ./MFD-Qwen3-8B ./MFD-D-Qwen3-8B --default-from mode:0",
    "mfd-hub convert mfd-d ./MFD-Qwen3-4B ./MFD-D-Qwen3-4B-init --default-from zeros --json",
    "mfd-hub convert zlab ./Qwen3-4B-DFlash-b16 ./mfd-4b --modes 8 --seed 1 --target-name Qwen/Qwen3-4B --json",
    "mfd-hub convert released ./MFD-Qwen3-8B-released ./MFD-Qwen3-8B",
    "mfd-hub convert released ./MFD-D-Qwen3-8B-released ./MFD-D-Qwen3-8B --map default_vector=default_embed "
    "--map gate_temperature=- --json",
    "mfd-hub train --list",
    "mfd-hub train MFD-Qwen3-8B data.train=data/qwen3-8b.jsonl --check",
    "mfd-hub train my-recipe.yaml --resume",
    "mfd-hub list",
    "mfd-hub list --json",
    "mfd-hub evaluate MFD-SmolLM2-135M --target smollm2 --data heldout.jsonl",
    "mfd-hub card MFD-Qwen3-8B",
    "mfd-hub card MFD-Qwen3-8B --path ./MFD-Qwen3-8B --out ./MFD-Qwen3-8B/README.md",
    "mfd-hub card MFD-D-Qwen3-4B --repo-id me/MFD-D-Qwen3-4B --out README.md",
    # HF_HUB_OFFLINE=1 is set here, so the dry run plans without reading the remote
    "mfd-hub push MFD-Qwen3-8B --path ./MFD-Qwen3-8B --dry-run",
}

# documented command -> (the form run here: the documented one plus size options, why)
SHRUNK = {
    "mfd-hub demo": (
        "mfd-hub demo --max-new-tokens 8 --repeats 1", "128 tokens x 4 methods x 3 timing repeats"),
    "mfd-hub generate --drafter MFD-SmolLM2-135M --target smollm2 'Write a palindrome check.'": (
        "mfd-hub generate --drafter MFD-SmolLM2-135M --target smollm2 'Write a palindrome check.' --max-new-tokens 8",
        "256 new tokens"),
    "mfd-hub generate --drafter ./drafter --target ./Qwen3-4B --method product --mode 2 --json 'Explain RoPE.'": (
        "mfd-hub generate --drafter ./drafter --target ./Qwen3-4B --method product --mode 2 --json 'Explain RoPE.' "
        "--max-new-tokens 8", "256 new tokens from a random stand-in target, which never stops early"),
    "mfd-hub bench --prompts my-prompts.jsonl --drafter MFD-SmolLM2-135M --methods product,mixture --json": (
        "mfd-hub bench --prompts my-prompts.jsonl --drafter MFD-SmolLM2-135M --methods product,mixture --json "
        "--max-new-tokens 8 --budgets 16", "128 tokens x 3 tree sizes (the prompt file holds one prompt)"),
    "mfd-hub bench --target ./Qwen3-4B --drafter ./MFD-Qwen3-4B --limit 10": (
        "mfd-hub bench --target ./Qwen3-4B --drafter ./MFD-Qwen3-4B --limit 10 --limit 1 --max-new-tokens 8 "
        "--budgets 16", "10 HumanEval prompts x 7 configurations x 128 tokens; one prompt, one tree size"),
    "mfd-hub regen --target smollm2 --prompts prompts.jsonl --out responses.jsonl --max-new-tokens 256": (
        "mfd-hub regen --target smollm2 --prompts prompts.jsonl --out responses.jsonl --max-new-tokens 256 "
        "--limit 1 --max-new-tokens 8", "256 sampled tokens per prompt"),
    "mfd-hub regen --target smollm2 --prompts prompts.jsonl --out data/smollm2/train --max-new-tokens 192": (
        "mfd-hub regen --target smollm2 --prompts prompts.jsonl --out data/smollm2/train --max-new-tokens 192 "
        "--limit 1 --max-new-tokens 8", "12,000 prompts (the miniature's data: hours on a CPU)"),
    "mfd-hub regen --target smollm2 --prompts prompts.jsonl --out data/smollm2-regen --max-new-tokens 256": (
        "mfd-hub regen --target smollm2 --prompts prompts.jsonl --out data/smollm2-regen --max-new-tokens 256 "
        "--limit 1 --max-new-tokens 8", "256 sampled tokens per prompt"),
    "mfd-hub regen --target smollm2 --prompts prompts.jsonl --out responses.jsonl --engine generate --batch-size 8": (
        "mfd-hub regen --target smollm2 --prompts prompts.jsonl --out responses.jsonl --engine generate --batch-size 8 "
        "--limit 1 --max-new-tokens 8", "2,048 sampled tokens per prompt"),
    "mfd-hub train my-recipe.yaml train.max_steps=200 output.dir=runs/try": (
        "mfd-hub train my-recipe.yaml train.max_steps=200 output.dir=runs/try train.max_steps=4",
        "200 steps of the tiny recipe (the later override wins)"),
    "mfd-hub evaluate MFD-SmolLM2-135M --trees --against DPACE-SmolLM2-135M --data heldout.jsonl --out analyses "
    "--resume --json": (
        "mfd-hub evaluate MFD-SmolLM2-135M --trees --against DPACE-SmolLM2-135M --data heldout.jsonl --out analyses "
        "--resume --json --limit 1 --max-new-tokens 2 --budgets 16",
        "the target's greedy answers to every held-out prompt, 128 tokens each, trees at 3 budgets"),
    "mfd-hub train my-recipe.yaml --stop-after 100": (
        "mfd-hub train my-recipe.yaml --stop-after 100 --stop-after 2",
        "my-recipe.yaml is the tiny-mfd recipe (12 steps): stop early, so that --resume (run after it) resumes"),
}
# The options a shrunk form may add: sizes only.
SIZE_OPTIONS = {"--limit", "--max-new-tokens", "--budgets", "--repeats", "--stop-after", "train.max_steps=N"}

SEEDED = "its Hub ids are served offline (HF_HUB_OFFLINE=1) from a cache seeded with tiny random stand-ins"
# documented command -> (why it cannot run here, the offline form run instead, or None)
CANNOT_RUN_HERE = {
    "mfd-hub generate --drafter ./MFD-drafter --target Qwen/Qwen3-8B --method mixture --budget 64 'What is 17 * 23?'": (
        f"Qwen/Qwen3-8B is a download and a GPU's worth of model; {SEEDED}",
        "mfd-hub generate --drafter ./MFD-drafter --target Qwen/Qwen3-8B --method mixture --budget 64 "
        "'What is 17 * 23?' --max-new-tokens 8"),
    "mfd-hub generate --drafter ./drafter --target Qwen/Qwen3-8B --method mixture Hello": (
        f"Qwen/Qwen3-8B; {SEEDED}",
        "mfd-hub generate --drafter ./drafter --target Qwen/Qwen3-8B --method mixture Hello --max-new-tokens 8"),
    "mfd-hub generate --drafter ./drafter --target Qwen/Qwen3-8B --method mixture --budget 32 --temperature 0 Hi": (
        f"Qwen/Qwen3-8B; {SEEDED}",
        "mfd-hub generate --drafter ./drafter --target Qwen/Qwen3-8B --method mixture --budget 32 --temperature 0 Hi "
        "--max-new-tokens 8"),
    "mfd-hub convert zlab z-lab/Qwen3-8B-DFlash-b16 ./MFD-Qwen3-8B-init --modes 8": (
        f"a Hub download; {SEEDED}", "mfd-hub convert zlab z-lab/Qwen3-8B-DFlash-b16 ./MFD-Qwen3-8B-init --modes 8"),
    "mfd-hub verify z-lab/Qwen3-8B-DFlash-b16 --json": (
        f"a Hub download; {SEEDED}", "mfd-hub verify z-lab/Qwen3-8B-DFlash-b16 --json"),
    "mfd-hub info z-lab/Qwen3-8B-DFlash-b16 --json": (
        f"a Hub download; {SEEDED}", "mfd-hub info z-lab/Qwen3-8B-DFlash-b16 --json"),
    "mfd-hub convert draft-vocab ./MFD-Qwen3-8B ./MFD-Qwen3-8B-dv64k --target Qwen/Qwen3-8B --corpus responses.jsonl "
    "--field response --size 65536 --json": (
        f"Qwen/Qwen3-8B's LM head and tokenizer; {SEEDED}",
        "mfd-hub convert draft-vocab ./MFD-Qwen3-8B ./MFD-Qwen3-8B-dv64k --target Qwen/Qwen3-8B --corpus responses.jsonl "
        "--field response --size 65536 --json"),
    "mfd-hub regen --target Qwen/Qwen3-8B --prompts prompts.jsonl --out data.jsonl --batch-size 32 --no-thinking": (
        f"Qwen/Qwen3-8B; {SEEDED}",
        "mfd-hub regen --target Qwen/Qwen3-8B --prompts prompts.jsonl --out data.jsonl --batch-size 32 --no-thinking "
        "--limit 1 --max-new-tokens 8"),
    **{f"mfd-hub regen --target Qwen/Qwen3-8B --prompts hf:mlabonne/open-perfectblend --out {out} --engine openai "
       "--endpoint http://localhost:8000/v1 --concurrency 64": (
           "needs a vLLM/SGLang server of Qwen3-8B and a Hub dataset; --engine openai is tested against a fake "
           "server in tests/test_regen.py", None) for out in ("data.jsonl", "data/qwen3-8b")},
    "torchrun --nproc-per-node 8 -m mfd_hub train MFD-Qwen3-8B data.train=data/qwen3-8b.jsonl": (
        "8 GPUs under torchrun and the 1.42M-prompt data; the recipe itself is checked by the documented --check form",
        "mfd-hub train MFD-Qwen3-8B data.train=data/qwen3-8b.jsonl --check"),
    "mfd-hub push MFD-Qwen3-8B --path ./MFD-Qwen3-8B": (
        "a Hub upload", "mfd-hub push MFD-Qwen3-8B --path ./MFD-Qwen3-8B --dry-run"),
    **{f"mfd-hub train {recipe}": (
        "hours of CPU: the target's tap features of the 12,000 committed answers, then 750 to 2,250 steps",
        f"mfd-hub train {recipe} --check") for recipe in ("smollm2-dflash", "smollm2-dpace", "smollm2-mfd")},
}
# The registry cards' generate lines: the published drafters and their targets (GPU-sized, on
# the Hub); two of them run on seeded stand-ins, the others differ only in the names.
_CARD = "mfd-hub generate --drafter hhhhhhy5/{d} --target Qwen/{t} --method {m} --budget {b} 'What is 17 * 23?'"
CANNOT_RUN_HERE.update({
    _CARD.format(d="MFD-Qwen3-8B", t="Qwen3-8B", m="mixture", b=128): (
        f"a published drafter and its target; {SEEDED}",
        _CARD.format(d="MFD-Qwen3-8B", t="Qwen3-8B", m="mixture", b=128) + " --max-new-tokens 8"),
    _CARD.format(d="MFD-D-Qwen3-4B", t="Qwen3-4B", m="product --mode default", b=64): (
        f"a published drafter and its target; {SEEDED}",
        _CARD.format(d="MFD-D-Qwen3-4B", t="Qwen3-4B", m="product --mode default", b=64) + " --max-new-tokens 8"),
})

# documented command -> (why it is only parsed, the command whose run covers it)
_BENCH = "mfd-hub bench --prompts my-prompts.jsonl --drafter MFD-SmolLM2-135M --methods product,mixture --json"
_HUMANEVAL = "mfd-hub bench --target ./Qwen3-4B --drafter ./MFD-Qwen3-4B --limit 10"
PARSE_ONLY = {
    "mfd-hub push MFD-D-Qwen3-4B --path ./ckpt --repo-id me/MFD-D-Qwen3-4B --private --tag v1.1 --json": (
        "a Hub upload; its dry run costs as much as the one that runs (verify's AutoModel process)",
        "mfd-hub push MFD-Qwen3-8B --path ./MFD-Qwen3-8B --dry-run"),
    "mfd-hub verify MFD-SmolLM2-135M DPACE-SmolLM2-135M DFlash-SmolLM2-135M": (
        "each drafter gets the checks of verify MFD-SmolLM2-135M --target smollm2, less the target's; several "
        "drafters in one process are tests/test_verify.py's damaged corpus",
        "mfd-hub verify MFD-SmolLM2-135M --target smollm2"),
    "mfd-hub verify ./MFD-Qwen3-8B": (
        "push --dry-run runs every check of verify on the same folder first",
        "mfd-hub push MFD-Qwen3-8B --path ./MFD-Qwen3-8B --dry-run"),
    "mfd-hub bench --limit 10": (
        "HumanEval's first prompt is long: 14 s of prefills on SmolLM2 even shrunk; the built-in prompts run on the "
        "stand-in target, SmolLM2's bench on a short prompt", _HUMANEVAL),
    "mfd-hub demo --json": ("the same run as demo, printed as JSON", "mfd-hub demo"),
    "mfd-hub evaluate ./MFD-Qwen3-4B --target ./Qwen3-4B --data heldout.jsonl --limit 100 --json": (
        "another drafter and target, as JSON", "mfd-hub evaluate MFD-SmolLM2-135M --target smollm2 --data heldout.jsonl"),
    "mfd-hub demo --drafter MFD-SmolLM2-135M": ("demo's default drafter", "mfd-hub demo"),
    "mfd-hub demo --drafter DPACE-SmolLM2-135M": ("another shipped drafter", "mfd-hub demo"),
    "mfd-hub demo --drafter DFlash-SmolLM2-135M": ("another shipped drafter", "mfd-hub demo"),
    "mfd-hub demo --budget 64 --max-new-tokens 200 'Write a function that reverses the words of a sentence.'": (
        "another budget and prompt", "mfd-hub demo"),
    "mfd-hub demo --dtype float32 --budget 8": ("another dtype and budget", "mfd-hub demo"),
    "mfd-hub bench --limit 20": ("as bench --limit 10", _BENCH),
    "mfd-hub bench --limit 164 --out bench-results --resume": (
        "all 164 prompts, hours here (resuming: tests/test_miniature.py)", _BENCH),
    "mfd-hub bench --limit 20 --budgets 4,8,16,32,64,auto --methods product --dtype float32": (
        "as bench --limit 10, more budgets, one method", _BENCH),
    "mfd-hub bench --limit 20 --max-new-tokens 128 --budgets 16,32,64,auto --dtype float32 --linears onednn": (
        "as bench --limit 10 (the miniature's results run), more budgets", _BENCH),
    "mfd-hub bench --budgets 16,32,64 --temperatures 0,1 --out bench/humaneval": (
        "as bench --limit 10, all 164 prompts at two temperatures", _BENCH),
    "mfd-hub bench --prompts my.jsonl --temperatures 0,0.7 --drafter MFD-SmolLM2-135M --out bench/mine": (
        "another prompt file and temperatures", _BENCH),
    **{f"mfd-hub bench --drafter {name} --limit 20": ("another shipped drafter, as bench --limit 10", _BENCH)
       for name in ("MFD-SmolLM2-135M", "DPACE-SmolLM2-135M", "DFlash-SmolLM2-135M")},
    **{f"mfd-hub verify {name} --target smollm2": (
        "the same checks as on MFD-SmolLM2-135M; the shipped report is zoo/NAME/verify.json",
        "mfd-hub verify MFD-SmolLM2-135M --target smollm2") for name in ("DPACE-SmolLM2-135M", "DFlash-SmolLM2-135M")},
    **{_CARD.format(d=d, t=t, m="mixture", b=64): (
        "another published drafter (network, as the card lines that run on stand-ins)",
        _CARD.format(d="MFD-Qwen3-8B", t="Qwen3-8B", m="mixture", b=128))
       for d, t in (("MFD-Qwen3-4B", "Qwen3-4B"), ("MFD-Qwen3.5-4B", "Qwen3.5-4B"), ("MFD-Qwen3.6-27B", "Qwen3.6-27B"),
                    ("MFD-Qwen3-4B-100K", "Qwen3-4B"), ("MFD-Qwen3-8B-100K", "Qwen3-8B"),
                    ("MFD-Qwen3.5-4B-100K", "Qwen3.5-4B"), ("MFD-Qwen3.6-27B-100K", "Qwen3.6-27B"),
                    ("MFD-D-Qwen3-4B", "Qwen3-4B"), ("MFD-D-Qwen3-8B", "Qwen3-8B"))},
    _CARD.format(d="MFD-D-Qwen3-8B", t="Qwen3-8B", m="product --mode default", b=64): (
        "another MFD-D drafter", _CARD.format(d="MFD-D-Qwen3-4B", t="Qwen3-4B", m="product --mode default", b=64)),
}

# Run as real `mfd-hub` processes (as the shrunk form, where shrunk); the rest run in the worker.
IN_A_PROCESS_OF_ITS_OWN = {
    "mfd-hub info MFD-SmolLM2-135M",
    "mfd-hub generate --drafter MFD-SmolLM2-135M --target smollm2 'Write a palindrome check.'",
}
# command -> the command whose workspace it continues in (docs/training.md: "--resume finishes it")
AFTER = {"mfd-hub train my-recipe.yaml --resume": "mfd-hub train my-recipe.yaml --stop-after 100"}


def form_run(command):
    """The command line this test runs for a documented command, or None (not run)."""
    if command in RUN_AS_WRITTEN:
        return command
    if command in SHRUNK:
        return SHRUNK[command][0]
    if command in CANNOT_RUN_HERE:
        return CANNOT_RUN_HERE[command][1]
    return None


def account(collected):
    """Problems with the tables against the collected commands (empty when all is accounted for)."""
    tables = {"RUN_AS_WRITTEN": RUN_AS_WRITTEN, "SHRUNK": SHRUNK, "CANNOT_RUN_HERE": CANNOT_RUN_HERE,
              "PARSE_ONLY": PARSE_ONLY}
    problems = []
    for command, places in sorted(collected.items()):
        homes = [name for name, table in tables.items() if command in table]
        if not homes:
            problems.append(f"not accounted for: {command!r} (shown in {', '.join(sorted(places))}); add it to "
                            "RUN_AS_WRITTEN, SHRUNK, CANNOT_RUN_HERE or PARSE_ONLY in tests/test_docs.py")
        elif len(homes) > 1:
            problems.append(f"{command!r} is in {' and '.join(homes)}")
    for name, table in tables.items():
        for command in table:
            if command not in collected:
                problems.append(f"{name} lists {command!r}, which no documentation shows any more")
    for command, (shrunk, _) in SHRUNK.items():
        extra = shlex.split(shrunk[len(command):]) if shrunk.startswith(command + " ") else None
        if not extra or not all(re.sub(r"=\d+$", "=N", word) in SIZE_OPTIONS or word.isdigit() for word in extra):
            problems.append(f"the shrunk form of {command!r} must be the command plus size options {sorted(SIZE_OPTIONS)}")
    for command, (_, covered_by) in PARSE_ONLY.items():
        if form_run(covered_by) is None:
            problems.append(f"PARSE_ONLY {command!r} is covered by {covered_by!r}, which does not run")
    for command in (*IN_A_PROCESS_OF_ITS_OWN, *AFTER, *AFTER.values()):
        if form_run(command) is None:
            problems.append(f"{command!r} is set to run specially but does not run")
    return problems


# ---- fixtures -----------------------------------------------------------------------------------
HIDDEN = 16  # the stand-ins' width: the vocabulary (152k, 248k) dominates their size


def _stand_in_target(vocab_size, num_layers):
    from mfd_hub.testing import tiny_target

    return tiny_target("qwen3", vocab_size=vocab_size, hidden_size=HIDDEN, num_layers=num_layers,
                       tie_word_embeddings=True, init_std=0.2)


def _registry_drafter(drafter, target, seed=1):
    """A tiny drafter with the identity the registry gives ``drafter``, for the stand-in ``target``."""
    from mfd_hub.testing import tiny_drafter

    identity = drafter.identity()
    model = tiny_drafter(target, num_modes=identity["num_modes"], block_size=identity["block_size"],
                         target_layer_ids=identity["target_layer_ids"], mask_token_id=identity["mask_token_id"],
                         default_path=identity["default_path"], seed=seed)
    model.config.target["name_or_path"] = drafter.target.repo
    return model


def _hub_snapshot(hf_home, repo_id, commit="0123456789abcdef0123456789abcdef01234567"):
    """The snapshot folder of ``repo_id`` in huggingface_hub's cache layout (made empty)."""
    repo = Path(hf_home) / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    return snapshot


def _jsonl(path, records):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def build_fixtures(root):
    """The fixtures folder (every path the documented commands name) and the seeded HF_HOME."""
    from types import SimpleNamespace

    import torch
    from transformers import LlamaConfig

    from mfd_hub import save_draft
    from mfd_hub.cards.registry import load_registry
    from mfd_hub.recipes.regen import regenerate
    from mfd_hub.recipes.train_checkpoint import save_model_state, save_train_config
    from mfd_hub.testing import (
        save_released_layout, save_tiny_target, tiny_drafter, tiny_target, tiny_tokenizer, write_zlab_checkpoint,
    )

    fx, hf_home = root / "fixtures", root / "hf_home"
    fx.mkdir()
    registry = load_registry()

    # Stand-ins for Qwen/Qwen3-8B and Qwen/Qwen3-4B under their Hub ids (same depth and vocabulary);
    # ./Qwen3-4B is a local folder of the latter
    targets = {}
    for repo in ("Qwen/Qwen3-8B", "Qwen/Qwen3-4B"):
        shape = next(d.target for d in registry.drafters.values() if d.target.repo == repo)
        targets[repo] = _stand_in_target(shape.vocab_size, shape.num_hidden_layers)
        snapshot = save_tiny_target(_hub_snapshot(hf_home, repo), targets[repo])
    os.symlink(snapshot, fx / "Qwen3-4B")
    # published drafters (their card lines) under their repo ids, and local folders of the names the documentation uses
    for name, target_repo in (("MFD-Qwen3-8B", "Qwen/Qwen3-8B"), ("MFD-D-Qwen3-4B", "Qwen/Qwen3-4B")):
        drafter = registry.get(name)
        save_draft(_registry_drafter(drafter, targets[target_repo]), _hub_snapshot(hf_home, drafter.repo_id),
                   overwrite=True)
    for folder, name, target_repo in (("MFD-Qwen3-8B", "MFD-Qwen3-8B", "Qwen/Qwen3-8B"),
                                      ("MFD-drafter", "MFD-Qwen3-8B", "Qwen/Qwen3-8B"),
                                      ("drafter", "MFD-Qwen3-8B", "Qwen/Qwen3-8B"),
                                      ("MFD-Qwen3-4B", "MFD-Qwen3-4B", "Qwen/Qwen3-4B"),
                                      ("ckpt", "MFD-D-Qwen3-4B", "Qwen/Qwen3-4B")):
        save_draft(_registry_drafter(registry.get(name), targets[target_repo]), fx / folder)
    # z-lab DFlash drafters: one on the Hub, one local
    for where, target_repo in ((_hub_snapshot(hf_home, "z-lab/Qwen3-8B-DFlash-b16"), "Qwen/Qwen3-8B"),
                               (fx / "Qwen3-4B-DFlash-b16", "Qwen/Qwen3-4B")):
        base = tiny_drafter(targets[target_repo], num_modes=0, block_size=16, target_layer_ids=[1, 9, 17, 25, 33])
        write_zlab_checkpoint(where, base.config, base.state_dict())

    # drafters in the layout their authors release them in (DFlash format with K mode embeddings); the MFD-D one
    # names its default path and carries a tensor of no role, as the --map example expects
    released = registry.get("MFD-Qwen3-8B"), registry.get("MFD-D-Qwen3-8B")
    save_released_layout(_registry_drafter(released[0], targets["Qwen/Qwen3-8B"]), fx / "MFD-Qwen3-8B-released",
                         dtype=torch.bfloat16)
    save_released_layout(_registry_drafter(released[1], targets["Qwen/Qwen3-8B"]), fx / "MFD-D-Qwen3-8B-released",
                         default_name="default_vector", dtype=torch.bfloat16,
                         extra_tensors={"gate_temperature": torch.ones(8, dtype=torch.bfloat16)})

    # ./MFD-SmolLM2: a full-vocabulary drafter of SmolLM2-135M's shape (what train-ckpt would write)
    smol = SimpleNamespace(config=LlamaConfig(vocab_size=49152, hidden_size=576, num_hidden_layers=30,
                                              num_attention_heads=9, num_key_value_heads=3))
    save_draft(tiny_drafter(smol, num_modes=8, num_layers=1, block_size=16, target_layer_ids=[1, 7, 14, 20, 27],
                            mask_token_id=16), fx / "MFD-SmolLM2", dtype=torch.bfloat16)
    # training checkpoints: one folder, and a run folder with its checkpoints
    small = tiny_target("qwen3")
    trained = tiny_drafter(small, num_modes=2)
    for folder in (fx / "runs/mfd-smollm2/checkpoints/step-000600", fx / "runs/mfd-qwen3-8b/checkpoints/step-000010"):
        save_train_config(folder, trained.config)
        save_model_state(folder, trained.state_dict())

    # my-recipe.yaml: the packaged tiny-mfd recipe with what it expects beside it
    from importlib.resources import files

    shutil.copyfile(str(files("mfd_hub.recipes").joinpath("tiny-mfd.yaml")), fx / "my-recipe.yaml")
    tiny = tiny_target("qwen3", vocab_size=64, init_std=0.2)
    save_tiny_target(fx / "tiny-target", tiny)
    gen = torch.Generator().manual_seed(0)
    prompts = [(f"p{i}", " ".join(f"t{int(t)}" for t in torch.randint(1, 64, (6,), generator=gen))) for i in range(16)]
    regenerate(tiny, tiny_tokenizer(64), prompts, fx / "tiny-data.jsonl", temperature=0.0, max_new_tokens=24,
               batch_size=16, chat=False)
    base = tiny_drafter(tiny, num_modes=0, num_layers=2, block_size=8)
    write_zlab_checkpoint(fx / "tiny-zlab", base.config, base.state_dict(), dtype=torch.float32)

    # prompt and response files
    _jsonl(fx / "prompts.jsonl", [{"id": "q0", "prompt": "Write a palindrome check."},
                                  {"id": "q1", "prompt": "Write a function that sums a list."}])
    for name in ("my.jsonl", "my-prompts.jsonl"):
        _jsonl(fx / name, [{"id": "m0", "prompt": "Write a palindrome check."}])
    _jsonl(fx / "regen.jsonl", [{"id": f"r{i}", "response_ids": [100 + i, 200, 300 + i, 2]} for i in range(4)])
    # held-out regen records (token ids in SmolLM2's vocabulary) for evaluate
    _jsonl(fx / "heldout.jsonl", [{"id": f"h{i}", "prompt": "", "prompt_ids": [1, 9690, 198, 4093 + i],
                                   "response_ids": [504 + 7 * j + i for j in range(20)]} for i in range(2)])
    _jsonl(fx / "responses.jsonl", [{"id": f"r{i}", "prompt": "t1 t2", "response": f"t{5 + i} t7 t{9 + i} t0"}
                                    for i in range(4)])
    return fx, hf_home


def workspace(fixtures, folder, command):
    """A fresh copy of the fixtures for ``command`` (large files hard-linked, small ones copied,
    so appends and rewrites stay inside it); a convert command's OUT is left out."""

    def copy(src, dst):
        if os.path.getsize(src) > 1 << 20:
            os.link(src, dst)
        else:
            shutil.copy2(src, dst)

    shutil.copytree(fixtures, folder, symlinks=True, copy_function=copy)
    words = shlex.split(command)
    if words[1:2] == ["convert"] and len(words) > 4:
        out = folder / words[4]
        if out.is_symlink() or out.is_file():
            out.unlink()
        elif out.exists():
            shutil.rmtree(out)
    return folder


# ---- running ------------------------------------------------------------------------------------
def _files(root):
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


def _cpu():
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def parse_command(argv):
    """Parse a command line with the real click command (every option and argument converted and
    checked, nothing invoked) and resolve the drafters it names -- Hub ids excepted, which would
    need the network."""
    import click

    from mfd_hub.locate import resolve_drafter
    from mfd_hub.cli import cli

    command, ctx, rest, name = cli, click.Context(cli, info_name="mfd-hub"), list(argv), "mfd-hub"
    while isinstance(command, click.Group):
        name, rest = rest[0], rest[1:]
        command = command.get_command(ctx, name)
        if command is None:
            raise click.UsageError(f"No such command {name!r}.")
        ctx = click.Context(command, info_name=name, parent=ctx)
    ctx = command.make_context(name, rest, parent=ctx.parent)
    for param in ("drafter", "drafters", "path", "source"):
        values = ctx.params.get(param)
        for value in values if isinstance(values, tuple) else (values,):
            hub_id = isinstance(value, str) and value.count("/") == 1 and not os.path.exists(value)
            if isinstance(value, str) and not hub_id:
                resolve_drafter(value)


def run_items(plan, log=None):
    """Run plan items (dicts: key, run, workspace, parse_only) in THIS process, each in its
    workspace, through ``mfd_hub.cli.main`` (or ``parse_command``) -> result dicts."""
    import contextlib
    import io
    import time

    import click

    from mfd_hub.cli import main
    from mfd_hub.errors import MfdHubError

    results, home = [], os.getcwd()
    try:
        for item in plan:
            os.chdir(item["workspace"])
            argv = shlex.split(item["run"])[1:]
            before, out, err = _files("."), io.StringIO(), io.StringIO()
            started, cpu = time.perf_counter(), _cpu()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    if item["parse_only"]:
                        parse_command(argv)
                        print("parsed:", item["run"])
                    else:
                        main(argv)
                    code = 0
                except SystemExit as done:
                    code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
                except (click.ClickException, MfdHubError) as failure:  # parse_command's
                    message = failure.format_message() if isinstance(failure, click.ClickException) else failure
                    print(f"error: {message}", file=sys.stderr)
                    code = failure.exit_code
            after = _files(".")
            results.append({
                "key": item["key"], "run": item["run"], "parse_only": item["parse_only"], "code": code,
                "stdout": out.getvalue(), "stderr": err.getvalue()[-4000:], "seconds": time.perf_counter() - started,
                "cpu": _cpu() - cpu, "changed": sorted(p for p in after if before.get(p) != after[p]),
            })
            if log:
                log(f"{code} {results[-1]['seconds']:6.1f} s {results[-1]['cpu']:6.1f} s cpu  {item['run']}")
    finally:
        os.chdir(home)
    return results


# The worker: this module's run_items in a process of its own, with the offline environment.
WORKER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_docs import run_items
plan = json.load(open(sys.argv[2]))
results = run_items(plan, log=lambda line: print(line, file=sys.stderr, flush=True))
json.dump(results, open(sys.argv[3], "w"))
"""


def run_plan(plan, tmp, hf_home, timeout=900):
    """Run ``plan`` in the worker subprocess -> (its result dicts, its log)."""
    (tmp / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    env = dict(os.environ, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    done = fork_server.run("code", WORKER, [str(Path(__file__).parent), str(tmp / "plan.json"), str(tmp / "results.json")],
                           tmp, env, timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((tmp / "results.json").read_text(encoding="utf-8")), done.stderr


def failures(results):
    """One line per result that is not a pass: exit 0 and a non-empty result (JSON for --json)."""
    bad = []
    for r in results:
        last = r["stderr"].strip().splitlines()[-1:] or [""]
        if r["code"] != 0:
            bad.append(f"{r['key']!r} ran as {r['run']!r}: exit {r['code']}: {last[0]}")
        elif not (r["stdout"].strip() or r["changed"]):
            bad.append(f"{r['key']!r} ran as {r['run']!r}: no output and no file written")
        elif "--json" in shlex.split(r["run"]) and not r["parse_only"]:
            try:
                json.loads(r["stdout"])
            except ValueError:
                bad.append(f"{r['key']!r}: --json printed no JSON document")
    return bad


BROKEN_README = """
```bash
mfd-hub info MFD-SmolLM2-135M --no-such-option
mfd-hub verify MFD-SmolLM2-135m
```
"""
BROKEN = ["mfd-hub info MFD-SmolLM2-135M --no-such-option", "mfd-hub verify MFD-SmolLM2-135m"]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    return root, *build_fixtures(root)


@pytest.fixture(scope="module")
def documented(fixtures):
    """Every documented command, run in the worker: (collected, results, the worker's log). Only
    test_documented_commands_run uses it, so that pytest-xdist never runs it twice."""
    root, fixture_dir, hf_home = fixtures
    collected = collect()
    plan, same = [], {}  # same: command -> the command whose run (the same command line) it shares
    for number, command in enumerate(sorted(collected)):
        run = form_run(command)
        parse_only = run is None and command in PARSE_ONLY
        if (run is None and not parse_only) or command in IN_A_PROCESS_OF_ITS_OWN or command in AFTER:
            continue  # not run, run in a process of its own, or planned right after what it continues
        run = run or command
        first = next((item["key"] for item in plan if item["run"] == run and not parse_only), None)
        if first is not None:
            same[command] = first
            continue
        folder = workspace(fixture_dir, root / f"ws{number:03d}", run)
        plan.append({"key": command, "run": run, "workspace": str(folder), "parse_only": parse_only})
        for later, earlier in AFTER.items():
            if earlier == command:
                plan.append({"key": later, "run": form_run(later), "workspace": str(folder), "parse_only": False})
    results, log = run_plan(plan, root, hf_home)
    by_key = {r["key"]: r for r in results}
    results += [{**by_key[first], "key": command, "shared_with": first} for command, first in same.items()]
    return collected, results, log


# ---- tests --------------------------------------------------------------------------------------
def test_the_collector_reads_code_blocks_spans_and_chains():
    text = """
```bash
python3 -m venv .venv && . .venv/bin/activate && mfd-hub demo   # the main job
mfd-hub bench --drafter A \\
    --limit 2
torchrun --nproc-per-node 2 -m mfd_hub train X
```
```python
print("mfd-hub info not-a-command")
```
Run `mfd-hub info B` or `pip install x`.
"""
    assert commands_in_markdown(text) == ["mfd-hub demo", "mfd-hub bench --drafter A --limit 2",
                                          "torchrun --nproc-per-node 2 -m mfd_hub train X"]
    assert commands_in_markdown(text, inline=True)[-1] == "mfd-hub info B"


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference text to docs/"


def test_every_page_under_docs_is_collected(tmp_path):
    """A page anywhere under docs/ is documentation without being listed: the collector finds it
    by walking the folder, beside the README (and nothing outside docs/)."""
    for page in ("README.md", "docs/a.md", "docs/deep/er/b.md", "docs/notes.txt", "other/c.md"):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text("```bash\nmfd-hub list\n```\n", encoding="utf-8")
    found = [p.relative_to(tmp_path).as_posix() for p in documentation_pages(tmp_path)]
    assert found == ["README.md", "docs/a.md", "docs/deep/er/b.md"]


def test_every_documented_command_is_accounted_for():
    collected = collect()
    places = {p for where in collected.values() for p in where}
    assert "README.md" in places and "mfd-hub verify --help" in places
    assert any(p.startswith("docs/") for p in places)
    assert any(p.startswith("mfd-hub card ") for p in places) and any(p.startswith("zoo/") for p in places)
    assert account(collected) == []


def test_the_issue_commands_are_documented_and_run():
    """The three commands of issue 17 are shown (README, --help, cards) and run here."""
    collected = collect()
    for command in ("mfd-hub verify MFD-SmolLM2-135M --target smollm2",
                    "mfd-hub generate --drafter MFD-SmolLM2-135M --target smollm2 'Write a palindrome check.'",
                    "mfd-hub info MFD-SmolLM2-135M"):
        assert command in collected and form_run(command) is not None, command
    assert "zoo/MFD-SmolLM2-135M/README.md" in collected["mfd-hub verify MFD-SmolLM2-135M --target smollm2"]


@pytest.mark.slow
def test_documented_commands_run(documented):
    collected, results, log = documented
    ran = {r["key"] for r in results}
    want = {c for c in collected if (form_run(c) or c in PARSE_ONLY) and c not in IN_A_PROCESS_OF_ITS_OWN}
    assert ran == want
    assert failures(results) == [], log[-6000:]
    total = sum(r["cpu"] for r in results if "shared_with" not in r)
    print(f"\n{len(results)} documented commands, {total:.0f} s of CPU in the worker; the costliest:")
    for r in sorted((r for r in results if "shared_with" not in r), key=lambda r: -r["cpu"])[:12]:
        print(f"  {r['cpu']:5.1f} s cpu {r['seconds']:6.1f} s wall  {r['run']}")


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(IN_A_PROCESS_OF_ITS_OWN))
def test_documented_commands_run_as_real_processes(command, tmp_path):
    """The issue's commands on the shipped drafters, as real `mfd-hub` processes (they need no
    fixtures)."""
    run = form_run(command)
    result = run_cli(shlex.split(run)[1:], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()
    if shlex.split(run)[1] == "generate":  # stdout is the text alone; the report is on stderr
        assert "tau" not in result.stdout and re.search(r"tau \d+\.\d\d, [\d.]+ tok/s", result.stderr)
        assert re.search(r"method mixture, budget \S+", result.stderr)


def test_a_broken_example_is_reported(tmp_path):
    """A README snippet with a wrong option and a misspelt shipped name: the collector finds both,
    the accounting reports them, and the runner (run_items, in this process) reports their failures."""
    collected = collect(readme=BROKEN_README)
    assert set(BROKEN) <= set(collected)
    problems = account(collected)
    assert all(any(f"not accounted for: {c!r}" in p for p in problems) for c in BROKEN), problems
    results = run_items([{"key": c, "run": c, "workspace": str(tmp_path), "parse_only": False} for c in BROKEN]
                        + [{"key": c, "run": c, "workspace": str(tmp_path), "parse_only": True} for c in BROKEN])
    reported = failures(results)
    assert len(reported) == 4, reported
    for line in reported[0], reported[2]:
        assert "No such option" in line and "--no-such-option" in line, line
    for line in reported[1], reported[3]:
        assert "did you mean MFD-SmolLM2-135M" in line, line
