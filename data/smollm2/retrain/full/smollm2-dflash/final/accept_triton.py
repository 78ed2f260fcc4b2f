# mfd-hub remote code 0.1.0, generated from kernels/accept_triton.py; edit the source, not this copy.
"""Triton kernel for the accept walk (reference: ``accept.py``): one program, pointer jumping
over the parent array in registers, the accepted node of each depth, the bonus token.

This file is part of the remote-code bundle: torch only (triton through ``backend``).
"""

import torch

from .backend import next_power_of_2, tl, triton

if triton is not None:

    @triton.jit
    def _accept_kernel(
        tokens_ptr, parents_ptr, depths_ptr, target_ptr, path_ptr, info_ptr, n, max_depth,
        N_PAD: tl.constexpr, P_PAD: tl.constexpr, STEPS: tl.constexpr,
    ):
        idx = tl.arange(0, N_PAD)
        valid = idx < n
        tokens = tl.load(tokens_ptr + idx, mask=valid, other=-1)
        parents = tl.load(parents_ptr + idx, mask=valid, other=-1)
        depths = tl.load(depths_ptr + idx, mask=valid, other=-1)
        target = tl.load(target_ptr + idx, mask=valid, other=-2)
        jump = tl.where(parents < 0, idx, parents).to(tl.int32)  # the root points at itself
        ok = ((tokens == tl.gather(target, jump, 0)) | (idx == 0)) & valid
        ok = ok.to(tl.int32)
        for _ in tl.static_range(STEPS):  # AND over 2^k ancestors per step
            ok = ok & tl.gather(ok, jump, 0)
            jump = tl.gather(jump, jump, 0)
        slots = tl.arange(0, P_PAD)
        hit = (ok[None, :] != 0) & (depths[None, :] == slots[:, None])
        at_depth = tl.max(tl.where(hit, idx[None, :], -1), axis=1)
        deepest = tl.max(at_depth, axis=0)
        path = tl.where(at_depth < 0, deepest, at_depth)
        accepted = tl.sum(ok, axis=0)
        off_spine = tl.sum(((path != slots) & (slots < accepted)).to(tl.int32), axis=0)
        tl.store(path_ptr + slots, path.to(tl.int64), mask=slots <= max_depth)
        bonus = tl.load(target_ptr + deepest)
        tl.store(info_ptr, accepted.to(tl.int64))
        tl.store(info_ptr + 1, (off_spine == 0).to(tl.int64))
        tl.store(info_ptr + 2, bonus.to(tl.int64))


def accept_walk_triton(tokens, parents, depths, target_tokens, max_depth):
    """``accept_walk_reference`` in Triton -> (path [max_depth + 1], info [3]), int64."""
    n = tokens.shape[0]
    path = torch.empty(max_depth + 1, dtype=torch.int64, device=tokens.device)
    info = torch.empty(3, dtype=torch.int64, device=tokens.device)
    steps = max(0, (max_depth).bit_length())  # 2^steps >= max_depth + 1
    _accept_kernel[(1,)](
        tokens.contiguous(), parents.contiguous(), depths.contiguous(), target_tokens.contiguous(),
        path, info, n, max_depth,
        N_PAD=next_power_of_2(n), P_PAD=next_power_of_2(max_depth + 1), STEPS=steps,
    )
    return path, info
