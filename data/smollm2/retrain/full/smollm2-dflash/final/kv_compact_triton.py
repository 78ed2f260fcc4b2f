# mfd-hub remote code 0.1.0, generated from kernels/kv_compact_triton.py; edit the source, not this copy.
"""Triton kernel for KV compaction (reference: ``kv_compact.py``): every layer's keys and values
in one launch, through a device table of their addresses. Program (tensor, batch*head) loads the
accepted rows, then writes them after the prefix; the rows are read before any is written, and
each program owns its (tensor, head), so moving in place is safe. When the accepted path is the
spine (already in place) nothing is written.

This file is part of the remote-code bundle: torch only (triton through ``backend``).
"""

import torch

from .backend import next_power_of_2, tl, triton

_DTYPES = {}
if triton is not None:
    _DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}

    @triton.jit
    def _compact_kernel(
        table_ptr, path_ptr, n, prefix_len, rows_per_head, head_dim,
        DTYPE: tl.constexpr, N_PAD: tl.constexpr, D_PAD: tl.constexpr,
    ):
        base = tl.load(table_ptr + tl.program_id(0)).to(tl.pointer_type(DTYPE))
        head = base + tl.program_id(1).to(tl.int64) * rows_per_head * head_dim
        r = tl.arange(0, N_PAD)
        in_path = r < n
        src = tl.load(path_ptr + r, mask=in_path, other=0)
        moves = in_path & (src != r)  # rows already in place (all of them on the spine) stay
        cols = tl.arange(0, D_PAD)[None, :]
        ok = moves[:, None] & (cols < head_dim)
        rows = tl.load(head + (prefix_len + src)[:, None] * head_dim + cols, mask=ok, other=0.0)
        tl.store(head + (prefix_len + r)[:, None] * head_dim + cols, rows, mask=ok)


def kv_kernel_supports(tensors):
    """Same shape, dtype and device, contiguous [..., T, D]: one address table serves them all."""
    first = tensors[0]
    return first.dtype in _DTYPES and all(
        t.shape == first.shape and t.dtype == first.dtype and t.device == first.device and t.is_contiguous()
        for t in tensors
    )


def _address_table(tensors, device):
    table = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    if device.type == "cuda":  # a pinned, asynchronous copy: no host synchronisation
        return table.pin_memory().to(device, non_blocking=True)
    return table


def compact_kv_triton(tensors, prefix_len, path):
    """``compact_kv_reference`` in Triton, in place -> views of the tensors cut to prefix + path."""
    n = path.shape[0]
    first = tensors[0]
    rows_per_head, head_dim = first.shape[-2], first.shape[-1]
    heads = first.numel() // (rows_per_head * head_dim)
    _compact_kernel[(len(tensors), heads)](
        _address_table(tensors, first.device), path.contiguous(), n, prefix_len, rows_per_head, head_dim,
        DTYPE=_DTYPES[first.dtype], N_PAD=next_power_of_2(n), D_PAD=next_power_of_2(head_dim),
    )
    return [t[..., : prefix_len + n, :] for t in tensors]
