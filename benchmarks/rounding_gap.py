"""How far a verify pass's logits move from a decode step's over the same positions, per precision:
how far apart two computations of the same logits land (``docs/lossless.md``).

For each prompt (HumanEval's first problems, asked as the bench asks them), plain greedy decoding
writes ``--tokens`` new tokens and keeps its logits (one decode step a row). Then the target reads
the same tokens as verify passes of ``--rows`` rows over the cached prefix, and each of their
logit rows is compared with the decode step that predicted the same position. A precision is
``float32``, ``bfloat16``, ``float16``, or ``float32:packed`` / ``float32:fp16w`` (fp32 rows with
oneDNN-packed or fp16-rounded weights, ``mfd_hub/packed_linear.py``) / ``bfloat16:packed``. The gap is reported in
logits and in units in the last place of the step's largest logit, ``2^(floor(log2 |z|max) - p)``
with p the fraction bits of the precision's sums (7 bf16, 10 fp16, 23 for fp32 rows whatever the
weights).

    python benchmarks/rounding_gap.py                                  # bfloat16, float32:fp16w
    python benchmarks/rounding_gap.py --precisions float32 float32:packed --prompts 8 --rows 8
"""

import argparse
import contextlib
import copy
import math

import torch
from transformers import DynamicCache

from mfd_hub.packed_linear import fp16_weight_linears, packed_linears
from mfd_hub.precision import FRACTION_BITS, resolve_dtype
from mfd_hub.targets import encode_prompt, greedy_decode, load_target
from mfd_hub.zoo.bench import load_prompt_set


def ulp(row, bits):
    top = float(row.abs().max())
    return 2.0 ** (math.floor(math.log2(top)) - bits) if top else 0.0


def verify_rows(model, ids, start, rows):
    """Logits [rows, V] of one pass over ids[start:start+rows] after a prefill of ids[:start]."""
    cache = DynamicCache()
    model(input_ids=ids[:, :start], past_key_values=cache, use_cache=True)
    return model(input_ids=ids[:, start:start + rows], past_key_values=cache, use_cache=True).logits[0].float()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--precisions", nargs="+", default=["bfloat16", "float32:fp16w"])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per prompt")
    parser.add_argument("--rows", type=int, default=16, help="rows of a verify pass")
    args = parser.parse_args(argv)
    base, tokenizer = load_target(args.target)
    prompts = load_prompt_set("humaneval", args.prompts)
    print(f"{args.target}: verify passes of {args.rows} rows against decode steps, {args.prompts} prompts x "
          f"{args.tokens} tokens")
    print("| precision | rows compared | largest gap (logits) | largest gap (ulps of the top logit) |")
    print("|---|---|---|---|")
    with torch.inference_mode():
        for spec in args.precisions:
            name, _, linears = spec.partition(":")
            dtype = resolve_dtype(name)
            if linears and not (dtype == torch.float32 or (dtype == torch.bfloat16 and linears == "packed")):
                raise SystemExit(f"error: {spec!r}: only float32 takes :packed or :fp16w, bfloat16 :packed")
            model = base if spec == "float32" else copy.deepcopy(base).to(dtype)
            bits = FRACTION_BITS.get(dtype, 23)
            worst, worst_ulps, compared = 0.0, 0.0, 0
            with contextlib.ExitStack() as stack:
                if linears == "packed":
                    stack.enter_context(packed_linears(model, args.rows))
                elif linears == "fp16w":
                    stack.enter_context(fp16_weight_linears(model))
                elif linears:
                    raise SystemExit(f"error: {spec!r}: the suffix is :packed or :fp16w")
                for _, text in prompts:
                    prompt = encode_prompt(tokenizer, text)
                    new, logits = greedy_decode(model, prompt, args.tokens, return_logits=True)
                    ids = torch.cat([prompt, torch.tensor([new])], dim=1)
                    length = prompt.shape[1]
                    # decode step i predicted new token i from ids[:length + i]; a verify row j over
                    # ids[start + j] predicts the token after it
                    for start in range(length, length + len(new) - args.rows, args.rows):
                        rows = verify_rows(model, ids, start, args.rows)
                        for j in range(args.rows):
                            step = start + j + 1 - length
                            gap = float((rows[j] - logits[step].float()).abs().max())
                            worst = max(worst, gap)
                            worst_ulps = max(worst_ulps, gap / ulp(logits[step].float(), bits))
                            compared += 1
            print(f"| {spec} | {compared} | {worst:.3g} | {worst_ulps:.2f} |", flush=True)


if __name__ == "__main__":
    main()
