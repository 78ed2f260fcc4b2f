"""Attention targets (Llama, Qwen3): tree verification and commit equal brute force.

At every verify, the logits and taps of every node equal a plain forward of the target over the
committed tokens + the node's path; after every commit, the cache equals a plain prefill of the
committed tokens. Checked on hand-made deep trees with chosen commits, and on the real chain,
product and mixture trees of T = 1 generations (partial acceptance, rejections, many rounds).
"""

import pytest
import torch

from mfd_hub.kernels.tree_attention import ancestor_mask
from mfd_hub.remote.targets_mfd import AttentionVerifier, make_verifier
from mfd_hub.testing import spine_tree, tiny_drafter, tiny_target

FAMILIES = ("llama", "qwen3")
TOL = dict(rtol=1e-4, atol=1e-4)


def brute_target(family, vocab_size=16):
    return tiny_target(family, vocab_size=vocab_size, num_layers=4, init_std=0.3)



def assert_nodes_equal_plain_forward(target, taps, committed, tokens, parents, logits, node_taps):
    """One plain forward per leaf checks every node on its path (the leaves in one batch,
    right-padded: a causal model's earlier positions do not see what follows)."""
    mask = ancestor_mask(parents)
    leaves = sorted(set(range(len(tokens))) - set(parents.tolist()))
    paths = [mask[leaf].nonzero().flatten() for leaf in leaves]
    longest = max(len(path) for path in paths)
    rows = [committed + tokens[path].tolist() + [0] * (longest - len(path)) for path in paths]
    with torch.no_grad():
        out = target(torch.tensor(rows), output_hidden_states=True)
    plain_taps = torch.cat([out.hidden_states[j + 1] for j in taps], dim=-1)
    for row, path in enumerate(paths):
        at = slice(len(committed), len(committed) + len(path))
        torch.testing.assert_close(logits[path], out.logits[row, at], **TOL)
        torch.testing.assert_close(node_taps[path], plain_taps[row, at], **TOL)


def assert_cache_is_prefill(verifier, target, committed):
    """The verifier's keys/values equal those of a plain prefill of the committed tokens."""
    from transformers import DynamicCache

    assert verifier.length == len(committed)
    cache = DynamicCache()
    with torch.no_grad():
        target(torch.tensor([committed]), cache=cache, use_cache=True)
    for mine, plain in zip(verifier.cache.layers, cache.layers):
        torch.testing.assert_close(mine.keys, plain.keys, **TOL)
        torch.testing.assert_close(mine.values, plain.values, **TOL)


# (nodes, spine, node to commit): a deep path, the root alone, a branch off the spine, a chain
ROUNDS = [(14, 7, 6), (9, 4, 0), (16, 6, 15), (6, 6, 5)]


@pytest.mark.parametrize("family", FAMILIES)
def test_hand_made_deep_trees(family):
    target = brute_target(family)
    taps = [0, 2, 3]  # the last layer's tap is the normed output
    verifier = make_verifier(target, taps)
    assert isinstance(verifier, AttentionVerifier)
    committed = [3, 1, 4, 1, 5]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        verifier.prefill(torch.tensor([committed]))
        assert_cache_is_prefill(verifier, target, committed)
        for n, spine, pick in ROUNDS:
            parents, depths = spine_tree(n, spine, seed=n)
            tokens = torch.randint(0, 16, (n,), generator=gen)
            logits, node_taps = verifier.verify(tokens, depths, ancestor_mask(parents))
            assert_nodes_equal_plain_forward(target, taps, committed, tokens, parents, logits, node_taps)
            path = ancestor_mask(parents)[pick].nonzero().flatten()
            verifier.commit(path)
            committed += tokens[path].tolist()
            assert_cache_is_prefill(verifier, target, committed)


def test_a_leaky_commit_is_caught():
    """Keeping a rejected sibling's entry in place of the accepted node's fails the cache check
    (so the checks above can fail)."""
    target = brute_target("qwen3")
    verifier = make_verifier(target, [0, 3])
    committed = [3, 1, 4, 1, 5]
    parents, depths = spine_tree(8, 4, seed=3)
    tokens = torch.tensor([2, 7, 7, 1, 9, 4, 4, 6])
    with torch.no_grad():
        verifier.prefill(torch.tensor([committed]))
        verifier.verify(tokens, depths, ancestor_mask(parents))
        path = ancestor_mask(parents)[3].nonzero().flatten()  # the spine: nodes 0, 1, 2, 3
        sibling = next(i for i in range(4, 8) if parents[i] == parents[3])
        leaky = path.clone()
        leaky[-1] = sibling
        verifier.commit(leaky)
    with pytest.raises(AssertionError):
        assert_cache_is_prefill(verifier, target, committed + tokens[path].tolist())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ("chain", "product", "mixture"))
def test_real_trees_of_sampled_generations(monkeypatch, family, method):
    """Every verify and commit of T = 1 generations, checked as they happen."""
    target = brute_target(family, vocab_size=6 if method == "chain" else 16)  # a chain needs agreement
    drafter = tiny_drafter(target, num_modes=3, block_size=8, seed=2)
    taps = drafter.target_layer_ids
    state = dict(committed=None, tree=None, verifies=0, partial=0)
    real_prefill, real_verify, real_commit = AttentionVerifier.prefill, AttentionVerifier.verify, AttentionVerifier.commit

    def prefill(verifier, input_ids):
        state["committed"] = input_ids[0].tolist()
        return real_prefill(verifier, input_ids)

    def verify(verifier, tokens, depths, tree_mask):
        logits, node_taps = real_verify(verifier, tokens, depths, tree_mask)
        parents = torch.tensor([-1] + [int(row[:i].nonzero().max()) for i, row in enumerate(tree_mask) if i])
        assert_nodes_equal_plain_forward(target, taps, state["committed"], tokens, parents, logits, node_taps)
        state["tree"], state["verifies"] = (tokens, depths), state["verifies"] + 1
        return logits, node_taps

    def commit(verifier, path):
        real_commit(verifier, path)
        tokens, depths = state["tree"]
        state["committed"] += tokens[path].tolist()
        state["partial"] += 1 < len(path) < int(depths.max()) + 1  # accepted some, rejected deeper
        assert_cache_is_prefill(verifier, target, state["committed"])

    monkeypatch.setattr(AttentionVerifier, "prefill", prefill)
    monkeypatch.setattr(AttentionVerifier, "verify", verify)
    monkeypatch.setattr(AttentionVerifier, "commit", commit)
    gen = torch.Generator().manual_seed(7)
    budget = 7 if method == "chain" else 16
    out = drafter.spec_generate(target, torch.tensor([[3, 1, 4, 1, 5]]), max_new_tokens=30, method=method,
                                tree_budget=budget, temperature=1.0, generator=gen)
    assert state["verifies"] == out.rounds >= 5
    assert state["partial"] >= 2, state
