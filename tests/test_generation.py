"""spec_generate is lossless: token-identical at T=0 (T > 0: tests/test_sampling_exactness.py)."""

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from mfd_hub.remote import generation_mfd
from mfd_hub.remote.sampling_mfd import sampling_probs
from mfd_hub.remote.targets_mfd import UnsupportedTargetError
from mfd_hub.testing import greedy_decode, tiny_drafter, tiny_target

METHODS = ("chain", "product", "mixture")


def greedy_reference(target, ids, max_new_tokens, stop=None):
    return greedy_decode(target, ids, max_new_tokens, stop_ids=[stop] if stop is not None else None)


@pytest.fixture
def small_vocab_pair(family):
    # a small vocabulary makes trees cover a lot, so rounds accept several tokens
    target = tiny_target(family, vocab_size=16, init_std=0.2)
    return target, tiny_drafter(target, num_modes=4, block_size=8)


@pytest.mark.parametrize("method", METHODS)
def test_greedy_is_token_identical(small_vocab_pair, method):
    target, drafter = small_vocab_pair
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    want = greedy_reference(target, ids, 48)
    taus = []
    for budget in (1, 2, 3, 7, 16, 33, 64):
        out = drafter.spec_generate(target, ids, max_new_tokens=48, method=method, tree_budget=budget)
        assert out.new_tokens == want, (method, budget)
        assert out.output_ids[0].tolist() == ids[0].tolist() + want
        assert sum(out.acceptance_lengths) + 1 == len(want)
        taus.append(out.tau)
    if method != "chain":
        assert max(taus) > 1.3  # large trees accept several tokens per round: the walk is exercised


def test_on_round_sees_each_tree_its_logits_and_the_accepted_path(small_vocab_pair):
    target, drafter = small_vocab_pair
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    seen = []

    def on_round(tree, tokens, logits, path):
        seen.append((tree.num_nodes, tokens.clone(), logits.shape, path.tolist(), tree.parents.tolist()))

    out = drafter.spec_generate(target, ids, max_new_tokens=30, method="mixture", tree_budget=12, on_round=on_round)
    assert len(seen) == out.rounds and [s[0] for s in seen] == out.tree_sizes
    emitted = out.new_tokens[1:]  # the first token comes from the prefill
    for (nodes, tokens, shape, path, parents), length in zip(seen, out.acceptance_lengths):
        assert shape == (nodes + 1, target.config.vocab_size)  # the root (anchor) and the drafted nodes
        assert path[0] == 0 and all(parents[c] == p for p, c in zip(path, path[1:]))  # a root-down path
        assert len(path) == length  # the accepted drafts and the root: one token per emitted token
        assert tokens[path[1:]].tolist() == emitted[: length - 1]
        emitted = emitted[length:]


def test_the_time_on_round_spends_is_not_the_generations(small_vocab_pair, monkeypatch):
    """A slow statistics callback leaves ``seconds`` and every stage's time as they are without
    it: the trees are not charged for being measured. The clock is the test's: every reading
    advances it by 1 ms of generation work, and the callback spends 10 s."""
    import types

    now = [0.0]

    def perf_counter():
        now[0] += 0.001
        return now[0]

    def slow_statistics(*args):
        now[0] += 10.0

    monkeypatch.setattr(generation_mfd, "time", types.SimpleNamespace(perf_counter=perf_counter))
    target, drafter = small_vocab_pair
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    out = drafter.spec_generate(target, ids, max_new_tokens=30, method="product", tree_budget=8,
                                on_round=slow_statistics)
    assert out.rounds >= 3
    assert out.seconds < 10.0  # all of the callbacks' time left out, whatever the rounds took
    assert out.seconds > 0.001 * out.rounds  # the generation's own readings are all counted
    # the stages hold all of it but the few readings around them (1 ms each)
    assert sum(out.stage_seconds.values()) == pytest.approx(out.seconds, abs=0.005)


def test_mode_choices_for_single_mode_methods(small_vocab_pair):
    target, drafter = small_vocab_pair
    ids = torch.tensor([[2, 7, 1]])
    want = greedy_reference(target, ids, 24)
    for mode in (0, 3, "gate"):
        for method in ("chain", "product"):
            out = drafter.spec_generate(target, ids, max_new_tokens=24, method=method, tree_budget=9, mode=mode)
            assert out.new_tokens == want
            if mode != "gate":
                assert set(out.modes_used) == {mode}


def test_stops_inside_accepted_runs_and_max_new_tokens(small_vocab_pair):
    target, drafter = small_vocab_pair
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    free = greedy_reference(target, ids, 60)
    truncated_rounds = 0
    for stop in sorted(set(free)):
        first = free.index(stop)
        for method in METHODS:
            out = drafter.spec_generate(target, ids, max_new_tokens=60, method=method, tree_budget=48, stop_token_ids=[stop])
            assert out.new_tokens == free[: first + 1], (stop, method)
            assert out.new_tokens == greedy_reference(target, ids, 60, stop=stop)
            # the final round may have accepted beyond the stop: nothing of it is emitted
            truncated_rounds += sum(out.acceptance_lengths) + 1 > len(out.new_tokens)
    assert truncated_rounds > 0
    for n in (1, 2, 5, 17):
        out = drafter.spec_generate(target, ids, max_new_tokens=n, method="mixture", tree_budget=64)
        assert out.new_tokens == free[:n]


def test_sampling_probs_match_transformers_warpers():
    logits = torch.randn(5, 50) * 3
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.5, 10, 0.6), (2.0, 1, 1.0)]:
        warpers = LogitsProcessorList()
        if temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(temperature))
        if top_k:
            warpers.append(TopKLogitsWarper(top_k))
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
        want = warpers(None, logits.clone()).softmax(-1)
        got = sampling_probs(logits, temperature, top_k, top_p)
        assert torch.allclose(got, want, atol=1e-6)


def test_unsupported_target_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    target = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=32, n_layer=4, n_head=4)).eval()
    drafter = tiny_drafter(tiny_target("llama", vocab_size=16), num_modes=2)
    target.config.num_hidden_layers = 4
    with pytest.raises(UnsupportedTargetError, match="gpt2"):
        drafter.spec_generate(target, torch.tensor([[1, 2]]), max_new_tokens=4)


def test_mismatched_target_is_refused():
    drafter = tiny_drafter(tiny_target("qwen3", vocab_size=16), num_modes=2)
    with pytest.raises(ValueError, match="vocabulary"):
        drafter.spec_generate(tiny_target("qwen3", vocab_size=20), torch.tensor([[1, 2]]), max_new_tokens=4)
