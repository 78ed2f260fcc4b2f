"""Draft trees equal a brute-force enumeration of every prefix (ties included)."""

import itertools
import random

import pytest
import torch

from mfd_hub.kernels.tree_build import (
    NEG_SCORE,
    SCORE_SCALE,
    build_chain,
    build_mixture_tree,
    draft_candidates,
    draft_tree,
    log_normaliser,
    quantize_logprobs,
    top_candidates,
)


def brute_force_top(qscores, budget, max_depth):
    """Every prefix up to max_depth, scored by its best mode, ranked (score desc, depth, tokens)."""
    m, _, v = qscores.shape
    table = qscores.tolist()
    ranked = []
    for d in range(1, max_depth + 1):
        for seq in itertools.product(range(v), repeat=d):
            best = max(sum(table[k][i][t] for i, t in enumerate(seq)) for k in range(m))
            ranked.append((-best, d, seq))
    ranked.sort()
    return {seq: -neg for neg, _, seq in ranked[:budget]}


def tree_prefixes(tree):
    paths, out = {}, {}
    for i in range(1, tree.tokens.shape[0]):
        p = int(tree.parents[i])
        paths[i] = paths.get(p, ()) + (int(tree.tokens[i]),)
        out[paths[i]] = int(tree.scores[i])
    return out, paths


def expected_preorder(selected):
    """DFS preorder of a prefix-closed set, children best first (score desc, then tokens)."""
    order = []

    def visit(prefix):
        kids = [s for s in selected if len(s) == len(prefix) + 1 and s[:-1] == prefix]
        for kid in sorted(kids, key=lambda s: (-selected[s], s)):
            order.append(kid)
            visit(kid)

    visit(())
    return order


def random_logprobs(rng, m, length, v, tie_heavy):
    if tie_heavy:  # small integer logits: many exact ties in and across positions and modes
        logits = torch.tensor([[[rng.randint(0, 2) for _ in range(v)] for _ in range(length)] for _ in range(m)])
        logits = logits.float()
    else:
        logits = torch.randn(m, length, v, generator=torch.Generator().manual_seed(rng.randint(0, 10**6)))
    if rng.random() < 0.2:  # a forbidden token (-inf), as a draft vocabulary or a mask would give
        logits[..., rng.randrange(v)] = float("-inf")
    if rng.random() < 0.3 and m > 1:  # the same distribution proposed by several modes
        logits[1] = logits[0]
    return torch.log_softmax(logits, dim=-1)


CASES = [(seed, seed % 2 == 0) for seed in range(120)]


def random_case(seed, tie_heavy):
    rng = random.Random(seed)
    m, length, v = rng.randint(1, 4), rng.randint(1, 5), rng.randint(2, 6)
    budget = rng.randint(1, 40)
    return m, length, v, budget, random_logprobs(rng, m, length, v, tie_heavy)


def assert_tree_is_brute_force_top(tree, q, budget, length, anchor):
    want = brute_force_top(q, budget, length)
    got, paths = tree_prefixes(tree)
    assert got == want
    assert tree.num_nodes == len(want)
    # layout: root first, parents precede children, depth = parent depth + 1, DFS preorder
    assert int(tree.tokens[0]) == anchor and int(tree.parents[0]) == -1 and int(tree.depths[0]) == 0
    for i in range(1, tree.num_nodes + 1):
        p = int(tree.parents[i])
        assert 0 <= p < i and int(tree.depths[i]) == int(tree.depths[p]) + 1
    assert [paths[i] for i in range(1, tree.num_nodes + 1)] == expected_preorder(want)


@pytest.mark.parametrize("seed,tie_heavy", CASES)
def test_mixture_and_product_trees_equal_brute_force(seed, tie_heavy):
    m, length, v, budget, lp = random_case(seed, tie_heavy)
    q = quantize_logprobs(lp)
    top_s, top_i = top_candidates(lp, budget)
    assert torch.equal(top_s, top_candidates(q, budget)[0])
    for modes in [list(range(m))] + [[k] for k in range(m)]:  # the mixture, then each mode's product tree
        tree = build_mixture_tree(top_s[modes], top_i[modes], budget, 99)
        assert_tree_is_brute_force_top(tree, q[modes], budget, length, 99)


@pytest.mark.parametrize("seed,tie_heavy", CASES[:10])
def test_triton_trees_equal_brute_force_and_reference(forced_triton, seed, tie_heavy):
    """The Triton path (candidates from raw logits, then the tree) on a subset of the cases."""
    m, length, v, budget, lp = random_case(seed, tie_heavy)
    logits = (lp * 1.5 + 0.25).to(forced_triton)  # not normalised: the candidates normalise
    top_s, top_i = draft_candidates(logits, budget)
    want_s, want_i = top_candidates(logits, budget, log_normaliser(logits))
    assert torch.equal(top_s, want_s) and torch.equal(top_i, want_i)
    q = quantize_logprobs(logits - log_normaliser(logits)[..., None])
    for modes in [list(range(m)), [0]]:
        tree = draft_tree(top_s[modes], top_i[modes], budget, 99, v)
        want = build_mixture_tree(top_s[modes], top_i[modes], budget, 99)
        for name in ("tokens", "parents", "depths", "scores", "modes"):
            assert torch.equal(getattr(tree, name), getattr(want, name)), name
        assert_tree_is_brute_force_top(tree, q[modes].cpu(), budget, length, 99)


@pytest.mark.parametrize("k", [1, 7, 33])
def test_candidates_on_a_large_vocabulary_equal_a_full_stable_sort(k):
    """A vocabulary large enough for the blockwise top-k, with ties straddling the cut: a few
    (bf16 logits, 8 significant bits, as a bf16 drafter gives them) or a thousand (small integers)."""
    g = torch.Generator().manual_seed(k)
    for logits in (torch.randn(2, 3, 128 * 80, generator=g), torch.randint(-6, 2, (2, 3, 128 * 80), generator=g).float(),
                   (torch.randn(2, 3, 128 * 80, generator=g) * 3).bfloat16()):
        lse = log_normaliser(logits)
        assert torch.allclose(lse, torch.logsumexp(logits.float(), -1), atol=1e-5)
        full = quantize_logprobs(logits - lse[..., None]).sort(dim=-1, descending=True, stable=True)
        scores, ids = top_candidates(logits, k, lse)
        assert torch.equal(scores, full.values[..., :k]) and torch.equal(ids, full.indices[..., :k])


@pytest.mark.parametrize("k", [16, 32])
def test_candidates_redo_only_straddling_rows_and_stay_exact(k):
    """The mixture's shape: 8 modes x 7 positions of a 4,096-token draft vocabulary in bf16, where
    a tie straddles the cut in some rows and not others; the rows redone alone must land back in
    their places, every row equal to a full stable sort."""
    g = torch.Generator().manual_seed(k)
    logits = (torch.randn(8, 7, 4096, generator=g) * 3).bfloat16()
    lse = log_normaliser(logits)
    full = quantize_logprobs(logits - lse[..., None]).sort(dim=-1, descending=True, stable=True)
    straddles = full.values[..., k] == full.values[..., k - 1]
    assert straddles.any() and not straddles.all()
    scores, ids = top_candidates(logits, k, lse)
    assert torch.equal(scores, full.values[..., :k]) and torch.equal(ids, full.indices[..., :k])
    got = draft_candidates(logits, k)
    assert torch.equal(got[0], scores) and torch.equal(got[1], ids)


def test_candidates_from_raw_logits_equal_those_from_log_probs():
    logits = torch.randint(-3, 3, (3, 4, 50)).float() * 0.7 + 2.0  # many ties
    lse = torch.logsumexp(logits, -1)
    for k in (1, 5, 50, 60):
        got = top_candidates(logits, k, lse)
        want = top_candidates(logits - lse[..., None], k)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_exact_ties_break_to_smaller_depth_then_smaller_tokens():
    # two modes, uniform over 3 tokens: every prefix of one depth ties exactly
    q = quantize_logprobs(torch.log_softmax(torch.zeros(2, 3, 3), -1))
    top_s, top_i = top_candidates(q, 5)
    tree = build_mixture_tree(top_s, top_i, 5, anchor=0)
    got, _ = tree_prefixes(tree)
    assert sorted(got) == [(0,), (0, 0), (1,), (1, 0), (2,)] or sorted(got) == sorted(
        [(0,), (1,), (2,), (0, 0), (0, 1)]
    )
    assert set(got) == {(0,), (1,), (2,), (0, 0), (0, 1)}


def test_top_candidates_orders_ties_by_id():
    lp = torch.tensor([[0.0, 1.0, 1.0, 0.5, 1.0, -1.0]]) - 2.0
    vals, ids = top_candidates(lp, 3)
    assert vals.dtype == torch.int64 and vals.tolist() == [[int(-1.0 * SCORE_SCALE)] * 3]
    assert ids.tolist() == [[1, 2, 4]]
    vals, ids = top_candidates(lp, 2)  # the cut falls inside the tie
    assert ids.tolist() == [[1, 2]]
    vals, ids = top_candidates(lp, 10)
    assert ids.tolist() == [[1, 2, 4, 3, 0, 5]]


def test_quantized_scores_are_exact_and_monotone():
    lp = torch.tensor([-0.0, -1e-12, -0.5, float("-inf")])
    q = quantize_logprobs(lp)
    assert q.dtype == torch.int64 and int(q[3]) == NEG_SCORE
    assert int(q[0]) >= int(q[1]) >= int(q[2]) > int(q[3])
    assert int(15 * q[3]) < 0  # fifteen forbidden steps still fit


def test_chain_is_the_argmax_path():
    lp = torch.log_softmax(torch.randn(1, 6, 9), -1)
    _, ids = top_candidates(lp[0], 1)
    tree = build_chain(ids, anchor=4, length=4)
    assert tree.tokens.tolist() == [4] + lp[0, :4].argmax(-1).tolist()
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3]
    assert tree.scores.tolist() == [0] * 5  # no scores given
    scores, ids = top_candidates(quantize_logprobs(lp[0]), 1)
    scored = build_chain(ids, anchor=4, length=4, top_scores=scores)
    assert scored.scores.tolist() == [0] + torch.cumsum(scores[:4, 0], 0).tolist()  # prefix scores, as in trees


def test_budget_one_and_single_chain_trees():
    q = quantize_logprobs(torch.log_softmax(torch.randn(3, 4, 5), -1))
    s, i = top_candidates(q, 1)
    tree = build_mixture_tree(s, i, 1, anchor=0)
    assert tree.num_nodes == 1
    assert int(tree.scores[1]) == int(q[:, 0].max())
    # a vocabulary of one token: the tree can only be one chain
    q1 = quantize_logprobs(torch.zeros(2, 4, 1))
    s, i = top_candidates(q1, 8)
    tree = build_mixture_tree(s, i, 8, anchor=0)
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3]
