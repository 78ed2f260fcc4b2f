"""tree_budget="auto": costs measured once and cached, acceptance calibrated online, per-round
choices that follow the costs -- and output still the target's own."""

import json

import pytest
import torch

from mfd_hub.remote import budget_mfd
from mfd_hub.remote.budget_mfd import AcceptanceTable, BudgetChooser, RoundCosts
from mfd_hub.testing import greedy_decode, tiny_drafter, tiny_target

METHODS = ("chain", "product", "mixture")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MFD_HUB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def pair():
    target = tiny_target("qwen3", vocab_size=16, init_std=0.2)
    return target, tiny_drafter(target, num_modes=4, block_size=8)


def test_costs_interpolate_and_never_fall_with_more_nodes():
    costs = RoundCosts({1: 0.010, 3: 0.014, 5: 0.012, 9: 0.030}, {1: 0.002, 4: 0.005})
    assert costs.verify(1) == 0.010 and costs.verify(2) == pytest.approx(0.012)
    assert costs.verify(5) == 0.014  # a noisy dip below the 3-node figure is not believed
    assert costs.verify(17) == pytest.approx(0.030 + (0.030 - 0.014) * 8 / 4)  # linear beyond
    assert costs.draft(1) == 0.002 and costs.draft(4) == 0.005 and costs.draft(2) == pytest.approx(0.003)


def test_acceptance_table_starts_at_the_drafters_claim_and_learns():
    table = AcceptanceTable(prior=2.0)
    assert table.probability(-0.1) == pytest.approx(torch.tensor(-0.125).exp().item())
    for _ in range(200):
        table.observe([-0.1, -3.0], [False, True])  # the drafter is wrong both ways
    assert table.probability(-0.1) < 0.05 and table.probability(-3.0) > 0.9
    assert table.expected_accepted([-0.1, -3.0]) == pytest.approx([0.0, table.probability(-0.1),
                                                                  table.probability(-0.1) + table.probability(-3.0)])


def test_the_chooser_follows_the_cost_curve():
    confident = [-0.01 * (i + 1) for i in range(64)]  # a drafter sure of 64 nodes
    flat = RoundCosts({n: 0.010 + 0.0001 * n for n in budget_mfd.MEASURED_NODES}, {1: 0.001, 4: 0.002})
    steep = RoundCosts({n: 0.010 * n for n in budget_mfd.MEASURED_NODES}, {1: 0.001, 4: 0.002})
    assert BudgetChooser(flat, "product", 4).best(confident, 1)[0] == 64
    assert BudgetChooser(steep, "product", 4).best(confident, 1)[0] <= 2
    doubtful = [-5.0] * 64  # nodes the target almost never accepts: the smallest tree
    assert BudgetChooser(flat, "product", 4).best(doubtful, 1)[0] == 1


@pytest.mark.parametrize("method", METHODS)
def test_auto_is_token_identical_and_measures_once(pair, cache, method, monkeypatch):
    target, drafter = pair
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    want = greedy_decode(target, ids, 40)
    out = drafter.spec_generate(target, ids, max_new_tokens=40, method=method, tree_budget="auto")
    assert out.new_tokens == want and out.tree_budget == "auto"
    files = list((cache / "costs").glob("*.json"))
    assert len(files) == 1 and files[0].stem == out.round_costs_key
    saved = json.loads(files[0].read_text())
    assert set(map(int, saved["verify_seconds"])) == set(budget_mfd.MEASURED_NODES)
    assert saved["machine"]["threads"] == torch.get_num_threads()

    def no_second_measurement(*args, **kwargs):
        raise AssertionError("the costs were measured again")

    monkeypatch.setattr(budget_mfd, "measure_costs", no_second_measurement)
    again = drafter.spec_generate(target, ids, max_new_tokens=40, method=method, tree_budget="auto")
    assert again.new_tokens == want
    assert len(again.modes_drafted) == again.rounds


def _write_costs(drafter, target, cache, verify, draft):
    key, parts = budget_mfd.machine_key(drafter, target)
    (cache / "costs").mkdir(parents=True, exist_ok=True)
    costs = RoundCosts(verify, draft, key=key)
    (cache / "costs" / f"{key}.json").write_text(json.dumps({**costs.to_dict(), "machine": parts}))


def test_auto_takes_plain_steps_where_trees_cost_too_much(pair, cache):
    target, drafter = pair
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    # verifying even one extra node costs 100 decode steps here: speculation cannot pay
    _write_costs(drafter, target, cache, {n: 0.01 if n == 1 else 1.0 * n for n in budget_mfd.MEASURED_NODES},
                 {1: 0.001, 4: 0.001})
    out = drafter.spec_generate(target, ids, max_new_tokens=40, method="product", tree_budget="auto")
    assert out.new_tokens == greedy_decode(target, ids, 40)
    assert out.modes_drafted.count(0) > out.rounds // 2  # mostly plain steps, with a probe now and then
    assert any(m > 0 for m in out.modes_drafted)


def test_auto_drafts_one_mode_where_all_modes_cost_too_much(pair, cache):
    target, drafter = pair
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    # drafting 4 modes costs 50 verify passes, one mode nearly nothing
    _write_costs(drafter, target, cache, {n: 0.01 + 0.0001 * n for n in budget_mfd.MEASURED_NODES},
                 {1: 0.0001, 4: 0.5})
    out = drafter.spec_generate(target, ids, max_new_tokens=60, method="mixture", tree_budget="auto")
    assert out.new_tokens == greedy_decode(target, ids, 60)
    assert out.modes_drafted.count(1) > out.modes_drafted.count(4) > 0


def test_the_calibration_carries_over_to_the_next_generation_of_the_same_drafter(pair, cache):
    """The acceptance table one generation learned is where the next one (same drafter, method,
    sampling and machine) starts; another method or temperature, or another drafter, has its own."""
    target, drafter = pair
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    first = drafter.spec_generate(target, ids, max_new_tokens=30, method="product", tree_budget="auto")
    table = budget_mfd.calibration(drafter, first.round_costs_key, "product", (0.0, 0, 1.0))
    seen = sum(table.seen)
    assert seen > AcceptanceTable().seen[0] * table.bins  # the first generation's rounds are in it
    again = drafter.spec_generate(target, ids, max_new_tokens=30, method="product", tree_budget="auto")
    assert again.new_tokens == first.new_tokens == greedy_decode(target, ids, 30)
    assert budget_mfd.calibration(drafter, first.round_costs_key, "product", (0.0, 0, 1.0)) is table
    assert sum(table.seen) > seen  # the second generation went on learning in the same table
    for other in (budget_mfd.calibration(drafter, first.round_costs_key, "mixture", (0.0, 0, 1.0)),
                  budget_mfd.calibration(drafter, first.round_costs_key, "product", (0.7, 0, 1.0)),
                  budget_mfd.calibration(tiny_drafter(target, num_modes=4, block_size=8), first.round_costs_key,
                                         "product", (0.0, 0, 1.0))):
        assert other is not table and sum(other.seen) == sum(AcceptanceTable().seen)


def test_each_mode_count_of_the_mixture_learns_its_own_table(pair, cache):
    """A verified tree over m modes teaches only the table of m: a mixture node's score is the best
    of m claims, inflated the more modes compete, so the counts must not share what they learn."""
    target, drafter = pair
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    k = drafter.config.num_modes
    # one mode costs nearly nothing and K a verify pass: both get verified in 60 tokens
    _write_costs(drafter, target, cache, {n: 0.01 + 0.0001 * n for n in budget_mfd.MEASURED_NODES},
                 {1: 0.0001, 2: 0.004, k: 0.01})
    out = drafter.spec_generate(target, ids, max_new_tokens=60, method="mixture", tree_budget="auto")
    assert out.new_tokens == greedy_decode(target, ids, 60)
    verified = {m: sum(1 for t in out.tree_modes if t == m) for m in budget_mfd.mode_options(k)}
    prior = sum(AcceptanceTable().seen)
    for m, rounds in verified.items():
        table = budget_mfd.calibration(drafter, out.round_costs_key, "mixture", (0.0, 0, 1.0), m)
        learned = sum(table.seen) - prior
        assert (learned > 0) == (rounds > 0), (m, rounds, learned)
    assert sum(1 for rounds in verified.values() if rounds) >= 2  # the test saw two counts verified


def test_auto_refuses_other_words(pair):
    target, drafter = pair
    with pytest.raises(ValueError, match="auto"):
        drafter.spec_generate(target, torch.tensor([[1, 2]]), tree_budget="big")


def test_the_round_costs_key_tells_packed_linear_layers_apart():
    """Costs measured with oneDNN's packed products are not reused for torch's (and back): the
    key names each model's kind of linear layers. packed_for_speculation packs a model given
    twice once, leaves everything as it was on exit, and packs nothing with linears="torch"; fp16
    weights are a kind of their own."""
    from mfd_hub.packed_linear import packed_for_speculation
    from mfd_hub.remote.budget_mfd import machine_key

    target = tiny_target("qwen3", vocab_size=32)
    draft = tiny_drafter(target, num_modes=2)
    plain_key = machine_key(draft, target)[0]
    layers = sum(type(m) is torch.nn.Linear for model in (target, draft) for m in model.modules())
    with packed_for_speculation(target, draft, target) as packed:
        assert packed == layers > 0
        packed_key = machine_key(draft, target)[0]
        assert packed_key != plain_key
    assert machine_key(draft, target)[0] == plain_key
    with packed_for_speculation(target, draft, linears="fp16") as changed:  # fp16 weights: costs of their own
        assert changed == layers and machine_key(draft, target)[0] not in (plain_key, packed_key)
    assert machine_key(draft, target)[0] == plain_key
    with packed_for_speculation(target, draft, linears="torch") as packed:
        assert packed == 0 and machine_key(draft, target)[0] == plain_key
    with pytest.raises(ValueError, match="linears"):
        with packed_for_speculation(target, linears="fast"):
            pass
