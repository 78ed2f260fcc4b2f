"""fp32 linear layers through oneDNN with weights packed once, for batched inference on CPU.

torch's CPU ``F.linear`` hands the weight as it is stored to a BLAS sgemm; for the row counts of
tree verifies and batched decoding (a few to a few hundred) oneDNN, given the weight reordered
into its blocked layout once ahead of time, is much faster (measured on 2 AVX2 cores: 53-85
GFLOP/s through torch at 128 rows, 109-119 through oneDNN, the LM head 58 against 109; a
16-node verify of SmolLM2 187 ms against 260). torch ships the packed path for its compiler
(``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``); ``packed_linears`` uses it
eagerly. The results are fp32 products of the same numbers, summed in another order (they
differ from ``F.linear`` in the last bits, as two BLAS libraries do).
"""

import contextlib

import torch
import torch.nn as nn


def packed_linears_available(model):
    """Whether ``model`` can take packed linears: fp32 on CPU, and a torch with oneDNN's packed
    linear ops."""
    try:
        parameter = next(model.parameters())
    except StopIteration:
        return False
    ops = torch.ops.mkldnn
    return (parameter.device.type == "cpu" and parameter.dtype == torch.float32
            and torch.backends.mkldnn.is_available()
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


class _PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose forward multiplies by its packed weight (``packed_weight``); with
    gradients on, or an input that is not fp32 on CPU, it is a plain linear layer."""

    def forward(self, x):
        if torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu":
            return super().forward(x)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


@contextlib.contextmanager
def packed_linears(model, rows):
    """Within the block, every ``nn.Linear`` of ``model`` (fp32, CPU) multiplies through oneDNN by
    a copy of its weight packed for about ``rows`` input rows; on exit the layers are as before
    and the copies freed. The weights must not change inside the block. A model that cannot take
    them (``packed_linears_available``) is left as it is. Yields the number of layers packed."""
    layers = [module for module in model.modules() if type(module) is nn.Linear] \
        if packed_linears_available(model) else []
    try:
        with torch.no_grad():
            for layer in layers:
                layer.packed_weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), max(1, rows))
                layer.__class__ = _PackedLinear
        yield len(layers)
    finally:
        for layer in layers:
            layer.__class__ = nn.Linear
            layer.__dict__.pop("packed_weight", None)


# Verify passes are trees of 1 to 65 nodes; measured (benchmarks/cost_curve.py, SmolLM2, 2 AVX2
# cores), weights packed for 16 rows beat weights packed for 1 at every size from 1 to 64.
SPECULATION_ROWS = 16
LINEARS = ("auto", "torch")  # auto: oneDNN packed products where they run; torch: torch's own


def linears_label(packed):
    """What reports call the products: "onednn" when layers were packed, else "torch"."""
    return "onednn" if packed else "torch"


@contextlib.contextmanager
def packed_for_speculation(*models, linears="auto", rows=SPECULATION_ROWS):
    """``packed_linears(model, rows)`` for every one of ``models`` that can take them (fp32 on
    CPU), with ``linears="auto"``; ``"torch"`` leaves them all as they are. Yields how many layers
    were packed. A model given twice is packed once."""
    if linears not in LINEARS:
        raise ValueError(f"linears must be one of {', '.join(LINEARS)}, not {linears!r}")
    with contextlib.ExitStack() as stack:
        count = 0
        if linears == "auto":
            for model in models:
                count += stack.enter_context(packed_linears(model, rows))
        yield count
