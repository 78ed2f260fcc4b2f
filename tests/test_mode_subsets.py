"""The mixture over the gate's best m modes (``num_modes=m``, and ``auto`` choosing m): each round
builds exactly the tree of a drafter that holds only those modes, and output stays greedy's."""

import copy
import json
import random

import pytest
import torch
from test_trees import assert_tree_is_brute_force_top, random_logprobs

from mfd_hub.kernels.tree_build import draft_candidates, draft_tree, log_normaliser, quantize_logprobs
from mfd_hub.remote import budget_mfd
from mfd_hub.remote.budget_mfd import BudgetChooser, RoundCosts, mode_options
from mfd_hub.testing import greedy_decode, tiny_drafter, tiny_target

K = 8
# The gate's logit of mode k is 2 * RANK_BIAS[k] plus a small context-dependent part: the gate's
# order, 1 5 3 7 0 6 4 2, shares no prefix with the index order and leaves no mode at its index.
RANK_BIAS = [3, 7, 0, 5, 1, 6, 2, 4]
GATE_ORDER = sorted(range(K), key=lambda k: -RANK_BIAS[k])
PROMPT = torch.tensor([[3, 1, 4, 1, 5, 9]])
TREE_FIELDS = ("tokens", "parents", "depths", "scores", "modes")


@pytest.fixture(scope="module")
def pair():
    target = tiny_target("qwen3", vocab_size=16, init_std=0.2)
    drafter = tiny_drafter(target, num_modes=K, block_size=8, mode_gate_bias=True)
    with torch.no_grad():
        drafter.mode_gate.bias.copy_(2.0 * torch.tensor(RANK_BIAS, dtype=torch.float32))
    return target, drafter


def holding_only(drafter, modes):
    """A drafter whose modes are ``modes`` of ``drafter`` (in that order), everything else shared."""
    config = copy.deepcopy(drafter.config)
    config.num_modes = len(modes)
    sliced = type(drafter)(config).float().eval()
    state = drafter.state_dict()
    for name in ("mode_embed", "mode_gate.weight", "mode_gate.bias"):
        state[name] = state[name][list(modes)]
    sliced.load_state_dict(state)
    return sliced


def trees_of(drafter, target, **kwargs):
    trees = []

    def on_round(tree, tokens, logits, path):
        trees.append({name: getattr(tree, name).clone() for name in TREE_FIELDS})

    out = drafter.spec_generate(target, PROMPT, max_new_tokens=24, method="mixture", on_round=on_round, **kwargs)
    return out, trees


def same_trees(a, b):
    return len(a) == len(b) and all(torch.equal(x[f], y[f]) for x, y in zip(a, b) for f in TREE_FIELDS)


@pytest.mark.parametrize("m", [1, 2, 4, K])
def test_each_round_builds_the_tree_of_a_drafter_holding_only_the_gates_best_m_modes(pair, m):
    target, drafter = pair
    want = greedy_decode(target, PROMPT, 24)
    for budget in (5, 24):
        out, trees = trees_of(drafter, target, tree_budget=budget, num_modes=m)
        assert out.new_tokens == want
        # the drafter ran m copies every round (but a last one with a single token left to emit,
        # which is a plain target step: 0)
        assert out.modes_drafted == out.tree_modes and set(out.modes_drafted[:-1]) == {m}
        assert out.modes_drafted[-1] in (0, m) and len(out.modes_drafted) == out.rounds
        sliced_out, sliced_trees = trees_of(holding_only(drafter, GATE_ORDER[:m]), target, tree_budget=budget)
        assert sliced_out.new_tokens == want and same_trees(trees, sliced_trees), (m, budget)
    # the same number of modes taken in index order builds other trees: the gate's order matters
    _, index_trees = trees_of(holding_only(drafter, range(m)), target, tree_budget=24)
    assert not same_trees(trees, index_trees)


@pytest.mark.parametrize("seed", range(24))
def test_the_tree_over_the_first_m_rows_in_gate_order_is_the_brute_force_best_over_those_modes(seed):
    """What a round does with the drafted rows (K of them in the gate's order, on a probe): one
    candidate pass over all rows, then the tree over the first m rows, for m = 1, 2, 4, K. Each is
    the brute-force best-B set of prefixes over exactly those m modes (ties included)."""
    rng = random.Random(seed)
    k, length, v, budget = 4, rng.randint(1, 4), rng.randint(2, 5), rng.randint(1, 30)
    logprobs = random_logprobs(rng, k, length, v, tie_heavy=seed % 2 == 0)
    drafted = logprobs[rng.sample(range(k), k)] * 1.5 + 0.25  # raw logits, rows in the gate's order
    scores, ids = draft_candidates(drafted, budget)
    q = quantize_logprobs(drafted - log_normaliser(drafted)[..., None])
    for m in (1, 2, 4):
        tree = draft_tree(scores[:m], ids[:m], budget, 99, v)
        assert_tree_is_brute_force_top(tree, q[:m], budget, length, 99)


def test_num_modes_is_refused_where_it_means_nothing(pair):
    target, drafter = pair
    for method in ("chain", "product"):
        with pytest.raises(ValueError, match="num_modes applies to the mixture"):
            drafter.spec_generate(target, PROMPT, max_new_tokens=4, method=method, num_modes=2)
    for bad in (0, K + 1, 2.5, True, "2"):
        with pytest.raises(ValueError, match=f"num_modes must be an int in 1..{K}"):
            drafter.spec_generate(target, PROMPT, max_new_tokens=4, method="mixture", num_modes=bad)
    no_modes = tiny_drafter(target, num_modes=0, block_size=8)
    with pytest.raises(ValueError, match="num_modes applies to the mixture"):
        no_modes.spec_generate(target, PROMPT, max_new_tokens=4, method="mixture", num_modes=1)


def write_costs(drafter, target, cache, verify, draft, fmt=budget_mfd.COSTS_FORMAT):
    key, parts = budget_mfd.machine_key(drafter, target)
    (cache / "costs").mkdir(parents=True, exist_ok=True)
    raw = {**RoundCosts(verify, draft, key=key).to_dict(), "format": fmt, "machine": parts}
    (cache / "costs" / f"{key}.json").write_text(json.dumps(raw))
    return cache / "costs" / f"{key}.json"


def test_auto_probes_all_modes_and_drafts_fewer_where_modes_are_dear(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("MFD_HUB_CACHE", str(tmp_path))
    target, drafter = pair
    # verify nearly flat; each mode beyond the first costs ten verify passes
    write_costs(drafter, target, tmp_path, {n: 0.01 + 1e-5 * n for n in budget_mfd.MEASURED_NODES},
                {1: 1e-4, 2: 0.1, 4: 0.3, 8: 0.7})
    out = drafter.spec_generate(target, PROMPT, max_new_tokens=60, method="mixture", tree_budget="auto")
    assert out.new_tokens == greedy_decode(target, PROMPT, 60)
    drafted = [m for m in out.modes_drafted if m > 0]
    assert len(drafted) > 3 * BudgetChooser.PROBE_EVERY
    # all modes on the probes: 8 rounds apart, then twice as far each time one mode stays the best ...
    probes = [i for i, m in enumerate(drafted) if m == K]
    assert probes == [i for i in (0, 8, 24, 56) if i < len(drafted)]
    assert drafted.count(1) == len(drafted) - len(probes)  # ... and the rounds between only the best one
    assert set(out.tree_modes) <= {0, 1}  # on the probes too, one mode's tree was the best buy
    assert len(out.tree_modes) == len(out.modes_drafted) == len(out.acceptance_lengths) == out.rounds


def test_costs_of_the_old_format_are_measured_again_per_mode_count(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("MFD_HUB_CACHE", str(tmp_path))
    target, drafter = pair
    path = write_costs(drafter, target, tmp_path, {n: 0.01 for n in budget_mfd.MEASURED_NODES},
                       {1: 1e-4, K: 0.7}, fmt=budget_mfd.COSTS_FORMAT - 1)
    out = drafter.spec_generate(target, PROMPT, max_new_tokens=8, method="mixture", tree_budget="auto")
    assert out.new_tokens == greedy_decode(target, PROMPT, 8)
    saved = json.loads(path.read_text())
    assert saved["format"] == budget_mfd.COSTS_FORMAT and sorted(map(int, saved["draft_seconds"])) == [1, 2, 4, K]


def test_mode_options_and_draft_costs_between_measured_counts():
    assert mode_options(8) == [1, 2, 4, 8] and mode_options(3) == [1, 2, 3] and mode_options(1) == [1]
    assert mode_options(0) == [1]  # a drafter without modes drafts its one path
    costs = RoundCosts({1: 0.01, 2: 0.02}, {1: 1.0, 2: 2.0, 4: 3.0, 8: 7.0})
    assert costs.draft(3) == pytest.approx(2.5) and costs.draft(6) == pytest.approx(5.0)
    assert costs.draft(8) == 7.0 and costs.draft(16) == 7.0


def chooser_with_draft_costs(draft):
    verify = {n: 0.01 for n in budget_mfd.MEASURED_NODES}
    return BudgetChooser(RoundCosts(verify, draft), "mixture", K, mode_counts=mode_options(K))


def test_the_chooser_probes_all_counts_spaces_probes_out_while_they_confirm_and_exploits_between():
    chooser = chooser_with_draft_costs({1: 0.004, 2: 0.005, 4: 0.02, 8: 0.05})
    # on the probe, more modes give a better tree; 2 modes buy the most tokens per second
    trees = {1: [-2.0] * 8, 2: [-0.2] * 8, 4: [-0.1] * 8, 8: [-0.05] * 8}

    def rounds_to_next_probe(count):
        """Exploit rounds (drafting ``count`` modes) until the next probe -> how many there were."""
        between = 0
        while chooser.modes_to_draft() != K:
            assert chooser.priced == [count] and chooser.choose({count: trees[count]})[0] == count
            between += 1
        assert chooser.priced == [1, 2, 4, K]
        return between

    assert chooser.modes_to_draft() == K and chooser.priced == [1, 2, 4, K]
    modes, budget = chooser.choose(trees)
    assert modes == 2 and budget == 8 and set(chooser.rate) == {1, 2, 4, K}
    assert chooser.rate[2] == max(chooser.rate.values())
    assert rounds_to_next_probe(2) == BudgetChooser.PROBE_EVERY - 1  # the first probe set the best
    for gap in (16, 32, 32):  # each probe that confirms it doubles the gap, up to PROBE_EVERY_MAX
        assert chooser.choose(trees)[0] == 2
        assert rounds_to_next_probe(2) == gap - 1
    # now 4 modes pay best and 2 have been paying as little as 4: the probe finds it, and probes
    # come close together again
    trees[2], trees[4] = [-3.0] * 8, [-0.001] * 8
    chooser.rate[2] = chooser.rate[4]
    assert chooser.choose(trees)[0] == 4
    assert rounds_to_next_probe(4) == BudgetChooser.PROBE_EVERY - 1
    chooser.choose(trees)
    chooser.rate[2] = chooser.rate[1] = chooser.rate[4] = max(chooser.rate.values())
    assert chooser.modes_to_draft() == 1  # equal rates: the fewest modes
    del chooser.rate[K]  # an option without a rate is priced again at once, between probes
    assert chooser.modes_to_draft() == K and chooser.priced == [1, 2, 4, K]


def test_the_tree_is_built_at_twice_the_largest_recent_budget():
    verify = {n: 0.01 + 0.002 * n for n in budget_mfd.MEASURED_NODES}  # each node costs
    chooser = BudgetChooser(RoundCosts(verify, {1: 0.004, 2: 0.005, 4: 0.02, 8: 0.05}), "mixture", K,
                            mode_counts=mode_options(K))
    assert chooser.max_budget == 64  # nothing chosen yet: the whole range
    chooser.modes_to_draft()
    assert chooser.choose({m: [-0.01, -0.02, -9.0, -9.0] for m in (1, 2, 4, K)})[1] == 2
    assert chooser.max_budget == 4
    chooser.modes_to_draft()
    assert chooser.choose({2: [-0.01] * 4})[1] == 4  # the bound won: the next round may take 8
    assert chooser.max_budget == 8
    chain = BudgetChooser(RoundCosts({1: 0.01, 2: 0.01}, {1: 0.001}), "chain", 0, max_budget=7)
    chain.budgets = list(range(1, 8))  # as AutoBudget sets them: every length up to the block
    chain.choose({1: [-0.01]})
    assert chain.max_budget == 7  # a chain's length costs no candidates: never bounded


def test_a_chooser_with_one_mode_count_never_probes():
    chooser = BudgetChooser(RoundCosts({1: 0.01, 2: 0.01}, {1: 0.001}), "mixture", K, mode_counts=(2,))
    for _ in range(2 * BudgetChooser.PROBE_EVERY):
        assert chooser.modes_to_draft() == 2 and chooser.priced == [2]
        chooser.choose({2: [-0.1, -0.2]})
