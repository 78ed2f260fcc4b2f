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
- bfloat16 / float16: a verify pass over N rows and a one-row decode step add the same numbers in
  a different order, so their logits differ by rounding. Output may leave plain decoding only where
  plain decoding itself stood at a near-tie: at the first divergent step, the gap between the
  logit of the token plain decoding chose and the logit of the token speculation emitted (both
  read from plain decoding's own logits) must be within ``rounding_bound``. Anything else is a
  bug (an error in ``mfd-hub demo`` and ``mfd-hub bench``).

The bound. Logits are stored in the dtype, so two of them are distinguishable only to within one
unit in the last place of the largest, ``ulp = 2^(floor(log2 |z|max) - p)`` (p = 7 fraction bits
for bf16, 10 for fp16); each layer's output is rounded to the dtype as well, and these roundings,
added in another order, move every logit by a few such units. The bound allows ``ROUNDING_ULPS``
units of the top logit. Measured on SmolLM2-135M in bf16 (``benchmarks/rounding_gap.py``, 12
HumanEval prompts x 96 tokens, 960 rows): a verify pass moves a logit by up to 9.5 units from the
decode step over the same position, and a gap is the difference of two logits, so it can move by
twice that: 20 units. (The first bound, 8, came from 96 rows whose largest move was 5.0 units;
on all 164 problems one output diverged where plain decoding's gap was 10 units, 1.25 logits,
while the fp32 target put the two tokens 0.49 logits apart on the same context: a near-tie.) A
token the target did not prefer lies, in practice, many units below its best.
"""

import math

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FRACTION_BITS = {torch.bfloat16: 7, torch.float16: 10}
ROUNDING_ULPS = 20


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


def rounding_bound(dtype, logits):
    """The largest logit gap rounding in ``dtype`` explains, for a step whose logits are ``logits``
    (0 for float32: there, any divergence is an error)."""
    bits = FRACTION_BITS.get(dtype)
    if bits is None:
        return 0.0
    top = float(logits.abs().max())
    if top == 0:
        return 0.0
    return ROUNDING_ULPS * 2.0 ** (math.floor(math.log2(top)) - bits)


def classify_divergence(plain_tokens, spec_tokens, plain_logits, dtype):
    """Compare a speculative output with plain greedy decoding of the same target and dtype.

    plain_logits: plain decoding's own logits, one [V] row per emitted token (transformers
    ``generate(output_logits=True)``). Returns a dict: ``identical``; else ``step`` (the first
    divergent index), ``plain_token`` / ``spec_token``, ``gap`` (their logit difference in plain
    decoding's logits), ``bound`` and ``near_tie`` (gap <= bound); ``explained`` is True when the
    output is identical or diverges at a near-tie."""
    n = min(len(plain_tokens), len(spec_tokens))
    step = next((i for i in range(n) if plain_tokens[i] != spec_tokens[i]), None)
    if step is None:
        if len(plain_tokens) == len(spec_tokens):
            return {"identical": True, "explained": True}
        step = n  # one stopped earlier: the other emitted a token where the first stopped
        if step >= len(plain_tokens):  # plain stopped (max tokens or a stop id) and spec went on
            return {"identical": False, "explained": False, "step": step, "reason": "length differs"}
    row = plain_logits[step].float()
    plain_token = int(plain_tokens[step])
    spec_token = int(spec_tokens[step]) if step < len(spec_tokens) else None
    if spec_token is None:
        return {"identical": False, "explained": False, "step": step, "reason": "speculation stopped early"}
    gap = float(row[plain_token] - row[spec_token])
    bound = rounding_bound(dtype, row)
    near = gap <= bound
    return {"identical": False, "explained": near, "near_tie": near, "step": step, "plain_token": plain_token,
            "spec_token": spec_token, "gap": gap, "bound": bound}
