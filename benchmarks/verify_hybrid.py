"""Cost of one tree-verification round on a hybrid Gated-DeltaNet target (Qwen3.5 layout: three
linear-attention layers to one full-attention layer) next to a pure-attention target (Qwen3) of
the same width, depth, heads and vocabulary, in one run.

A round is ``verify`` over root + tree (one target pass) plus ``commit`` of an accepted path.
Prints, per tree size, the median milliseconds of both targets and their ratio (hybrid /
attention). Random weights: only the shapes matter for cost.

    python benchmarks/verify_hybrid.py                      # CPU, fp32, small shapes
    python benchmarks/verify_hybrid.py --device cuda --dtype bfloat16 --hidden 2560 --layers 32
"""

import argparse
import json
import statistics
import time

import torch

from mfd_hub.kernels.tree_attention import ancestor_mask
from mfd_hub.remote.targets_mfd import make_verifier
from mfd_hub.testing import tiny_target


NAMES = {"attention": "qwen3", "hybrid": "qwen3_5_text"}


def build_targets(args):
    heads = args.hidden // args.head_dim
    shared = dict(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        intermediate_size=3 * args.hidden,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=args.head_dim,
        max_position_embeddings=args.prefix + args.accept * (args.warmup + args.rounds) + 1024,
    )
    # linear attention as in Qwen3.5: twice as many value heads as key heads, value width = hidden
    linear = dict(
        linear_num_key_heads=max(1, heads // 2),
        linear_num_value_heads=heads,
        linear_key_head_dim=args.head_dim,
        linear_value_head_dim=args.head_dim,
    )
    dtype = getattr(torch, args.dtype)
    return {
        "attention": tiny_target(NAMES["attention"], **shared).to(args.device, dtype),
        "hybrid": tiny_target(NAMES["hybrid"], **shared, **linear).to(args.device, dtype),
    }


def tree_shape(n, max_depth, device, seed=0):
    """root + n - 1 nodes: a spine as deep as allowed, the rest hung on random shallower nodes."""
    gen = torch.Generator().manual_seed(seed)
    spine = min(n, max_depth + 1)
    parents, depths = [-1] + list(range(spine - 1)), list(range(spine))
    while len(parents) < n:
        p = int(torch.randint(0, len(parents), (1,), generator=gen))
        if depths[p] < max_depth:
            parents.append(p)
            depths.append(depths[p] + 1)
    parents = torch.tensor(parents, device=device)
    return torch.tensor(depths, device=device), ancestor_mask(parents)


def time_rounds(targets, args, n_nodes):
    """Alternate rounds between the targets (so load drift hits both alike) -> median ms per target."""
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, args.vocab, (1, args.prefix), generator=gen).to(device)
    depths, mask = tree_shape(n_nodes, args.max_depth, device)
    accepted = torch.arange(min(n_nodes, args.accept), device=device)  # the spine's first nodes
    verifiers = {name: make_verifier(t, [0, args.layers // 2]) for name, t in targets.items()}
    seconds = {name: {"verify": [], "commit": []} for name in targets}
    with torch.inference_mode():
        for verifier in verifiers.values():
            verifier.prefill(prompt)
        for r in range(args.warmup + args.rounds):
            tokens = torch.randint(0, args.vocab, (n_nodes,), generator=gen).to(device)
            for name, verifier in verifiers.items():
                sync()
                t0 = time.perf_counter()
                verifier.verify(tokens, depths, mask)
                sync()
                t1 = time.perf_counter()
                verifier.commit(accepted)
                sync()
                if r >= args.warmup:
                    seconds[name]["verify"].append(t1 - t0)
                    seconds[name]["commit"].append(time.perf_counter() - t1)

    def ms(xs):
        return 1000 * statistics.median(xs)

    return {
        name: {"verify_ms": ms(s["verify"]), "commit_ms": ms(s["commit"]),
               "round_ms": ms([a + b for a, b in zip(s["verify"], s["commit"])])}
        for name, s in seconds.items()
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--prefix", type=int, default=256, help="committed tokens before the first round")
    parser.add_argument("--trees", default="1,16,64", help="tree sizes (nodes incl. root)")
    parser.add_argument("--max-depth", type=int, default=15, help="deepest drafted position (block 16)")
    parser.add_argument("--accept", type=int, default=4, help="nodes committed per round")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    targets = build_targets(args)
    params = {name: sum(p.numel() for p in t.parameters()) for name, t in targets.items()}
    rows = []
    for n in (int(x) for x in args.trees.split(",")):
        timing = time_rounds(targets, args, n)
        ratio = timing["hybrid"]["round_ms"] / timing["attention"]["round_ms"]
        rows.append({"tree_nodes": n, **timing, "ratio": ratio})
    if args.json:
        print(json.dumps({"args": vars(args), "parameters": params, "rows": rows}, indent=2))
        return
    sizes = ", ".join(f"{name} ({NAMES[name]}) {count / 1e6:.1f}M parameters" for name, count in params.items())
    print(f"device {args.device} {args.dtype}; hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, "
          f"prefix {args.prefix}; {sizes}")
    print("median ms per round (verify + commit); ratio = hybrid / attention")
    header = ("tree nodes", "attention", "hybrid", "hybrid verify", "hybrid commit", "ratio")
    print(" | ".join(f"{h:>13}" for h in header))
    for r in rows:
        cells = (r["attention"]["round_ms"], r["hybrid"]["round_ms"], r["hybrid"]["verify_ms"],
                 r["hybrid"]["commit_ms"], r["ratio"])
        print(" | ".join([f"{r['tree_nodes']:>13}"] + [f"{c:>13.2f}" for c in cells]))


if __name__ == "__main__":
    main()
