"""T > 0: speculative sampling draws every token from plain sampling's distribution, deep in the tree.

The verifier samples the target's next token at every tree node and walks down the children
whose token matches; the bonus is the draw at the deepest accepted node. It is lossless when
(a) every node's draw has exactly plain sampling's distribution given the node's prefix
(committed tokens + the node's path), (b) draws are independent of each other, and (c) the
emitted tokens are the draws along the walk. The test checks all three, directly:

- **every draw at every node**, in every round, is compared with the exact distribution of
  plain sampling for that node's prefix: transformers' own logits warpers (temperature, top-k,
  top-p) over a plain forward pass of the target on the prefix. Nothing of the verifier (tree
  mask, cache, commit) is used for the reference, so a wrong cache shows up as wrong draws;
- **every emitted token** is compared with plain sampling given everything emitted before it,
  which sees correlated draws and a bonus taken from the wrong node.

Statistic. A draw y with exact probabilities p contributes onehot(y) - p, of mean 0 and
covariance diag(p) - p p^T, whatever the context. Summing the contributions of a pool of draws
(independent given their prefixes) gives S with exact covariance C = the sum of theirs, and
S^T C^+ S is asymptotically chi-square with rank(C) degrees of freedom. Pools: draws by tree
depth (0, 1, 2, >= 3); emitted tokens by the depth of the node whose draw they are (0, 1, >= 2);
and parent-child pairs below depth 1, whose products (onehot(y_p) - p_p)(onehot(y_c) - p_c)^T
have mean 0 exactly when the two draws are independent (covariance C_p (x) C_c; a shared random
stream keeps every marginal right and shows only here). Each pool is read in token coordinates
and in rank coordinates (the context's three most likely tokens, and the rest), where a
distortion towards or away from the likely tokens adds up across contexts. The p-values are
combined by Bonferroni; a draw of a token plain sampling gives probability 0 (cut by top-k or
top-p) rejects outright.

Power. Argmax instead of a sample with probability eps at depth >= 2 shifts each such draw's
mean by eps (e_a - p); n draws give non-centrality about n eps^2 (1/p_a - 1) in rank
coordinates, p_a the argmax's probability. eps = 0.02 and a target of p < 1e-6 after Bonferroni
on 4 degrees of freedom need a non-centrality of ~60, i.e. n (1/p_a - 1) ~ 150,000. The
emitted tokens alone see the distortion only where a round accepts two drafts or more, a few
tokens in a hundred rounds: ~100,000 rounds. Drawing at every node, the product configuration
(flat target at temperature 2.5, p_a ~ 0.25; trees of 96 nodes, ~90 of them at depth >= 2)
gets there in ~530 rounds: measured non-centrality 62 (depth >= 3) + 9 (depth 2) on 46,000
draws, and the distorted sampler is rejected at p = 3e-13. The other configurations are smaller
(120-430 rounds); the cruder bugs are rejected far more strongly (a draw of probability 0, or
p < 1e-100). CPU time: ~27 s for the six honest configurations, ~26 s for the nine bugs.
"""

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from mfd_hub.remote import generation_mfd
from mfd_hub.remote.hybrid_mfd import HybridVerifier
from mfd_hub.remote.sampling_mfd import sampling_probs
from mfd_hub.remote.targets_mfd import AttentionVerifier
from mfd_hub.testing import tiny_drafter, tiny_target

FAMILIES = {
    "attention": lambda vocab: tiny_target("qwen3", vocab_size=vocab, hidden_size=32, num_layers=2, init_std=0.5),
    "hybrid": lambda vocab: tiny_target("qwen3_5_text", vocab_size=vocab, hidden_size=32, num_layers=2, init_std=0.5,
                                        layer_types=["linear_attention", "full_attention"]),
}
# a chain holds one token per depth: a small vocabulary lets a random drafter's chain be accepted
# past depth 1 often enough to be rejected deeper; trees cover a larger one
VOCAB = {"chain": 6, "product": 24, "mixture": 8}
RULES = {  # plain sampling's rules; each cuts a tail, so tokens of probability 0 exist
    "chain": dict(temperature=1.0, top_k=0, top_p=0.9),
    "product": dict(temperature=2.5, top_k=0, top_p=0.97),  # flat: see the power calculation
    "mixture": dict(temperature=0.7, top_k=6, top_p=0.9),
}
BUDGET = {"chain": 7, "product": 96, "mixture": 32}  # the hybrid target's product trees: 48 (its verify costs more)
PROMPTS = [[1, 2, 3], [5, 0, 4, 4, 2], [3], [4, 4, 1, 5]]
NEW_TOKENS = 60
# generator seeds per configuration (4 prompts each): 160-250 rounds; ~550 where the 2% distortion
# is measured
SEEDS = {("attention", "product"): (11, 12, 13), ("attention", "chain"): (11, 12, 13, 14), ("attention", "mixture"): (11, 12)}
DEFAULT_SEEDS = (11,)
TOP_RANKS = 3  # rank coordinates: the context's 3 most likely tokens, and the rest
PAIR_VOCAB = 8  # parent-child pairs in token coordinates up to this vocabulary (V^2 cells)
ALPHA = 1e-3  # the honest sampler passes above it; a bug must fall below 1e-6


def pair(family, method):
    target = FAMILIES[family](VOCAB[method])
    drafter = tiny_drafter(target, num_modes=3, num_layers=1, block_size=8, target_layer_ids=[0, 1], seed=5)
    return target, drafter


def warpers(rule):
    """transformers' own sampling pipeline for ``rule`` (generate's order: temperature, top-k, top-p)."""
    chain = LogitsProcessorList()
    if rule["temperature"] != 1.0:
        chain.append(TemperatureLogitsWarper(rule["temperature"]))
    if rule["top_k"]:
        chain.append(TopKLogitsWarper(rule["top_k"]))
    if rule["top_p"] < 1.0:
        chain.append(TopPLogitsWarper(rule["top_p"]))
    return chain


def plain_probs(target, sequences, rule):
    """Plain sampling's next-token probabilities after every position of equal-length sequences
    -> [B, L, V] float64."""
    with torch.no_grad():
        logits = target(torch.tensor(sequences)).logits.float()
    b, length, v = logits.shape
    warped = warpers(rule)(None, logits.reshape(b * length, v))
    return warped.softmax(-1).double().reshape(b, length, v)


class Recorder:
    """Sits at spec_generate's seams and keeps, per round, the tree and the target's draw at
    every node (what the accept walk is given); ``draw_bug`` / ``walk_bug`` inject a fault
    between the verifier's sampling and the walk."""

    def __init__(self, monkeypatch, draw_bug=None, walk_bug=None, commit_bug=None):
        self.rounds = []
        self.commits = 0
        self.logits = None  # the verify pass's logits of the current round
        self.draft_logits = None  # the drafter's per-position logits of the current round
        self.draw_bug, self.walk_bug = draw_bug, walk_bug
        real_walk, real_next, real_candidates = (
            generation_mfd.accept_walk, generation_mfd.next_tokens, generation_mfd.draft_candidates)

        def next_tokens(logits, *args, **kwargs):
            self.logits = logits
            return real_next(logits, *args, **kwargs)

        def draft_candidates(logits, k):
            self.draft_logits = logits if logits.dim() == 2 else logits[0]  # [depth, V] of one mode
            return real_candidates(logits, k)

        def accept_walk(tokens, parents, depths, target_tokens, max_depth):
            if self.draw_bug is not None:
                target_tokens = self.draw_bug(self, tokens, parents, depths, target_tokens.clone())
            self.rounds.append((tokens.tolist(), parents.tolist(), depths.tolist(), target_tokens.tolist()))
            path, info = real_walk(tokens, parents, depths, target_tokens, max_depth)
            if self.walk_bug is not None:
                info = self.walk_bug(parents, depths, target_tokens, path, info)
            return path, info

        for cls in (AttentionVerifier, HybridVerifier):
            real_commit = cls.commit

            def commit(verifier, path, real_commit=real_commit):
                self.commits += 1
                if commit_bug is not None:
                    path = commit_bug(self, path)
                return real_commit(verifier, path)

            monkeypatch.setattr(cls, "commit", commit)
        monkeypatch.setattr(generation_mfd, "next_tokens", next_tokens)
        monkeypatch.setattr(generation_mfd, "draft_candidates", draft_candidates)
        monkeypatch.setattr(generation_mfd, "accept_walk", accept_walk)


class Pools:
    """Per pool: the sum of onehot(draw) - p and its exact covariance, in token and rank order."""

    def __init__(self):
        self.sums, self.covs, self.impossible = {}, {}, 0

    def add(self, pool, probs, draws):
        """probs [n, V] float64, draws [n]."""
        if len(draws) == 0:
            return
        draws = torch.as_tensor(draws)
        picked = probs[torch.arange(len(draws)), draws]
        self.impossible += int((picked == 0).sum())
        for name, (p, y) in self._coordinates(probs, draws).items():
            coords = f"{pool}/{name}"
            dev = torch.nn.functional.one_hot(y, p.shape[-1]).double() - p
            cov = torch.diag_embed(p).sum(0) - p.T @ p
            self.sums[coords] = self.sums.get(coords, 0) + dev.sum(0)
            self.covs[coords] = self.covs.get(coords, 0) + cov

    def _coordinates(self, probs, draws):
        """(name, p, y) per coordinate system: token ids (vocabularies up to PAIR_VOCAB for pairs),
        and ranks (the TOP_RANKS most likely tokens of the context, and the rest)."""
        draws = torch.as_tensor(draws)
        order = probs.argsort(dim=-1, descending=True, stable=True)
        ranks = order.argsort(dim=-1)[torch.arange(len(draws)), draws]
        by_rank = probs.gather(-1, order)
        top = torch.cat([by_rank[:, :TOP_RANKS], by_rank[:, TOP_RANKS:].sum(-1, keepdim=True)], dim=-1)
        return {"token": (probs, draws), "rank": (top, ranks.clamp(max=TOP_RANKS))}

    def add_pairs(self, pool, parent_probs, parent_draws, child_probs, child_draws):
        """Parent and child draws are independent: E[(onehot(y_p) - p_p) x (onehot(y_c) - p_c)] = 0,
        with covariance C_p x C_c (Kronecker); distinct pairs are uncorrelated, since each holds a
        draw the other lacks, of mean 0 given the rest."""
        if len(child_draws) == 0:
            return
        parent = self._coordinates(parent_probs, parent_draws)
        child = self._coordinates(child_probs, child_draws)
        for name in parent:
            (pp, yp), (pc, yc) = parent[name], child[name]
            d = pp.shape[-1]
            if name == "token" and d > PAIR_VOCAB:
                continue
            xp = torch.nn.functional.one_hot(yp, d).double() - pp
            xc = torch.nn.functional.one_hot(yc, d).double() - pc
            cp = torch.diag_embed(pp) - pp[:, :, None] * pp[:, None, :]
            cc = torch.diag_embed(pc) - pc[:, :, None] * pc[:, None, :]
            key = f"{pool}/{name}"
            self.sums[key] = self.sums.get(key, 0) + torch.einsum("ni,nj->ij", xp, xc).reshape(-1)
            cov = torch.einsum("nik,njl->ijkl", cp, cc).reshape(d * d, d * d)
            self.covs[key] = self.covs.get(key, 0) + cov

    def pvalues(self):
        out = {}
        for key, s in self.sums.items():
            values, vectors = torch.linalg.eigh(self.covs[key])
            keep = values > values.max() * 1e-9
            z = vectors[:, keep].T @ s
            stat, dof = float((z**2 / values[keep]).sum()), int(keep.sum())
            out[key] = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                                     torch.tensor(stat / 2.0, dtype=torch.float64)))
        return out

    def combined(self):
        """Bonferroni over the pools; 0 when a draw had probability 0."""
        if self.impossible:
            return 0.0
        p = self.pvalues()
        return min(1.0, len(p) * min(p.values()))


def depth_pool(depth):
    return f"depth{min(depth, 3)}"


def tree_reference(target, context, paths, parents, rule):
    """Plain sampling's probabilities after every node: one plain forward over context + each
    leaf's path (right-padded: a causal model's earlier positions ignore what follows) reads
    every node on that path -> [N, V] float64."""
    leaf_of = list(range(len(paths)))  # a leaf below each node
    for i in reversed(range(1, len(paths))):
        leaf_of[parents[i]] = leaf_of[i]
    leaves = sorted(set(leaf_of))
    longest = max(len(paths[i]) for i in leaves)
    rows = [context + paths[i] + [0] * (longest - len(paths[i])) for i in leaves]
    probs = plain_probs(target, rows, rule)
    row = {leaf: r for r, leaf in enumerate(leaves)}
    at = [len(context) - 1 + len(path) for path in paths]
    return probs[[row[leaf_of[i]] for i in range(len(paths))], at]


def check_run(target, prompt, rule, out, rounds, pools, counts):
    """Add one generation's draws and emitted tokens to ``pools``; count its deep events."""
    assert len(rounds) == out.rounds
    emitted = out.new_tokens
    # the emitted tokens: each given everything before it (one plain forward over the output),
    # pooled by the depth of the node whose draw it is (a round emits draws at depths 0, 1, ...)
    probs = plain_probs(target, [prompt + emitted], rule)[0, len(prompt) - 1 : -1]
    depth_of = [0] + [d for length in out.acceptance_lengths for d in range(length)]
    for d in (0, 1, 2):
        at = [j for j, dj in enumerate(depth_of[: len(emitted)]) if min(dj, 2) == d]
        pools.add(f"emitted{d}", probs[at], [emitted[j] for j in at])
    done = 1  # tokens committed before the round (the first came from the prefill)
    for (tokens, parents, depths, draws), length in zip(rounds, out.acceptance_lengths):
        context = prompt + emitted[:done]
        assert tokens[0] == context[-1], "the round's root is not the last committed token"
        paths = []  # each node's path below the root
        for i, p in enumerate(parents):
            paths.append([] if p < 0 else paths[p] + [tokens[i]])
        node_probs = tree_reference(target, context, paths, parents, rule)
        for d in set(depths):
            nodes = [i for i, depth in enumerate(depths) if depth == d]
            pools.add(depth_pool(d), node_probs[nodes], [draws[i] for i in nodes])
        deep = [i for i in range(1, len(tokens)) if depths[i] >= 2]  # a draw and its parent's
        up = [parents[i] for i in deep]
        pools.add_pairs("pairs", node_probs[up], [draws[i] for i in up], node_probs[deep], [draws[i] for i in deep])
        # which nodes the walk accepted: rejections are children of accepted nodes that were not
        accepted = {0}
        for i in range(1, len(tokens)):
            if parents[i] in accepted and tokens[i] == draws[parents[i]]:
                accepted.add(i)
        counts["deep_rejections"] += sum(
            1 for i in range(1, len(tokens)) if depths[i] >= 2 and parents[i] in accepted and i not in accepted)
        counts["deep_trees"] += max(depths) >= 3
        counts["rounds"] += 1
        counts["draws_depth2+"] += sum(1 for d in depths if d >= 2)
        done += length


def sample(monkeypatch, family, method, draw_bug=None, walk_bug=None, commit_bug=None, seeds=None):
    """Generate from every prompt with every seed; -> (Pools, counts)."""
    target, drafter = pair(family, method)
    rule = RULES[method]
    pools = Pools()
    counts = dict(rounds=0, deep_rejections=0, deep_trees=0, commits=0, **{"draws_depth2+": 0})
    for seed in seeds or SEEDS.get((family, method), DEFAULT_SEEDS):
        gen = torch.Generator().manual_seed(seed)
        for prompt in PROMPTS:
            with monkeypatch.context() as patch:
                recorder = Recorder(patch, draw_bug, walk_bug, commit_bug)
                out = drafter.spec_generate(target, torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, method=method,
                                            tree_budget=48 if (family, method) == ("hybrid", "product") else BUDGET[method], generator=gen, **rule)
            check_run(target, prompt, rule, out, recorder.rounds, pools, counts)
            counts["commits"] += recorder.commits
    return pools, counts


def floors(counts):
    """The runs went where bugs live: deep trees, rejections at depth >= 2, commits."""
    assert counts["deep_rejections"] >= 20, counts
    assert counts["deep_trees"] >= 100, counts
    assert counts["commits"] >= 100, counts


CONFIGS = [(family, method) for family in FAMILIES for method in RULES]


@pytest.mark.parametrize("family,method", CONFIGS, ids=[f"{f}-{m}" for f, m in CONFIGS])
def test_honest_sampler_draws_every_node_from_plain_sampling(monkeypatch, family, method):
    pools, counts = sample(monkeypatch, family, method)
    floors(counts)
    assert pools.impossible == 0, "a draw plain sampling gives probability 0"
    assert pools.combined() > ALPHA, pools.pvalues()


# ---- injected bugs, each at depth >= 2 ---------------------------------------------------------
def _deep(depths):
    return depths >= 2


def reuse_parent_draw(rec, tokens, parents, depths, draws):
    """A node's draw is its parent's."""
    deep = _deep(depths)
    draws[deep] = draws.clone()[parents[deep]]
    return draws


def carry_over_draw(rec, tokens, parents, depths, draws):
    """A node's draw is the one the same node index got in the previous round."""
    previous, rec.previous = getattr(rec, "previous", None), draws.clone()
    if previous is not None:
        rows = torch.nonzero(_deep(depths) & (torch.arange(len(draws)) < len(previous))).flatten()
        draws[rows] = previous[rows]
    return draws


def bonus_from_parent(parents, depths, draws, path, info):
    """The bonus is the draw of the deepest accepted node's parent."""
    accepted = int(info[0])
    if accepted >= 3:
        info = info.clone()
        info[2] = draws[parents[path[accepted - 1]]]
    return info


BUG_GEN = torch.Generator()


def resample(probs, rows):
    return torch.multinomial(probs[rows], 1, generator=BUG_GEN).flatten()


def drafter_draw(rule):
    def bug(rec, tokens, parents, depths, draws):
        """A node drawn from the drafter's distribution at its depth."""
        deep = torch.nonzero(_deep(depths)).flatten()
        probs = sampling_probs(rec.draft_logits, **rule)
        draws[deep] = resample(probs, depths[deep] - 1)
        return draws
    return bug


def shared_uniform(rule):
    def bug(rec, tokens, parents, depths, draws):
        """Inverse-CDF draws whose uniforms are shared with the parent's below depth 1."""
        cdf = sampling_probs(rec.logits, **rule).double().cumsum(-1)
        u = torch.rand(len(draws), generator=BUG_GEN, dtype=torch.float64)
        for i in range(len(draws)):
            if depths[i] >= 2:
                u[i] = u[parents[i]]
        picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).flatten()
        return picked.clamp(max=cdf.shape[-1] - 1)
    return bug


def wrong_warper_order(rule):
    def bug(rec, tokens, parents, depths, draws):
        """top-k and top-p cut the raw logits, temperature applied after them."""
        kept = sampling_probs(rec.logits, 1.0, rule["top_k"], rule["top_p"]) > 0
        probs = (rec.logits.float().masked_fill(~kept, float("-inf")) / rule["temperature"]).softmax(-1)
        deep = torch.nonzero(_deep(depths)).flatten()
        draws[deep] = resample(probs, deep)
        return draws
    return bug


def argmax_two_percent(rec, tokens, parents, depths, draws):
    """The target's argmax instead of its draw 2% of the time."""
    coin = (torch.rand(len(draws), generator=BUG_GEN) < 0.02) & _deep(depths)
    return torch.where(coin, rec.logits.argmax(-1), draws)


def keep_rejected_sibling(rec, path):
    """Commit keeps a rejected sibling's cache entry in place of the deepest accepted node's."""
    tokens, parents, depths, draws = rec.rounds[-1]
    if len(path) >= 3:
        deepest = int(path[-1])
        siblings = [i for i, p in enumerate(parents) if p == parents[deepest] and i != deepest]
        if siblings:
            path = path.clone()
            path[-1] = siblings[0]
    return path


BUGS = {  # name -> (family, method, where the bug sits)
    "parent-draw-reused": ("attention", "mixture", dict(draw_bug=reuse_parent_draw)),
    "draw-carried-over": ("attention", "mixture", dict(draw_bug=carry_over_draw)),
    "bonus-from-parent": ("attention", "mixture", dict(walk_bug=bonus_from_parent)),
    "drafter-distribution": ("attention", "mixture", dict(draw_bug=drafter_draw(RULES["mixture"]))),
    "leaky-commit": ("attention", "mixture", dict(commit_bug=keep_rejected_sibling)),
    "leaky-commit-hybrid": ("hybrid", "mixture", dict(commit_bug=keep_rejected_sibling)),
    "shared-uniform": ("attention", "chain", dict(draw_bug=shared_uniform(RULES["chain"]))),
    "warpers-wrong-order": ("attention", "mixture", dict(draw_bug=wrong_warper_order(RULES["mixture"]))),
    "argmax-2%": ("attention", "product", dict(draw_bug=argmax_two_percent)),
}


@pytest.mark.parametrize("bug", BUGS)
def test_every_injected_bug_is_rejected(monkeypatch, bug):
    family, method, injection = BUGS[bug]
    BUG_GEN.manual_seed(0)
    pools, counts = sample(monkeypatch, family, method, **injection)
    floors(counts)
    assert pools.combined() < 1e-6, pools.pvalues()
