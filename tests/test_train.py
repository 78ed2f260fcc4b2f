"""Training: losses against hand computations, data and features, recipes, and real tiny runs
(loss falls, bit-exact resume, 2 gloo ranks = 1 rank, the checkpoint contract)."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from click.testing import CliRunner
from conftest import load_script, run_cli, run_cli_many
from mfd_hub.cli import cli
from mfd_hub.errors import MfdHubError
from mfd_hub.recipes.config import load_recipe, packaged_recipes
from mfd_hub.recipes.data import (
    FeatureStore,
    Sequence,
    TapExtractor,
    draft_vocabulary,
    load_sequences,
    make_batch,
    sample_anchors,
    step_sequences,
)
from mfd_hub.recipes.losses import (
    decay_weights,
    dflash_loss,
    dpace_loss,
    dpace_weights,
    mfd_loss,
    soft_coverage,
    true_token_logprobs,
    true_token_probs,
    winner_take_all_weights,
)

LN2 = math.log(2.0)
INF = float("inf")


# -- losses by hand ------------------------------------------------------------------------------
def test_dflash_decay_by_hand():
    w = decay_weights(3, gamma=7.0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(-1 / 7), math.exp(-2 / 7)]))
    logp = torch.log(torch.tensor([[0.5, 0.25, 1.0, 0.9]]))
    valid = torch.tensor([[True, True, True, False]])
    want = LN2 + math.exp(-1 / 7) * 2 * LN2  # the third CE is 0, the fourth position does not exist
    assert dflash_loss(logp, valid, 7.0).item() == pytest.approx(want, rel=1e-6)


def test_dpace_weights_loss_and_detached_gradient_by_hand():
    q = torch.tensor([0.5, 0.25, 1.0, 0.7])
    valid = torch.tensor([True, True, True, False])
    # s = 0.75, 0.625, 1, 0 -> prefix 0.75, 0.46875, 0.46875, 0 -> suffix sums
    assert torch.allclose(dpace_weights(q, valid, 0.5), torch.tensor([1.6875, 0.9375, 0.46875, 0.0]))
    logp = q.log().requires_grad_(True)
    loss = dpace_loss(logp, valid, 0.5)
    assert loss.item() == pytest.approx(1.6875 * LN2 + 0.9375 * 2 * LN2, rel=1e-6)
    (grad,) = torch.autograd.grad(loss, logp)
    # weights are detached: d loss / d log q_k = -weight_k exactly
    assert torch.allclose(grad, -torch.tensor([1.6875, 0.9375, 0.46875, 0.0]))


def test_token_outside_draft_vocabulary_counts_as_a_miss_without_gradient():
    logp = torch.tensor([math.log(0.5), -INF, 0.0], requires_grad=True)
    valid = torch.tensor([True, True, True])
    q = true_token_probs(logp, valid)
    assert q.tolist() == [0.5, 0.0, 1.0]
    assert soft_coverage(q).item() == pytest.approx(0.5)  # acceptance stops at the miss
    # s = 0.75, 0.5, 1 -> prefix 0.75, 0.375, 0.375 -> weights 1.5, 0.75, 0.375; CE 0 at the miss
    loss = dpace_loss(logp, valid, 0.5)
    assert loss.item() == pytest.approx(1.5 * LN2)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(grad).all() and grad[1] == 0


def test_coverage_winner_take_all_and_gate_by_hand():
    q = torch.tensor([[0.5, 0.5, 0.5], [1.0, 0.5, 0.0]])
    assert soft_coverage(q).tolist() == [0.5 + 0.25 + 0.125, 1.0 + 0.5 + 0.0]
    weights, winner = winner_take_all_weights(torch.tensor([0.2, 0.9, 0.5, 0.9]), 0.9)
    assert winner.item() == 1  # ties go to the smaller index
    assert torch.allclose(weights, torch.tensor([0.1 / 3, 0.9, 0.1 / 3, 0.1 / 3]))
    # MFD on one block, K = 2, P = 2: mode 0 q = (.5, .5), mode 1 q = (1, .25)
    logp = torch.log(torch.tensor([[0.5, 0.5], [1.0, 0.25]]))
    gate = torch.tensor([0.0, math.log(3.0)])
    loss, parts = mfd_loss(logp, torch.tensor([True, True]), gate, alpha=0.5, winner_weight=0.9, gate_weight=0.1)
    assert parts["coverage"].tolist() == [0.75, 1.25] and parts["winner"].item() == 1
    # D-PACE: mode 0 weights (1.3125, .5625) x CE (ln2, ln2); mode 1 weights (1.625, .625) x CE (0, 2 ln2)
    dpace = 0.1 * 1.875 * LN2 + 0.9 * 1.25 * LN2
    gate_ce = -math.log(3.0 / 4.0)  # softmax(0, ln 3) puts 3/4 on the winner
    assert parts["dpace"].item() == pytest.approx(dpace, rel=1e-6)
    assert parts["gate"].item() == pytest.approx(gate_ce, rel=1e-6)
    assert loss.item() == pytest.approx(dpace + 0.1 * gate_ce, rel=1e-6)


@pytest.mark.parametrize("chunk", [0, 3])
def test_true_token_logprobs_match_log_softmax(chunk):
    torch.manual_seed(0)
    hidden = torch.randn(7, 5, requires_grad=True)
    weight = torch.randn(11, 5, requires_grad=True)
    index = torch.tensor([0, 3, -1, 10, 2, -1, 5])
    upstream = torch.randn(7)
    got = true_token_logprobs(hidden, weight, index, chunk)
    ref = torch.log_softmax(hidden @ weight.t(), -1).gather(1, index.clamp(min=0)[:, None])[:, 0]
    ok = index >= 0
    assert torch.isinf(got[~ok]).all() and torch.allclose(got[ok], ref[ok], atol=1e-6)
    grads = torch.autograd.grad((got[ok] * upstream[ok]).sum(), [hidden, weight])
    ref_grads = torch.autograd.grad((ref[ok] * upstream[ok]).sum(), [hidden, weight])
    for a, b in zip(grads, ref_grads):
        assert torch.allclose(a, b, atol=1e-5)


# -- data ------------------------------------------------------------------------------------------
def test_anchors_order_and_batches_are_deterministic_and_supervised():
    seq = Sequence("a", list(range(1, 21)), prompt_len=6)
    anchors, valid = sample_anchors(seq, 8, seed=3, epoch=1, index=5)
    assert valid.all() and len(set(anchors.tolist())) == 8 and anchors.tolist() == sorted(anchors.tolist())
    assert all(6 <= p <= seq.length - 2 for p in anchors.tolist())  # p and p + 1 are response tokens
    again, _ = sample_anchors(seq, 8, seed=3, epoch=1, index=5)
    other, _ = sample_anchors(seq, 8, seed=3, epoch=2, index=5)
    assert torch.equal(anchors, again) and not torch.equal(anchors, other)
    short = Sequence("b", [1, 2, 3, 4], prompt_len=2)  # one anchor only: p = 2
    anchors, valid = sample_anchors(short, 4, 0, 0, 0)
    assert anchors.tolist()[:1] == [2] and valid.tolist() == [True, False, False, False]
    epoch, first = step_sequences(3, 10, 4, seed=0)  # 2 steps an epoch: step 3 is epoch 1, batch 1
    assert epoch == 1 and len(first) == 4 and first == step_sequences(3, 10, 4, seed=0)[1]
    taps = [torch.randn(seq.length, 6), torch.randn(short.length, 6)]
    batch = make_batch([seq, short], [0, 1], [sample_anchors(seq, 4, 0, 0, 0), (anchors, valid)], taps)
    context = int(batch.anchors.max())
    assert batch.taps.shape == (2, context, 6) and torch.equal(batch.taps[0], taps[0][:context])
    assert batch.ids[1].tolist() == [1, 2, 3, 4] + [0] * 16 and batch.lengths.tolist() == [20, 4]


def test_draft_vocabulary_is_the_most_frequent_response_tokens():
    seqs = [Sequence("a", [9, 9, 5, 5, 5, 7], 2), Sequence("b", [1, 5, 7, 3], 1)]
    # response tokens: 5 x 4, 7 x 2, 3 x 1 (the prompts' 9s and 1 do not count)
    assert draft_vocabulary(seqs, 2, 10).tolist() == [5, 7]
    assert draft_vocabulary(seqs, 3, 10).tolist() == [3, 5, 7]
    assert draft_vocabulary(seqs, 4, 10).tolist() == [3, 5, 7]  # only tokens that occur


# -- a tiny workspace: target, z-lab base, regenerated data ----------------------------------------
@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    from mfd_hub.recipes.regen import regenerate
    from mfd_hub.testing import save_tiny_target, tiny_drafter, tiny_target, tiny_tokenizer, write_zlab_checkpoint

    root = tmp_path_factory.mktemp("train")
    target = tiny_target("qwen3", vocab_size=64, init_std=0.2)
    save_tiny_target(root / "tiny-target", target)
    gen = torch.Generator().manual_seed(0)
    prompts = []
    for i in range(16):
        n = int(torch.randint(3, 9, (1,), generator=gen))
        prompts.append((f"p{i}", " ".join(f"t{int(t)}" for t in torch.randint(1, 64, (n,), generator=gen))))
    regenerate(target, tiny_tokenizer(64), prompts, root / "tiny-data.jsonl", temperature=0.0, max_new_tokens=40,
               batch_size=8, chat=False)
    base = tiny_drafter(target, num_modes=0, num_layers=2, block_size=8)
    write_zlab_checkpoint(root / "tiny-zlab", base.config, base.state_dict(), dtype=torch.float32)
    return root, target


@pytest.fixture
def in_workspace(workspace, monkeypatch):
    monkeypatch.chdir(workspace[0])
    return workspace


def _tiny(overrides=()):
    return load_recipe("tiny-mfd", list(overrides))


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_feature_store_holds_the_target_taps_and_is_reused(in_workspace, tmp_path):
    root, target = in_workspace
    from mfd_hub.testing import target_taps
    from mfd_hub.recipes.trainer import Dist, _Log, prepare_features

    recipe = _tiny([f"data.features_dir={tmp_path / 'feats'}", "data.features_dtype=float32"])
    sequences, _ = load_sequences(recipe.data.train, recipe.data.max_length)
    info, embed, head, taps_of = prepare_features(recipe, sequences, [0, 2], Dist(), _Log(False))
    assert info["hidden_size"] == 32 and torch.equal(head, target.lm_head.weight)
    for i in (0, 7):
        want = target_taps(target, torch.tensor([sequences[i].ids]), [0, 2])[0]
        assert torch.allclose(taps_of([i])[0], want, atol=1e-5)
    # complete store: the target is not needed any more (its folder may even be gone)
    os.rename(root / "tiny-target", root / "moved-target")
    try:
        again = prepare_features(recipe, sequences, [0, 2], Dist(), _Log(False))
        assert torch.equal(again[3]([3])[0], taps_of([3])[0])
    finally:
        os.rename(root / "moved-target", root / "tiny-target")
    store = FeatureStore(tmp_path / "feats", {"target": recipe.target, "tap_layers": [0, 2], "dtype": "float32",
                                              "max_length": 64})
    changed = [Sequence(s.id, s.ids[:-1] + [s.ids[-1] ^ 1], s.prompt_len) for s in sequences]
    with pytest.raises(MfdHubError, match="other tokens"):
        store.missing(changed)
    with pytest.raises(MfdHubError, match="tap_layers"):
        FeatureStore(tmp_path / "feats", {**store.spec, "tap_layers": [1]}).check_meta()
    extractor = TapExtractor(target, [0, 2], torch.float32, batch_tokens=20)  # several padded batches
    for got, seq in zip(extractor([s.ids for s in sequences[:5]]), sequences[:5]):
        assert torch.allclose(got, target_taps(target, torch.tensor([seq.ids]), [0, 2])[0], atol=1e-5)


# -- recipes -----------------------------------------------------------------------------------------
PUBLISHED = {
    # name: (target, z-lab base, taps, mask id, prompts, thinking, MFD-D)
    "MFD-Qwen3-4B": ("Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", [1, 9, 17, 25, 33], 151669, 1420000, False, False),
    "MFD-Qwen3-8B": ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", [1, 9, 17, 25, 33], 151669, 1420000, False, False),
    "MFD-Qwen3.5-4B": ("Qwen/Qwen3.5-4B", "z-lab/Qwen3.5-4B-DFlash", [1, 8, 15, 22, 29], 248070, 1420000, True, False),
    "MFD-Qwen3.6-27B": ("Qwen/Qwen3.6-27B", "z-lab/Qwen3.6-27B-DFlash", [1, 16, 31, 46, 61], 248070, 1420000, True,
                        False),
    "MFD-Qwen3-4B-100K": ("Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", [1, 9, 17, 25, 33], 151669, 100000, False,
                          False),
    "MFD-Qwen3-8B-100K": ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", [1, 9, 17, 25, 33], 151669, 100000, False,
                          False),
    "MFD-Qwen3.5-4B-100K": ("Qwen/Qwen3.5-4B", "z-lab/Qwen3.5-4B-DFlash", [1, 8, 15, 22, 29], 248070, 100000, True,
                            False),
    "MFD-Qwen3.6-27B-100K": ("Qwen/Qwen3.6-27B", "z-lab/Qwen3.6-27B-DFlash", [1, 16, 31, 46, 61], 248070, 100000,
                             True, False),
    "MFD-D-Qwen3-4B": ("Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", [1, 9, 17, 25, 33], 151669, 1420000, False, True),
    "MFD-D-Qwen3-8B": ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", [1, 9, 17, 25, 33], 151669, 1420000, False, True),
}


def test_published_recipes_match_design_and_the_model_card():
    shipped = packaged_recipes()
    assert set(PUBLISHED) <= set(shipped)
    for name, (target, base, taps, mask, prompts, thinking, mfd_d) in PUBLISHED.items():
        r = load_recipe(name)
        assert (r.name, r.target, r.drafter.base, r.drafter.target_layer_ids) == (name, target, base, taps)
        assert (r.drafter.mask_token_id, r.drafter.block_size, r.drafter.num_modes) == (mask, 16, 8)
        assert r.drafter.default_path is mfd_d and r.drafter.draft_vocab_size is None
        # DESIGN §2 / the card: data and regeneration
        g = r.data.regen
        assert (g.num_prompts, g.thinking, g.temperature, g.top_p, g.top_k, g.max_new_tokens) == (
            prompts, thinking, 0.7, 0.8, 20, 2048)
        assert g.prompts == ("hf:mlabonne/open-perfectblend" if prompts == 1420000 else None)
        assert r.data.max_length == 3072
        # objective: relaxed winner-take-all 0.9 / 0.1 / (K-1), D-PACE alpha 0.5 in each mode, gate 0.1
        assert (r.loss.type, r.loss.winner_weight, r.loss.alpha, r.loss.gate_weight) == ("mfd", 0.9, 0.5, 0.1)
        # optimisation: AdamW 1e-4, 4% warmup, cosine, clip 1, 3 epochs, 36 sequences, 64 anchors
        t = r.train
        assert (t.lr, t.warmup_ratio, t.schedule, t.grad_clip, t.epochs, t.batch_size, t.anchors_per_sequence) == (
            1e-4, 0.04, "cosine", 1.0, 3, 36, 64)
        assert t.max_steps is None and t.precision == "auto"


def test_recipe_errors_are_one_clear_line(in_workspace, tmp_path):
    cases = {
        "train.epoch=1": "unknown key train.epoch (did you mean train.epochs?)",
        "train.lr=fast": "train.lr must be a number",
        "loss.type=kl": "loss.type must be one of dflash, dpace, mfd",
        "drafter.num_modes=1": "mfd needs drafter.num_modes >= 2",
        "train.micro_batch_size=3": "not a multiple of train.micro_batch_size",
        "loss.winner_weight=1.5": "loss.winner_weight must be in [0, 1]",
        "drafter.config={num_layers: 2}": "drafter.config is only for drafter.base: scratch",
    }
    scratch = ["drafter.base=scratch", "drafter.num_modes=0", "loss.type=dpace", "drafter.mask_token_id=1",
               "drafter.target_layer_ids=[0]"]
    cases[("drafter.config={num_hiden_layers: 2}", *scratch)] = "num_hiden_layers is not a DFlashConfig field " \
        "(did you mean drafter.config.num_hidden_layers?)"
    cases[("drafter.config={hidden_size: 8}", *scratch)] = "drafter.config.hidden_size is set by the recipe"
    for override, message in cases.items():
        with pytest.raises(MfdHubError) as caught:
            _tiny([override] if isinstance(override, str) else list(override))
        assert message in str(caught.value) and "\n" not in str(caught.value), override
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntarget: [unclosed\n")
    commands = [["train", str(bad)], ["train", "no-such-recipe"], ["train", "tiny-mfd", "data.train=missing.jsonl"]]
    for args, result in zip(commands, run_cli_many(commands, in_workspace[0])):
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode != 0 and lines and lines[-1].startswith("error: "), (args, result.stderr)
        assert "Traceback" not in result.stderr and sum(line.startswith("error") for line in lines) == 1


# -- real runs -------------------------------------------------------------------------------------
def test_tiny_recipe_trains_on_cpu_and_writes_contract_checkpoints(in_workspace):
    from mfd_hub import load_draft
    from mfd_hub.recipes.train_checkpoint import is_train_checkpoint, load_train_checkpoint
    from mfd_hub.verify import verify_checkpoint

    root, _ = in_workspace
    result = run_cli(["train", "tiny-mfd", "output.dir=runs/cli", "--json"], root)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    run = root / "runs" / "cli"
    losses = [m["loss"] for m in _metrics(run)]
    steps = len(load_sequences(root / "tiny-data.jsonl", 64)[0]) // 4 * 3  # 4 sequences a step, 3 epochs
    assert len(losses) == summary["total_steps"] == steps
    # AdamW at 3e-3: linear warmup over ceil(10%) of the steps, then cosine to 0
    warmup = math.ceil(0.1 * steps)
    want = [3e-3 * (k + 1) / warmup if k < warmup
            else 3e-3 * 0.5 * (1 + math.cos(math.pi * (k - warmup) / (steps - warmup))) for k in range(steps)]
    assert [m["lr"] for m in _metrics(run)] == pytest.approx(want)
    assert sum(losses[-3:]) / 3 < 0.85 * sum(losses[:3]) / 3, losses  # the loss falls
    diag = json.loads((run / "diagnostics.json").read_text())["run"]
    assert diag["blocks"] == steps * 4 * 8 and len(diag["win_rate_per_mode"]) == 4
    assert 1.0 <= diag["effective_modes"] <= 4.0 and 0.0 <= diag["gate_top1_accuracy"] <= 1.0
    checkpoint = run / "checkpoints" / f"step-{steps:07d}"
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert is_train_checkpoint(checkpoint) and kept == [f"step-{steps - 3:07d}", checkpoint.name]
    trained = load_train_checkpoint(checkpoint)
    exported = load_draft(summary["exported"])
    assert verify_checkpoint(summary["exported"]).ok
    for name, tensor in exported.state_dict().items():
        assert torch.equal(tensor, trained.state_dict()[name]), name
    assert exported.config.num_modes == 4 and exported.config.mfd_metadata["mode_init"]["seed"] == 0
    base = load_draft(root / "tiny-zlab")
    assert not torch.equal(base.fc.weight, exported.fc.weight)  # it trained
    # a finished run refuses to start over in the same folder
    again = run_cli(["train", "tiny-mfd", "output.dir=runs/cli"], root)
    assert again.returncode != 0 and "--resume" in again.stderr


@pytest.fixture(scope="module")
def reference_run(workspace):
    """The tiny recipe, uninterrupted, in one process (micro-batches of 2 sequences)."""
    from mfd_hub.recipes.trainer import train

    root, _ = workspace
    cwd = os.getcwd()
    os.chdir(root)
    try:
        train(_tiny(["output.dir=runs/reference"]), verbose=False)
    finally:
        os.chdir(cwd)
    return root / "runs" / "reference"


def _close(summary):
    """A summary with its numbers compared to 1e-5 (padding in a batch of another size moves the last bits)."""
    def c(v):
        return [c(x) for x in v] if isinstance(v, list) else pytest.approx(v, rel=1e-5, abs=1e-6) if isinstance(v, float) else v
    return {k: c(v) for k, v in summary.items()}


def test_evaluate_reports_the_mode_diagnostics_of_held_out_records(in_workspace, reference_run):
    """mfd-hub evaluate: every block of the records counted once, the rates consistent, and a gate
    made indifferent (all logits equal: its top-1 is mode 0) scores exactly mode 0's win rate and
    coverage. The CLI prints it, as text and as JSON; missing data is one error line."""
    from safetensors.torch import load_file, save_file

    from mfd_hub.recipes.data import sample_anchors
    from mfd_hub.recipes.evaluate import evaluate_drafter

    root, _ = in_workspace
    final = reference_run / "final"
    sequences, _ = load_sequences("tiny-data.jsonl", 1024)
    result = evaluate_drafter(final, "./tiny-target", "tiny-data.jsonl", anchors_per_sequence=4, batch_sequences=5)
    assert result["blocks"] == sum(int(sample_anchors(s, 4, 0, 0, i)[1].sum()) for i, s in enumerate(sequences))
    assert result["num_modes"] == 4 and sum(result["win_rate_per_mode"]) == pytest.approx(1.0)
    assert 1.0 <= result["effective_modes"] <= 4.0 and result["chance"] == 0.25
    assert max(result["coverage_per_mode"]) <= result["best_mode_coverage"] + 1e-9
    assert result["gate_choice_coverage"] <= result["best_mode_coverage"] + 1e-9
    depths = result["best_mode_coverage_per_depth"]  # the chance of reaching each depth: falls with depth
    assert len(depths) == 7 and all(a >= b for a, b in zip(depths, depths[1:])) and depths[0] > depths[-1]
    assert sum(depths) == pytest.approx(result["best_mode_coverage"])
    summary = "\n".join(load_script("benchmarks/paper_analyses.py").evaluate_lines(result))  # the README's lines
    assert f"{result['effective_modes']:.2f} of 4" in summary and f"{100 * result['gate_top1_accuracy']:.1f}%" in summary
    # the batching does not change a number
    assert evaluate_drafter(final, "./tiny-target", "tiny-data.jsonl", anchors_per_sequence=4,
                            batch_sequences=16) == _close(result)

    blind = root / "blind-gate"
    shutil.copytree(final, blind)
    weights = load_file(blind / "model.safetensors")
    weights["mode_gate.weight"].zero_()
    save_file(weights, blind / "model.safetensors", metadata={"format": "pt"})
    indifferent = evaluate_drafter(blind, "./tiny-target", "tiny-data.jsonl", anchors_per_sequence=4)
    assert indifferent["gate_top1_accuracy"] == pytest.approx(indifferent["win_rate_per_mode"][0])
    assert indifferent["gate_choice_coverage"] == pytest.approx(indifferent["coverage_per_mode"][0])

    text, as_json, missing = run_cli_many([
        ["evaluate", str(final), "--target", "./tiny-target", "--data", "tiny-data.jsonl", "--anchors", "4"],
        ["evaluate", str(final), "--target", "./tiny-target", "--data", "tiny-data.jsonl", "--anchors", "4", "--json"],
        ["evaluate", str(final), "--target", "./tiny-target", "--data", "nothing-here.jsonl"],
    ], root)
    assert text.returncode == 0 and "effective modes" in text.stdout and "(chance 25.0%)" in text.stdout, text.stderr
    assert "best mode, per depth  " + "  ".join(f"{c:.3g}" for c in depths) in text.stdout
    assert json.loads(as_json.stdout) == _close(result)
    lines = [line for line in missing.stderr.splitlines() if line.strip()]
    assert missing.returncode != 0 and lines == ["error: held-out data nothing-here.jsonl not found (make it with "
                                                 "'mfd-hub regen')"], missing.stderr


def _final_weights(run):
    from mfd_hub.recipes.train_checkpoint import load_train_checkpoint

    step = json.loads((run / "train_summary.json").read_text())["steps"]
    return load_train_checkpoint(run / "checkpoints" / f"step-{step:07d}").state_dict()


def test_stop_and_resume_is_bit_exact(in_workspace, reference_run):
    from mfd_hub.recipes.trainer import train

    recipe = _tiny(["output.dir=runs/resumed"])
    train(recipe, stop_after=6, verbose=False)
    assert not (recipe.run_dir / "final").exists()
    with pytest.raises(MfdHubError, match="recipe changed"):
        train(_tiny(["output.dir=runs/resumed", "train.lr=1e-3"]), resume=True, verbose=False)
    train(recipe, resume=True, verbose=False)
    want, got = _final_weights(reference_run), _final_weights(recipe.run_dir)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
    assert [m["loss"] for m in _metrics(recipe.run_dir)] == [m["loss"] for m in _metrics(reference_run)]


@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_two_gloo_ranks_equal_one_rank(in_workspace, reference_run, parallel):
    import tempfile

    from filelock import FileLock

    root, _ = in_workspace
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env.pop("TRITON_INTERPRET", None)  # training runs no Triton kernel
    out_dir = root / "runs" / f"two-{parallel}"
    # One torchrun launch at a time on this machine, whichever xdist worker runs it: a standalone
    # launch picks its rendezvous and master ports by binding port 0 and releasing it, so two
    # launches at once can race for a port. CI used to abort a rank now and then ("terminate called
    # without an active exception"), only with both launches running at once on two workers.
    with FileLock(os.path.join(tempfile.gettempdir(), "mfd-hub-tests-torchrun.lock")):
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "mfd_hub",
             "train", "tiny-mfd", f"output.dir={out_dir}", f"train.parallel={parallel}", "--json"],
            cwd=root, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["world_size"] == 2  # one summary, from rank 0
    want, got = _final_weights(reference_run), _final_weights(out_dir)
    for name in want:
        assert torch.allclose(want[name], got[name], atol=1e-5, rtol=1e-4), name
    ref_losses = [m["loss"] for m in _metrics(reference_run)]
    assert [m["loss"] for m in _metrics(out_dir)] == pytest.approx(ref_losses, rel=1e-5)


def test_scratch_dpace_with_a_draft_vocabulary(in_workspace):
    """A scratch drafter (no base), D-PACE, drafting over 24 of 64 tokens: targets outside the
    draft vocabulary are misses, the loss stays finite and falls, the head and d2t are exported."""
    from mfd_hub import load_draft
    from mfd_hub.recipes.trainer import train

    overrides = ["output.dir=runs/scratch", "drafter.base=scratch", "drafter.num_modes=0", "loss.type=dpace",
                 "drafter.target_layer_ids=[0, 2]", "drafter.mask_token_id=63", "drafter.block_size=8",
                 "drafter.draft_vocab_size=24", "drafter.train_lm_head=true", "output.save_every=0",
                 "drafter.config={num_hidden_layers: 1, intermediate_size: 64, num_attention_heads: 4, "
                 "num_key_value_heads: 2, head_dim: 8}"]
    summary = train(_tiny(overrides), verbose=False)
    losses = [m["loss"] for m in _metrics(Path(summary["run_dir"]))]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    drafter = load_draft(summary["exported"])
    cfg = drafter.config
    assert cfg.num_hidden_layers == 1 and cfg.draft_vocab_size == 24 and cfg.mfd_metadata["init"] == "scratch"
    sequences, _ = load_sequences("tiny-data.jsonl", 64)
    kept = drafter.draft_to_target_ids(torch.arange(24))
    assert kept.tolist() == draft_vocabulary(sequences, 24, 64).tolist() and int(drafter.t2d.sum()) == 24
    response = [t for s in sequences for t in s.ids[s.prompt_len:]]
    assert any(t not in set(kept.tolist()) for t in response)  # some targets really are outside


def test_mfd_d_trains_the_default_path_and_dflash_loss_runs(in_workspace):
    from mfd_hub import load_draft
    from mfd_hub.recipes.trainer import train

    summary = train(_tiny(["output.dir=runs/mfd-d", "drafter.default_path=true", "train.max_steps=4",
                           "output.save_every=0"]), verbose=False)
    drafter = load_draft(summary["exported"])
    assert drafter.config.default_path and drafter.default_embed.abs().sum() > 0  # it moved from zero
    assert "default_path" in summary["diagnostics"] and "default" in _metrics(Path("runs/mfd-d"))[0]
    summary = train(_tiny(["output.dir=runs/dflash", "loss.type=dflash", "drafter.num_modes=0", "train.max_steps=3",
                           "output.save_every=0"]), verbose=False)
    assert summary["final_loss"] > 0 and load_draft(summary["exported"]).config.num_modes == 0


def test_data_limit_trains_on_the_first_records_only(in_workspace):
    """data.limit (the data-scaling runs): the first N usable records, in file order; more than the
    file holds is one clear error."""
    from mfd_hub import load_draft
    from mfd_hub.recipes.data import data_checksum
    from mfd_hub.recipes.trainer import train

    sequences, _ = load_sequences("tiny-data.jsonl", 64)
    summary = train(_tiny(["output.dir=runs/limit", "data.limit=8", "train.max_steps=2", "output.save_every=0"]),
                    verbose=False)
    assert summary["data"] == {"sequences": 8, "crc": data_checksum(sequences[:8])}
    assert len(sequences) > 8 and load_draft(summary["exported"]).config.mfd_metadata["training"]["sequences"] == 8
    with pytest.raises(MfdHubError, match=f"data.limit is {len(sequences) + 1}, but .* holds only {len(sequences)}"):
        train(_tiny(["output.dir=runs/limit2", f"data.limit={len(sequences) + 1}"]), verbose=False)


def test_bases_zlab_with_new_modes_and_mfd_as_they_are(in_workspace, reference_run):
    from mfd_hub import load_draft
    from mfd_hub.recipes.trainer import build_drafter

    root, target = in_workspace
    sequences, _ = load_sequences("tiny-data.jsonl", 64)
    info = {"name_or_path": "./tiny-target", "model_type": "qwen3", "hidden_size": 32, "vocab_size": 64,
            "num_hidden_layers": 4}
    base = load_draft("tiny-zlab").state_dict()
    fresh = build_drafter(_tiny(), info, target.lm_head.weight, sequences)
    state = fresh.state_dict()
    assert all(torch.equal(state[k], v) for k, v in base.items())  # every base weight carried over
    assert set(state) - set(base) == {"mode_embed", "mode_gate.weight"}
    assert 0.01 < float(fresh.mode_embed.detach().std()) < 0.04 and fresh.config.mfd_metadata["base"] == "./tiny-zlab"
    assert fresh.config.target == info
    mfd_base = reference_run / "final"  # an MFD checkpoint keeps its modes and gate
    again = build_drafter(_tiny([f"drafter.base={mfd_base}"]), info, target.lm_head.weight, sequences)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in load_draft(mfd_base).state_dict().items())
    with pytest.raises(MfdHubError, match="has 4 modes"):
        build_drafter(_tiny([f"drafter.base={mfd_base}", "drafter.num_modes=8"]), info, target.lm_head.weight,
                      sequences)
    with pytest.raises(MfdHubError, match="target_layer_ids"):
        build_drafter(_tiny(["drafter.target_layer_ids=[1, 2]"]), info, target.lm_head.weight, sequences)


def test_packaged_recipe_check_prints_the_resolved_recipe(in_workspace):
    result = run_cli(["train", "MFD-Qwen3-8B", "data.train=x.jsonl", "--check", "--json"], in_workspace[0])
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout)
    assert resolved["data"]["train"] == "x.jsonl" and resolved["train"]["lr"] == 1e-4
    listed = CliRunner().invoke(cli, ["train", "--list"])
    assert listed.exit_code == 0 and set(PUBLISHED) <= set(listed.output.split())


def test_the_miniature_retraining_plan_is_valid_and_gives_the_fine_tunes_equal_compute():
    """scripts/retrain_miniature.py: every train stage is a valid packaged recipe with its
    overrides, D-PACE and MFD get the same data, steps and anchors at every data size, all three the same block, stage 1 runs
    at least the shipped base's 600 steps, the shipped run's fine-tunes start from the shipped base,
    and the bench and evaluate stages parse as commands (the benches with their products pinned)."""
    plan_module = load_script("scripts/retrain_miniature.py")
    plan = plan_module.stages(10_400)
    recipes, trained = {}, set()
    for name, argv, marker in plan:
        # every drafter a stage reads (a base, a bench or evaluate drafter) is trained by an earlier stage
        used = {word.split("=", 1)[-1] for word in argv if word.split("=", 1)[-1].endswith("/final")}
        assert used <= trained, (name, used - trained)
        if argv[1] == "train":  # done only once its weights exist, so `run` rebuilds a checkpoint git does not keep
            assert marker.name == "model.safetensors"
        if argv[1] == "train":
            trained.add(str(marker.parent))
        assert argv[0] == "mfd-hub"
        if argv[1] == "train":
            recipe = load_recipe(argv[2], argv[3:])
            assert recipe.train.precision == "auto" and str(marker).startswith(recipe.output.dir)
            assert recipe.data.features_dir == str(plan_module.FEATURES)
            recipes[name] = recipe
        else:
            command = cli.get_command(None, argv[1])
            command.make_context(argv[1], list(argv[2:]))  # raises on a bad option
            if argv[1] == "bench":  # pinned, so a bench resumed on another CPU keeps its settings
                assert argv[argv.index("--linears") + 1] == "onednn"
    for size in plan_module.SIZES:
        dflash, dpace, mfd = (recipes[f"{size}-{kind}"] for kind in ("dflash", "dpace", "mfd"))
        count = dflash.data.limit
        assert count == dpace.data.limit == mfd.data.limit == (plan_module.SIZES[size] or 10_400)
        assert dflash.train.epochs * count / dflash.train.batch_size >= 600
        assert (dpace.train.epochs, dpace.train.anchors_per_sequence) == (mfd.train.epochs, mfd.train.anchors_per_sequence)
        assert dpace.drafter.base == mfd.drafter.base == str(Path(dflash.output.dir) / "final")
        assert mfd.drafter.num_modes == 8 and dpace.drafter.num_modes == 0
        assert dflash.drafter.block_size == dpace.drafter.block_size == mfd.drafter.block_size == plan_module.BLOCK
    candidate = plan_module.CANDIDATE
    assert recipes[f"{candidate}-dpace"].drafter.base == recipes[f"{candidate}-mfd"].drafter.base == plan_module.SHIPPED_BASE
    # what a stage measured is kept by git; its weights, checkpoints and the feature store are not
    # (a checkpoint is rebuilt from its recipe)
    repo = Path(__file__).resolve().parents[1]
    if (repo / ".git").exists():
        run = Path(recipes["full-dflash"].output.dir)
        paths = [run / "final" / "model.safetensors", run / "checkpoints" / "step-50" / "state.pt",
                 plan_module.FEATURES / "meta.json", plan_module.DATA / "part-00000.jsonl.gz",
                 plan_module.ROOT / "full" / "bench-humaneval-20" / "progress.jsonl", run / "final" / "modeling_mfd.py",
                 run / "final" / "config.json"]
        probe = subprocess.run(["git", "check-ignore", "--no-index", *map(str, paths)], cwd=repo,
                               capture_output=True, text=True)
        assert probe.stdout.split() == [str(paths[0]), str(paths[1]), str(paths[2]), str(paths[5])]


def test_the_rebuild_page_lists_every_checkpoint_and_is_current(tmp_path, monkeypatch):
    """data/smollm2/retrain/REBUILD.md names every train stage's checkpoint with its command and the
    ledger's CPU hours, and `rebuild-doc --check` fails, writing nothing, once the plan moves on."""
    plan_module = load_script("scripts/retrain_miniature.py")
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    assert plan_module.main(["rebuild-doc", "--check"]) == 0
    page = (repo / plan_module.REBUILD).read_text(encoding="utf-8")
    plan = plan_module.stages(plan_module.frozen_answers())
    for name, argv, marker in plan:
        if argv[1] == "train":
            row = next(line for line in page.splitlines() if line.startswith(f"| {name} |"))
            assert f"`{marker.parent}`" in row and f"`{' '.join(argv)}`" in row
            cost = sum(e["cpu_s"] / 3600 for e in plan_module.ledger() if e["stage"] == name)
            assert f"| {cost:.2f} |" in row
    stale = tmp_path / "REBUILD.md"
    stale.write_text(page.replace("| long-mfd |", "| long-mfd-old |"))
    monkeypatch.setattr(plan_module, "REBUILD", stale)
    assert plan_module.main(["rebuild-doc", "--check"]) == 1
    assert "long-mfd-old" in stale.read_text()


def test_the_retraining_writes_the_remote_code_back_into_finished_drafters(tmp_path, monkeypatch):
    """git keeps a finished stage's weights and config, not its generated remote code: every action
    of scripts/retrain_miniature.py writes the bundle back where it is missing, as it is generated."""
    from mfd_hub.bundle import bundle_sources

    plan_module = load_script("scripts/retrain_miniature.py")
    final = tmp_path / "full" / "smollm2-mfd" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    unfinished = tmp_path / "5k" / "smollm2-mfd" / "final"
    unfinished.mkdir(parents=True)
    monkeypatch.setattr(plan_module, "ROOT", tmp_path)
    plan_module.restore_bundles()
    sources = bundle_sources()
    assert sorted(p.name for p in final.glob("*.py")) == sorted(sources)
    assert (final / "modeling_mfd.py").read_text() == sources["modeling_mfd.py"]
    assert not list(unfinished.iterdir())


def test_stopping_the_retraining_stops_its_running_stage_and_logs_its_cost(tmp_path):
    """A plain `kill` of scripts/retrain_miniature.py ends the stage it runs (the child process with
    it, not left running beside the next run's) and still writes the stage's ledger line."""
    import signal
    import time

    repo = Path(__file__).resolve().parents[1]
    child_pid = tmp_path / "child.pid"
    driver = f"""
import importlib.util, pathlib, signal, sys
spec = importlib.util.spec_from_file_location("plan", {str(repo / "scripts/retrain_miniature.py")!r})
plan = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plan)
plan.ROOT = pathlib.Path({str(tmp_path)!r})
signal.signal(signal.SIGTERM, plan._raise_stopped)
try:
    plan.run_stage("sleeper", ["python3", "-c", "import os, time; open({str(child_pid)!r}, 'w').write(str(os.getpid())); time.sleep(120)"],
                   plan.ROOT / "marker")
except plan.Stopped:
    sys.exit(130)
"""
    process = subprocess.Popen([sys.executable, "-c", driver])
    deadline = time.time() + 60
    while not child_pid.exists() or not child_pid.read_text():
        assert time.time() < deadline and process.poll() is None
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 130
    pid = int(child_pid.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the stage's child is gone (reaped by the script)
    entry = json.loads((tmp_path / "ledger.jsonl").read_text())
    assert entry["stage"] == "sleeper" and entry["stopped"] is True and entry["returncode"] != 0
