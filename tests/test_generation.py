"""spec_generate is lossless: token-identical at T=0, the same distribution at T>0."""

import itertools
import math

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


# ---- T > 0: the distribution of whole sequences ------------------------------------------------
SAMPLES = 20_000
NEW_TOKENS = 3


def exact_sequence_probs(target, prompt, rule):
    """P(y_1..y_n | prompt) under plain sampling for every sequence of NEW_TOKENS tokens."""
    vocab = target.config.vocab_size
    seqs = list(itertools.product(range(vocab), repeat=NEW_TOKENS))
    batch = torch.tensor([prompt + list(s) for s in seqs])
    with torch.no_grad():
        logits = target(batch).logits
    probs = sampling_probs(logits, **rule)
    p = torch.ones(len(seqs), dtype=torch.float64)
    for i in range(NEW_TOKENS):
        pos = len(prompt) - 1 + i
        p *= probs[torch.arange(len(seqs)), pos, batch[:, pos + 1]].double()
    return {s: float(x) for s, x in zip(seqs, p)}


def chi_square_pvalue(counts, expected_probs, n):
    """Pearson's test; outcomes with expected count < 5 are pooled into one cell."""
    chi, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for seq, p in expected_probs.items():
        e, o = n * p, counts.get(seq, 0)
        if e < 5:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
            continue
        chi += (o - e) ** 2 / e
        cells += 1
    if pooled_exp > 0:
        chi += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-9)
        cells += 1
    dof = cells - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(chi / 2)))


def sample_distribution(drafter, target, prompt, rule, method):
    gen = torch.Generator().manual_seed(1234)
    counts = {}
    for _ in range(SAMPLES):
        out = drafter.spec_generate(
            target, torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, method=method, tree_budget=6,
            generator=gen, **rule,
        )
        key = tuple(out.new_tokens)
        counts[key] = counts.get(key, 0) + 1
    return counts


def tiny_sampling_pair(family):
    target = tiny_target(family, vocab_size=4, hidden_size=16, num_layers=2, init_std=0.3)
    drafter = tiny_drafter(target, num_modes=3, num_layers=1, block_size=4, target_layer_ids=[0, 1])
    return target, drafter


SAMPLING_CASES = [
    ("mixture", dict(temperature=0.9, top_k=3, top_p=0.95)),
    ("product", dict(temperature=1.0, top_k=0, top_p=1.0)),
    ("chain", dict(temperature=1.2, top_k=0, top_p=0.9)),
]


@pytest.mark.slow
@pytest.mark.parametrize("method,rule", SAMPLING_CASES, ids=[c[0] for c in SAMPLING_CASES])
def test_sampling_matches_the_exact_distribution(family, method, rule):
    target, drafter = tiny_sampling_pair(family)
    prompt = [1, 2]
    exact = exact_sequence_probs(target, prompt, rule)
    counts = sample_distribution(drafter, target, prompt, rule, method)
    assert all(exact[s] > 0 for s in counts), "a sequence plain sampling can never produce"
    assert chi_square_pvalue(counts, exact, SAMPLES) > 1e-3


@pytest.mark.slow
def test_the_distribution_test_rejects_a_biased_verifier(monkeypatch):
    """A verifier that sometimes takes the target's argmax instead of a sample is lossy."""
    target, drafter = tiny_sampling_pair("qwen3")
    rule = dict(temperature=1.0, top_k=0, top_p=1.0)
    honest = generation_mfd.next_tokens

    def biased(logits, temperature=0.0, top_k=0, top_p=1.0, generator=None):
        sampled = honest(logits, temperature, top_k, top_p, generator)
        greedy = logits.argmax(-1)
        coin = torch.rand(sampled.shape, generator=generator) < 0.15
        return torch.where(coin, greedy, sampled)

    monkeypatch.setattr(generation_mfd, "next_tokens", biased)
    prompt = [1, 2]
    exact = exact_sequence_probs(target, prompt, rule)
    counts = sample_distribution(drafter, target, prompt, rule, "mixture")
    assert chi_square_pvalue(counts, exact, SAMPLES) < 1e-6
