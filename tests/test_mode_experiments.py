"""scripts/mode_experiments.py: the plan of controlled fine-tunes of the miniature's modes. Every
train stage is a valid recipe that changes only its own knob against a D-PACE control trained the
same way as `long`'s fine-tunes, the other stages parse as commands, and status / commands run."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO, load_script
from mfd_hub.cli import cli
from mfd_hub.recipes.config import load_recipe
from mfd_hub.recipes.trainer import _flat


def test_the_mode_experiments_plan_is_valid_and_changes_one_knob_per_variant(monkeypatch):
    monkeypatch.chdir(REPO)
    plan_module = load_script("scripts/mode_experiments.py")
    retrain = plan_module.retrain
    plan = plan_module.stages(10_400)
    names = [name for name, _, _ in plan]
    assert names[0] == "shipped-analyses" and names[-1] == "bench20-best"
    assert {f"mfd-{v}" for v in plan_module.VARIANTS} | {"dpace-control"} <= set(names)
    recipes = {}
    for name, argv, marker in plan:
        assert argv[0] == "mfd-hub"
        if argv[1] == "train":
            recipe = load_recipe(argv[2], argv[3:])
            assert marker == Path(recipe.output.dir) / "final" / "model.safetensors"
            assert argv[-1].startswith("output.dir=")  # the stage runner resumes from it
            recipes[name] = recipe
        else:
            cli.get_command(None, argv[1]).make_context(argv[1], list(argv[2:]))  # raises on a bad option
    shipped = plan[0][1]
    assert shipped[2:6] == [plan_module.SHIPPED_MFD, "--trees", "--against", plan_module.SHIPPED_DPACE]
    assert "--mass" in shipped and str(retrain.HELDOUT) in shipped
    parity = {name: argv for name, argv, _ in plan if name.startswith("parity-")}
    for argv in parity.values():  # the same pair on the same held-out prompts, offline and in the bench
        assert {plan_module.SHIPPED_MFD, plan_module.SHIPPED_DPACE, str(retrain.HELDOUT)} <= set(argv)
        assert argv[argv.index("--limit") + 1] == str(plan_module.PARITY_PROMPTS)
    control = recipes["dpace-control"]
    assert control.loss.type == "dpace" and control.drafter.base == retrain.SHIPPED_BASE
    assert (control.data.limit, control.drafter.block_size, control.train.anchors_per_sequence) == (
        10_400, retrain.BLOCK, retrain.FINETUNE_ANCHORS)
    assert control.data.features_dir == str(retrain.FEATURES)
    deep, plain_dpace = _flat(recipes["dpace-block16"].to_dict()), _flat(control.to_dict())
    assert {k for k in deep if deep[k] != plain_dpace[k]} - {"output.dir"} == {"drafter.block_size", "drafter.resize_block"}
    assert deep["drafter.block_size"] == recipes["mfd-block16"].drafter.block_size == 16
    for best in ("block16", "mode-lr10"):  # the best variant beside the control, and its own depth's if deeper
        monkeypatch.setattr(plan_module, "best_variant", lambda best=best: best)
        bench = plan_module.stages(10_400)[-1][1]
        drafters = [bench[i + 1] for i, arg in enumerate(bench) if arg == "--drafter"]
        expected = [control.output.dir] + ([recipes["dpace-block16"].output.dir] if best == "block16" else [])
        assert drafters == [str(Path(d) / "final") for d in expected] + [str(plan_module.ROOT / best / "final")]
    plain_mfd = _flat(load_recipe("smollm2-mfd", plan_module.finetune_overrides(10_400)).to_dict())
    for variant, knobs in plan_module.VARIANTS.items():
        recipe = recipes[f"mfd-{variant}"]
        assert (recipe.data.limit, recipe.train.epochs, recipe.train.anchors_per_sequence, recipe.drafter.base) == (
            control.data.limit, control.train.epochs, control.train.anchors_per_sequence, control.drafter.base)
        mine = _flat(recipe.to_dict())
        changed = {k for k in mine if mine[k] != plain_mfd[k]} - {"output.dir"}
        assert changed == {knob.split("=")[0] for knob in knobs}, variant
    # what a stage measured is meant for git; weights and the feature store are not
    run = plan_module.ROOT / "hard-wta"
    ignored = [run / "final" / "model.safetensors", run / "final" / "modeling_mfd.py",
               run / "checkpoints" / "step-0000200" / "optim" / "__0_0.distcp", retrain.FEATURES / "meta.json"]
    kept = [run / "final" / "config.json", run / "train_summary.json", run / "analyses" / "analyses.json",
            plan_module.LEDGER, plan_module.ROOT / "shipped-analyses" / "progress.jsonl"]
    if (REPO / ".git").exists():
        probe = subprocess.run(["git", "check-ignore", "--no-index", *map(str, ignored + kept)], cwd=REPO,
                               capture_output=True, text=True)
        assert probe.stdout.split() == [str(path) for path in ignored]


def test_status_and_commands_run():
    for action, shows in (("status", "CPU-h"), ("commands", "mfd-hub evaluate MFD-SmolLM2-135M --trees")):
        result = subprocess.run([sys.executable, "scripts/mode_experiments.py", action], cwd=REPO, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "shipped-analyses" in result.stdout and "mfd-block16" in result.stdout and shows in result.stdout


def test_the_table_row_is_read_from_the_analysis(monkeypatch):
    monkeypatch.chdir(REPO)
    plan_module = load_script("scripts/mode_experiments.py")
    path = plan_module.ROOT / "parity" / "analyses" / "analyses.json"
    result = json.loads(path.read_text())
    cells = [c.strip() for c in plan_module.analysis_row("parity", path, 0.25).split("|")[1:-1]]
    assert cells[:2] == ["`parity`", str(result["prompts"])] and cells[-1] == "0.25"
    mixture, dpace = result["constructions"]["mixture"], result["against_dpace"]
    point, spread = cells[2].split(" (")
    assert point == " / ".join(f"{dpace['mixture'][b]['tau_offline']:.3f}" for b in ("16", "32", "64"))
    for interval, estimate in zip(spread.rstrip(")").split(", "), point.split(" / ")):  # 95% over prompts
        low, high = map(float, interval.split("-"))
        assert low <= float(estimate) <= high and high - low < 0.05
    coupling = mixture["32"]["tau_offline"] / result["constructions"]["shuffled"]["32"]["tau_offline"]
    assert cells[5].split(" / ")[1] == f"{coupling:.3f}"
    table = subprocess.run([sys.executable, "scripts/mode_experiments.py", "table"], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert table.returncode == 0 and "| `shipped` | 200 |" in table.stdout, table.stderr


def test_a_fine_tune_whose_weights_git_dropped_is_retrained_only_when_a_stage_to_run_reads_it(tmp_path):
    plan_module = load_script("scripts/mode_experiments.py")

    def fine_tune(name, trained, weights):
        final = tmp_path / name / "final"
        final.mkdir(parents=True)
        if trained:
            (final.parent / "train_summary.json").write_text("{}")
        if weights:
            (final / "model.safetensors").write_text("")
        return name, ["mfd-hub", "train", "recipe", f"output.dir={final.parent}"], final / "model.safetensors"

    def analysis(name, drafter):
        return name, ["mfd-hub", "evaluate", str(tmp_path / drafter / "final")], tmp_path / name / "analyses.json"

    kept = fine_tune("kept", trained=True, weights=True)
    measured = fine_tune("measured", trained=True, weights=False)  # its analysis is done: nothing reads it
    needed = fine_tune("needed", trained=True, weights=False)  # an analysis still to run reads it
    fresh = fine_tune("fresh", trained=False, weights=False)
    done = analysis("done", "measured")
    done[2].parent.mkdir()
    done[2].write_text("{}")
    plan = [kept, measured, needed, fresh, done, analysis("waiting", "needed")]
    assert [name for name, _, _ in plan_module.to_do(plan)] == ["needed", "fresh", "waiting"]


def test_the_best_variant_is_read_against_the_control_of_its_own_depth(tmp_path, monkeypatch):
    plan_module = load_script("scripts/mode_experiments.py")
    monkeypatch.setattr(plan_module, "ROOT", tmp_path)
    monkeypatch.setattr(plan_module, "VARIANTS", {"deeper": [], "steady": []})

    def plant(variant, folder, ratio):
        path = tmp_path / variant / folder / "analyses.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"against_dpace": {"mixture": {b: {"tau_offline": ratio} for b in ("16", "32")}}}))

    plant("steady", "analyses", 1.01)
    assert plan_module.best_variant() is None  # until every variant's analysis is done
    plant("deeper", "analyses", 1.05)  # against the block-8 control: its depth counts too
    assert plan_module.best_variant() == "deeper"
    plant("deeper", plan_module.DEEP_ANALYSES, 1.00)  # against the control of its own depth
    assert plan_module.best_variant() == "steady"


def test_the_table_counts_one_training_where_a_fresh_checkout_trained_it_again():
    plan_module = load_script("scripts/mode_experiments.py")

    def run(stage, cpu, returncode=0, stopped=False):
        return {"stage": stage, "cpu_s": cpu, "returncode": returncode, "stopped": stopped}

    entries = [run("mfd-a", 100.0, returncode=-15, stopped=True), run("mfd-a", 50.0), run("mfd-b", 70.0),
               run("mfd-a", 400.0)]  # trained again from its recipe, for a stage that read its weights
    count = plan_module.retrain.cpu_seconds_by_stage
    assert count(entries) == {"mfd-a": 550.0, "mfd-b": 70.0}  # what was spent
    assert count(entries, first_finish=True) == {"mfd-a": 150.0, "mfd-b": 70.0}  # what one training cost
