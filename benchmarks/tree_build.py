"""Tree build: the exact K-mode mixture tree vs a best-first heap build of one mode (DDTree-style),
side by side in one run, 15 positions, vocabulary 151,936.

Each method is timed in two parts, and the ratios are printed for both:
  vocab  the vocabulary-wide work from the drafter's logits [K, 15, V]:
           heap (1 mode): log_softmax over V, then top-B
           mixture (K modes): logsumexp over V, top-(B+1) on the raw logits, exact quantisation
  build  everything after it, from the per-position candidates to the tree's token / parent /
         depth tensors (the mixture also gives the DFS-preorder layout, scores and modes)
The heap baseline is written here for the benchmark: the classic best-first search (pop the best
frontier prefix, push its next sibling and its first child), float scores, reading candidates
through a zero-copy view as the mixture does. On CUDA (and with triton) the mixture is also
timed through the Triton kernels (``--device cuda``).

    python benchmarks/tree_build.py [--threads 1] [--repeats 30] [--device cpu]
"""

import argparse
import heapq

import torch

from mfd_hub.timing import round_robin_ms
from mfd_hub.kernels.backend import set_kernel_backend
from mfd_hub.kernels.tree_build import build_mixture_tree, draft_candidates, draft_tree

VOCAB = 151_936
POSITIONS = 15


def synthetic_logits(modes, seed=0, device="cpu", vocab=VOCAB, positions=POSITIONS):
    """Drafter-like logits [modes, positions, vocab]: noise plus a few confident tokens per
    position; half of each mode's favourites are shared with the other modes (the modes agree on
    some futures, not all). benchmarks/gpu_check.py uses other vocabularies and depths."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(modes, positions, vocab, generator=g) * 2
    shared = torch.randint(0, vocab, (positions, 3), generator=g)
    rows = torch.arange(positions)
    for k in range(modes):
        own = torch.randint(0, vocab, (positions, 3), generator=g)
        pick = torch.where(torch.rand(positions, 1, generator=g) < 0.5, shared, own)
        for rank, boost in enumerate((14.0, 12.0, 11.0)):
            logits[k, rows, pick[:, rank]] += boost
    return logits.to(device)


def heap_vocab(logits, budget):
    """DDTree-style: log-probabilities over the vocabulary, then each position's top-B."""
    return torch.log_softmax(logits.float(), dim=-1).topk(budget, dim=-1)


def heap_build(values, ids, budget, anchor=0):
    """Best-first product tree of one mode: the B most probable prefixes, parents first."""
    depth_max, width = values.shape
    value_at = values.detach().cpu().contiguous().numpy().reshape(-1).item
    token_at = ids.detach().cpu().contiguous().numpy().reshape(-1).item
    heap = [(-value_at(0), (0,))]  # (-log-probability, the rank of each position's token)
    index = {(): 0}
    tokens, parents, depths = [anchor], [-1], [0]
    while heap and len(tokens) <= budget:
        neg, ranks = heapq.heappop(heap)
        depth, rank = len(ranks), ranks[-1]
        index[ranks] = len(tokens)
        tokens.append(token_at((depth - 1) * width + rank))
        parents.append(index[ranks[:-1]])
        depths.append(depth)
        row = (depth - 1) * width
        if rank + 1 < width:  # next sibling
            heapq.heappush(heap, (neg + value_at(row + rank) - value_at(row + rank + 1), ranks[:-1] + (rank + 1,)))
        if depth < depth_max:  # first child
            heapq.heappush(heap, (neg - value_at(depth * width), ranks + (0,)))
    return torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths)


def mixture_build(scores, ids, budget, anchor=0):
    return build_mixture_tree(scores, ids, budget, anchor)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (both sides alike)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--budgets", type=int, nargs="+", default=[32, 64, 128])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    logits8 = synthetic_logits(8, device=device)
    print(f"tree build, {POSITIONS} positions, vocabulary {VOCAB}, {args.threads} thread(s), {device}, median ms")
    header = f"{'K':>2} {'B':>4} | {'heap1 vocab':>11} {'build':>7} | {'mix vocab':>9} {'build':>7} | {'build ratio':>11} {'total ratio':>11}"
    print(header)
    print("-" * len(header))
    set_kernel_backend("torch")
    for modes in (1, 8):
        logits = logits8[:modes]
        for budget in args.budgets:
            values, ids = heap_vocab(logits8[0], budget)
            scores, cand = draft_candidates(logits, budget)
            # side by side, round-robin: a shared machine drifts
            t_heap_vocab, t_heap, t_mix_vocab, t_mix = (ms / 1e3 for ms in round_robin_ms([
                lambda: heap_vocab(logits8[0], budget), lambda: heap_build(values, ids, budget),
                lambda: draft_candidates(logits, budget), lambda: mixture_build(scores, cand, budget),
            ], args.repeats, device))
            print(
                f"{modes:>2} {budget:>4} | {t_heap_vocab * 1e3:>11.3f} {t_heap * 1e3:>7.3f} | "
                f"{t_mix_vocab * 1e3:>9.3f} {t_mix * 1e3:>7.3f} | {t_mix / t_heap:>11.2f} "
                f"{(t_mix_vocab + t_mix) / (t_heap_vocab + t_heap):>11.2f}"
            )
    if device.type == "cuda":
        set_kernel_backend("triton")
        print("\nTriton kernels (CUDA): mixture vocab (top-k kernels) and build (tree kernels), median ms")
        for modes in (1, 8):
            for budget in args.budgets:
                logits = logits8[:modes].to(torch.bfloat16)
                scores, cand = draft_candidates(logits, budget)
                t_vocab, t_tree = (ms / 1e3 for ms in round_robin_ms([
                    lambda: draft_candidates(logits, budget), lambda: draft_tree(scores, cand, budget, 0, VOCAB),
                ], args.repeats, device))
                print(f"{modes:>2} {budget:>4} | vocab {t_vocab * 1e3:8.3f} | build {t_tree * 1e3:8.3f}")
    set_kernel_backend(None)


if __name__ == "__main__":
    main()
