"""KV compaction after tree verification: keep the committed prefix and the accepted path.

The verify pass appended every tree node to each layer's cache; only the accepted path (root
first, in depth order) stays. With a best-child-first preorder layout the accepted path is
often the spine 0, 1, 2, ..., already in place: then compaction is a crop.

This file is part of the remote-code bundle: torch only.
"""

import torch


def compact_kv(tensors, prefix_len, path):
    """tensors: [..., T, D] caches holding prefix_len committed positions then the tree block;
    path: accepted node indices into the block -> the tensors cut to prefix + path."""
    n = path.shape[0]
    spine = torch.arange(n, device=path.device)
    if bool((path == spine).all()):
        return [t[..., : prefix_len + n, :] for t in tensors]
    keep = torch.cat([torch.arange(prefix_len, device=path.device), prefix_len + path])
    return [t.index_select(-2, keep) for t in tensors]
