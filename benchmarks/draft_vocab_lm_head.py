"""The drafter's LM-head cost against the draft vocabulary size (``mfd-hub convert draft-vocab``).

Per drafting round the drafter scores K modes x (S-1) positions over its vocabulary; the tree
builder then takes log-softmax and the top candidates. This times that stage (the real
``DFlashDraftModel.compute_logits`` + ``log_softmax`` + ``kernels.tree_build.top_candidates``)
with the full target vocabulary and with reduced draft vocabularies built by
``converters.reduce_vocabulary``, next to the drafter's own layers over the same block, and
prints side-by-side ratios. Random weights: only shapes matter for time.

    python benchmarks/draft_vocab_lm_head.py                     # SmolLM2-135M shapes (CPU)
    python benchmarks/draft_vocab_lm_head.py --hidden 4096 --vocab 151936 --device cuda   # Qwen3-8B shapes
"""

import argparse

import torch

from mfd_hub import DFlashConfig, DFlashDraftModel, DraftContextCache
from mfd_hub.timing import round_robin_ms
from mfd_hub.converters import reduce_vocabulary
from mfd_hub.kernels.tree_build import top_candidates


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--layers", type=int, default=2, help="drafter layers (for the 'layers' column)")
    parser.add_argument("--modes", type=int, default=8)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--context", type=int, default=300, help="committed context length")
    parser.add_argument("--budget", type=int, default=32, help="top candidates per position (tree budget)")
    parser.add_argument("--sizes", default="32768,16384,8192,4096,2048")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)

    head_dim = 64
    config = DFlashConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // head_dim,
        num_key_value_heads=max(1, args.hidden // head_dim // 3), head_dim=head_dim, block_size=args.block,
        num_target_layers=30, target_layer_ids=[1, 10, 19, 28], mask_token_id=args.vocab - 1, num_modes=args.modes,
    )
    drafter = DFlashDraftModel(config).eval()
    target_head = torch.nn.Linear(args.hidden, args.vocab, bias=False)
    torch.nn.init.normal_(target_head.weight, std=0.02)

    # Built outside inference_mode, as loading does: weights created as inference tensors take a
    # slower matmul path here (2x per row on CPU), which would flatter the full head.
    models = [("full", args.vocab, drafter, target_head)]
    for size in [int(s) for s in args.sizes.split(",")]:
        keep = torch.randperm(args.vocab)[:size].sort().values
        models.append((f"draft {size}", size, reduce_vocabulary(drafter, target_head.weight.detach(), keep), None))
    models = [(name, size, model.to(device, dtype), head and head.to(device, dtype)) for name, size, model, head in models]

    cache = DraftContextCache()
    with torch.inference_mode():
        taps = torch.randn(1, args.context, len(config.target_layer_ids) * args.hidden, device=device, dtype=dtype)
        drafter.extend_context(cache, taps, torch.arange(args.context, device=device))
        block = torch.randn(1, 1, args.block, args.hidden, device=device, dtype=dtype)
        hidden = drafter(block, args.context, cache=cache, modes="all").hidden_states[0, 0, :, 1:]  # [K, S-1, H]

        def layers():
            drafter(block, args.context, cache=cache, modes="all")

        def head_stage(model, lm_head):
            logprobs = torch.log_softmax(model.compute_logits(hidden, lm_head).float(), dim=-1)
            top_candidates(logprobs, args.budget)

        fns = [layers]
        for _, _, model, lm_head in models:
            fns.append(lambda model=model, lm_head=lm_head: model.compute_logits(hidden, lm_head))
            fns.append(lambda model=model, lm_head=lm_head: head_stage(model, lm_head))
        layer_ms, *head_ms = round_robin_ms(fns, args.repeats, device)
        rows = [(name, size, head_ms[2 * i], head_ms[2 * i + 1]) for i, (name, size, _, _) in enumerate(models)]

    full_logits, full_stage = rows[0][2], rows[0][3]
    print(f"device {device}, {args.dtype}, threads {torch.get_num_threads()}, H={args.hidden}, V={args.vocab}, "
          f"K={args.modes} x {args.block - 1} positions, context {args.context}, top-{args.budget}")
    print(f"drafter layers ({args.layers}) over the block: {layer_ms:.2f} ms")
    print("LM head = compute_logits; stage = LM head + log_softmax + top-k (what the tree builder pays)")
    print(f"{'vocabulary':<14}{'size':>7}{'size ratio':>12}{'head ms':>9}{'ratio':>8}{'stage ms':>10}{'ratio':>8}"
          f"{'stage/layers':>14}")
    for name, size, head_ms, stage_ms in rows:
        print(f"{name:<14}{size:>7}{size / args.vocab:>12.3f}{head_ms:>9.2f}{head_ms / full_logits:>8.3f}"
              f"{stage_ms:>10.2f}{stage_ms / full_stage:>8.3f}{stage_ms / layer_ms:>14.2f}")


if __name__ == "__main__":
    main()
