"""Time one training step of a block drafter on this machine, side by side across settings.

The shapes default to the SmolLM2-135M miniature (hidden 576, 9 heads of 64, 3 KV heads,
vocabulary 49,152, 30 target layers): a drafter of ``--layers`` layers over random tap features
of one sequence (prompt + response tokens), the real DrafterObjective (drafter forward, LM head,
loss) and an AdamW step. The target is not needed: its features and LM head are random tensors
of the right shapes, which is all a step's cost depends on.

    python benchmarks/train_step.py                      # the default grid
    python benchmarks/train_step.py --anchors 16 32 --modes 8 --vocab 4096 --layers 2
    python benchmarks/train_step.py --blocks 16 8 --anchors 16 32 --modes 1 --draft-vocab 4096 --layers 2 --precision fp32
"""

import argparse
import itertools
import resource
import time
from types import SimpleNamespace

import torch

from mfd_hub.remote.configuration_mfd import DFlashConfig
from mfd_hub.remote.modeling_mfd import DFlashDraftModel
from mfd_hub.recipes.data import Sequence, make_batch, sample_anchors
from mfd_hub.recipes.losses import true_token_logprobs
from mfd_hub.converters.draft_vocab import reduce_vocabulary
from mfd_hub.recipes.trainer import DrafterObjective, add_modes


def drafter(hidden, layers, inter, vocab, modes, draft_vocab, head, block):
    config = DFlashConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                          num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 192), head_dim=64,
                          block_size=block, num_target_layers=30, target_layer_ids=[1, 7, 14, 20, 27],
                          mask_token_id=vocab - 1)
    torch.manual_seed(0)
    model = DFlashDraftModel(config).float()
    if modes > 1:
        model = add_modes(model, modes, False, 0.02, 0)
    if draft_vocab:
        model = reduce_vocabulary(model, head, torch.arange(draft_vocab)).float()
        model.lm_head.weight.requires_grad_(False)
    return model


def time_step(args, anchors, modes, vocab_d, chunk, repeats, precision):
    hidden, vocab = args.hidden, args.vocab
    autocast = torch.bfloat16 if precision == "bf16" else None
    head = torch.randn(vocab, hidden) * 0.02
    embed = torch.randn(vocab, hidden) * 0.02
    model = drafter(hidden, args.layers, args.intermediate, vocab, modes, vocab_d, head, args.block)
    loss = SimpleNamespace(type="mfd" if modes > 1 else "dpace", alpha=0.5, winner_weight=0.9, gate_weight=0.1,
                           gamma=7.0, default_weight=1.0)
    # as the trainer does: the frozen target head in the compute precision
    objective = DrafterObjective(model, embed, head.to(autocast or torch.float32), loss, head_chunk=chunk,
                                 autocast_dtype=autocast)
    optimizer = torch.optim.AdamW([p for p in objective.parameters() if p.requires_grad], lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_d or vocab, (args.length,), generator=gen).tolist()
    seq = Sequence("x", ids, args.prompt)
    picked = [sample_anchors(seq, anchors, 0, 0, 0)]
    taps = [torch.randn(args.length, 5 * hidden, generator=gen).to(torch.bfloat16)]
    batch = make_batch([seq], [0], picked, taps)
    times = []
    for _ in range(repeats + 1):  # the first step warms up allocations
        tick, cpu = time.perf_counter(), time.process_time()
        total, _ = objective(batch.ids, batch.lengths, batch.anchors, batch.block_valid, batch.taps)
        (total / anchors).backward()
        torch.nn.utils.clip_grad_norm_(objective.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - tick, time.process_time() - cpu))
    return min(times[1:])  # (wall seconds, CPU seconds of all threads)


def head_only(args, rows, vocab, repeats):
    """The fused true-token log-prob against log_softmax + gather under autograd (CPU seconds)."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(rows, args.hidden, generator=gen, requires_grad=True)
    w = torch.randn(vocab, args.hidden, generator=gen) * 0.02
    idx = torch.randint(0, vocab, (rows,), generator=gen)

    def fused():
        true_token_logprobs(h, w, idx).sum().backward()

    def plain():
        torch.log_softmax(h @ w.t(), -1).gather(1, idx[:, None]).sum().backward()

    out = {}
    for name, fn in (("fused", fused), ("log_softmax", plain)):
        times = []
        for _ in range(repeats + 1):
            tick = time.process_time()
            fn()
            times.append(time.process_time() - tick)
        out[name] = min(times[1:])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--layers", type=int, nargs="+", default=[1])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--draft-vocab", type=int, nargs="+", default=[0, 4096], help="0 = the full vocabulary")
    parser.add_argument("--anchors", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--blocks", type=int, nargs="+", default=[16], help="block sizes (anchor + drafted positions)")
    parser.add_argument("--modes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--length", type=int, default=400, help="prompt + response tokens")
    parser.add_argument("--head-chunk", type=int, default=0)
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"],
                        help="bf16: autocast (CPUs with AVX512-BF16/AMX run bf16 matmuls 2-3x faster)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-head", action="store_true", help="skip the LM-head comparison")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (1 gives steadier CPU seconds on a busy machine)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; hidden {args.hidden}, "
          f"intermediate {args.intermediate}, sequence {args.length} ({args.prompt} prompt)")
    if not args.skip_head:
        rows = 16 * 8 * 15
        for vocab in (4096, args.vocab):
            t = head_only(args, rows, vocab, args.repeats)
            print(f"LM head fwd+bwd, {rows} rows x vocab {vocab}: fused {t['fused']:.2f} CPU s, "
                  f"log_softmax+gather {t['log_softmax']:.2f} CPU s ({t['log_softmax'] / t['fused']:.2f}x)")
    # CPU seconds (all threads) are what a busy machine does not change much; wall = CPU / threads
    # on an idle one
    header = " ".join(f"{p + ' wall s':>11} {p + ' CPU s':>10}" for p in args.precision)
    ratio = "  fp32/bf16 (CPU)" if args.precision == ["fp32", "bf16"] else ""
    print(f"{'layers':>6} {'block':>5} {'modes':>5} {'anchors':>7} {'vocab':>6} {header}{ratio}")
    grid = itertools.product(args.layers, args.blocks, args.modes, args.anchors, args.draft_vocab)
    for layers, block, modes, anchors, vocab_d in grid:
        args.layers, args.block = layers, block
        seconds = [time_step(args, anchors, modes, vocab_d, args.head_chunk, args.repeats, p) for p in args.precision]
        cells = " ".join(f"{wall:>11.2f} {cpu:>10.2f}" for wall, cpu in seconds)
        extra = f"  {seconds[0][1] / seconds[1][1]:>15.2f}x" if ratio else ""
        print(f"{layers:>6} {block:>5} {modes:>5} {anchors:>7} {vocab_d or args.vocab:>6} {cells}{extra}", flush=True)
    print(f"peak resident memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
