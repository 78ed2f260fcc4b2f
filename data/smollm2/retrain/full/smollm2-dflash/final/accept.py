# mfd-hub remote code 0.1.0, generated from kernels/accept.py; edit the source, not this copy.
"""The accept walk of tree verification.

With y[i] the target's token after node i (argmax at T=0, a sample at T>0), node i is accepted
when its parent is accepted and its token equals y[parent]; the root always is. Accepted nodes
form one path (siblings carry different tokens); the target's token at its deepest node is the
bonus. Every emitted token is therefore the target's own.

Outputs have fixed sizes so that nothing here synchronises with the host: the caller reads the
small ``info`` tensor once per round (the accepted length) and slices with it.

This file is part of the remote-code bundle: torch only.
"""

import torch

from .backend import use_triton


def accept_walk_reference(tokens, parents, depths, target_tokens, max_depth):
    """tokens/parents/depths/target_tokens [N] (root first, parents before children), max_depth:
    a bound on the tree's depth -> (path, info).

    path [max_depth + 1] int64: the accepted nodes root..deepest, then the deepest repeated.
    info [3] int64: (accepted nodes including the root, 1 if they are the spine 0, 1, ..., n-1
    (the nodes already in place), the bonus token).
    """
    n = tokens.shape[0]
    idx = torch.arange(n, device=tokens.device)
    jump = torch.where(parents < 0, idx, parents)  # the root points at itself
    ok = (tokens == target_tokens[jump]) | (idx == 0)
    reach = 1
    while reach < max_depth + 1:  # pointer jumping: AND over 2^k ancestors per step
        ok = ok & ok[jump]
        jump = jump[jump]
        reach *= 2
    slots = torch.arange(max_depth + 1, device=tokens.device)
    # the accepted node at each depth (they form one path; index order is depth order)
    at_depth = torch.where(ok[None, :] & (depths[None, :] == slots[:, None]), idx[None, :], -1).amax(dim=1)
    deepest = at_depth.amax()
    path = torch.where(at_depth < 0, deepest, at_depth)
    accepted = ok.sum()
    spine = ((path == slots) | (slots >= accepted)).all()
    info = torch.stack([accepted, spine.to(torch.int64), target_tokens[deepest].to(torch.int64)])
    return path, info


def accept_walk(tokens, parents, depths, target_tokens, max_depth):
    """``accept_walk_reference`` on the best backend (one launch in Triton)."""
    if use_triton(tokens):
        from .accept_triton import accept_walk_triton

        return accept_walk_triton(tokens, parents, depths, target_tokens, max_depth)
    return accept_walk_reference(tokens, parents, depths, target_tokens, max_depth)
