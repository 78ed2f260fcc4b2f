"""Linear layers through oneDNN with weights packed once, for batched inference on CPU.

torch's CPU ``F.linear`` hands the weight as it is stored to a BLAS sgemm (fp32) or to oneDNN,
which reorders it into its blocked layout at every call (bf16); for the row counts of tree
verifies and batched decoding (one to a few hundred) oneDNN given the weight reordered once ahead
of time is much faster. fp32, measured on 2 AVX2 cores: 53-85 GFLOP/s through torch at 128 rows,
109-119 through oneDNN, the LM head 58 against 109; a 16-node verify of SmolLM2 187 ms against 260.
bf16 (only where the CPU computes it natively: AMX-BF16 / AVX512-BF16), on an AMX Xeon, one
thread, a 1536 x 576 weight: 126 / 147 / 325 us at 1 / 16 / 128 rows through torch against
59 / 108 / 209 packed. torch ships the packed path for its compiler
(``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``); ``packed_linears`` uses it
eagerly. fp32 results are fp32 products of the same numbers, summed in another order (they differ
from ``F.linear`` in the last bits, as two BLAS libraries do); bf16 ones are oneDNN's products as
torch's own bf16 layer computes them.
"""

import contextlib
import copy

import torch
import torch.nn as nn


def packed_linears_available(model):
    """Whether ``model`` can take packed linears: fp32 on CPU, or bf16 on a CPU that computes bf16
    natively (elsewhere oneDNN emulates it), and a torch with oneDNN's packed linear ops."""
    from .precision import cpu_has_native_bf16

    ops = torch.ops.mkldnn
    dtype = _dtype_on_cpu(model)
    return ((dtype is torch.float32 or (dtype is torch.bfloat16 and cpu_has_native_bf16()))
            and torch.backends.mkldnn.is_available()
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


def _dtype_on_cpu(model):
    """The dtype of ``model``'s parameters when they are on CPU (judged by the first), else None."""
    parameter = next(model.parameters(), None)
    return parameter.dtype if parameter is not None and parameter.device.type == "cpu" else None


def _fp32_on_cpu(model):
    """Whether ``model``'s parameters are fp32 on CPU (judged by the first; False without any)."""
    return _dtype_on_cpu(model) is torch.float32


def _fbgemm_fp16_available():
    """Whether this torch has FBGEMM's fp16-weight products (x86 builds)."""
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_prepack_fp16")


class _PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose forward multiplies by its packed weight (``packed_weight``); with
    gradients on, or an input not on CPU or not in the weight's dtype, it is a plain linear layer."""

    def forward(self, x):
        if torch.is_grad_enabled() or x.dtype != self.weight.dtype or x.device.type != "cpu":
            return super().forward(x)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


@contextlib.contextmanager
def packed_linears(model, rows):
    """Within the block, every ``nn.Linear`` of ``model`` (fp32, or bf16 where native, on CPU)
    multiplies through oneDNN by a copy of its weight packed for about ``rows`` input rows; on exit
    the layers are as before and the copies freed. The weights must not change inside the block.
    A model that cannot take them (``packed_linears_available``) is left as it is. Yields the
    number of layers packed."""
    with _swapped_linears(model, packed_linears_available(model), _PackedLinear, "packed_weight",
                          lambda layer: torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), max(1, rows))) as count:
        yield count


@contextlib.contextmanager
def _swapped_linears(model, available, layer_class, attribute, make):
    """Every plain ``nn.Linear`` of ``model`` becomes ``layer_class`` with ``make(layer)`` as its
    ``attribute`` (nothing when not ``available``); on exit, plain layers again. Yields the count."""
    layers = [module for module in model.modules() if type(module) is nn.Linear] if available else []
    try:
        with torch.no_grad():
            for layer in layers:
                setattr(layer, attribute, make(layer))
                layer.__class__ = layer_class
        yield len(layers)
    finally:
        for layer in layers:
            layer.__class__ = nn.Linear
            layer.__dict__.pop(attribute, None)


SWAPPED_ATTRIBUTES = ("packed_weight", "fp16_weight")  # what a swapped layer multiplies by instead of its weight


def plain_copy(model):
    """A deep copy of ``model`` whose linear layers are all plain ``nn.Linear`` again, computing with
    their own ``weight`` (a swapped layer's packed or fp16 copy is neither copied nor used: oneDNN's
    packed tensors cannot be deep-copied, and the copy must compute what torch's layers compute)."""
    swapped = [module for module in model.modules() if isinstance(module, nn.Linear) and type(module) is not nn.Linear]
    memo = {id(layer.__dict__[name]): None  # deepcopy takes these as already copied, to None
            for layer in swapped for name in SWAPPED_ATTRIBUTES if name in layer.__dict__}
    copied = copy.deepcopy(model, memo)
    for layer in copied.modules():
        if isinstance(layer, nn.Linear):
            layer.__class__ = nn.Linear
            for name in SWAPPED_ATTRIBUTES:
                layer.__dict__.pop(name, None)
    return copied


def fp16_weight_linears_available(model):
    """Whether ``model`` can take fp16-weight linears: fp32 on CPU, and a torch built with FBGEMM's
    fp16 products (``torch.ops.quantized.linear_dynamic_fp16``, x86)."""
    return _fp32_on_cpu(model) and _fbgemm_fp16_available()


class _Fp16WeightLinear(nn.Linear):
    """An ``nn.Linear`` whose forward multiplies fp32 rows by its weight stored in fp16
    (``fp16_weight``), accumulating in fp32; with gradients on, or an input that is not fp32 on
    CPU, it is a plain linear layer."""

    def forward(self, x):
        if torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu":
            return super().forward(x)
        return torch.ops.quantized.linear_dynamic_fp16(x, self.fp16_weight)


@contextlib.contextmanager
def fp16_weight_linears(model):
    """Within the block, every ``nn.Linear`` of ``model`` (fp32, CPU) multiplies by its weight
    rounded to fp16 (FBGEMM: the weight read as fp16 and widened in registers, the rows and the
    sums fp32). A verify pass of a few to 64 rows then reads the weights once at half the bytes:
    on 2 AVX2 cores, 30 of SmolLM2's MLP products cost 6.5 / 9.3 / 16 ms at 1 / 4 / 16 rows
    against 18 / 33 / 38 in fp32 and 6.5 / 19 / 67 in emulated bf16. The model computes with
    fp16-rounded weights (10 fraction bits: finer than bf16's 7), so its outputs are those of that
    rounding; on exit the layers are as before. Yields the number of layers changed."""
    with _swapped_linears(model, fp16_weight_linears_available(model), _Fp16WeightLinear, "fp16_weight",
                          lambda layer: torch.ops.quantized.linear_prepack_fp16(layer.weight.detach(), layer.bias)) as count:
        yield count


# Verify passes are trees of 1 to 65 nodes; measured (benchmarks/cost_curve.py, SmolLM2, 2 AVX2
# cores), weights packed for 16 rows beat weights packed for 1 at every size from 1 to 64.
SPECULATION_ROWS = 16
LINEARS = ("auto", "torch")  # regen: auto, oneDNN packed products where they run; torch: torch's own
# speculation (demo, bench, generate) may also round the weights to fp16: onednn / fp16 / torch,
# or auto (``speculation_linears``)
SPECULATION_LINEARS = ("auto", "onednn", "fp16", "torch")


def speculation_linears(linears, device="cpu"):
    """``auto`` -> ``fp16`` on a CPU without native bf16 where FBGEMM's fp16 products run (its
    decode step reads half the bytes, as bf16's does, and a verify of 4 rows costs 1.3 steps
    against bf16's 2.0: ``benchmarks/cost_curve.py``), else ``onednn``; other names unchanged."""
    from .precision import cpu_has_native_bf16

    if linears not in SPECULATION_LINEARS:
        raise ValueError(f"linears must be one of {', '.join(SPECULATION_LINEARS)}, not {linears!r}")
    if linears != "auto":
        return linears
    if torch.device(device).type == "cpu" and not cpu_has_native_bf16() and _fbgemm_fp16_available():
        return "fp16"
    return "onednn"


def packs_bf16(linears, models):
    """Whether ``linears`` multiplies a bf16 one of ``models`` through oneDNN (CPUs with native bf16)."""
    return linears in ("auto", "onednn") and any(
        _dtype_on_cpu(m) is torch.bfloat16 and packed_linears_available(m) for m in models)


def changes_layers(*models, linears="auto"):
    """Whether ``packed_for_speculation(*models, linears=linears)`` would change any layer."""
    if linears == "torch":
        return False
    available = fp16_weight_linears_available if linears == "fp16" else packed_linears_available
    return any(available(m) and any(isinstance(layer, nn.Linear) for layer in m.modules()) for m in models)


def linears_label(packed, linears="auto", models=()):
    """What reports call the products: "fp16-weights" or "onednn" when layers were changed, else
    "torch"; "onednn+bf16" when a bf16 one of ``models`` multiplies through oneDNN too."""
    if not packed:
        return "torch"
    if linears == "fp16":
        return "fp16-weights"
    return "onednn+bf16" if packs_bf16(linears, models) else "onednn"


def linears_option(label):
    """The ``--linears`` value that produced a report's ``linears_label`` (for a command line that
    reruns it): "onednn+bf16" came from ``onednn``, "fp16-weights" from ``fp16``."""
    return {"onednn+bf16": "onednn", "fp16-weights": "fp16"}.get(label, label)


@contextlib.contextmanager
def packed_for_speculation(*models, linears="auto", rows=SPECULATION_ROWS):
    """``packed_linears(model, rows)`` for every one of ``models`` that can take them (fp32 on
    CPU, bf16 where native), with ``linears="auto"`` or ``"onednn"``; ``"fp16"``:
    ``fp16_weight_linears`` for each (the miniature's drafter too drafts faster so: one mode 10 ms
    against oneDNN's 14, eight 35 against 37); ``"torch"`` leaves them all as they are. Yields how many layers were changed. A
    model given twice is changed once."""
    if linears not in SPECULATION_LINEARS:
        raise ValueError(f"linears must be one of {', '.join(SPECULATION_LINEARS)}, not {linears!r}")
    with contextlib.ExitStack() as stack:
        count = 0
        for model in models if linears != "torch" else ():
            change = fp16_weight_linears(model) if linears == "fp16" else packed_linears(model, rows)
            count += stack.enter_context(change)
        yield count
