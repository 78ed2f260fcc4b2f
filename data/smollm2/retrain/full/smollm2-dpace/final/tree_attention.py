# mfd-hub remote code 0.1.0, generated from kernels/tree_attention.py; edit the source, not this copy.
"""The verify pass's attention pattern, built from the parent array on the device.

Node i of a draft tree (root 0, parents before children) may attend to node j exactly when j is
i itself or one of its ancestors. ``ancestor_mask_reference`` doubles the reach of a parent
pointer per step (pointer jumping), so it needs log2(depth) gathers and no loop over nodes; the
Triton kernel walks each row's ancestors in one launch. Both never synchronise with the host.

The verify forward itself uses the target's own attention (SDPA with this dense mask): the tree
block is at most a few hundred queries over the cached prefix, so the mask is small next to the
keys it masks, and a custom tree-attention kernel would have to replace the target model's
attention implementation for a saving we cannot measure here.

This file is part of the remote-code bundle: torch only.
"""

import torch

from .backend import use_triton


def ancestor_mask_reference(parents):
    """parents [N] (root: -1) -> bool [N, N], mask[i, j] = j is i or an ancestor of i."""
    n = parents.shape[0]
    idx = torch.arange(n, device=parents.device)
    jump = torch.where(parents < 0, idx, parents)  # the root points at itself
    mask = torch.zeros(n, n, dtype=torch.bool, device=parents.device)
    mask[idx, idx] = True
    mask[idx, jump] = True
    reach = 1
    while reach < n:
        # what my 2^k-th ancestor sees, I see too; then jump twice as far
        mask = mask | mask[jump]
        jump = jump[jump]
        reach *= 2
    return mask


def ancestor_mask(parents, max_depth=None):
    """``ancestor_mask_reference`` on the best backend; ``max_depth`` (the tree's deepest node, a
    bound known to the caller) lets the kernel stop its walk early."""
    if use_triton(parents):
        from .tree_attention_triton import ancestor_mask_triton

        return ancestor_mask_triton(parents, max_depth)
    return ancestor_mask_reference(parents)


def verify_attention_bias_reference(tree_mask, prefix_len, dtype):
    """Additive mask [1, 1, N, prefix_len + N] for a target forward over the tree: every node sees
    the committed prefix and its ancestors-or-self; 0 where visible, the dtype's minimum elsewhere."""
    n = tree_mask.shape[0]
    visible = torch.cat(
        [torch.ones(n, prefix_len, dtype=torch.bool, device=tree_mask.device), tree_mask], dim=1
    )
    bias = torch.zeros(visible.shape, dtype=dtype, device=tree_mask.device)
    return bias.masked_fill(~visible, torch.finfo(dtype).min)[None, None]


def verify_attention_bias(tree_mask, prefix_len, dtype):
    """``verify_attention_bias_reference`` on the best backend (one launch in Triton)."""
    if use_triton(tree_mask):
        from .tree_attention_triton import verify_attention_bias_triton

        return verify_attention_bias_triton(tree_mask, prefix_len, dtype)
    return verify_attention_bias_reference(tree_mask, prefix_len, dtype)
