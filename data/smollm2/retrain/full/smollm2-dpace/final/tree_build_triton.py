# mfd-hub remote code 0.1.0, generated from kernels/tree_build_triton.py; edit the source, not this copy.
"""Triton kernels for the draft tree: vocabulary top-k and the exact mixture tree, on the device.

They equal the torch references in ``tree_build.py`` bit for bit and never synchronise with the
host (every output size follows from the shapes). Selection sorts packed int64 keys
(``tl.topk``; up to 128 entries a pairwise rank, which triton's interpreter runs fast).

Candidates (``top_candidates_triton``): the quantised score of a token is exactly the
reference's (``round(max(logit - lse, -1024) * 2^32)``, half to even); the key
``(-score) << 19 | id`` sorts best first with ties to the smaller id. One program per (row,
vocabulary chunk) keeps its chunk's best keys; one program per row merges the chunks.

Tree (``build_mixture_tree_triton``):
1. One program per mode runs the beam of width B over the depths. Cell (i, j) extends beam entry
   i with candidate j; only cells with (i+1)(j+1) <= B can rank in the top B (both lists are
   sorted), so the kernel sorts those (645 for B=128) by ``score << 16 | parent lex << 8 | j``:
   equal scores go by the parent's lexicographic rank in the beam, then by j (candidates are
   sorted by score, then id, so equal scores under one parent are in id order). It then keeps
   the mode's own top B over all depths (its product tree).
2. One program merges the modes: the M*B prefixes (token paths packed 3 x 20 bits per word) are
   sorted by (path, score, mode), the first of each path keeps its best score and mode, the
   global top B is taken by ``score << 16 | depth << 12 | lexicographic rank``, and the layout
   is computed with B x B pairwise tests: in lexicographic order a subtree is contiguous, which
   gives ancestors and subtree sizes; a node's DFS-preorder position (children best first) is
   its depth plus the sizes of the better siblings of all its ancestors-or-self.
Limits (else ``tree_build.draft_tree`` uses the reference): B <= 256, at most 15 positions,
M <= 256, M * B <= 4096, vocabulary < 2^19.

This file is part of the remote-code bundle: torch only (triton through ``backend``).
"""

import torch

from .backend import INTERPRETED, next_power_of_2, tl, triton
from .tree_format import LOGPROB_FLOOR, NEG_SCORE, SCORE_SCALE, DraftTree

ID_BITS = 19  # token ids in candidate keys
TOKEN_BITS = 20  # (token id + 1) in packed paths: 3 per int64 word
MAX_BUDGET = 256
MAX_DEPTH = 15
MAX_ENTRIES = 4096
VOCAB_CHUNK = 4096
WARPS = {"chunk": 4, "merge": 8, "beams": 8, "modes": 8}  # per kernel, for the large tiles


def candidates_kernel_supports(vocab_size):
    """Token ids must fit the candidate keys."""
    return vocab_size < 2**ID_BITS


def tree_kernel_supports(num_modes, length, budget, vocab_size):
    """Can the Triton tree build take this shape? (the packed keys' bit budget)"""
    b_pad = next_power_of_2(min(budget, MAX_BUDGET))
    return (
        budget <= MAX_BUDGET
        and num_modes <= 256  # the mode index breaks ties in 8 bits
        and length <= MAX_DEPTH
        and next_power_of_2(num_modes) * b_pad <= MAX_ENTRIES
        and candidates_kernel_supports(vocab_size)
    )


if triton is not None:
    _KEY_MAX = tl.constexpr(2**63 - 1)
    _NEG_SCORE = tl.constexpr(NEG_SCORE)
    _SCALE = tl.constexpr(SCORE_SCALE)
    _FLOOR = tl.constexpr(LOGPROB_FLOOR)
    _ID_BITS = tl.constexpr(ID_BITS)
    _ID_MASK = tl.constexpr(2**ID_BITS - 1)
    _TOKEN_BITS = tl.constexpr(TOKEN_BITS)

    @triton.jit
    def _sorted_prefix(x, tmp_ptr, K: tl.constexpr, LOG_N: tl.constexpr):
        """The K smallest of x [2^LOG_N], ascending. Up to 128 entries: each entry's rank (a
        pairwise count) places it in the scratch ``tmp_ptr`` [2^LOG_N]; above: ``tl.topk``."""
        N: tl.constexpr = x.shape[0]
        if LOG_N <= 7:
            i = tl.arange(0, N)
            before = (x[None, :] < x[:, None]) | ((x[None, :] == x[:, None]) & (i[None, :] < i[:, None]))
            tl.store(tmp_ptr + tl.sum(before.to(tl.int32), axis=1), x)
            tl.debug_barrier()
            return tl.load(tmp_ptr + tl.arange(0, K))
        else:
            return tl.topk(x, K, descending=False)

    @triton.jit
    def _candidate_key(x, lse, ids):
        """(-quantised log-probability) << ID_BITS | id: ascending = best first, ties to small id."""
        lp = x - lse
        finite = (lp == lp) & (lp != float("inf")) & (lp != float("-inf"))
        v = tl.maximum(tl.where(finite, lp, 0.0), _FLOOR) * _SCALE  # exact: a power-of-two scale
        f = tl.floor(v)
        frac = v - f
        half = f * 0.5
        odd = half != tl.floor(half)
        up = (frac > 0.5) | ((frac == 0.5) & odd)  # round half to even, as torch.round
        q = f.to(tl.int64) + up.to(tl.int64)
        q = tl.where(finite, q, _NEG_SCORE)
        return ((-q) << _ID_BITS) | ids.to(tl.int64)

    @triton.jit
    def _vocab_chunk_kernel(
        logits_ptr, lse_ptr, keys_ptr, n_rows, vocab, row_stride,
        ROWS: tl.constexpr, CHUNK: tl.constexpr, KEEP: tl.constexpr,
    ):
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
        n_chunks = tl.num_programs(1)
        rows = pid_r * ROWS + tl.arange(0, ROWS)[:, None]
        cols = pid_c * CHUNK + tl.arange(0, CHUNK)[None, :]
        in_row = rows < n_rows
        valid = in_row & (cols < vocab)
        x = tl.load(logits_ptr + rows.to(tl.int64) * row_stride + cols, mask=valid, other=0.0).to(tl.float32)
        lse = tl.load(lse_ptr + rows, mask=in_row, other=0.0)
        key = tl.where(valid, _candidate_key(x, lse, cols), _KEY_MAX)
        best = tl.topk(key, KEEP, descending=False)  # the chunk's KEEP best keys, best first
        slot = tl.arange(0, KEEP)[None, :]
        tl.store(keys_ptr + (rows.to(tl.int64) * n_chunks + pid_c) * KEEP + slot, best, mask=in_row)

    @triton.jit
    def _vocab_merge_kernel(
        keys_ptr, scores_ptr, ids_ptr, n_rows, n_keys, n_out,
        ROWS: tl.constexpr, MERGE: tl.constexpr, OUT_PAD: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
        cols = tl.arange(0, MERGE)[None, :]
        in_row = rows < n_rows
        key = tl.load(keys_ptr + rows.to(tl.int64) * n_keys + cols, mask=in_row & (cols < n_keys), other=_KEY_MAX)
        key = tl.topk(key, OUT_PAD, descending=False)
        cols = tl.arange(0, OUT_PAD)[None, :]
        keep = in_row & (cols < n_out)
        tl.store(scores_ptr + rows * n_out + cols, -(key >> _ID_BITS), mask=keep)
        tl.store(ids_ptr + rows * n_out + cols, key & _ID_MASK, mask=keep)

    @triton.jit
    def _mode_beams_kernel(
        scores_ptr, ids_ptr, cell_i_ptr, cell_j_ptr, n_cells, length, width, budget,
        sort_tmp, slot_tmp, words_tmp, tokens_tmp, keys_tmp, out_s, out_depth, out_token, out_words,
        B_PAD: tl.constexpr, C_PAD: tl.constexpr, CELLS_PAD: tl.constexpr, LOG_CELLS: tl.constexpr,
        L_PAD: tl.constexpr, LOG_ALL: tl.constexpr, NW: tl.constexpr,
    ):
        """One mode: beam of width B over the depths, then the mode's own top B.

        Scratch (per mode, per depth, so no write ever races a read): sort_tmp for sorting,
        slot_tmp[lex] = beam slot, words_tmp/tokens_tmp[depth, lex], keys_tmp[depth, slot].
        """
        k = tl.program_id(0)
        ALL: tl.constexpr = L_PAD * B_PAD
        SORT_STRIDE: tl.constexpr = L_PAD * CELLS_PAD + ALL
        slot = tl.arange(0, B_PAD)
        cslot = tl.arange(0, C_PAD)
        wcol = tl.arange(0, NW)[None, :]
        cell = tl.arange(0, CELLS_PAD)
        in_table = cell < n_cells
        ci = tl.load(cell_i_ptr + cell, mask=in_table, other=0)
        cj = tl.load(cell_j_ptr + cell, mask=in_table, other=0)
        # the beam, root only at first: -score (>= 0; _KEY_MAX = empty), lexicographic rank, path
        beam_s = tl.where(slot == 0, 0, _KEY_MAX).to(tl.int64)
        beam_lex = tl.zeros([B_PAD], dtype=tl.int64)
        beam_words = tl.zeros([B_PAD, NW], dtype=tl.int64)
        tl.store(slot_tmp + k * (L_PAD + 1) * B_PAD + slot, slot, mask=slot == 0)
        tl.debug_barrier()
        for d in range(0, length):
            row = (k * length + d) * width
            c_s = -tl.load(scores_ptr + row + cslot, mask=cslot < width, other=0)
            c_id = tl.load(ids_ptr + row + cslot, mask=cslot < width, other=0)
            parent_s = tl.gather(beam_s, ci, 0)
            ok = in_table & (cj < width) & (parent_s != _KEY_MAX)
            # equal scores: the parent's lexicographic rank, then the candidate's rank j (sorted
            # by score then id, so among equal scores j follows the id)
            key = ((parent_s + tl.gather(c_s, cj, 0)) << 16) | (tl.gather(beam_lex, ci, 0) << 8) | cj
            key = tl.where(ok, key, _KEY_MAX)
            top = _sorted_prefix(key, sort_tmp + k * SORT_STRIDE + d * CELLS_PAD, B_PAD, LOG_CELLS)
            kept = (top != _KEY_MAX) & (slot < budget)
            lex_parent = (top >> 8) & 255
            parent = tl.load(slot_tmp + (k * (L_PAD + 1) + d) * B_PAD + lex_parent, mask=kept, other=0)
            token = tl.gather(c_id, tl.where(kept, top & 255, 0).to(tl.int32), 0)
            words = tl.gather(beam_words, parent[:, None] + tl.zeros([B_PAD, NW], dtype=tl.int32), 0)
            shift = (2 - d % 3) * _TOKEN_BITS
            words = tl.where(wcol == d // 3, words | ((token + 1)[:, None] << shift), words)
            # lexicographic rank in the new beam: by (parent's rank, token)
            lex_key = (lex_parent << _TOKEN_BITS) | token
            lex = tl.sum(((lex_key[None, :] < lex_key[:, None]) & kept[None, :]).to(tl.int64), axis=1)
            tl.store(slot_tmp + (k * (L_PAD + 1) + d + 1) * B_PAD + lex, slot, mask=kept)
            at = (k * L_PAD + d) * B_PAD + lex
            tl.store(words_tmp + at[:, None] * NW + wcol, words, mask=kept[:, None])
            tl.store(tokens_tmp + at, token, mask=kept)
            s_new = top >> 16
            all_key = (s_new << 16) | ((d + 1) << 8) | lex
            tl.store(keys_tmp + (k * L_PAD + d) * B_PAD + slot, tl.where(kept, all_key, _KEY_MAX))
            beam_s = tl.where(kept, s_new, _KEY_MAX)
            beam_lex = lex
            beam_words = words
            tl.debug_barrier()
        # the mode's own top B over all depths: (score, depth, lexicographic rank)
        e = tl.arange(0, ALL)
        keys = tl.load(keys_tmp + k * ALL + e, mask=e < length * B_PAD, other=_KEY_MAX)
        best = _sorted_prefix(keys, sort_tmp + k * SORT_STRIDE + L_PAD * CELLS_PAD, B_PAD, LOG_ALL)
        ok = (best != _KEY_MAX) & (slot < budget)
        depth = (best >> 8) & 255
        at = (k * L_PAD + depth - 1) * B_PAD + (best & 255)
        words = tl.load(words_tmp + at[:, None] * NW + wcol, mask=ok[:, None], other=0)
        out = k * B_PAD + slot
        tl.store(out_s + out, tl.where(ok, best >> 16, _KEY_MAX))
        tl.store(out_depth + out, tl.where(ok, depth, 0))
        tl.store(out_token + out, tl.load(tokens_tmp + at, mask=ok, other=0))
        tl.store(out_words + out[:, None] * NW + wcol, words)

    @triton.jit
    def _precedes(words, key2, idx, other_w, other_k, other_i, AXIS: tl.constexpr):
        """Does entry ``other`` come before entry ``self`` in (path, key2, idx) order?
        words/other_w [..., NW] (the words along AXIS) broadcast together; the rest [...]."""
        diff = other_w != words
        first_diff = diff & (tl.cumsum(diff.to(tl.int32), axis=AXIS) == 1)
        w_less = tl.sum((first_diff & (other_w < words)).to(tl.int32), axis=AXIS) > 0
        w_same = tl.sum(diff.to(tl.int32), axis=AXIS) == 0
        return w_less | (w_same & ((other_k < key2) | ((other_k == key2) & (other_i < idx))))

    @triton.jit
    def _sort_by_path(words, key2, idx, tmp_ptr, LOG_N: tl.constexpr):
        """Sort entries by (packed path words lexicographically, key2, idx) ascending (scratch
        ``tmp_ptr`` [2^LOG_N] for the small path)."""
        N: tl.constexpr = words.shape[0]
        NW: tl.constexpr = words.shape[1]
        if LOG_N <= 7:
            before = _precedes(
                words[:, None, :], key2[:, None], idx[:, None], words[None, :, :], key2[None, :], idx[None, :], 2
            )
            tl.store(tmp_ptr + tl.sum(before.to(tl.int32), axis=1), tl.arange(0, N))
            tl.debug_barrier()
            order = tl.load(tmp_ptr + tl.arange(0, N))
            words = tl.gather(words, order[:, None] + tl.zeros([N, NW], dtype=tl.int32), 0)
            key2 = tl.gather(key2, order, 0)
            idx = tl.gather(idx, order, 0)
        else:
            pos = tl.arange(0, N)
            for stage in range(1, LOG_N + 1):  # a bitonic network (runtime loops: a small program)
                for step in range(0, stage):
                    dist = 1 << (stage - 1 - step)
                    partner = pos ^ dist
                    other_w = tl.gather(words, partner[:, None] + tl.zeros([N, NW], dtype=tl.int32), 0)
                    other_k = tl.gather(key2, partner, 0)
                    other_i = tl.gather(idx, partner, 0)
                    other_first = _precedes(words, key2, idx, other_w, other_k, other_i, 1)
                    ascending = ((pos >> stage) & 1) == 0
                    low = (pos & dist) == 0
                    take = other_first == (low == ascending)
                    words = tl.where(take[:, None], other_w, words)
                    key2 = tl.where(take, other_k, key2)
                    idx = tl.where(take, other_i, idx)
        return words, key2, idx

    @triton.jit
    def _merge_modes_kernel(
        ent_s, ent_depth, ent_token, ent_words, n_entries, n_nodes, anchor, tmp,
        tokens_out, parents_out, depths_out, scores_out, modes_out,
        E_PAD: tl.constexpr, LOG_E: tl.constexpr, B_PAD: tl.constexpr, NW: tl.constexpr,
    ):
        """Union of the modes' top-B lists, global top B, DFS-preorder layout."""
        e = tl.arange(0, E_PAD)
        wcol = tl.arange(0, NW)[None, :]
        s = tl.load(ent_s + e, mask=e < n_entries, other=_KEY_MAX)
        valid = s != _KEY_MAX
        words = tl.load(ent_words + e[:, None] * NW + wcol, mask=valid[:, None], other=_KEY_MAX)
        key2 = tl.where(valid, (s << 8) | (e // B_PAD), _KEY_MAX)
        words, key2, idx = _sort_by_path(words, key2, e, tmp, LOG_E)
        # the first entry of each path carries its best score and (smallest) best mode
        prev = tl.gather(words, tl.maximum(e - 1, 0)[:, None] + tl.zeros([E_PAD, NW], dtype=tl.int32), 0)
        new_path = (e == 0) | (tl.sum((prev != words).to(tl.int32), axis=1) > 0)
        first = new_path & (key2 != _KEY_MAX)
        lex = tl.cumsum(first.to(tl.int64), axis=0) - 1
        depth = tl.load(ent_depth + idx, mask=first, other=0)
        gkey = tl.where(first, ((key2 >> 8) << 16) | (depth << 12) | lex, _KEY_MAX)
        tl.store(tmp + E_PAD + lex, e, mask=first)
        tl.debug_barrier()
        sel = _sorted_prefix(gkey, tmp + 2 * E_PAD, B_PAD, LOG_E)
        slot = tl.arange(0, B_PAD)
        ok = slot < n_nodes
        d = tl.where(ok, (sel >> 12) & 15, 0)
        lex_s = tl.where(ok, sel & 4095, 0)
        at = tl.load(tmp + E_PAD + lex_s, mask=ok, other=0)
        token = tl.load(ent_token + tl.gather(idx, at, 0), mask=ok, other=0)
        mode = tl.gather(key2, at, 0) & 255
        # layout: in lexicographic order a subtree is contiguous and ends at the next node that
        # is no deeper than its root
        BIG: tl.constexpr = 1 << 30
        later = ok[None, :] & (lex_s[None, :] > lex_s[:, None]) & (d[None, :] <= d[:, None])
        end = tl.min(tl.where(later, lex_s[None, :], BIG), axis=1)
        anc = ok[:, None] & ok[None, :] & (lex_s[None, :] <= lex_s[:, None]) & (lex_s[:, None] < end[None, :])
        size = tl.sum(anc.to(tl.int64), axis=0)
        parent = tl.sum(tl.where(anc & (d[None, :] == d[:, None] - 1), slot[None, :], 0), axis=1)
        parent = tl.where(d > 1, parent, -1)
        better_sibling = (parent[None, :] == parent[:, None]) & (slot[None, :] < slot[:, None]) & ok[None, :]
        before = tl.sum(tl.where(better_sibling, size[None, :], 0), axis=1)
        pos = d + tl.sum(tl.where(anc, before[None, :], 0), axis=1)
        parent_pos = tl.sum(tl.where(slot[None, :] == parent[:, None], pos[None, :], 0), axis=1)
        tl.store(tokens_out + pos, token, mask=ok)
        tl.store(parents_out + pos, parent_pos, mask=ok)
        tl.store(depths_out + pos, d, mask=ok)
        tl.store(scores_out + pos, -(sel >> 16), mask=ok)
        tl.store(modes_out + pos, mode, mask=ok)
        root = slot == 0
        tl.store(tokens_out + slot, tl.zeros([B_PAD], dtype=tl.int64) + anchor, mask=root)
        tl.store(parents_out + slot, tl.full([B_PAD], -1, tl.int64), mask=root)
        tl.store(depths_out + slot, tl.zeros([B_PAD], dtype=tl.int64), mask=root)
        tl.store(scores_out + slot, tl.zeros([B_PAD], dtype=tl.int64), mask=root)
        tl.store(modes_out + slot, tl.full([B_PAD], -1, tl.int64), mask=root)


def _rows_per_program(rows):
    # the interpreter pays per operation, not per element: batch every row into one program
    return next_power_of_2(rows) if INTERPRETED else 1


def top_candidates_triton(logits, lse, k):
    """``top_candidates(logits, k, lse)`` in Triton -> (int64 scores, ids), each [..., min(k, V)]."""
    vocab = logits.shape[-1]
    if not candidates_kernel_supports(vocab):
        raise ValueError(f"the Triton top-k packs token ids in {ID_BITS} bits; vocabulary {vocab} is too large")
    lead = logits.shape[:-1]
    x = logits.reshape(-1, vocab)
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows = x.shape[0]
    n_out = min(k, vocab)
    keep = next_power_of_2(n_out)
    chunk = max(keep, min(VOCAB_CHUNK, next_power_of_2(vocab)))
    n_chunks = triton.cdiv(vocab, chunk)
    block_rows = _rows_per_program(rows)
    keys = torch.empty(rows, n_chunks * keep, dtype=torch.int64, device=x.device)
    _vocab_chunk_kernel[(triton.cdiv(rows, block_rows), n_chunks)](
        x, lse.reshape(-1).float().contiguous(), keys, rows, vocab, x.stride(0),
        ROWS=block_rows, CHUNK=chunk, KEEP=keep, num_warps=WARPS["chunk"],
    )
    scores = torch.empty(rows, n_out, dtype=torch.int64, device=x.device)
    ids = torch.empty(rows, n_out, dtype=torch.int64, device=x.device)
    merge = next_power_of_2(n_chunks * keep)
    _vocab_merge_kernel[(triton.cdiv(rows, block_rows),)](
        keys, scores, ids, rows, n_chunks * keep, n_out,
        ROWS=block_rows, MERGE=merge, OUT_PAD=keep, num_warps=WARPS["merge"],
    )
    return scores.reshape(*lead, n_out), ids.reshape(*lead, n_out)


_CELL_TABLES = {}


def _cell_table(budget, width, device):
    """The beam cells (i, j) with (i+1)(j+1) <= budget, built once per shape and device."""
    key = (budget, width, str(device))
    if key not in _CELL_TABLES:
        cells = [(i, j) for j in range(width) for i in range(budget // (j + 1))]
        table = torch.tensor(cells, dtype=torch.int32).t().contiguous()
        _CELL_TABLES[key] = table.to(device)
    return _CELL_TABLES[key]


def tree_size(length, width, budget):
    """Nodes of the tree (root excluded): min(budget, number of prefixes of <= length tokens)."""
    total, level = 0, 1
    for _ in range(length):
        level *= width
        total += level
        if total >= budget:
            return budget
    return total


def build_mixture_tree_triton(top_scores, top_ids, budget, anchor):
    """``build_mixture_tree`` in Triton (same arguments, the same DraftTree; token ids < 2^19)."""
    m, length, c = top_scores.shape
    width = min(budget, c)
    if not tree_kernel_supports(m, length, budget, 0):
        raise ValueError(f"the Triton tree build supports B <= {MAX_BUDGET}, <= {MAX_DEPTH} positions, M*B <= {MAX_ENTRIES}")
    device = top_scores.device
    n = tree_size(length, width, budget)
    fields = torch.empty(5, n + 1, dtype=torch.int64, device=device)
    if n == 0:
        fields[:, 0] = torch.tensor([anchor, -1, 0, 0, -1])
        return DraftTree(*fields)
    scores = top_scores[:, :length, :width].contiguous()
    ids = top_ids[:, :length, :width].to(torch.int64).contiguous()
    b_pad, c_pad, l_pad = next_power_of_2(budget), next_power_of_2(width), next_power_of_2(length)
    n_words = next_power_of_2((length + 2) // 3)
    cells = _cell_table(budget, width, device)
    cells_pad = next_power_of_2(cells.shape[1])
    i64 = dict(dtype=torch.int64, device=device)
    sort_tmp = torch.empty(m * l_pad * (cells_pad + b_pad), **i64)
    slot_tmp = torch.empty(m * (l_pad + 1) * b_pad, **i64)
    words_tmp = torch.empty(m * l_pad * b_pad * n_words, **i64)
    tokens_tmp = torch.empty(m * l_pad * b_pad, **i64)
    keys_tmp = torch.empty(m * l_pad * b_pad, **i64)
    m_pad = next_power_of_2(m)
    ent_s = torch.full((m_pad * b_pad,), 2**63 - 1, **i64)
    ent_depth = torch.empty(m_pad * b_pad, **i64)
    ent_token = torch.empty(m_pad * b_pad, **i64)
    ent_words = torch.empty(m_pad * b_pad * n_words, **i64)
    _mode_beams_kernel[(m,)](
        scores, ids, cells[0], cells[1], cells.shape[1], length, width, budget,
        sort_tmp, slot_tmp, words_tmp, tokens_tmp, keys_tmp, ent_s, ent_depth, ent_token, ent_words,
        B_PAD=b_pad, C_PAD=c_pad, CELLS_PAD=cells_pad, LOG_CELLS=cells_pad.bit_length() - 1,
        L_PAD=l_pad, LOG_ALL=(l_pad * b_pad).bit_length() - 1, NW=n_words, num_warps=WARPS["beams"],
    )
    e_pad = m_pad * b_pad
    merge_tmp = torch.empty(3 * e_pad, **i64)
    _merge_modes_kernel[(1,)](
        ent_s, ent_depth, ent_token, ent_words, m * b_pad, n, anchor, merge_tmp,
        fields[0], fields[1], fields[2], fields[3], fields[4],
        E_PAD=e_pad, LOG_E=e_pad.bit_length() - 1, B_PAD=b_pad, NW=n_words, num_warps=WARPS["modes"],
    )
    return DraftTree(*fields)
