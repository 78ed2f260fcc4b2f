"""Draft trees from per-position draft distributions: chain, product tree, exact mixture tree.

Scores. A prefix y_1..y_d drafted by mode k scores sum_d log p_{k,d}(y_d); the mixture scores a
prefix by its best mode. Log-probabilities are quantised to integers (``quantize_logprobs``:
fixed point, 2^-32 nats) so that sums are exact: the ordering is then a true total order,
ties are reproducible, and the beam argument below holds bit for bit.

Order. Prefix a ranks before b when its score is higher; then when it is shallower; then when
its token sequence is lexicographically smaller (token ids). Scores only fall along a path, so
the top-B set is prefix-closed.

Exactness. For one mode, the depth-d members of the top-B extend depth-(d-1) members with one of
the top-B tokens of position d, so a beam of width B per depth over (beam x top-B tokens) is
exact; since both lists are sorted, only cells with (i+1)(j+1) <= B can enter. For the mixture,
a prefix in the global top-B is in the top-B of its best mode: run the per-mode beams, take their
union (a prefix found by several modes keeps its best score) and keep the global top-B.

Layout. Node 0 is the root (the anchor token, depth 0). The B nodes follow in DFS preorder with
the best child first, so parents precede children and the main spine is 0, 1, 2, ...

This file is part of the remote-code bundle: torch only.
"""

from dataclasses import dataclass

import torch

SCORE_SCALE = float(2**32)
NEG_SCORE = -(2**58)  # the score of a -inf log-probability; 15 of them still fit in int64


@dataclass
class DraftTree:
    """A draft tree in DFS preorder. All tensors have N+1 entries (root first).

    tokens: draft token ids (root: the anchor); parents: parent index (root: -1);
    depths: 0 for the root; scores: int64 prefix scores (root 0); modes: the best mode of each
    prefix (root -1, chains and product trees: the mode drafted).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    modes: torch.Tensor

    @property
    def num_nodes(self):
        """Nodes excluding the root."""
        return self.tokens.shape[0] - 1


def quantize_logprobs(logprobs):
    """float log-probabilities -> int64 fixed point (exact sums, -inf -> NEG_SCORE).

    Monotone: a > b implies q(a) >= q(b). int64 input is returned as is.
    """
    if logprobs.dtype == torch.int64:
        return logprobs
    lp = logprobs.float()
    q = torch.round(lp.clamp(min=-1e6) * SCORE_SCALE).to(torch.int64)
    return torch.where(torch.isfinite(lp), q, torch.full_like(q, NEG_SCORE))


def top_candidates(logprobs, k):
    """The k best tokens of each position in quantised score, best first, ties to the smaller id.

    logprobs [..., V] (float log-probabilities or quantised int64) -> (int64 scores, ids), each
    [..., min(k, V)]. Only the float top-(k+1) is quantised unless a quantised tie straddles the
    cut (quantisation is monotone, so the float top-(k+1) then holds the exact top-k).
    """
    v = logprobs.shape[-1]
    k = min(k, v)
    if k < v:
        vals, ids = logprobs.topk(k + 1, dim=-1, sorted=True)
        vals = quantize_logprobs(vals)
        if bool((vals[..., k - 1] == vals[..., k]).any()):
            # a tie straddles the cut: only a full stable sort knows which ids win
            full = quantize_logprobs(logprobs)
            ids = torch.sort(full, dim=-1, descending=True, stable=True).indices[..., :k]
            return full.gather(-1, ids), ids
        vals, ids = vals[..., :k], ids[..., :k]
    else:
        ids = torch.arange(v, device=logprobs.device).expand(logprobs.shape)
        vals = quantize_logprobs(logprobs)
    # order ties inside the kept set by id: sort by id, then stably by score
    by_id = torch.sort(ids, dim=-1, stable=True)
    vals, ids = vals.gather(-1, by_id.indices), by_id.values
    by_val = torch.sort(vals, dim=-1, descending=True, stable=True)
    return by_val.values, ids.gather(-1, by_val.indices)


def _order(*keys):
    """Indices sorting by several keys (the first most significant), each ascending, stable."""
    order = None
    for key in reversed(keys):
        key = key if order is None else key[order]
        step = torch.sort(key, stable=True).indices
        order = step if order is None else order[step]
    return order


def build_chain(top_ids, anchor, length=None, mode=0):
    """The argmax path of one mode: top_ids [L, >=1] -> DraftTree with min(L, length) nodes."""
    depth = top_ids.shape[0] if length is None else min(length, top_ids.shape[0])
    device = top_ids.device
    tokens = torch.cat([torch.as_tensor([anchor], device=device), top_ids[:depth, 0]])
    steps = torch.arange(depth + 1, device=device)
    return DraftTree(
        tokens=tokens,
        parents=steps - 1,
        depths=steps,
        scores=torch.zeros(depth + 1, dtype=torch.int64, device=device),
        modes=torch.where(steps == 0, -1, mode),
    )


def build_mixture_tree(top_scores, top_ids, budget, anchor, vocab_size, max_depth=None):
    """The exact top-``budget`` prefixes over all modes, each scored by its best mode.

    top_scores [M, L, C] int64 (quantised, from ``top_candidates``), top_ids [M, L, C]: each
    mode's best C >= min(budget, V) tokens per position, best first. With M = 1 this is the
    product tree (DDTree). Returns a DraftTree in DFS preorder, best child first.
    """
    m, length, c = top_scores.shape
    device = top_scores.device
    if max_depth is not None:
        length = min(length, max_depth)
    width = min(budget, c)
    cells_i = torch.arange(budget, device=device)[:, None]
    cells_j = torch.arange(width, device=device)[None, :]
    useful = (cells_i + 1) * (cells_j + 1) <= budget  # [budget, width]

    levels = []  # per depth: (uids [U], parent_uids [U], tokens [U], mix score [U], best mode [U])
    beam_score = torch.zeros(m, 1, dtype=torch.int64, device=device)
    beam_uid = torch.zeros(m, 1, dtype=torch.int64, device=device)  # the root
    for d in range(length):
        w_prev = beam_score.shape[1]
        score = beam_score[:, :, None] + top_scores[:, d, None, :width]  # [M, Wp, W]
        key = beam_uid[:, :, None] * vocab_size + top_ids[:, d, None, :width]
        valid = useful[:w_prev].expand(m, w_prev, width).reshape(m, -1)
        score, key = score.reshape(m, -1), key.reshape(m, -1)
        n_keep = min(budget, int(useful[:w_prev].sum()))
        # per mode: valid cells first, then score descending, then key (lexicographic) ascending
        cells = score.shape[1]
        mode_of_cell = torch.arange(m, device=device)[:, None].expand(m, cells)
        flat = _order(mode_of_cell.reshape(-1), (~valid).reshape(-1), -score.reshape(-1), key.reshape(-1))
        rank = (flat.reshape(m, cells) - mode_of_cell * cells)[:, :n_keep]
        beam_score, beam_key = score.gather(1, rank), key.gather(1, rank)
        # union over modes; uids are assigned in key order, i.e. lexicographic order at this depth
        uniq, inverse = torch.unique(beam_key.reshape(-1), sorted=True, return_inverse=True)
        mix = torch.full((uniq.shape[0],), torch.iinfo(torch.int64).min, dtype=torch.int64, device=device)
        mix = mix.scatter_reduce(0, inverse, beam_score.reshape(-1), reduce="amax")
        mode_of = torch.arange(m, device=device)[:, None].expand(m, n_keep).reshape(-1)
        is_best = beam_score.reshape(-1) == mix[inverse]
        best_mode = torch.full_like(mix, m).scatter_reduce(
            0, inverse, torch.where(is_best, mode_of, torch.full_like(mode_of, m)), reduce="amin"
        )
        levels.append((uniq // vocab_size, uniq % vocab_size, mix, best_mode))
        beam_uid = inverse.reshape(m, n_keep)

    # global top-B over all depths: score descending, then depth, then lexicographic (uid)
    depth_of = torch.cat([torch.full_like(lv[2], d + 1) for d, lv in enumerate(levels)])
    uid_of = torch.cat([torch.arange(lv[2].shape[0], device=device) for lv in levels])
    parent_uid = torch.cat([lv[0] for lv in levels])
    token_of = torch.cat([lv[1] for lv in levels])
    score_of = torch.cat([lv[2] for lv in levels])
    mode_best = torch.cat([lv[3] for lv in levels])
    chosen = _order(-score_of, depth_of, uid_of)[:budget]
    return _preorder_layout(
        depth_of[chosen], uid_of[chosen], parent_uid[chosen], token_of[chosen], score_of[chosen],
        mode_best[chosen], anchor,
    )


def _preorder_layout(depth, uid, parent_uid, token, score, mode, anchor):
    """Selected prefixes (in rank order: best first) -> DraftTree in DFS preorder."""
    n = depth.shape[0]
    device = depth.device
    max_depth = int(depth.max()) if n else 0
    # parent rank: the selected node at depth-1 whose uid is parent_uid (-1 for the root)
    parent_rank = torch.full((n,), -1, dtype=torch.int64, device=device)
    for d in range(2, max_depth + 1):
        at_d, above = depth == d, (depth == d - 1).nonzero().flatten()
        lookup = torch.full((int(uid[above].max()) + 1,), -1, dtype=torch.int64, device=device)
        lookup[uid[above]] = above
        parent_rank[at_d] = lookup[parent_uid[at_d]]
    # subtree sizes, bottom up
    size = torch.ones(n + 1, dtype=torch.int64, device=device)  # slot n is the root
    parent_slot = torch.where(parent_rank < 0, n, parent_rank)
    for d in range(max_depth, 0, -1):
        at_d = (depth == d).nonzero().flatten()
        size.index_add_(0, parent_slot[at_d], size[at_d])
    # siblings in rank order (= best first); each child's offset = sizes of the siblings before it
    order = _order(parent_slot, torch.arange(n, device=device))
    sizes_sorted = size[order]
    cum = torch.cumsum(sizes_sorted, 0) - sizes_sorted
    group_start = torch.zeros(n + 1, dtype=torch.int64, device=device)
    firsts = torch.ones(n, dtype=torch.bool, device=device)
    firsts[1:] = parent_slot[order][1:] != parent_slot[order][:-1]
    group_start.scatter_(0, parent_slot[order][firsts], cum[firsts])
    before = torch.empty(n, dtype=torch.int64, device=device)
    before[order] = cum - group_start[parent_slot[order]]
    # preorder positions, top down
    pos = torch.zeros(n + 1, dtype=torch.int64, device=device)  # root at 0
    for d in range(1, max_depth + 1):
        at_d = (depth == d).nonzero().flatten()
        pos[at_d] = pos[parent_slot[at_d]] + 1 + before[at_d]
    node = pos[:n]
    tokens = torch.empty(n + 1, dtype=torch.int64, device=device)
    tokens[0], tokens[node] = anchor, token
    parents = torch.empty_like(tokens)
    parents[0], parents[node] = -1, pos[parent_slot]
    depths = torch.zeros_like(tokens)
    depths[node] = depth
    scores = torch.zeros_like(tokens)
    scores[node] = score
    modes = torch.full_like(tokens, -1)
    modes[node] = mode
    return DraftTree(tokens=tokens, parents=parents, depths=depths, scores=scores, modes=modes)
