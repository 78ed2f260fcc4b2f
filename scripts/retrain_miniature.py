"""Maintainers: retrain the SmolLM2 miniature's drafters on the regenerated prompt set, stage by
stage, resumable (hours of CPU: run it in the background and look in now and then).

    python scripts/retrain_miniature.py status                 # what is done, what runs next, CPU hours
    python scripts/retrain_miniature.py freeze                 # fix the training data: the answers so far
    nohup python scripts/retrain_miniature.py run > runs/retrain.log 2>&1 &
    python scripts/retrain_miniature.py run --only full-       # the stages whose name starts so
    python scripts/retrain_miniature.py commands               # the commands, without running them
    python scripts/retrain_miniature.py rebuild-doc            # rewrite data/smollm2/retrain/REBUILD.md

Every stage is an `mfd-hub` command (train, bench, evaluate). A finished stage leaves its output
(`final/`, `results.json`, `evaluate.json`) and is skipped; a training stopped part way resumes
from its newest checkpoint, a bench from its finished prompts. Each stage's wall and CPU time is
appended to data/smollm2/retrain/ledger.jsonl. `freeze` records how many answers the regeneration
has written (at least MIN_ANSWERS) in data/smollm2/retrain/data.json, and every stage trains on the
first that many (`data.limit`), so a regeneration that goes on writing changes nothing already
trained.

Git keeps what a stage measured, never what it trained: the answers (data/smollm2/train,
heldout), every bench's results and finished prompts (packed as progress.jsonl.gz once the bench
is done; `bench --resume` reads it back), every evaluation, the ledger, and a trained
drafter's config. The weights themselves (`final/model.safetensors`) are not tracked: a checkpoint
is rebuilt from its recipe by running its stage again, and data/smollm2/retrain/REBUILD.md lists
each one's command and CPU hours (`rebuild-doc` writes it from the plan and the ledger). A train
stage counts as done only when its weights exist, so `run --only NAME` rebuilds a missing one. The
training checkpoints (data/smollm2/retrain/**/checkpoints) and the target's feature store
(runs/features, rebuilt in minutes) are not tracked either. The fine-tunes of the shipped run start
from the shipped base (`DFlash-SmolLM2-135M`, the bf16 copy of that run's stage 1), so they can be
rebuilt without rebuilding stage 1 first.

Choices, from measurements on the 2-core development machine (README, "Training"):
- `train.precision=auto`: bf16 autocast on a CPU with native bf16 (AMX-BF16, AVX512-BF16), where a
  step costs half to 0.4x an fp32 step; fp32 elsewhere, where bf16 is emulated and 10x slower;
- stage 1 (DFlash from scratch) for at least 600 steps of 16 sequences, as the shipped base,
  and at least 3 epochs; the fine-tunes (D-PACE and MFD, same data and steps) for at least 225
  steps and 1 epoch, with half stage 1's anchors per sequence: the MFD step with K = 8 costs
  6.5x a one-mode step, so this halves the largest stage;
- blocks of 8 (the anchor and 7 drafted positions) instead of 16, with twice the anchors at the
  same cost a step: on held-out answers, positions 9-15 of a block-16 drafter held none of the
  greedy accepted length and 1e-8 of its expected length (README, "Training"), so half of a
  block-16 step trained positions no draft ever reaches; a block of 8 also halves drafting;
- three data sizes for the scaling plot (1.2K, 5K and all answers), each benchmarked on the
  first 20 HumanEval problems, then `long` (all answers, stage 1 for a second cycle from full's,
  and its fine-tunes and bench); last, the candidate to ship (CANDIDATE, now `long`) on all 164
  at T = 0 and T = 0.7 (fp32) and in bf16 for the README's speed table, and its MFD drafter
  evaluated on the held-out answers (full's were, when full was the candidate).
"""

import argparse
import json
import math
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

DATA = Path("data/smollm2/train")
HELDOUT = Path("data/smollm2/heldout")
ROOT = Path("data/smollm2/retrain")
FEATURES = Path("runs/features/smollm2")  # the target's tap features of DATA, shared by every stage
MIN_ANSWERS = 10_000
SIZES = {"full": None, "5k": 5000, "1k2": 1200}  # data.limit of each size
# runs whose stage 1 is a second cosine cycle, as long as the first, from another run's stage 1 (all
# answers): full's stage-1 coverage was still rising 8% over its last fifth of steps
CONTINUED = {"long": "full"}
# the run whose drafters are evaluated on the held-out answers and benchmarked on all 164 problems,
# and ship once those runs are done: `long` beat `full` at every method and budget on the first 20
# (README). full's own 164-problem T = 0 results and evaluation stay in git as the record of what ships now.
CANDIDATE = "long"
BATCH = 16  # sequences per step, as the recipes say
STAGE1_STEPS, FINETUNE_STEPS = 600, 225
BLOCK = 8  # anchor + drafted positions of every retrained drafter
STAGE1_ANCHORS, FINETUNE_ANCHORS = 32, 16  # anchors per sequence: positions x anchors sets a step's cost
# the benches' products: fp32 through oneDNN on every machine (what "auto" picks where bf16 is
# native), so a bench resumed on another CPU keeps its settings, and tau and the fp32 identity
# check mean the same at every size
PINNED = ("--linears", "onednn")
SHIPPED_BASE = "DFlash-SmolLM2-135M"  # zoo/'s bf16 copy of CANDIDATE's stage 1
SAVE_EVERY = 50  # steps between a training's checkpoints: a run stopped part way loses at most this many


def answers_available():
    from mfd_hub.recipes.data import load_sequences

    return len(load_sequences(str(DATA), 1024)[0]) if DATA.exists() else 0


def epochs(data_size, steps, at_least):
    return max(at_least, math.ceil(steps * BATCH / data_size))


def frozen_answers():
    path = ROOT / "data.json"
    return json.loads(path.read_text())["answers"] if path.exists() else None


def stages(full_size):
    """[(name, argv, done marker)] in the order they run; ``full_size``: the frozen answer count."""
    plan = []
    runs_to_plan = [(size, limit, None) for size, limit in SIZES.items()]
    runs_to_plan += [(name, SIZES[source], source) for name, source in CONTINUED.items()]
    for size, limit, continued_from in runs_to_plan:
        n = limit or full_size
        folder = ROOT / size
        data = [f"data.train={DATA}", f"data.limit={n}", f"data.features_dir={FEATURES}", "train.precision=auto",
                f"drafter.block_size={BLOCK}", f"output.save_every={SAVE_EVERY}"]
        # the shipped run's fine-tunes start from the shipped base; the other sizes', from their own stage 1
        base = SHIPPED_BASE if size == CANDIDATE else folder / "smollm2-dflash" / "final"
        finetune = [f"train.epochs={epochs(n, FINETUNE_STEPS, 1)}", f"train.anchors_per_sequence={FINETUNE_ANCHORS}",
                    f"drafter.base={base}"]
        stage1 = [f"train.epochs={epochs(n, STAGE1_STEPS, 3)}", f"train.anchors_per_sequence={STAGE1_ANCHORS}"]
        if continued_from:  # the architecture comes with the base
            stage1 += [f"drafter.base={ROOT / continued_from / 'smollm2-dflash' / 'final'}", "drafter.config={}"]
        runs = {
            "smollm2-dflash": stage1,
            "smollm2-dpace": finetune,
            "smollm2-mfd": finetune,
        }
        for recipe, extra in runs.items():
            out = folder / recipe
            plan.append((f"{size}-{recipe.split('-')[1]}", ["mfd-hub", "train", recipe, *data, *extra,
                                                            f"output.dir={out}"], out / "final" / "model.safetensors"))
        drafters = ["--drafter", str(folder / "smollm2-dpace" / "final"), "--drafter", str(folder / "smollm2-mfd" / "final")]
        bench20 = folder / "bench-humaneval-20"
        plan.append((f"{size}-bench20", ["mfd-hub", "bench", *drafters, "--limit", "20", "--budgets", "16,32,64",
                                         "--dtype", "float32", *PINNED, "--out", str(bench20), "--resume"], bench20 / "results.json"))
        if size in ("full", CANDIDATE):
            evaluation = folder / "evaluate.json"
            plan.append((f"{size}-evaluate", ["mfd-hub", "evaluate", str(folder / "smollm2-mfd" / "final"), "--data",
                                           str(HELDOUT), "--json"], evaluation))
    candidate = ROOT / CANDIDATE
    candidate_drafters = ["--drafter", str(candidate / "smollm2-dpace" / "final"),
                          "--drafter", str(candidate / "smollm2-mfd" / "final")]
    for temperature, budgets in (("0", "16,32,64,auto"), ("0.7", "16,32,64")):
        out = candidate / f"bench-humaneval-164-T{temperature}"
        plan.append((f"{CANDIDATE}-bench164-T{temperature}", [
            "mfd-hub", "bench", *candidate_drafters, "--temperatures", temperature, "--budgets", budgets,
            "--dtype", "float32", *PINNED, "--out", str(out), "--resume"], out / "results.json"))
    # the README's speed table: what a user of a CPU with native bf16 gets (bf16 speculation, the
    # faster plain decoding as baseline), pinned so that a resume on another CPU keeps the settings
    out = candidate / "bench-bf16-humaneval-164"
    plan.append((f"{CANDIDATE}-bench164-bf16", ["mfd-hub", "bench", *candidate_drafters, "--budgets", "16,auto",
                                               "--dtype", "bfloat16", *PINNED, "--out", str(out), "--resume"],
                 out / "results.json"))
    return plan


def restore_bundles():
    """Write the remote-code bundle into every finished drafter folder (git keeps a stage's weights
    and config; the bundle is generated by mfd_hub.bundle, so rewriting it also keeps it current)."""
    from mfd_hub.bundle import write_bundle

    for config in ROOT.glob("*/*/final/config.json"):
        write_bundle(config.parent)


class Stopped(Exception):
    """SIGTERM (a plain `kill`): unwinds like Ctrl-C so the running stage is stopped and logged."""


def _raise_stopped(signum, frame):
    raise Stopped(signum)


def run_stage(name, argv, marker, ledger_path=None):
    """Run one stage to its end (resuming a training that has checkpoints) and log its cost in
    ``ledger_path`` (default: this plan's ledger; scripts/mode_experiments.py keeps its own)."""
    if argv[1] == "train" and (Path(argv[-1].split("=", 1)[1]) / "checkpoints").exists():
        argv = [*argv, "--resume"]
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(argv)}", flush=True)
    # the mfd-hub installed beside this interpreter, so a run without an activated venv finds it
    beside = Path(sys.executable).with_name(argv[0])
    command = [str(beside) if beside.exists() else argv[0], *argv[1:]]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.time()
    evaluate = argv[1] == "evaluate"  # its JSON is the stage's output: written whole or not at all
    child = subprocess.Popen(command, stdout=subprocess.PIPE if evaluate else None)
    stopped = None
    try:
        output, _ = child.communicate()
    except (Stopped, KeyboardInterrupt) as why:
        # a stage stopped from outside ends with its child (a kill of this script alone used to leave
        # the bench running, unseen, beside the next one); what the child finished is on disk
        stopped = why
        child.terminate()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    if evaluate and child.returncode == 0:
        temporary = marker.with_suffix(".tmp")
        temporary.write_bytes(output)
        temporary.replace(marker)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    ledger_path = Path(ledger_path or ROOT / "ledger.jsonl")
    ledger_path.parent.mkdir(parents=True, exist_ok=True)
    with open(ledger_path, "a", encoding="utf-8") as ledger:  # a stopped part counts too
        ledger.write(json.dumps({"stage": name, "started": began, "wall_s": time.time() - began, "cpu_s": cpu,
                                 "returncode": child.returncode, "stopped": stopped is not None,
                                 "argv": argv}) + "\n")
    if stopped is not None:
        raise stopped
    return child.returncode


def print_commands(plan):
    for name, command, _ in plan:
        print(f"{name}: {' '.join(command)}")


def cpu_seconds_by_stage(entries, first_finish=False):
    """{stage: CPU seconds} over ledger entries, stopped attempts included. ``first_finish``: only
    up to a stage's first finished run, what it costs once when git's lack of weights made a fresh
    checkout run it again."""
    spent, finished = {}, set()
    for entry in entries:
        if entry["stage"] in finished:
            continue
        spent[entry["stage"]] = spent.get(entry["stage"], 0.0) + entry["cpu_s"]
        if first_finish and entry["returncode"] == 0 and not entry["stopped"]:
            finished.add(entry["stage"])
    return spent


def ledger():
    path = ROOT / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


REBUILD = ROOT / "REBUILD.md"


def rebuild_doc(plan):
    """REBUILD.md's text: for every train stage, the command that rebuilds its checkpoint and what it
    cost (the ledger's CPU and wall hours, stopped attempts included)."""
    cpu, wall = {}, {}
    for entry in ledger():
        cpu[entry["stage"]] = cpu.get(entry["stage"], 0.0) + entry["cpu_s"] / 3600
        wall[entry["stage"]] = wall.get(entry["stage"], 0.0) + entry["wall_s"] / 3600
    lines = [
        "# Rebuilding the miniature's training checkpoints",
        "",
        "Written by `python scripts/retrain_miniature.py rebuild-doc`; do not edit by hand.",
        "",
        "Git keeps what each stage measured (`results.json`, `evaluate.json`, `ledger.jsonl`, the",
        "benches' prompts) and each trained drafter's `config.json`, not its weights. A checkpoint is",
        "rebuilt from its recipe: `python scripts/retrain_miniature.py run --only STAGE` runs the",
        "command below (the training data must be frozen first, see the script's `freeze`). CPU and wall",
        "hours are the ledger's, every attempt of the stage included, on the 2-core CPUs it ran on.",
        f"The fine-tunes of `{CANDIDATE}` start from the shipped base `{SHIPPED_BASE}`, the bf16 copy of",
        f"`{CANDIDATE}`'s stage 1; the measured ones started from the fp32 original, so a rebuilt",
        "fine-tune is close to the measured one, not bit-identical.",
        "",
        "| stage | checkpoint | CPU h | wall h | command |",
        "|---|---|---|---|---|",
    ]
    for name, argv, marker in plan:
        if argv[1] == "train":
            lines.append(f"| {name} | `{marker.parent}` | {cpu.get(name, 0.0):.2f} | {wall.get(name, 0.0):.2f} "
                         f"| `{' '.join(argv)}` |")
    return "\n".join(lines) + "\n"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["status", "freeze", "run", "commands", "rebuild-doc"])
    parser.add_argument("--only", default="", help="run only the stages whose name starts with this")
    parser.add_argument("--check", action="store_true", help="rebuild-doc: fail if REBUILD.md is stale, write nothing")
    args = parser.parse_args(argv)
    frozen = frozen_answers()
    if args.action == "freeze":
        if frozen is not None:
            print(f"the training data is already frozen at {frozen} answers ({ROOT / 'data.json'})")
            return 1
        available = answers_available()
        if available < MIN_ANSWERS:
            print(f"only {available} answers in {DATA}; training needs {MIN_ANSWERS}")
            return 1
        ROOT.mkdir(parents=True, exist_ok=True)
        (ROOT / "data.json").write_text(json.dumps({"answers": available, "data": str(DATA)}) + "\n")
        print(f"training data: the first {available} answers of {DATA}")
        return 0
    plan = [stage for stage in stages(frozen or MIN_ANSWERS) if stage[0].startswith(args.only)]
    if args.action == "rebuild-doc":
        text = rebuild_doc(stages(frozen or MIN_ANSWERS))
        if args.check:
            current = REBUILD.read_text(encoding="utf-8") if REBUILD.exists() else ""
            if current != text:
                print(f"{REBUILD} is stale: run python {sys.argv[0]} rebuild-doc")
                return 1
            return 0
        temporary = REBUILD.with_suffix(".tmp")
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(REBUILD)
        print(f"wrote {REBUILD}")
        return 0
    restore_bundles()
    if args.action == "commands":
        print_commands(plan)
        return 0
    if args.action == "status":
        spent = cpu_seconds_by_stage(ledger())
        print(f"training data: {f'the first {frozen} answers' if frozen else 'not frozen yet'}; "
              f"{answers_available()} regenerated in {DATA}")
        for name, _, marker in plan:
            state = "done" if marker.exists() else "to do"
            print(f"  {name:<22} {state:<6} {spent.get(name, 0.0) / 3600:6.2f} CPU-h")
        print(f"total: {sum(spent.values()) / 3600:.2f} CPU-h")
        return 0
    if frozen is None:
        print(f"freeze the training data first (python {sys.argv[0]} freeze)")
        return 1
    signal.signal(signal.SIGTERM, _raise_stopped)
    for name, command, marker in plan:
        if marker.exists():
            continue
        try:
            code = run_stage(name, command, marker)
        except (Stopped, KeyboardInterrupt):
            print(f"{name} stopped; run again to go on from what is on disk", flush=True)
            return 130
        if code != 0:
            print(f"{name} failed (exit {code}); fix it and run again: finished stages are kept", flush=True)
            return code
        if command[1] == "bench":  # a finished journal is kept packed; a later --resume unpacks it
            from mfd_hub.zoo.bench import pack_journal

            pack_journal(marker.parent)
    print("every stage is done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
