# mfd-hub remote code 0.1.0, generated from kernels/tree_attention_triton.py; edit the source, not this copy.
"""Triton kernels for the verify pass's attention pattern (references in ``tree_attention.py``).

``ancestor_mask_triton``: one program per block of rows walks each row's parent pointers up to
the root and marks the ancestors; ``verify_attention_bias_triton`` writes the additive bias
(prefix visible, tree part from the mask) in one pass. Neither synchronises with the host.

This file is part of the remote-code bundle: torch only (triton through ``backend``).
"""

import torch

from .backend import INTERPRETED, next_power_of_2, tl, triton

if triton is not None:

    @triton.jit
    def _ancestor_mask_kernel(parents_ptr, mask_ptr, n, steps, ROWS: tl.constexpr, N_PAD: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, N_PAD)
        in_rows = rows < n
        node = tl.where(in_rows, rows, -1)
        seen = cols[None, :] == node[:, None]
        for _ in range(steps):  # one generation up per step; the root's parent is -1
            node = tl.load(parents_ptr + node, mask=node >= 0, other=-1).to(tl.int32)
            seen = seen | ((cols[None, :] == node[:, None]) & (node[:, None] >= 0))
        out = mask_ptr + rows[:, None].to(tl.int64) * n + cols[None, :]
        tl.store(out, seen.to(tl.int8), mask=in_rows[:, None] & (cols[None, :] < n))

    @triton.jit
    def _verify_bias_kernel(mask_ptr, bias_ptr, n, prefix_len, neg, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        width = prefix_len + n
        tree_col = cols - prefix_len
        in_tree = (tree_col >= 0) & (cols < width)
        visible = tl.load(mask_ptr + row * n + tree_col, mask=in_tree, other=1) != 0
        bias = tl.where(visible, 0.0, neg)
        tl.store(bias_ptr + row.to(tl.int64) * width + cols, bias.to(bias_ptr.dtype.element_ty), mask=cols < width)


def ancestor_mask_triton(parents, max_depth=None):
    """``ancestor_mask_reference`` in Triton: bool [N, N]."""
    n = parents.shape[0]
    steps = n - 1 if max_depth is None else min(int(max_depth), n - 1)
    mask = torch.empty(n, n, dtype=torch.bool, device=parents.device)
    rows = next_power_of_2(n) if INTERPRETED else 16
    _ancestor_mask_kernel[(triton.cdiv(n, rows),)](
        parents.contiguous(), mask.view(torch.int8), n, steps, ROWS=rows, N_PAD=next_power_of_2(n)
    )
    return mask


def verify_attention_bias_triton(tree_mask, prefix_len, dtype):
    """``verify_attention_bias_reference`` in Triton: [1, 1, N, prefix_len + N] of ``dtype``."""
    n = tree_mask.shape[0]
    width = prefix_len + n
    bias = torch.empty(n, width, dtype=dtype, device=tree_mask.device)
    block = min(1024, next_power_of_2(width)) if not INTERPRETED else next_power_of_2(width)
    _verify_bias_kernel[(n, triton.cdiv(width, block))](
        tree_mask.contiguous().view(torch.int8), bias, n, prefix_len, torch.finfo(dtype).min, BLOCK=block
    )
    return bias[None, None]
