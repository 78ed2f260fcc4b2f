"""The bf16/fp16 near-tie rule: when may a speculative output leave plain greedy decoding?

In bfloat16 / float16 a verify pass over N rows and a one-row decode step add the same numbers
in a different order, so their logits differ by rounding. Output may leave plain decoding only
where plain decoding itself stood at a near-tie: at the first divergent step, the two tokens
(plain decoding's and speculation's) must lie within ``NEAR_TIE_FACTOR`` times that step's
rounding error of each other in exact arithmetic (``near_tie_bound``). Anything else is a bug (an
error in ``mfd-hub demo`` and ``mfd-hub bench``). float32 allows no divergence at all.

The bound. Plain decoding chose a over b (its logits p_a >= p_b), the verify pass b over a
(v_b >= v_a). Against exact logits x (fp32 arithmetic on the same rounded weights, same prefix),
the exact gap x_a - x_b is then at most the error the verify pass made in that gap, and its
negative at most the error plain decoding made in it. Plain decoding's error is known at the
step: ``rounding_error`` is the largest error it made in the gap between any two of the exact top
``NEAR_TIE_TOKENS`` tokens (the spread of p - x over them; a shift common to all logits cancels
in a gap). The verify pass's is not (its tree is not kept), but it rounds the same numbers in
another order, and measured on SmolLM2-135M in bf16 (``benchmarks/near_tie_rule.py``: 6 HumanEval
prompts x 64 tokens, chain/product/mixture trees, 853 verify rows) its error in the gap of the
exact top two tokens was at most 1.79 times plain decoding's ``rounding_error`` of the same step
(1.96 in a run on other prompts). ``NEAR_TIE_FACTOR`` = 3 leaves half again that margin. On those
384 steps the runner-up lies within the bound at 64, against 236 for the rule it replaces (20
units in the last place of the top logit); every divergence of honest speculation (8 of 18 runs)
lay within it, at most 0.5 times the rounding error apart.
"""

import torch

from .packed_linear import plain_copy
from .precision import FRACTION_BITS, dtype_name

NEAR_TIE_TOKENS = 20  # the exact top tokens over which plain decoding's rounding error is read
NEAR_TIE_FACTOR = 3.0  # a verify pass's error in a gap, measured: <= 1.96 x plain decoding's (docstring)


def exact_logits(target, input_ids, tokens):
    """The target's logits in fp32 arithmetic on its own weights (bf16 and fp16 widen to fp32
    exactly) over ``input_ids`` [1, L] followed by ``tokens`` -> [len(tokens) + 1, V]: row i
    predicts the token after ``tokens[:i]``. A copy of the target computes them (its linear
    layers plain, whatever ``packed_linear`` swapped in), so the target itself is left as it is."""
    exact = plain_copy(target).float()
    ids = torch.cat([input_ids, torch.tensor([list(tokens)], dtype=input_ids.dtype)], dim=1).to(exact.device)
    with torch.inference_mode():
        return exact(input_ids=ids).logits[0, input_ids.shape[1] - 1 :].float()


def rounding_error(rounded, exact, tokens=()):
    """The largest error a rounded logit row makes in the gap between two of the top
    ``NEAR_TIE_TOKENS`` tokens of the ``exact`` row, or of ``tokens`` (the spread of
    rounded - exact over them)."""
    chosen = torch.cat([exact.topk(min(NEAR_TIE_TOKENS, exact.numel())).indices,
                        torch.tensor(list(tokens), dtype=torch.long, device=exact.device)])
    error = rounded.to(exact.device).float()[chosen] - exact[chosen]
    return float(error.max() - error.min())


def near_tie_bound(dtype, rounded, exact, tokens=()):
    """The largest exact logit gap between two of ``tokens`` that rounding in ``dtype`` explains at
    a step whose plain decoding logits are ``rounded`` and exact logits ``exact`` (0 for float32:
    there, any divergence is an error)."""
    if dtype not in FRACTION_BITS:
        return 0.0
    return NEAR_TIE_FACTOR * rounding_error(rounded, exact, tokens)


def classify_divergence(plain_tokens, spec_tokens, plain_logits, dtype, target=None, input_ids=None):
    """Compare a speculative output with plain greedy decoding of the same target and dtype.

    plain_logits: plain decoding's own logits, one [V] row per emitted token (transformers
    ``generate(output_logits=True)``); ``target`` and the prompt ``input_ids``: to recompute the
    divergent step exactly (needed for bfloat16 / float16). Returns a dict: ``identical``; else
    ``step`` (the first divergent index), ``plain_token`` / ``spec_token``, ``gap`` (their exact
    logit difference), ``rounding_error`` (plain decoding's at that step), ``bound`` and
    ``near_tie`` (|gap| <= bound); ``explained`` is True when the output is identical or diverges
    at a near-tie."""
    n = min(len(plain_tokens), len(spec_tokens))
    step = next((i for i in range(n) if plain_tokens[i] != spec_tokens[i]), None)
    if step is None:
        if len(plain_tokens) == len(spec_tokens):
            return {"identical": True, "explained": True}
        step = n  # one stopped earlier: the other emitted a token where the first stopped
        if step >= len(plain_tokens):  # plain stopped (max tokens or a stop id) and spec went on
            return {"identical": False, "explained": False, "step": step, "reason": "length differs"}
    plain_token = int(plain_tokens[step])
    spec_token = int(spec_tokens[step]) if step < len(spec_tokens) else None
    if spec_token is None:
        return {"identical": False, "explained": False, "step": step, "reason": "speculation stopped early"}
    if dtype not in FRACTION_BITS:  # float32: no tolerance, nothing to recompute
        row = plain_logits[step].float()
        return {"identical": False, "explained": False, "near_tie": False, "step": step, "plain_token": plain_token,
                "spec_token": spec_token, "gap": float(row[plain_token] - row[spec_token]), "rounding_error": 0.0,
                "bound": 0.0}
    if target is None or input_ids is None:
        raise ValueError(f"a {dtype_name(dtype)} divergence is judged against the target's exact logits: "
                         "pass target and input_ids")
    exact = exact_logits(target, input_ids, plain_tokens[:step])[-1]
    pair = (plain_token, spec_token)
    error = rounding_error(plain_logits[step], exact, pair)
    gap = float(exact[plain_token] - exact[spec_token])
    bound = NEAR_TIE_FACTOR * error
    near = abs(gap) <= bound
    return {"identical": False, "explained": near, "near_tie": near, "step": step, "plain_token": plain_token,
            "spec_token": spec_token, "gap": gap, "rounding_error": error, "bound": bound}
