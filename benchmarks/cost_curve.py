"""The cost curve that decides whether speculation pays: the target's forward over a cached
prefix with N new tokens (a tree verify of N nodes; N = 1 is a decode step), per dtype, measured
side by side (round-robin) in one process.

Prints, per dtype, the median milliseconds at each N and the ratio to that dtype's own decode
step, and which dtype decodes fastest. ``tree_budget="auto"`` measures the same curve once per
machine (``mfd_hub/remote/budget_mfd.py``) and caches it. A dtype written ``float32:packed`` (or
``float32:packedR``) runs fp32 with its linear layers through oneDNN, weights packed once for
about R rows (default 16; ``mfd_hub/packed_linear.py``), and ``bfloat16:packed`` the same for
bf16 on a CPU with native bf16; ``float32:fp16w`` multiplies by the weights rounded to fp16
(FBGEMM, fp32 rows and sums).

    python benchmarks/cost_curve.py                                   # SmolLM2-135M, fp32 and bf16
    python benchmarks/cost_curve.py --target ./my-target --dtypes float32 float16 --nodes 1 8 64
    python benchmarks/cost_curve.py --threads 1 --context 1000 --json
    python benchmarks/cost_curve.py --dtypes float32 float32:packed bfloat16
    python benchmarks/cost_curve.py --dtypes float32:packed float32:fp16w bfloat16
    python benchmarks/cost_curve.py --dtypes float32:packed bfloat16 bfloat16:packed
"""

import argparse
import contextlib
import copy
import json

import torch

from mfd_hub.kernels.tree_attention import ancestor_mask
from mfd_hub.packed_linear import fp16_weight_linears, packed_linears
from mfd_hub.precision import resolve_dtype
from mfd_hub.remote.budget_mfd import probe_tree
from mfd_hub.remote.targets_mfd import make_verifier
from mfd_hub.targets import load_target
from mfd_hub.timing import round_robin_ms


def forward_over(verifier, nodes, anchor, device):
    """A callable: one target pass over ``nodes`` new tokens (tree-shaped, depth <= 15), then a
    roll-back to the committed prefix, so every call sees the same context."""
    parents, depths = probe_tree(nodes, 15, device)
    tokens = torch.full((nodes,), anchor, dtype=torch.long, device=device)
    mask = ancestor_mask(parents, int(depths.max()))
    empty = torch.zeros(0, dtype=torch.long, device=device)

    def run():
        verifier.verify(tokens, depths, mask)
        verifier.commit(empty)

    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--nodes", nargs="+", type=int, default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--context", type=int, default=300, help="cached prefix length (tokens)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    base, _ = load_target(args.target, dtype=torch.float32, device=device)
    vocab = base.config.vocab_size
    prefix = torch.randint(0, vocab, (1, args.context), generator=torch.Generator().manual_seed(0)).to(device)
    calls, labels = [], []
    with torch.inference_mode(), contextlib.ExitStack() as packings:
        for spec in args.dtypes:
            name, _, packing = spec.partition(":")
            dtype = resolve_dtype(name, device)
            model = base if dtype == torch.float32 and not packing else copy.deepcopy(base).to(dtype)
            if packing:
                if not ((packing.startswith("packed") and dtype in (torch.float32, torch.bfloat16))
                        or (packing == "fp16w" and dtype == torch.float32)):
                    raise SystemExit(f"error: {spec!r}: only float32:packed[ROWS], bfloat16:packed[ROWS] (a CPU "
                                     "with native bf16) and float32:fp16w take a suffix")
                if packing == "fp16w":
                    if not packings.enter_context(fp16_weight_linears(model)):
                        raise SystemExit(f"error: {spec!r}: FBGEMM's fp16-weight products are not available here")
                elif not packings.enter_context(packed_linears(model, int(packing.removeprefix("packed") or 16))):
                    raise SystemExit(f"error: {spec!r}: oneDNN's packed linear layers are not available here")
            verifier = make_verifier(model, [0])
            verifier.prefill(prefix)
            for n in args.nodes:
                calls.append(forward_over(verifier, n, int(prefix[0, -1]), device))
                labels.append((str(dtype).removeprefix("torch.") + (f":{packing}" if packing else ""), n))
        ms = round_robin_ms(calls, args.repeats, device)
    table = {}
    for (dtype, n), value in zip(labels, ms):
        table.setdefault(dtype, {})[n] = value
    result = {"target": args.target, "context": args.context, "threads": torch.get_num_threads(),
              "device": str(device), "median_ms": table}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{args.target}: forward over a {args.context}-token cached prefix with N new tokens, median ms "
          f"({torch.get_num_threads()} threads, {device}, {args.repeats} round-robin repeats)")
    print("| N | " + " | ".join(str(n) for n in args.nodes) + " |")
    print("|---|" + "---|" * len(args.nodes))
    for dtype, row in table.items():
        print(f"| {dtype} | " + " | ".join(f"{row[n]:.0f}" for n in args.nodes) + " |")
    for dtype, row in table.items():
        first = row[args.nodes[0]]
        print(f"| {dtype} / its N={args.nodes[0]} | " + " | ".join(f"{row[n] / first:.2f}x" for n in args.nodes) + " |")
    fastest = min(table, key=lambda d: table[d][args.nodes[0]])
    print(f"fastest decode step: {fastest} ({table[fastest][args.nodes[0]]:.0f} ms)")


if __name__ == "__main__":
    main()
