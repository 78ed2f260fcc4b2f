"""Maintainers: do the SmolLM2 miniature's modes earn their keep? The mode analyses of the shipped
pair, then controlled MFD fine-tunes, each beside a D-PACE control trained the same way, stage by
stage, resumable (CPU hours: run it in the background and look in now and then).

    python scripts/mode_experiments.py status             # what is done, CPU hours, each variant's ratio
    nohup python scripts/mode_experiments.py run > runs/modes.log 2>&1 &
    python scripts/mode_experiments.py run --only mfd-    # the stages whose name starts so
    python scripts/mode_experiments.py commands           # the commands, without running them

Every stage is an `mfd-hub` command (evaluate --trees, train, bench), run and logged as
scripts/retrain_miniature.py runs its own: a finished stage leaves its output and is skipped, a
training stopped part way resumes from its newest checkpoint, an analysis or a bench from its
finished prompts, and each stage's wall and CPU time goes to data/smollm2/modes/ledger.jsonl.

1. `shipped-analyses`: the analyses (docs/mode-analyses.md) of the shipped MFD drafter against the
   shipped D-PACE drafter on the held-out answers, with the covered mass; `parity-analyses` and
   `parity-bench`: the same pair on the first PARITY_PROMPTS held-out prompts, offline and in the
   bench (fp32, T = 0), to show that the offline ratios reproduce the bench's.
2. `dpace-control`, then `mfd-VARIANT` and `analyses-VARIANT` per variant: fine-tunes of the
   shipped base (DFlash-SmolLM2-135M) with `long`'s block, anchors and recipe on the first
   FINETUNE_ANSWERS answers for FINETUNE_STEPS steps (one pass), reading the shared tap-feature
   store outside git (runs/features/smollm2). `baseline` is the MFD recipe unchanged; every other
   variant changes one knob of it (VARIANTS). Each is read at once on the offline ratio of its
   mixture (i) to the control's product tree (iv), on the first ANALYSED_PROMPTS held-out answers.
3. `dpace-block16`, then `analyses-block16-deep`: the control drafting blocks of 16 as `block16`
   does, and `block16` read against it, since against the block-8 control its depth and its modes
   both count.
4. `bench20-best`: the variant with the best mean ratio against the control trained as it is
   (`block16`'s against `dpace-block16`) on the first 20 HumanEval problems (T = 0, fp32), as the
   retraining's 20-problem benches, beside the control (and `dpace-block16` too for `block16`).

Git keeps what a stage measured (analyses.json and progress.jsonl, the bench's results and
finished prompts, the ledger), never the weights (*.safetensors is ignored). In a fresh checkout a
finished fine-tune therefore counts as done, unless a stage still to run reads its drafter (the
control, for a new variant's analysis; the best variant, for the bench): then it is trained again
from its recipe, and the feature store is rebuilt first (0.7 CPU-h).
"""

import argparse
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import retrain_miniature as retrain  # noqa: E402  (the same data, steps, stage runner and ledger format)
from mfd_hub.recipes.mode_analyses import PROGRESS_NAME, ratio_interval  # noqa: E402

ROOT = Path("data/smollm2/modes")
LEDGER = ROOT / "ledger.jsonl"
SHIPPED_MFD, SHIPPED_DPACE = "MFD-SmolLM2-135M", "DPACE-SmolLM2-135M"
BUDGETS = "16,32,64"
MASS_EVERY = 8  # the shipped pair's covered mass at every 8th anchor (a target pass over the trees' union each)
ANALYSED_PROMPTS = 50  # held-out answers per variant's analysis (the shipped pair's uses all of them)
PARITY_PROMPTS = 20
# The controlled fine-tunes' scale. The tap-feature store costs about 0.7 CPU-seconds and 1.6 MB an
# answer: for 3,600 answers 0.7 CPU-h and 6 GB, so the store, the control and every variant fit one
# stretch of a few hours on 2 cores (all 12,000 would cost 2.3 CPU-h before the first step). 225
# steps of 16 sequences is one pass over them, so no variant sees an answer twice.
FINETUNE_ANSWERS, FINETUNE_STEPS = 3600, retrain.FINETUNE_STEPS
# variant -> the overrides of the MFD fine-tune that make it (one knob each), in the order they run:
# the recipe as it is first, then the scale of the mode embeddings (the analyses' lead), block 16 last
# (twice the positions per step)
VARIANTS = {
    "baseline": [],
    "token-init": ["drafter.mode_init=token_scale"],
    "mode-lr10": ["train.mode_lr_scale=10"],
    "hard-wta": ["loss.winner_weight=1.0"],
    "gate-detached": ["loss.gate_input=detached"],
    "gate-w03": ["loss.gate_weight=0.3"],
    "block16": ["drafter.block_size=16", "drafter.resize_block=true"],  # the MFD fine-tune only
    # every variant's modes lose about as much in their marginals as their coupling wins, and each
    # mode is the winner on about 1/K of the anchors: two modes train each on half of them
    "modes2": ["drafter.num_modes=2"],
}
DEEP_CONTROL, DEEP_ANALYSES = "dpace-block16", "analyses-deep"  # block16 against the control of its depth
BEST_UNKNOWN = "<best variant: known once every analysis is done>"


def finetune_overrides(answers):
    """`long`'s fine-tune settings (retrain_miniature.py): its data, block and anchors, from the
    shipped base, with the shared feature store, on ``answers`` answers for FINETUNE_STEPS steps."""
    return [f"data.train={retrain.DATA}", f"data.limit={answers}", f"data.features_dir={retrain.FEATURES}",
            "train.precision=auto", f"drafter.block_size={retrain.BLOCK}", f"output.save_every={retrain.SAVE_EVERY}",
            f"train.epochs={retrain.epochs(answers, FINETUNE_STEPS, 1)}",
            f"train.anchors_per_sequence={retrain.FINETUNE_ANCHORS}", f"drafter.base={retrain.SHIPPED_BASE}"]


def analyses_stage(name, drafter, against, out, extra=()):
    argv = ["mfd-hub", "evaluate", str(drafter), "--trees", "--against", str(against), "--data", str(retrain.HELDOUT),
            "--budgets", BUDGETS, *extra, "--out", str(out), "--resume", "--json"]
    return name, argv, out / "analyses.json"


def analysis_json(variant, folder="analyses"):
    return ROOT / variant / folder / "analyses.json"


def matched_analysis(variant):
    """A variant's analysis against the control trained as it is: block16's against DEEP_CONTROL
    once that has run (DEEP_ANALYSES), every other's against the block-8 control."""
    deep = analysis_json(variant, DEEP_ANALYSES)
    return deep if deep.exists() else analysis_json(variant)


def ratio_of(analyses_json):
    """{budget: offline tau of (i) / (iv)} of a finished analysis, or None."""
    path = Path(analyses_json)
    if not path.exists():
        return None
    result = json.loads(path.read_text(encoding="utf-8"))
    return {b: cell["tau_offline"] for b, cell in result["against_dpace"]["mixture"].items()}


def analysis_row(name, analyses_json, cpu_hours):
    """One markdown row of a finished analysis: (i), (ii) and (iii) against (iv) (with the 95%
    interval of (i)/(iv) over the prompts where their journal is there), (i) against (iii)
    (what the coupling across positions is worth), at each budget; the gate's top-1 and the modes'
    norms against the mask token's; the CPU hours its fine-tune took (None: not one of the plan's)."""
    result = json.loads(Path(analyses_json).read_text(encoding="utf-8"))
    against, cons = result["against_dpace"], result["constructions"]

    def ratios(values):
        return " / ".join(f"{v:.3f}" for v in values)

    budgets = sorted(against["mixture"], key=int)
    progress = Path(analyses_json).parent / PROGRESS_NAME
    spread = ""
    if progress.exists():  # the 95% interval of (i)/(iv) over prompts, per budget
        spread = " (" + ", ".join("{:.3f}-{:.3f}".format(*ratio_interval(progress, "mixture", budget=b))
                                  for b in budgets) + ")"
    coupling = [cons["mixture"][b]["tau_offline"] / cons["shuffled"][b]["tau_offline"] for b in budgets]
    norms = result["modes"]["norms"]
    return (f"| `{name}` | {result['prompts']} | " + " | ".join(
        ratios(against[c][b]["tau_offline"] for b in budgets) + (spread if c == "mixture" else "")
        for c in ("mixture", "mean_marginals", "shuffled"))
        + f" | {ratios(coupling)} | {100 * result['gate']['top1_accuracy']:.1f}% | "
        f"{min(norms):.2f}-{max(norms):.2f} / {result['modes']['mask_token_norm']:.2f} | "
        f"{'-' if cpu_hours is None else f'{cpu_hours:.2f}'} |")


def analyses_table(spent):
    """The finished analyses (the shipped pair's, then each variant's) as a markdown table."""
    rows = ["| drafter | prompts | (i)/(iv) | (ii)/(iv) | (iii)/(iv) | (i)/(iii) | gate top-1 | mode norms / mask token's"
            " | fine-tune CPU-h |", "|---|---|---|---|---|---|---|---|---|"]
    shipped = ROOT / "shipped-analyses" / "analyses.json"
    if shipped.exists():
        rows.append(analysis_row("shipped", shipped, None))
    for variant in VARIANTS:
        found, deep = analysis_json(variant), analysis_json(variant, DEEP_ANALYSES)
        if found.exists():
            rows.append(analysis_row(variant, found, spent.get(f"mfd-{variant}", 0.0) / 3600))
        if deep.exists():
            rows.append(analysis_row(f"{variant} against {DEEP_CONTROL}", deep, None))
    return "\n".join(rows)


def best_variant():
    """The variant whose mixture beats the control trained as it is by most (mean offline ratio
    over the budgets), once every variant's analysis is done; else None."""
    ratios = {v: ratio_of(matched_analysis(v)) for v in VARIANTS}
    if any(r is None for r in ratios.values()):
        return None
    return max(ratios, key=lambda v: sum(ratios[v].values()) / len(ratios[v]))


def stages(answers):
    """[(name, argv, done marker)] in the order they run; ``answers``: the fine-tunes' answer count."""
    plan = [analyses_stage("shipped-analyses", SHIPPED_MFD, SHIPPED_DPACE, ROOT / "shipped-analyses",
                           ["--mass", "--mass-every", str(MASS_EVERY)])]
    parity = ROOT / "parity"
    plan.append(analyses_stage("parity-analyses", SHIPPED_MFD, SHIPPED_DPACE, parity / "analyses",
                               ["--limit", str(PARITY_PROMPTS)]))
    plan.append(("parity-bench", ["mfd-hub", "bench", "--prompts", str(retrain.HELDOUT), "--drafter", SHIPPED_DPACE,
                                  "--drafter", SHIPPED_MFD, "--limit", str(PARITY_PROMPTS), "--budgets", BUDGETS,
                                  "--dtype", "float32", *retrain.PINNED, "--out", str(parity / "bench"), "--resume"],
                 parity / "bench" / "results.json"))
    common = finetune_overrides(answers)
    control = ROOT / "dpace-control"
    plan.append(("dpace-control", ["mfd-hub", "train", "smollm2-dpace", *common, f"output.dir={control}"],
                 control / "final" / "model.safetensors"))
    for variant, knobs in VARIANTS.items():  # each read as soon as it is trained
        out = ROOT / variant
        plan.append((f"mfd-{variant}", ["mfd-hub", "train", "smollm2-mfd", *common, *knobs, f"output.dir={out}"],
                     out / "final" / "model.safetensors"))
        plan.append(analyses_stage(f"analyses-{variant}", ROOT / variant / "final", control / "final",
                                   ROOT / variant / "analyses", ["--limit", str(ANALYSED_PROMPTS)]))
    # block16's mixture beats the block-8 control through its depth as much as through its modes
    # ((ii) and (iii) beat (iv) too): a D-PACE control drafting blocks of 16 tells the two apart
    deep = ROOT / DEEP_CONTROL
    plan.append((DEEP_CONTROL, ["mfd-hub", "train", "smollm2-dpace", *common, *VARIANTS["block16"],
                                   f"output.dir={deep}"], deep / "final" / "model.safetensors"))
    plan.append(analyses_stage("analyses-block16-deep", ROOT / "block16" / "final", deep / "final",
                               ROOT / "block16" / DEEP_ANALYSES, ["--limit", str(ANALYSED_PROMPTS)]))
    best = best_variant()
    bench = ROOT / "bench-humaneval-20"
    # a block-16 variant is benched beside the control of its own depth too, so that the bench
    # separates what its modes win from what its depth wins, as analyses-block16-deep does
    deep_control = ["--drafter", str(deep / "final")] if best == "block16" else []
    plan.append(("bench20-best", ["mfd-hub", "bench", "--drafter", str(control / "final"), *deep_control,
                                  "--drafter", str(ROOT / best / "final") if best else BEST_UNKNOWN,
                                  "--limit", "20", "--budgets", BUDGETS, "--dtype", "float32", *retrain.PINNED,
                                  "--out", str(bench), "--resume"], bench / "results.json"))
    return plan


def to_do(plan):
    """The stages of ``plan`` still to run. Git keeps what a fine-tune measured, not its weights, so
    a fine-tune with its train_summary.json and no weights counts as done, unless a stage still to
    run reads its drafter: then it is trained again, with the same recipe and data."""
    waiting = [stage for stage in plan if not stage[2].exists()]
    read = {arg for _, argv, _ in waiting if argv[1] != "train" for arg in argv}
    return [(name, argv, marker) for name, argv, marker in waiting if argv[1] != "train"
            or not (marker.parent.parent / "train_summary.json").exists() or str(marker.parent) in read]


def ledger():
    return [json.loads(line) for line in LEDGER.read_text().splitlines()] if LEDGER.exists() else []


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["status", "run", "commands", "table"])
    parser.add_argument("--only", default="", help="run only the stages whose name starts with this")
    args = parser.parse_args(argv)
    frozen = retrain.frozen_answers()
    answers = min(frozen or retrain.MIN_ANSWERS, FINETUNE_ANSWERS)

    def plan():
        return [stage for stage in stages(answers) if stage[0].startswith(args.only)]

    if args.action == "commands":
        retrain.print_commands(plan())
        return 0
    if args.action == "table":
        print(analyses_table(retrain.cpu_seconds_by_stage(ledger(), first_finish=True)))
        return 0
    if args.action == "status":
        spent = retrain.cpu_seconds_by_stage(ledger())
        print(f"training data: {f'the first {answers} answers' if frozen else 'not frozen yet'} of {retrain.DATA}")
        todo = {name for name, _, _ in to_do(plan())}
        for name, _, marker in plan():
            state = "to do" if name in todo else "done"
            line = f"  {name:<24} {state:<6} {spent.get(name, 0.0) / 3600:6.2f} CPU-h"
            ratios = ratio_of(marker) if name.endswith("analyses") or name.startswith("analyses-") else None
            if ratios:
                line += "   (i)/(iv) " + " ".join(f"B={b} {r:.3f}x" for b, r in ratios.items())
            print(line)
        print(f"total: {sum(spent.values()) / 3600:.2f} CPU-h")
        return 0
    if frozen is None:
        print("freeze the training data first (python scripts/retrain_miniature.py freeze)")
        return 1
    signal.signal(signal.SIGTERM, retrain._raise_stopped)
    while True:  # planned again after each stage: the bench's drafter is known once the analyses are done
        todo = to_do(plan())
        if not todo:
            break
        name, command, marker = todo[0]
        if BEST_UNKNOWN in command:
            print(f"{name} waits for every variant's analysis (run without --only)", flush=True)
            return 1
        try:
            code = retrain.run_stage(name, command, marker, ledger_path=LEDGER)
        except (retrain.Stopped, KeyboardInterrupt):
            print(f"{name} stopped; run again to go on from what is on disk", flush=True)
            return 130
        if code != 0:
            print(f"{name} failed (exit {code}); fix it and run again: finished stages are kept", flush=True)
            return code
        if not marker.exists():
            print(f"{name} ended without writing {marker}", flush=True)
            return 1
    print(f"[{time.strftime('%H:%M:%S')}] every stage is done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
