"""The mode analyses (recipes/mode_analyses.py, `mfd-hub evaluate --trees`): every tree construction
against a brute-force enumeration of all prefixes, the offline accepted length against a walk of
the answer through the tree's prefixes, the covered mass against a target forward per prefix, and
the replayed rounds against real `spec_generate` rounds, on tiny real models."""

import itertools
import json
import math

import pytest
import torch

from conftest import one_error_line, run_cli_many
from mfd_hub import save_draft
from mfd_hub.errors import MfdHubError
from mfd_hub.kernels.tree_build import build_mixture_tree
from mfd_hub.recipes.mode_analyses import (
    AnalysesJournal,
    ratio_interval,
    FORK_RUNNER_UP,
    MASS_CONSTRUCTIONS,
    ModeAnalyses,
    candidate_sets,
    constructions,
    position_permutations,
    random_directions,
    tree_prefixes,
)
from mfd_hub.remote.generation_mfd import spec_generate
from mfd_hub.testing import greedy_decode, save_tiny_target, tiny_drafter, tiny_target

PROMPT = [3, 7, 11, 2, 9, 30]
MAX_NEW = 24


def _brute_top(logprob_rows, budget):
    """The ``budget`` best prefixes of a mixture by enumeration: logprob_rows [M, P, V] float64,
    a prefix scored by its best mode; ties (none with random floats) broken shallower first."""
    m, p, v = logprob_rows.shape
    scored = []
    for depth in range(1, p + 1):
        for prefix in itertools.product(range(v), repeat=depth):
            score = max(sum(float(logprob_rows[k, d, t]) for d, t in enumerate(prefix)) for k in range(m))
            scored.append((-score, depth, prefix))
    scored.sort()
    return {prefix for _, _, prefix in scored[:budget]}


def test_every_construction_is_the_top_b_of_a_brute_force_enumeration():
    """Mixture (i), mean marginals (ii), modes shuffled per position (iii), the control's product
    tree (iv), the gate's mode, random-norm modes and leave-one-out: each tree built from
    ``candidate_sets`` holds exactly the best prefixes of its own definition, enumerated over a
    5-token vocabulary."""
    torch.manual_seed(3)
    n, k, p, v = 2, 3, 3, 5
    mfd = torch.randn(n, k, p, v) * 2
    control = torch.randn(n, 1, p, v) * 2
    rnd = torch.randn(n, k, p, v) * 2
    gate = torch.randn(n, k)
    perms = position_permutations(n, k, p, torch.Generator().manual_seed(0))
    assert not all(torch.equal(perms[b, d], torch.arange(k)) for b in range(n) for d in range(p))
    sets = candidate_sets(mfd, control, rnd, gate, perms, budget=v)
    assert set(sets) == set(constructions(k))
    lp = lambda x: torch.log_softmax(x.double(), dim=-1)  # noqa: E731
    for block in range(n):
        modes = lp(mfd[block])
        shuffled = torch.stack([torch.stack([modes[perms[block, d, j], d] for d in range(p)]) for j in range(k)])
        mean = torch.log(torch.softmax(mfd[block].double(), dim=-1).mean(0, keepdim=True))
        oracle = {
            "mixture": modes, "mean_marginals": mean, "shuffled": shuffled, "dpace": lp(control[block]),
            "gate": modes[int(gate[block].argmax())][None], "random_norms": lp(rnd[block]),
            **{f"without_mode_{j}": modes[[m for m in range(k) if m != j]] for j in range(k)},
        }
        for name, (scores, ids, _) in sets.items():
            for budget in (3, 7, 12):
                tree = build_mixture_tree(scores[block], ids[block], budget, anchor=0)
                built = set(tree_prefixes(tree.tokens, tree.parents)[1:])
                assert built == _brute_top(oracle[name], budget), (name, budget)


def test_random_directions_keep_each_modes_norm_and_change_its_direction():
    embed = torch.randn(4, 16) * torch.tensor([[0.1], [1.0], [3.0], [0.5]])
    fresh = random_directions(embed, torch.Generator().manual_seed(1))
    assert torch.allclose(fresh.norm(dim=-1), embed.norm(dim=-1), rtol=1e-5)
    assert torch.nn.functional.cosine_similarity(fresh, embed, dim=-1).abs().max() < 0.9


@pytest.fixture(scope="module")
def analysed():
    """A tiny Qwen3 target, a 3-mode MFD drafter (block 5, drafting over a draft vocabulary of 40 of
    the 48 tokens, as the shipped ones do) and a D-PACE-like one (block 4, full vocabulary), and
    one prompt's analyses with every anchor's detail, a stop token in the middle of the answer."""
    from mfd_hub.converters.draft_vocab import reduce_vocabulary

    target = tiny_target("qwen3", vocab_size=48, num_layers=4, init_std=0.2, seed=1)
    full = tiny_drafter(target, num_modes=3, block_size=5, seed=1, initializer_range=0.2)
    mfd = reduce_vocabulary(full, target.lm_head.weight.detach(), torch.arange(4, 44)).float().eval()
    control = tiny_drafter(target, block_size=4, seed=2, initializer_range=0.2)
    plain = greedy_decode(target, torch.tensor([PROMPT]), MAX_NEW)
    stop = plain[12]  # the answer's first token not seen before, half way
    assert stop not in plain[:12]
    analyses = ModeAnalyses(target, mfd, control, budgets=(4, 9), max_new_tokens=MAX_NEW, stop_ids=[stop], mass=True,
                            mass_every=2)
    sums = analyses.analyse(PROMPT, detail=True)
    return target, mfd, control, stop, analyses, sums


def test_the_replayed_rounds_are_spec_generates_rounds(analysed):
    """At T = 0 in fp32, decoding's rounds replayed over the greedy answer give spec_generate's own
    acceptance lengths, for the mixture, the gate's product tree and the control's product tree,
    to the stop token."""
    target, mfd, control, stop, analyses, sums = analysed
    for name, draft, method in (("mixture", mfd, "mixture"), ("gate", mfd, "product"), ("dpace", control, "product")):
        for budget in (4, 9):
            out = spec_generate(draft, target, torch.tensor([PROMPT]), max_new_tokens=MAX_NEW, method=method,
                                tree_budget=budget, stop_token_ids=[stop], mode="gate" if draft is mfd else None)
            assert out.new_tokens == sums["greedy_answer"] and out.stopped_by == "stop_token"
            assert sums["rounds"][f"{name}@{budget}"] == out.acceptance_lengths, (name, budget)
            cell = sums["cells"][f"{name}@{budget}"]
            assert (cell["round_tokens"], cell["rounds"]) == (sum(out.acceptance_lengths), out.rounds)
    assert max(max(r) for r in sums["rounds"].values()) > 1  # some round accepted a drafted token


def test_offline_length_mass_and_forks_against_a_target_forward_per_prefix(analysed):
    """Each anchor's offline accepted length is the deepest prefix of the answer the tree holds, plus
    the root; at every 2nd anchor (mass_every) the main constructions' mass per depth is the sum of
    every node's target probability from a plain target forward per prefix; forks are the anchors
    whose target runner-up has >= 10%."""
    target, mfd, control, stop, analyses, sums = analysed
    answer = sums["greedy_answer"]
    full = PROMPT + analyses.greedy_answer(PROMPT)[0]
    last = len(sums["details"]) - 1
    probe = [0, 4, last - last % 2]

    @torch.no_grad()
    def next_probs(prefix):
        return torch.softmax(target(torch.tensor([prefix])).logits[0, -1].double(), dim=-1)

    forks = 0
    for entry in sums["details"]:
        i = entry["anchor"]
        context = full[: len(PROMPT) + i + 1]
        root = next_probs(context)
        fork = bool(root.topk(2).values[1] >= FORK_RUNNER_UP)
        assert entry["fork"] == fork
        forks += fork
        for (name, budget), cell in entry["cells"].items():
            tokens, parents, _ = cell["tree"]
            prefixes = set(tree_prefixes(tokens, parents))
            depth = 0
            while tuple(entry["continuation"][: depth + 1]) in prefixes and depth < len(entry["continuation"]):
                depth += 1
            assert cell["accepted"] == depth + 1, (i, name, budget)
            assert ("mass_per_depth" in cell) == (i % 2 == 0 and name in MASS_CONSTRUCTIONS), (i, name)
            if i not in probe or name not in ("mixture", "dpace", "shuffled"):
                continue
            mass = [0.0] * len(cell["mass_per_depth"])
            for prefix in prefixes - {()}:
                prob = 1.0
                for d, token in enumerate(prefix):
                    prob *= float(next_probs(context + list(prefix[:d]))[token])
                mass[len(prefix) - 1] += prob
            assert cell["mass_per_depth"] == pytest.approx(mass, abs=1e-5), (i, name, budget)
    assert sums["forks"] == forks and sums["anchors"] == len(answer) - 1
    assert sums["mass_anchors"] == len(range(0, len(answer) - 1, 2))
    assert sum(sums["cells"]["mixture@9"]["mass_per_depth"]) > 0


def test_evaluate_trees_writes_resumes_and_refuses_bad_options(tmp_path):
    """`mfd-hub evaluate --trees` through the console script: a JSON report with every construction
    at every budget and analyses.json in --out; --resume reads the finished prompts back instead of
    recomputing them (the journal is unchanged, the report the same); misused options are one
    error line."""
    target = tiny_target("qwen3", vocab_size=48, num_layers=4, init_std=0.2)
    save_tiny_target(tmp_path / "target", target)
    save_draft(tiny_drafter(target, num_modes=3, block_size=5, seed=1), tmp_path / "mfd")
    save_draft(tiny_drafter(target, block_size=5, seed=2), tmp_path / "dpace")
    records = [{"id": f"r{n}", "prompt_ids": [3 + n, 7, 11, 2], "response_ids": [5, 6, 7]} for n in range(2)]
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    common = ["evaluate", "mfd", "--target", "target", "--data", "heldout.jsonl", "--trees", "--against", "dpace",
              "--budgets", "4,8", "--max-new-tokens", "8", "--mass", "--mass-every", "3", "--out", "out", "--json"]
    other = [*common, "--resume", "--max-new-tokens", "6"]
    first, again, changed, no_against, stray = run_cli_many(
        [common, [*common, "--resume"], other, common[:7] + ["--trees"], common[:6] + ["--against", "dpace"]],
        tmp_path, watch=tmp_path / "out")
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert result["prompts"] == 2 and set(result["constructions"]) == set(constructions(3))
    assert all(set(cells) == {"4", "8"} for cells in result["constructions"].values())
    assert result["modes"]["num_modes"] == 3 and len(result["modes"]["norms"]) == 3
    assert json.loads((tmp_path / "out" / "analyses.json").read_text()) == result
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == result
    assert again.state["progress.jsonl"] == first.state["progress.jsonl"]  # not even touched
    lines = (tmp_path / "out" / "progress.jsonl").read_text().splitlines()
    assert [json.loads(line).get("record") for line in lines] == [None, "r0", "r1"]
    assert one_error_line(changed) and "max_new_tokens" in changed.stderr  # a journal of other settings
    assert changed.state["progress.jsonl"] == first.state["progress.jsonl"]
    assert one_error_line(no_against) and "--against" in no_against.stderr
    assert one_error_line(stray) and "--trees" in stray.stderr
    assert result["mass_anchors"] == 2 * 3  # anchors 0, 3 and 6 of each 8-token answer
    assert "mass" in result["constructions"]["gate"]["4"] and "mass" not in result["constructions"]["random_norms"]["4"]
    tau = result["constructions"]["mixture"]["8"]["tau_offline"]
    assert math.isfinite(tau) and tau >= 1


def test_greedy_answers_are_kept_per_target_and_prompt(tmp_path, monkeypatch):
    """With a key naming the target, a prompt's greedy answer is computed once and read back from the
    user's cache by every later analysis with that target; another key computes its own."""
    monkeypatch.setenv("MFD_HUB_CACHE", str(tmp_path))
    target = tiny_target("qwen3", vocab_size=48, num_layers=2, init_std=0.2, seed=1)
    mfd, control = tiny_drafter(target, num_modes=2, block_size=4), tiny_drafter(target, block_size=4, seed=2)
    keyed = ModeAnalyses(target, mfd, control, budgets=(4,), max_new_tokens=6, answers_key=["tiny", "float32", "cpu"])
    answer, length = keyed.greedy_answer(PROMPT)
    assert answer == greedy_decode(target, torch.tensor([PROMPT]), 6 + 3) and length == 6
    (record,) = (tmp_path / "greedy-answers").iterdir()
    record.write_text(json.dumps({"answer": [1] * 9}))  # what a later run reads instead of decoding
    assert keyed.greedy_answer(PROMPT)[0] == [1] * 9
    other = ModeAnalyses(target, mfd, control, budgets=(4,), max_new_tokens=6, answers_key=["other", "float32", "cpu"])
    assert other.greedy_answer(PROMPT)[0] == answer


def test_ratio_interval_resamples_prompts_and_holds_the_point_estimate(tmp_path):
    def journal(name, pairs):
        out = AnalysesJournal(tmp_path / name, {"probe": name})
        for i, (mixture, dpace) in enumerate(pairs):
            cell = lambda accepted: {"accepted": accepted, "accepted_forks": 0, "round_tokens": 0, "rounds": 0,  # noqa: E731
                                     "mass_per_depth": []}
            out.add(f"p{i}", {"anchors": 1, "cells": {"mixture@16": cell(mixture), "dpace@16": cell(dpace)}})
        return out.path

    # every prompt at 1.1: every resample is 1.1
    assert ratio_interval(journal("flat", [(11, 10)] * 30), "mixture") == pytest.approx((1.1, 1.1))
    # prompts of 1.0 and 1.2 (equal weights): the interval holds 1.1 and lies strictly inside [1.0, 1.2],
    # and more prompts make it narrower
    few = ratio_interval(journal("few", [(10, 10), (12, 10)] * 10), "mixture")
    many = ratio_interval(journal("many", [(10, 10), (12, 10)] * 200), "mixture")
    assert 1.0 < few[0] < 1.1 < few[1] < 1.2
    assert few[0] < many[0] < 1.1 < many[1] < few[1]
    with pytest.raises(MfdHubError, match="no finished prompt"):
        ratio_interval(journal("empty", []), "mixture")
