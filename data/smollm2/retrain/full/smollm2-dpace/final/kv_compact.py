# mfd-hub remote code 0.1.0, generated from kernels/kv_compact.py; edit the source, not this copy.
"""KV compaction after tree verification: keep the committed prefix and the accepted path.

The verify pass appended every tree node to each layer's cache; only the accepted path (root
first, in depth order) stays. With a best-child-first preorder layout the accepted path is
often the spine 0, 1, 2, ..., already in place: then compaction is a crop.

This file is part of the remote-code bundle: torch only.
"""

import torch

from .backend import use_triton


def compact_kv_reference(tensors, prefix_len, path):
    """tensors: [..., T, D] caches holding prefix_len committed positions then the tree block;
    path: accepted node indices into the block -> the tensors cut to prefix + path."""
    n = path.shape[0]
    spine = torch.arange(n, device=path.device)
    if bool((path == spine).all()):
        return [t[..., : prefix_len + n, :] for t in tensors]
    keep = torch.cat([torch.arange(prefix_len, device=path.device), prefix_len + path])
    return [t.index_select(-2, keep) for t in tensors]


def compact_kv(tensors, prefix_len, path):
    """``compact_kv_reference`` on the best backend. The Triton kernel moves the rows of every
    tensor in place in one launch (nothing moves when the path is the spine, decided on the
    device: no host synchronisation) and returns views; use the returned tensors."""
    if use_triton(path):
        from .kv_compact_triton import compact_kv_triton, kv_kernel_supports

        if kv_kernel_supports(tensors):
            return compact_kv_triton(tensors, prefix_len, path)
    return compact_kv_reference(tensors, prefix_len, path)
