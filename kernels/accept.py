"""The accept walk of tree verification.

With y[i] the target's token after node i (argmax at T=0, a sample at T>0), node i is accepted
when its parent is accepted and its token equals y[parent]; the root always is. Accepted nodes
form one path (siblings carry different tokens); the target's token at its deepest node is the
bonus. Every emitted token is therefore the target's own.

This file is part of the remote-code bundle: torch only.
"""

import torch


def accept_walk(tokens, parents, depths, target_tokens):
    """-> (path: node indices root..deepest accepted, in order, bonus token as a 0-d tensor)."""
    n = tokens.shape[0]
    safe_parent = parents.clamp(min=0)
    match = tokens == target_tokens[safe_parent]
    match[0] = True
    accepted = match.clone()
    max_depth = int(depths.max()) if n > 1 else 0
    for _ in range(max_depth):  # after d steps every node of depth <= d is settled
        accepted = match & accepted[safe_parent]
        accepted[0] = True
    path = accepted.nonzero().flatten()  # parents precede children: index order is depth order
    return path, target_tokens[path[-1]]
