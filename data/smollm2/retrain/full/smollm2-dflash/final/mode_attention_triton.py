# mfd-hub remote code 0.1.0, generated from kernels/mode_attention_triton.py; edit the source, not this copy.
"""Triton kernel for fused mode attention (reference: ``mode_attention.py``).

One program per (batch, query head, block): its K modes x S queries stream the shared context
keys/values once (online softmax over tiles), then attend to the block keys of their own mode
(a block-diagonal mask over the modes). The context is read once for all modes and never copied.
Scores and the softmax run in float32: tiles are upcast and multiplied with IEEE float32 for fp32
inputs (as the reference) and TF32 for bf16/fp16 inputs (their values are exact in TF32, so only
the probabilities lose bits in the second product, as in flash attention's low-precision P).

This file is part of the remote-code bundle: torch only (triton through ``backend``).
"""

import torch

from .backend import INTERPRETED, next_power_of_2, tl, triton

if triton is not None:
    _NEG = tl.constexpr(-1.0e30)  # finite: a row masked so far is wiped once a visible key arrives

    @triton.jit
    def _attend(q, k, v, visible, m_i, l_i, acc, scale, PRECISION: tl.constexpr):
        """One online-softmax step of queries q over keys/values k, v (float32 tiles)."""
        scores = tl.where(visible, tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale, _NEG)
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def _mode_attention_kernel(
        q_ptr, kc_ptr, vc_ptr, kb_ptr, vb_ptr, cvis_ptr, bvis_ptr, out_ptr,
        n_heads, n_blocks, rep, n_ctx, n_modes, seq, head_dim, scale,
        sq0, sq1, sq2, sq3, sq4, sq5,
        sc0, sc1, sc2, sc3,
        sb0, sb1, sb2, sb3, sb4, sb5,
        sv0, sv1, sv2, sv3,
        HAS_CVIS: tl.constexpr, HAS_BVIS: tl.constexpr, PRECISION: tl.constexpr,
        Q_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        pid = tl.program_id(0)
        n = pid % n_blocks
        h = (pid // n_blocks) % n_heads
        b = pid // (n_blocks * n_heads)
        kvh = h // rep
        r = tl.arange(0, Q_PAD)  # query row = mode * seq + position
        mode = r // seq
        s = r % seq
        rows_ok = r < n_modes * seq
        dcol = tl.arange(0, D_PAD)[None, :]
        d_ok = dcol < head_dim
        q = tl.load(
            q_ptr + b * sq0 + h * sq1 + n * sq2 + mode[:, None] * sq3 + s[:, None] * sq4 + dcol * sq5,
            mask=rows_ok[:, None] & d_ok, other=0.0,
        ).to(tl.float32)
        m_i = tl.full([Q_PAD], _NEG, tl.float32)
        l_i = tl.zeros([Q_PAD], dtype=tl.float32)
        acc = tl.zeros([Q_PAD, D_PAD], dtype=tl.float32)
        for c0 in range(0, n_ctx, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            c_ok = c < n_ctx
            at = b * sc0 + kvh * sc1 + c[:, None] * sc2 + dcol * sc3
            k = tl.load(kc_ptr + at, mask=c_ok[:, None] & d_ok, other=0.0).to(tl.float32)
            v = tl.load(vc_ptr + at, mask=c_ok[:, None] & d_ok, other=0.0).to(tl.float32)
            visible = c_ok[None, :] & rows_ok[:, None]
            if HAS_CVIS:
                seen = tl.load(cvis_ptr + b * sv0 + n * sv1 + s[:, None] * sv2 + c[None, :] * sv3, mask=visible, other=0)
                visible = visible & (seen != 0)
            m_i, l_i, acc = _attend(q, k, v, visible, m_i, l_i, acc, scale, PRECISION)
        # the block keys of every mode; a query sees only its own mode's copy
        kb_off = b * sb0 + kvh * sb1 + n * sb2 + mode[:, None] * sb3 + s[:, None] * sb4 + dcol * sb5
        kb = tl.load(kb_ptr + kb_off, mask=rows_ok[:, None] & d_ok, other=0.0).to(tl.float32)
        vb = tl.load(vb_ptr + kb_off, mask=rows_ok[:, None] & d_ok, other=0.0).to(tl.float32)
        visible = (mode[:, None] == mode[None, :]) & rows_ok[:, None] & rows_ok[None, :]
        if HAS_BVIS:
            seen = tl.load(bvis_ptr + s[:, None] * seq + s[None, :], mask=visible, other=0)
            visible = visible & (seen != 0)
        m_i, l_i, acc = _attend(q, kb, vb, visible, m_i, l_i, acc, scale, PRECISION)
        out = acc / l_i[:, None]
        o_off = (((b * n_heads + h) * n_blocks + n) * n_modes + mode[:, None]) * seq * head_dim + s[:, None] * head_dim + dcol
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=rows_ok[:, None] & d_ok)


def mode_attention_triton(q, k_ctx, v_ctx, k_blk, v_blk, ctx_visible=None, blk_visible=None, scale=None):
    """``mode_attention_reference`` in Triton (same shapes; see ``mode_attention.py``)."""
    B, Hq, N, M, S, D = q.shape
    Hkv, C = k_ctx.shape[1], k_ctx.shape[2]
    scale = D**-0.5 if scale is None else scale
    out = torch.empty(B, Hq, N, M, S, D, dtype=q.dtype, device=q.device)
    if v_ctx.stride() != k_ctx.stride() or v_blk.stride() != k_blk.stride():
        v_ctx, k_ctx = v_ctx.contiguous(), k_ctx.contiguous()
        v_blk, k_blk = v_blk.contiguous(), k_blk.contiguous()
    if ctx_visible is not None:
        cvis = ctx_visible.expand(B, N, S, C).view(torch.uint8)
    else:
        cvis = torch.empty(1, 1, 1, 1, dtype=torch.uint8, device=q.device)
    bvis = (blk_visible.contiguous() if blk_visible is not None else torch.ones(1, 1, dtype=torch.bool, device=q.device))
    block_c = next_power_of_2(max(C, 16)) if INTERPRETED else 64
    _mode_attention_kernel[(B * Hq * N,)](
        q, k_ctx, v_ctx, k_blk, v_blk, cvis, bvis.view(torch.uint8), out,
        Hq, N, Hq // Hkv, C, M, S, D, float(scale),
        *q.stride(), *k_ctx.stride(), *k_blk.stride(), *cvis.stride(),
        HAS_CVIS=ctx_visible is not None, HAS_BVIS=blk_visible is not None, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        Q_PAD=max(16, next_power_of_2(M * S)), D_PAD=max(16, next_power_of_2(D)), BLOCK_C=block_c,
        num_warps=8 if M * S > 64 else 4,
    )
    return out
