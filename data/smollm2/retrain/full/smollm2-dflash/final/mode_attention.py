# mfd-hub remote code 0.1.0, generated from kernels/mode_attention.py; edit the source, not this copy.
"""Mode attention: K modes' block queries over one shared context plus their own block.

Every drafted block is copied once per mode. All copies read the same context keys/values, so
the context is never copied: each query's softmax runs jointly over [context keys it may see]
and [the keys of its own (block, mode) copy].

Shapes (B batch, N blocks, M modes, S block positions, C context positions, D head dim):
    q       [B, Hq,  N, M, S, D]
    k_ctx   [B, Hkv, C, D]          v_ctx the same
    k_blk   [B, Hkv, N, M, S, D]    v_blk the same
    ctx_visible  bool, broadcastable to [B, N, S, C], or None (every context key visible)
    blk_visible  bool [S, S] (query s sees block key t), or None (non-causal)
Returns [B, Hq, N, M, S, D] in q's dtype.

This file is part of the remote-code bundle: torch only.
"""

import torch

from .backend import use_triton


def mode_attention_reference(q, k_ctx, v_ctx, k_blk, v_blk, ctx_visible=None, blk_visible=None, scale=None):
    """The torch reference (and the CPU path). Computes in float32."""
    B, Hq, N, M, S, D = q.shape
    Hkv = k_ctx.shape[1]
    rep = Hq // Hkv
    scale = D**-0.5 if scale is None else scale
    qf = q.float().reshape(B, Hkv, rep, N, M, S, D)
    kc, vc = k_ctx.float(), v_ctx.float()
    kb, vb = k_blk.float(), v_blk.float()

    scores_ctx = torch.einsum("bhrnmsd,bhcd->bhrnmsc", qf, kc) * scale
    scores_blk = torch.einsum("bhrnmsd,bhnmtd->bhrnmst", qf, kb) * scale
    if ctx_visible is not None:
        vis = ctx_visible.expand(B, N, S, ctx_visible.shape[-1])  # [B, N, S, C]
        scores_ctx = scores_ctx.masked_fill(~vis[:, None, None, :, None], float("-inf"))
    if blk_visible is not None:
        scores_blk = scores_blk.masked_fill(~blk_visible, float("-inf"))

    C = scores_ctx.shape[-1]
    probs = torch.cat([scores_ctx, scores_blk], dim=-1).softmax(dim=-1)
    out = torch.einsum("bhrnmsc,bhcd->bhrnmsd", probs[..., :C], vc)
    out = out + torch.einsum("bhrnmst,bhnmtd->bhrnmsd", probs[..., C:], vb)
    return out.reshape(B, Hq, N, M, S, D).to(q.dtype)


def mode_attention(q, k_ctx, v_ctx, k_blk, v_blk, ctx_visible=None, blk_visible=None, scale=None):
    """Mode attention on the best available backend (the dispatch point the drafter calls)."""
    if use_triton(q):
        from .mode_attention_triton import mode_attention_triton

        return mode_attention_triton(q, k_ctx, v_ctx, k_blk, v_blk, ctx_visible, blk_visible, scale)
    return mode_attention_reference(q, k_ctx, v_ctx, k_blk, v_blk, ctx_visible, blk_visible, scale)
