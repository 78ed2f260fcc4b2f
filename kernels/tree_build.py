"""Draft trees from per-position draft distributions: chain, product tree, exact mixture tree.

Scores. A prefix y_1..y_d drafted by mode k scores sum_d log p_{k,d}(y_d); the mixture scores a
prefix by its best mode. Log-probabilities are quantised to integers (``quantize_logprobs``:
fixed point, 2^-32 nats, floored at -1024 nats) so that sums are exact: the ordering is then a
true total order, ties are reproducible, and every bound below holds bit for bit. The floor keeps
a score of 15 positions inside 47 bits, which the Triton kernels pack into one int64 sort key
(a log-probability below -1024 nats is exactly zero probability in any float format).

Order. Prefix a ranks before b when its score is higher; then when it is shallower; then when
its token sequence is lexicographically smaller (token ids); a prefix's best mode is the smallest
mode index reaching its score. Scores only fall along a path, so the top-B set is prefix-closed.

Exactness. Each position's candidate list is sorted (score desc, id asc), so within one mode a
prefix's next sibling (its last token's next candidate) and its first child both rank after it:
a best-first search that pops the best frontier entry and pushes those two enumerates the mode's
prefixes exactly in order (the product tree, DDTree). A prefix in the mixture's top-B is in the
top-B of its best mode, so merging the K per-mode searches into one heap and keeping the first
occurrence of each prefix yields the mixture's top-B with the best score and mode of each
(``build_mixture_tree``, the reference and the CPU path). The Triton kernels run per-mode beams
of width B over the depths instead (a depth-d member of the top-B extends a depth-(d-1) member;
as both lists are sorted only cells with (i+1)(j+1) <= B can enter), then the union and the
global top-B; both equal a brute-force enumeration.

Layout. Node 0 is the root (the anchor token, depth 0). The B nodes follow in DFS preorder with
the best child first, so parents precede children and the main spine is 0, 1, 2, ...

This file is part of the remote-code bundle: torch only.
"""

import heapq
from array import array

import torch

from .backend import use_triton
from .tree_format import LOGPROB_FLOOR, NEG_SCORE, SCORE_SCALE, DraftTree

def quantize_logprobs(logprobs):
    """float log-probabilities -> int64 fixed point (exact sums, -inf -> NEG_SCORE).

    Monotone: a > b implies q(a) >= q(b). int64 input is returned as is.
    """
    if logprobs.dtype == torch.int64:
        return logprobs
    lp = logprobs.float()
    q = torch.round(lp.clamp(min=LOGPROB_FLOOR) * SCORE_SCALE).to(torch.int64)
    return torch.where(torch.isfinite(lp), q, torch.full_like(q, NEG_SCORE))


def top_candidates(logits, k, lse=None):
    """The k best tokens of each position in quantised score, best first, ties to the smaller id.

    logits [..., V]: log-probabilities (float or quantised int64), or raw logits with their
    log-normaliser ``lse`` [...] (then the log-probability is ``logit - lse`` in float32, and
    no vocabulary-wide log_softmax is needed). -> (int64 scores, ids), each [..., min(k, V)].
    Only the float top-(k+1) is quantised; when a quantised tie straddles the cut (the k-th and the
    (k+1)-th score are equal), the top-2(k+1), then twice that, ... until the last one taken ranks
    strictly below the k-th: the score is monotone in the logit, so every token tied with the k-th
    is then among those taken, and ordering them by (score, id) gives the exact top-k.
    """
    v = logits.shape[-1]
    k = min(k, v)
    if k >= v:
        ids = torch.arange(v, device=logits.device).expand(logits.shape)
        return _order_ties(_scores_of(logits, lse), ids, k)
    rows = logits.reshape(-1, v)
    # 16-bit logits (8 or 11 significant bits) tie often: a third of bf16 rows straddle the cut at
    # k + 1, almost none at 1.5 k, which costs a few percent more than k + 1 in one top-k
    take = min(v, k + 1 + (k // 2 if logits.element_size() == 2 else 0))
    scores, ids = _exact_top_rows(rows, None if lse is None else lse.reshape(-1), k, take)
    return scores.reshape(*logits.shape[:-1], k), ids.reshape(*logits.shape[:-1], k)


def _scores_of(values, lse):
    return quantize_logprobs(values if lse is None else values.float() - lse[..., None])


def _exact_top_rows(rows, lse, k, take):
    """``top_candidates`` of rows [R, V] from their float top-``take``. A row whose quantised tie
    straddles the cut (its last score taken equals its k-th: common with bf16 logits, 8 significant
    bits) is redone alone with twice as many, until the last one taken ranks strictly below the
    k-th: the score is monotone in the logit, so every token tied with the k-th is then taken. Only
    those rows pay for the larger top-k (with K modes the rows are many and few straddle)."""
    v = rows.shape[-1]
    vals, ids = _top_values(rows, take)
    vals = _scores_of(vals, lse)
    scores, ids = _order_ties(vals, ids, k)
    if take < v:
        straddle = (vals[:, -1] >= vals[:, k - 1]).nonzero().flatten()
        if straddle.numel():
            redone = _exact_top_rows(rows[straddle], None if lse is None else lse[straddle], k, min(v, 2 * take))
            scores[straddle], ids[straddle] = redone
    return scores, ids


def _order_ties(vals, ids, k):
    """The k best of a taken set (vals, ids [..., n]) by (score desc, id asc): sort by id, then
    stably by score."""
    by_id = torch.sort(ids, dim=-1, stable=True)
    vals, ids = vals.gather(-1, by_id.indices), by_id.values
    by_val = torch.sort(vals, dim=-1, descending=True, stable=True)
    return by_val.values[..., :k], ids.gather(-1, by_val.indices[..., :k])


def _top_values(x, k, block=128):
    """The k largest values of each row of x [..., V], sorted, with their ids; like ``topk`` but
    faster on CPU for a large V: only the k blocks with the largest maxima can hold them (any
    other block's values are below k block maxima), so ``topk`` runs over k * block values.
    With ties the ids may differ from ``topk``'s, the values never do."""
    v = x.shape[-1]
    if v % block or v < 2 * k * block or x.device.type != "cpu":
        return x.topk(k, dim=-1, sorted=True)
    blocks = x.reshape(-1, v // block, block)
    rows = blocks.shape[0]
    chosen = blocks.amax(dim=-1).topk(k, dim=-1, sorted=False).indices
    candidates = blocks.gather(1, chosen[..., None].expand(rows, k, block)).reshape(rows, k * block)
    vals, at = candidates.topk(k, dim=-1, sorted=True)
    ids = chosen.gather(1, at // block) * block + at % block
    return vals.reshape(*x.shape[:-1], k), ids.reshape(*x.shape[:-1], k)


def log_normaliser(logits):
    """log sum exp of each row of logits [..., V] in float32. On CPU through the fused softmax
    (max - log(max softmax)), several times faster there than ``torch.logsumexp``."""
    x = logits.float()
    if x.device.type != "cpu":
        return torch.logsumexp(x, dim=-1)
    rows = x.reshape(-1, x.shape[-1])
    # a few MB of rows at a time: a softmax output as large as K x 15 rows of a 152K vocabulary
    # would cost page faults, while a small draft vocabulary takes every row in one call
    parts = [r.amax(dim=-1) - torch.softmax(r, dim=-1).amax(dim=-1).log() for r in rows.split(_rows_per_block(rows))]
    return torch.cat(parts).reshape(x.shape[:-1])


BLOCK_BYTES = 4 << 20  # rows handled in one call on CPU: a few MB stay in the cache across passes


def _rows_per_block(rows):
    return max(1, BLOCK_BYTES // (rows.shape[-1] * 4))


def draft_candidates(logits, k):
    """Each position's k best draft tokens from raw logits [..., V] -> (int64 scores, ids).

    Normalises with ``log_normaliser`` (the same for both backends, so they agree bit for bit),
    then selects with the Triton kernels on CUDA (vocabularies below 2^19) or ``top_candidates``
    (a few MB of rows at a time: each row block stays in the CPU's cache across the passes over it,
    and the K x positions rows of a small draft vocabulary cost one call, not one per 8 rows).
    """
    if use_triton(logits):
        from .tree_build_triton import candidates_kernel_supports, top_candidates_triton

        if candidates_kernel_supports(logits.shape[-1]):
            return top_candidates_triton(logits, log_normaliser(logits), k)
    rows = logits.reshape(-1, logits.shape[-1])
    parts = [top_candidates(block, k, log_normaliser(block)) for block in rows.split(_rows_per_block(rows))]
    scores, ids = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return scores.reshape(*logits.shape[:-1], -1), ids.reshape(*logits.shape[:-1], -1)


def build_chain(top_ids, anchor, length=None, mode=0, top_scores=None):
    """The argmax path of one mode: top_ids [L, >=1] -> DraftTree with min(L, length) nodes.

    top_scores [L, >=1] (quantised, as ``top_candidates`` gives them): each node's score is then
    its prefix score, as in the trees (the auto budget calibrates on it); without them, 0."""
    depth = top_ids.shape[0] if length is None else min(length, top_ids.shape[0])
    device = top_ids.device
    if top_scores is None:
        scores = torch.zeros(depth + 1, dtype=torch.int64, device=device)
    else:
        scores = torch.cat([torch.zeros(1, dtype=torch.int64, device=device),
                            torch.cumsum(top_scores[:depth, 0].to(torch.int64), dim=0)])
    # torch.full passes the anchor as a kernel argument: unlike a copy of a host list, no sync
    tokens = torch.cat([torch.full((1,), int(anchor), dtype=top_ids.dtype, device=device), top_ids[:depth, 0]])
    steps = torch.arange(depth + 1, device=device)
    return DraftTree(
        tokens=tokens,
        parents=steps - 1,
        depths=steps,
        scores=scores,
        modes=torch.where(steps == 0, -1, mode),
    )


def build_mixture_tree(top_scores, top_ids, budget, anchor, max_depth=None):
    """The exact top-``budget`` prefixes over all modes, each scored by its best mode.

    top_scores [M, L, C] int64 (quantised, from ``top_candidates``), top_ids [M, L, C]: each
    mode's best C >= min(budget, V) tokens per position, best first. With M = 1 this is the
    product tree (DDTree). Returns a DraftTree in DFS preorder, best child first.
    """
    m, length, c = top_scores.shape
    if max_depth is not None:
        length = min(length, max_depth)
    width = min(budget, c)
    if length == 0 or width == 0:
        return _preorder_tree([-1], [anchor], [0], [0], [-1], [[]], top_scores.device)
    # Python-side reads of single entries: a numpy view costs nothing, .tolist() would convert
    # all M*L*C values. Entry (mode k, position d, rank j) sits at ((k * length + d) * width + j).
    # Scores are read as floats: sums of 15 quantised scores stay below 2^47 in magnitude, so
    # float64 holds them and their sums exactly, and Python adds and compares floats faster.
    score_at = top_scores[:, :length, :width].detach().cpu().double().contiguous().numpy().reshape(-1).item
    token_at = top_ids[:, :length, :width].detach().cpu().contiguous().numpy().reshape(-1).item
    # heap entries: (-score, depth, tokens, row = k * length + depth - 1, rank j, parent's score,
    # parent's rank); tuple order is the total order, the mode (row) breaking exact ties of one prefix.
    heap = [(-score_at(k * length * width), 1, (token_at(k * length * width),), k * length, 0, 0, 0) for k in range(m)]
    heapq.heapify(heap)
    seen = {}  # prefix -> its rank among the kept prefixes, 1-based (the root is 0)
    # the kept prefixes in rank order (index 0: the root)
    parent, token, depth, score, mode, children = [-1], [anchor], [0], [0], [-1], [[]]
    pop, push = heapq.heappop, heapq.heappush
    while heap and len(token) <= budget:
        neg, d, toks, row, j, parent_score, p = pop(heap)
        r = seen.setdefault(toks, len(token))
        if r == len(token):  # the first pop of a prefix carries its best score and mode
            parent.append(p)
            token.append(toks[-1])
            depth.append(d)
            score.append(-neg)
            mode.append(row // length)
            children.append([])
            children[p].append(r)  # in rank order: best child first
        if j + 1 < width:  # next sibling in this mode
            at = row * width + j + 1
            push(heap, (-(parent_score + score_at(at)), d, toks[:-1] + (token_at(at),), row, j + 1, parent_score, p))
        if d < length:  # first child in this mode
            at = (row + 1) * width
            push(heap, (neg - score_at(at), d + 1, toks + (token_at(at),), row + 1, 0, -neg, r))
    return _preorder_tree(parent, token, depth, score, mode, children, top_scores.device)


def _preorder_tree(parent, token, depth, score, mode, children, device):
    """Nodes in rank order (root first) -> DraftTree in DFS preorder, children best first."""
    position = [0] * len(token) + [-1]  # position[-1]: the root's parent
    tokens, parents, depths, scores, modes = [], [], [], [], []
    stack = [0]
    while stack:  # a parent is visited before its children: its position is known
        r = stack.pop()
        position[r] = len(tokens)
        tokens.append(token[r])
        parents.append(position[parent[r]])
        depths.append(depth[r])
        scores.append(score[r])
        modes.append(mode[r])
        stack.extend(reversed(children[r]))
    flat = array("q", tokens)
    for field in (parents, depths, modes):
        flat.extend(field)
    tokens, parents, depths, modes = torch.frombuffer(flat, dtype=torch.int64).view(4, -1).to(device)
    scores = torch.frombuffer(array("d", scores), dtype=torch.float64).to(device=device, dtype=torch.int64)
    return DraftTree(tokens, parents, depths, scores, modes)


def draft_tree(top_scores, top_ids, budget, anchor, vocab_size):
    """``build_mixture_tree`` on the best available backend (the Triton kernels on CUDA).

    Both give the same tree; the Triton one never synchronises with the host (its size,
    min(budget, number of prefixes), follows from the shapes). Shapes beyond the kernels' packed
    keys (B > 256, more than 15 positions, M * B > 4096, vocabularies of 2^19 or more) use the
    reference.
    """
    if use_triton(top_scores):
        from .tree_build_triton import build_mixture_tree_triton, tree_kernel_supports

        if tree_kernel_supports(top_scores.shape[0], top_scores.shape[1], budget, vocab_size):
            return build_mixture_tree_triton(top_scores, top_ids, budget, anchor)
    return build_mixture_tree(top_scores, top_ids, budget, anchor)
