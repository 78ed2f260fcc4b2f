"""Which dtype to decode in, and what "lossless" means in each.

Speculation pays where a tree verify costs little more than one decode step. On CPUs with native
bf16 (AMX-BF16 / AVX512-BF16) a 16-node bf16 verify costs about 1.1 decode steps against 2.3 in
fp32, so ``auto`` picks bf16 there, bf16 (else fp16) on CUDA, and fp32 elsewhere. The miniature's
``demo`` and ``bench`` measure instead (``mfd_hub.dtype_choice.fastest_speculation_dtype``): on a CPU
the target speculates in the dtype whose speculative decoding is fastest, timed on this machine,
and ``drafter_dtype`` keeps the drafter in fp32 where bf16 is emulated.

On a CPU without native bf16 the speculation commands multiply fp32 rows by fp16-rounded weights
instead (``mfd_hub.packed_linear.speculation_linears``): bf16's memory traffic at fp32's cost per row.

The guarantee per dtype (T = 0):
- float32 (exact or fp16-rounded weights): token-identical to plain greedy decoding with the same
  weights. No tolerance: fp32 sums in another order move a logit by about 1e-4
  (``benchmarks/rounding_gap.py``), far below the gap between two tokens in practice.
- bfloat16 / float16: output may leave plain decoding only at a near-tie of plain decoding's own
  logits, judged against the step's exact logits (``mfd_hub.near_tie``). Anything else is a bug
  (an error in ``mfd-hub demo`` and ``mfd-hub bench``).
"""

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FRACTION_BITS = {torch.bfloat16: 7, torch.float16: 10}


def cpu_has_native_bf16():
    """True when this CPU computes bf16 natively (AMX-BF16 or AVX512-BF16), as torch's own CPU
    probe or the kernel's CPU flags say."""
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        check = getattr(torch.cpu, probe, None)
        try:
            if check is not None and check():
                return True
        except RuntimeError:
            pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"amx_bf16", "avx512_bf16"})
    except OSError:
        pass
    return False


def auto_dtype(device="cpu"):
    """The dtype where speculation pays on ``device``."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if device.type == "cpu" and cpu_has_native_bf16() else torch.float32


def drafter_dtype(dtype, device="cpu"):
    """The drafter's dtype beside a target speculating in ``dtype`` under ``--dtype auto``: the same,
    except bf16/fp16 on a CPU without native bf16. There the drafter's pass (a block of rows per
    mode: compute-bound) runs emulated at about half its fp32 speed (SmolLM2 miniature, 2 cores:
    23.7 against 11.9 ms for one mode, 157 against 27 ms for eight), while the target's one-row
    decode step, bound by memory traffic, still gains from bf16; so the drafter stays in fp32.
    Mixed precision changes nothing emitted: the target verifies in its own dtype."""
    device = torch.device(device)
    if dtype in FRACTION_BITS and device.type == "cpu" and not cpu_has_native_bf16():
        return torch.float32
    return dtype


def resolve_dtype(name, device="cpu"):
    """'auto' / 'float32' / 'bfloat16' / 'float16' -> torch dtype (ValueError otherwise)."""
    if name == "auto":
        return auto_dtype(device)
    if name not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, not {name!r}")
    return DTYPES[name]


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")
