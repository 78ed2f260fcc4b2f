# mfd-hub remote code 0.1.0, generated from kernels/tree_deltanet.py; edit the source, not this copy.
"""Gated-DeltaNet layers over a draft tree: the short causal conv and the gated delta rule.

A hybrid target (Qwen3.5 / Qwen3-Next) mixes attention with Gated-DeltaNet layers, which carry
two states between tokens: the last ``width - 1`` conv inputs and a recurrent matrix per head.
On a tree, node i continues the sequence "committed prefix + its ancestors", so:
  - its conv window is the last ``width`` inputs along that path (the committed conv state fills
    the window where the path is shorter than the kernel);
  - its recurrent state is its parent's state advanced by its own token (the root's parent is the
    committed state): S_i = e^{g_i} S_p + k_i (beta_i (v_i - (e^{g_i} S_p)^T k_i))^T, o_i = S_i^T q_i.
After verification the states are committed along the accepted path only.

Two paths compute the same numbers:
  - torch (the CPU path, and the GPU path without triton): the conv as a gather of windows; the
    recurrence in closed form over the whole tree (``tree_delta_rule_torch``: the chunked delta
    rule with the ancestor mask in place of the causal mask; matmuls and two triangular solves,
    no loop over depths);
  - Triton (the GPU path): the conv as one gather-and-dot kernel; the recurrence as one launch in
    which each (node, head, value block) program replays its ancestor path (at most the tree's
    depth steps) from the committed state in registers, so no per-node state is written.
Commit needs one state only, the accepted node's: ``node_state`` replays that path (torch: the
sequential recurrence of plain decoding; Triton: the same kernel for that node).

Tree layout (``tree_layout``): nodes root first, parents before children; ``ancestors[i, t]`` is
the depth-t node on the root-to-i path (t <= depth_i); ``windows[i, w]`` indexes the buffer
``cat(conv_state rows, node rows)`` for window slot w (oldest first).
Shapes: q, k [N, Hk, Dk]; v [N, Hv, Dv] (Hv a multiple of Hk: grouped value heads);
g, beta [N, Hv]; recurrent state [Hv, Dk, Dv] (float32); conv inputs [N, C], conv state
[width - 1, C], conv weight [C, width].

This file is part of the remote-code bundle: torch, and triton when installed.
"""

from dataclasses import dataclass

import torch

from .backend import BACKENDS, tl, triton, use_triton


@dataclass
class TreeLayout:
    """Index tables of one draft tree, shared by every linear-attention layer of a verify pass."""

    depths: torch.Tensor  # [N] int64
    mask: torch.Tensor  # [N, N] bool: j is i or an ancestor of i
    ancestors: torch.Tensor  # [N, N] int64, row i: root .. i then padding (N)
    windows: torch.Tensor  # [N, width] int64 rows of cat(conv_state, node inputs)


def tree_layout(depths, tree_mask, width):
    """depths [N], tree_mask [N, N] (node i sees j: j is i or an ancestor) -> TreeLayout."""
    n = depths.shape[0]
    idx = torch.arange(n, device=depths.device)
    # parents precede children, so a node's ancestors sorted by index are sorted by depth
    ancestors = torch.where(tree_mask, idx[None, :], n).sort(dim=1).values
    depths = depths.long()
    # window slot w holds path position depth - (width - 1) + w; negative positions fall in the
    # committed conv state (row width - 1 + position)
    pos = depths[:, None] - (width - 1) + torch.arange(width, device=depths.device)[None, :]
    on_path = ancestors.gather(1, pos.clamp(min=0))
    windows = torch.where(pos >= 0, width - 1 + on_path, width - 1 + pos)
    return TreeLayout(depths=depths, mask=tree_mask, ancestors=ancestors, windows=windows)


def _use_triton(backend, tensor):
    """``backend=None`` follows the package-wide switch (``kernels/backend.py``); a name forces
    one path for this call (the tests compare both)."""
    if backend is None:
        return use_triton(tensor)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "triton" and triton is None:
        raise RuntimeError("the triton backend was requested but triton is not installed")
    return backend == "triton" or (backend == "auto" and triton is not None and tensor.is_cuda)


# ---- the short causal conv ----------------------------------------------------------------------
def tree_conv_torch(buffer, windows, weight):
    """buffer [width - 1 + N, C] (conv state rows, then node inputs) -> conv outputs [N, C] fp32."""
    gathered = buffer.float()[windows]  # [N, width, C]
    return (gathered * weight.float().t()[None]).sum(dim=1)


def tree_causal_conv(x, conv_state, weight, layout, bias=None, backend=None):
    """Each node's depthwise causal conv over its ancestor path (no activation) -> [N, C] fp32."""
    buffer = torch.cat([conv_state.to(x.dtype), x], dim=0).contiguous()
    if _use_triton(backend, x):
        out = _tree_conv_triton(buffer, layout.windows, weight)
    else:
        out = tree_conv_torch(buffer, layout.windows, weight)
    return out if bias is None else out + bias.float()


def conv_state_after(x, conv_state, layout, node):
    """The conv state once ``node`` is committed: the last width - 1 inputs of its path."""
    buffer = torch.cat([conv_state.to(x.dtype), x], dim=0)
    return buffer[layout.windows[node, 1:]]


# ---- the gated delta rule -----------------------------------------------------------------------
def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def delta_rule_inputs(q, k, v, g, beta):
    """fp32 inputs of the recurrence: q, k L2-normalised per head, q scaled by Dk^-1/2 (the
    ``use_qk_l2norm_in_kernel`` convention of the targets)."""
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    q = l2norm(q) / (q.shape[-1] ** 0.5)
    return q.contiguous(), l2norm(k).contiguous(), v.contiguous(), g.contiguous(), beta.contiguous()


def _grouped(t, heads):
    return t.repeat_interleave(heads // t.shape[1], dim=1) if t.shape[1] != heads else t


def tree_delta_rule_torch(q, k, v, g, beta, state, layout):
    """The whole tree in matmuls (the chunked delta rule with the causal mask replaced by the
    ancestor mask): with G_i the summed log-decay along i's path, the per-node corrections
    u = (I + L)^-1 (...) solve a unit lower-triangular system whose entries
    L_ij = beta_i k_i.k_j e^(G_i - G_j) link i only to its strict ancestors j, so forward
    substitution runs each path's own recurrence. Inputs from ``delta_rule_inputs``."""
    heads = v.shape[1]
    mask = layout.mask
    q, k = _grouped(q, heads).transpose(0, 1), _grouped(k, heads).transpose(0, 1)  # [Hv, N, Dk]
    v, g, beta = v.transpose(0, 1), g.t(), beta.t()[..., None]
    path_g = g @ mask.t().to(g.dtype)  # [Hv, N]: log-decay from the committed state to each node
    decay = (path_g[:, :, None] - path_g[:, None, :]).masked_fill(~mask, float("-inf")).exp()
    k_beta = k * beta
    system = (k_beta @ k.transpose(1, 2)) * decay  # the diagonal is read as 1 (unitriangular)
    from_state = path_g.exp()[..., None]
    u = torch.linalg.solve_triangular(system, v * beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * from_state, upper=False, unitriangular=True)
    v_new = u - w @ state
    out = (q * from_state) @ state + ((q @ k.transpose(1, 2)) * decay) @ v_new
    return out.transpose(0, 1)


def tree_delta_rule(q, k, v, g, beta, state, layout, backend=None):
    """Every node's delta-rule output over its ancestor path -> [N, Hv, Dv] fp32."""
    if _use_triton(backend, v):
        nodes = torch.arange(v.shape[0], device=v.device)
        out, _ = _tree_delta_triton(q, k, v, g, beta, state, layout, nodes, store_state=False)
        return out
    return tree_delta_rule_torch(q, k, v, g, beta, state, layout)


def node_state(k, v, g, beta, state, layout, node, backend=None):
    """The recurrent state after ``node`` (the committed state advanced along its path) -> [Hv, Dk, Dv]."""
    if _use_triton(backend, v):
        q = k.new_zeros(k.shape)  # outputs are not wanted, only the state
        nodes = torch.as_tensor(node, device=v.device).long().reshape(1)
        return _tree_delta_triton(q, k, v, g, beta, state, layout, nodes, store_state=True)[1][0]
    k = _grouped(k, v.shape[1])
    s = state
    for j in layout.ancestors[node, : int(layout.depths[node]) + 1].tolist():
        s = s * g[j].exp()[:, None, None]
        delta = (v[j] - (s * k[j][..., None]).sum(dim=-2)) * beta[j][:, None]
        s = s + k[j][..., None] * delta[:, None, :]
    return s


# ---- Triton -------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _tree_conv_kernel(buf_ptr, win_ptr, w_ptr, out_ptr, C, WIDTH: tl.constexpr, BLOCK_C: tl.constexpr):
        node = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        live = offs < C
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for w in tl.static_range(WIDTH):
            row = tl.load(win_ptr + node * WIDTH + w)
            x = tl.load(buf_ptr + row * C + offs, mask=live, other=0.0).to(tl.float32)
            wt = tl.load(w_ptr + offs * WIDTH + w, mask=live, other=0.0).to(tl.float32)
            acc += x * wt
        tl.store(out_ptr + node * C + offs, acc, mask=live)

    @triton.jit
    def _tree_delta_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s0_ptr, anc_ptr, depth_ptr, node_ptr, out_ptr, s_out_ptr,
        N, HK, HV, DK, DV,
        BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, STORE_STATE: tl.constexpr,
    ):
        i = tl.program_id(0)
        h = tl.program_id(1)
        hk = h // (HV // HK)
        node = tl.load(node_ptr + i)
        depth = tl.load(depth_ptr + node)
        offs_k = tl.arange(0, BLOCK_K)
        offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
        mk = offs_k < DK
        mv = offs_v < DV
        tile = mk[:, None] & mv[None, :]
        s = tl.load(s0_ptr + (h * DK + offs_k[:, None]) * DV + offs_v[None, :], mask=tile, other=0.0)
        # replay the root-to-node path from the committed state
        for t in range(0, depth + 1):
            j = tl.load(anc_ptr + node * N + t)
            kj = tl.load(k_ptr + (j * HK + hk) * DK + offs_k, mask=mk, other=0.0)
            vj = tl.load(v_ptr + (j * HV + h) * DV + offs_v, mask=mv, other=0.0)
            gj = tl.load(g_ptr + j * HV + h)
            bj = tl.load(beta_ptr + j * HV + h)
            s = s * tl.exp(gj)
            memory = tl.sum(s * kj[:, None], axis=0)
            delta = (vj - memory) * bj
            s = s + kj[:, None] * delta[None, :]
        qn = tl.load(q_ptr + (node * HK + hk) * DK + offs_k, mask=mk, other=0.0)
        tl.store(out_ptr + (i * HV + h) * DV + offs_v, tl.sum(s * qn[:, None], axis=0), mask=mv)
        if STORE_STATE:
            tl.store(s_out_ptr + ((i * HV + h) * DK + offs_k[:, None]) * DV + offs_v[None, :], s, mask=tile)


def _tree_conv_triton(buffer, windows, weight):
    n, channels = windows.shape[0], buffer.shape[1]
    out = torch.empty(n, channels, dtype=torch.float32, device=buffer.device)
    block = min(1024, triton.next_power_of_2(channels))
    grid = (n, triton.cdiv(channels, block))
    _tree_conv_kernel[grid](
        buffer, windows.contiguous(), weight.contiguous(), out, channels, WIDTH=windows.shape[1], BLOCK_C=block
    )
    return out


def _tree_delta_triton(q, k, v, g, beta, state, layout, nodes, store_state):
    n, hv, dv = v.shape
    hk, dk = k.shape[1], k.shape[2]
    m = nodes.shape[0]
    out = torch.empty(m, hv, dv, dtype=torch.float32, device=v.device)
    states = torch.empty(m if store_state else 1, hv, dk, dv, dtype=torch.float32, device=v.device)
    block_k = triton.next_power_of_2(dk)
    block_v = min(32, triton.next_power_of_2(dv))
    grid = (m, hv, triton.cdiv(dv, block_v))
    _tree_delta_kernel[grid](
        q, k, v, g, beta, state.float().contiguous(), layout.ancestors.contiguous(), layout.depths.contiguous(),
        nodes.contiguous(), out, states, n, hk, hv, dk, dv,
        BLOCK_K=block_k, BLOCK_V=block_v, STORE_STATE=store_state,
    )
    return out, states
