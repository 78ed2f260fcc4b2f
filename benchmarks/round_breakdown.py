"""Where a speculative round's time goes, on the SmolLM2-135M target with an untrained drafter.

Runs ``spec_generate`` and times every part of a round through wrappers around the functions
the generation loop calls (synchronising CUDA around each part when the device is a GPU, so the
parts add up; the generation itself never does that unless ``sync_timing=True``):
  drafter        the drafter's forward and the LM head over K modes x 15 positions
  vocab top-k    logsumexp + each position's top-B over the vocabulary (``draft_candidates``)
  tree build     the chain / product / mixture tree from those candidates (``draft_tree``)
  tree mask      the ancestor mask (``ancestor_mask``)
  target verify  the target's forward over root + tree (mask -> bias inside)
  sampling       the target's next token at every node (argmax at T=0)
  accept walk    the accepted path and the bonus (``accept_walk``)
  commit         the KV compaction (``verifier.commit``)
  rest           the summary read, the drafter's context update, bookkeeping
The untrained drafter accepts little, so rounds are short; the per-round costs are what matter.
With ``--drafter`` a trained one (a shipped drafter's name or a checkpoint folder) runs instead, in
``--dtype`` with the products the demo uses, on HumanEval problems (``--problems``, as bench encodes them).

    python benchmarks/round_breakdown.py [--device cpu] [--backend auto] [--tokens 48] [--threads 1]
    python benchmarks/round_breakdown.py --drafter MFD-SmolLM2-135M --budget 16 --threads 2 --tokens 128
"""

import argparse
import contextlib
import time
from collections import defaultdict

import torch

from mfd_hub.kernels.backend import set_kernel_backend
from mfd_hub.remote import generation_mfd
from mfd_hub.targets import encode_prompt, load_target
from mfd_hub.testing import tiny_drafter

PROMPT = "Write a Python function that returns the n-th Fibonacci number."
PARTS = ("drafter", "vocab top-k", "tree build", "tree mask", "target verify", "sampling", "accept walk", "commit", "rest")


class PartClock:
    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.seconds = defaultdict(float)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def wrap(self, part, fn):
        def timed(*args, **kwargs):
            self.sync()
            started = time.perf_counter()
            result = fn(*args, **kwargs)
            self.sync()
            self.seconds[part] += time.perf_counter() - started
            return result

        return timed


def instrument(clock, drafter):
    """Wrap what the round calls; returns a function that undoes it."""
    saved = {name: getattr(generation_mfd, name) for name in ("draft_candidates", "draft_tree", "build_chain",
                                                               "ancestor_mask", "next_tokens", "accept_walk", "make_verifier")}
    generation_mfd.draft_candidates = clock.wrap("vocab top-k", saved["draft_candidates"])
    generation_mfd.draft_tree = clock.wrap("tree build", saved["draft_tree"])
    generation_mfd.build_chain = clock.wrap("tree build", saved["build_chain"])
    generation_mfd.ancestor_mask = clock.wrap("tree mask", saved["ancestor_mask"])
    generation_mfd.next_tokens = clock.wrap("sampling", saved["next_tokens"])
    generation_mfd.accept_walk = clock.wrap("accept walk", saved["accept_walk"])

    def make_verifier(target, tap_ids):
        verifier = saved["make_verifier"](target, tap_ids)
        verifier.verify = clock.wrap("target verify", verifier.verify)
        verifier.commit = clock.wrap("commit", verifier.commit)
        return verifier

    generation_mfd.make_verifier = make_verifier
    forward = drafter.forward
    drafter.forward = clock.wrap("drafter", forward)

    def undo():
        for name, fn in saved.items():
            setattr(generation_mfd, name, fn)
        drafter.forward = forward

    return undo


def measure_rounds(drafter, target, ids, method, budget, tokens, device, mode=0, num_modes=None):
    """One warm-up, then an instrumented ``spec_generate`` per prompt (``ids``: one, or a list)
    -> per-round figures: ``rounds``,
    ``tau``, ``parts`` (ms a round for each of PARTS), ``round_ms`` (the decoding loop's time a
    round, prefill excluded) and ``outside`` (the share of a round spent outside the target's
    verify forward). benchmarks/gpu_check.py reuses it on a Qwen3-8B-shaped target."""
    prompts = ids if isinstance(ids, list) else [ids]
    drafter.spec_generate(target, prompts[0], max_new_tokens=4, method=method, tree_budget=budget, mode=mode)  # warm-up
    clock = PartClock(device)
    undo = instrument(clock, drafter)
    rounds, emitted, loop = 0, 0, 0.0
    try:
        for prompt in prompts:
            clock.sync()
            started = time.perf_counter()
            out = drafter.spec_generate(target, prompt, max_new_tokens=tokens, method=method, tree_budget=budget, mode=mode,
                                        num_modes=num_modes if method == "mixture" else None)
            clock.sync()
            loop += time.perf_counter() - started - out.stage_seconds["prefill"]
            rounds += out.rounds
            emitted += sum(out.acceptance_lengths)
    finally:
        undo()
    parts = dict(clock.seconds)
    parts["rest"] = loop - sum(parts.values())
    per_round = {p: 1e3 * parts.get(p, 0.0) / rounds for p in PARTS}
    round_ms = 1e3 * loop / rounds
    return {
        "rounds": rounds,
        "tau": emitted / rounds,
        "parts": per_round,
        "round_ms": round_ms,
        "outside": 1 - per_round["target verify"] / round_ms,
    }


def problem_range(text):
    """'N' or 'N-M' -> (first, last) problem indices (a clear usage error otherwise)."""
    first, _, last = text.partition("-")
    if not first.isdigit() or not (last or first).isdigit() or int(last or first) < int(first):
        raise argparse.ArgumentTypeError(f"expected N or N-M with N <= M, got {text!r}")
    return int(first), int(last or first)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--budget", type=lambda v: v if v == "auto" else int(v), default=64, help="a tree budget or auto")
    parser.add_argument("--modes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--drafter", help="a trained drafter (shipped name or folder) instead of an untrained one")
    parser.add_argument("--dtype", default="auto", help="with --drafter: the pair's dtype (load_pair's)")
    parser.add_argument("--mixture-modes", type=int, action="append",
                        help="also run the mixture over the gate's best N modes (repeatable)")
    parser.add_argument("--problems", type=problem_range, default="0", help="with --drafter: HumanEval problems run one after the other, e.g. 0-4")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    set_kernel_backend(args.backend)
    with contextlib.ExitStack() as stack:
        if args.drafter:
            # imported here: gpu_check.py imports this file with only mfd_hub's kernels mapped
            from mfd_hub.pair import load_pair
            from mfd_hub.zoo.prompts import humaneval_prompts

            pair = load_pair(args.drafter, "smollm2", dtype=args.dtype, device=args.device)
            stack.enter_context(pair.packed())
            target, drafter = pair.target, pair.draft
            first, last = args.problems
            problems = humaneval_prompts()[first : last + 1]
            ids = [pair.encode(text).to(device) for _, text in problems]
            what = f"{args.drafter} ({pair.dtype}, products: {pair.linears})"
        else:
            target, tokenizer = load_target("smollm2", device=device)
            drafter = tiny_drafter(target, num_modes=args.modes, num_layers=1, block_size=16).to(device)
            ids = [encode_prompt(tokenizer, PROMPT).to(device)]
            what = f"untrained {args.modes}-mode drafter (1 layer)"
        report(args, drafter, target, ids, device, what)
    set_kernel_backend(None)


def report(args, drafter, target, ids, device, what):
    print(f"SmolLM2-135M target, {what}, {device}, kernels: {args.backend}, "
          f"{args.threads} thread(s), {args.tokens} new tokens, ms per round")
    print(f"{'method':8} {'B':>4} {'rounds':>6} {'tau':>5} | " + " ".join(f"{p:>13}" for p in PARTS) + f" | {'round':>7} {'non-target':>10}")
    runs = [(method, None) for method in ("chain", "product", "mixture")]
    runs += [("mixture", m) for m in args.mixture_modes or ()]
    for method, num_modes in runs:
        budget = drafter.config.block_size - 1 if method == "chain" and args.budget != "auto" else args.budget
        m = measure_rounds(drafter, target, ids, method, budget, args.tokens, device, mode="gate" if args.drafter else 0,
                           num_modes=num_modes)
        name = method if num_modes is None else f"mix/{num_modes}"
        print(f"{name:8} {budget:>4} {m['rounds']:>6} {m['tau']:>5.2f} | " + " ".join(f"{m['parts'][p]:>13.3f}" for p in PARTS)
              + f" | {m['round_ms']:>7.2f} {m['outside']:>9.1%}")


if __name__ == "__main__":
    main()
