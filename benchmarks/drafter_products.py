"""The drafter's pass per mode count with each CPU product it could multiply with, side by side.

A mixture round pays for the drafter over m modes (m copies of the block: 8 m rows through every
linear layer). On a GPU the paper's serving engine runs the drafter's linears in FP8; on a CPU the
candidates are the products torch ships:
  bf16-onednn   bf16 weights packed for oneDNN (what the demo uses on a CPU with native bf16)
  fp32-onednn   fp32 weights packed for oneDNN
  fp16-weights  fp32 rows times fp16-rounded weights (FBGEMM, what the demo uses on AVX2-only CPUs)
  int8-dynamic  fp32 rows quantised per call times int8 weights, one scale per output channel
                (FBGEMM, torch's dynamic quantisation; VNNI where the CPU has it)
Each is timed on the shipped drafter's real pass (the target's tap features as context, a
HumanEval prompt), round-robin with the others, median ms. With ``--tau N`` each product's drafter
also decodes the first N HumanEval problems with the mixture at B = 16 against the bf16 (or, without
native bf16, fp32) target, so a cheaper product is read with its acceptance beside it.

    python benchmarks/drafter_products.py [--drafter MFD-SmolLM2-135M] [--threads 2] [--repeats 15] [--tau 4]
"""

import argparse
import contextlib

import torch
import torch.nn as nn

from mfd_hub.packed_linear import fp16_weight_linears, packed_linears, plain_copy
from mfd_hub.precision import cpu_has_native_bf16
from mfd_hub.remote.budget_mfd import mode_options
from mfd_hub.remote.context_mfd import DraftContextCache
from mfd_hub.remote.targets_mfd import make_verifier
from mfd_hub.timing import round_robin_ms

PRODUCTS = ("bf16-onednn", "fp32-onednn", "fp16-weights", "int8-dynamic")


def drafter_with(product, drafter, stack):
    """A copy of ``drafter`` multiplying with ``product`` for as long as ``stack`` is open, or None
    where this CPU or torch cannot run it."""
    if product == "bf16-onednn":
        if not cpu_has_native_bf16():
            return None
        model = plain_copy(drafter).to(torch.bfloat16)
        return model if stack.enter_context(packed_linears(model, 16)) else None
    model = plain_copy(drafter).float()
    if product == "fp32-onednn":
        return model if stack.enter_context(packed_linears(model, 16)) else None
    if product == "fp16-weights":
        return model if stack.enter_context(fp16_weight_linears(model)) else None
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return None
    torch.backends.quantized.engine = "fbgemm"
    per_channel = torch.ao.quantization.per_channel_dynamic_qconfig  # per-tensor scales lose acceptance
    # model is already a copy of its own: quantise it in place rather than copy it once more
    return torch.ao.quantization.quantize_dynamic(model, {nn.Linear: per_channel}, dtype=torch.qint8, inplace=True)


def pass_timer(model, target, prompt_ids, modes):
    """A function running ``model``'s pass over ``modes`` (a count) at the end of the prompt."""
    verifier = make_verifier(target, model.target_layer_ids)
    _, taps = verifier.prefill(prompt_ids)
    cache = DraftContextCache()
    model.extend_context(cache, taps[None].to(model.dtype), torch.arange(prompt_ids.shape[1]))
    block = torch.full((1, 1, model.config.block_size), model.mask_token_id)
    block[..., 0] = int(prompt_ids[0, -1])
    embeds = model.embed_block(block, target.get_input_embeddings()).to(model.dtype)
    position = torch.full((1, 1), prompt_ids.shape[1])
    chosen = torch.arange(modes)
    head = target.get_output_embeddings()
    return lambda: model(embeds, position, cache=cache, modes=chosen, lm_head=head)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default="MFD-SmolLM2-135M")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tau", type=int, default=0, help="also decode the first N HumanEval problems (mixture, B = 16)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from mfd_hub.pair import load_pair
    from mfd_hub.zoo.prompts import humaneval_prompts

    pair = load_pair(args.drafter, "smollm2", dtype="auto")
    problems = humaneval_prompts()
    prompt_ids = pair.encode(problems[0][1])
    counts = mode_options(pair.draft.config.num_modes)
    with contextlib.ExitStack() as stack, torch.inference_mode():
        stack.enter_context(pair.packed())
        models = {p: drafter_with(p, pair.draft, stack) for p in PRODUCTS}
        models = {p: m for p, m in models.items() if m is not None}
        fns = [pass_timer(m, pair.target, prompt_ids, c) for m in models.values() for c in counts]
        ms = iter(round_robin_ms(fns, args.repeats, torch.device("cpu")))
        table = {p: {c: next(ms) for c in counts} for p in models}
    print(f"{args.drafter}'s pass, median ms over {args.repeats} round-robin repeats, {args.threads} threads; "
          f"target {pair.dtype} ({pair.linears})")
    print(f"{'product':14}" + "".join(f"{str(c) + ' modes':>10}" for c in counts) + ("   tau (mixture, B = 16)" if args.tau else ""))
    for product, row in table.items():
        tau = ""
        if args.tau:
            tau = f"   {mixture_tau(pair, models[product], problems[: args.tau]):.3f}"
        print(f"{product:14}" + "".join(f"{row[c]:>10.2f}" for c in counts) + tau)


def mixture_tau(pair, model, problems):
    """Mean tau of ``model`` drafting for the pair's target over ``problems`` (mixture, B = 16)."""
    emitted = rounds = 0
    with pair.packed():
        for _, text in problems:
            out = model.spec_generate(pair.target, pair.encode(text), max_new_tokens=128, method="mixture",
                                      tree_budget=16, stop_token_ids=pair.stop_ids)
            emitted += sum(out.acceptance_lengths)
            rounds += out.rounds
    return emitted / rounds


if __name__ == "__main__":
    main()
