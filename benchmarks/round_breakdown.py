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

    python benchmarks/round_breakdown.py [--device cpu] [--backend auto] [--tokens 48] [--threads 1]
"""

import argparse
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


def measure_rounds(drafter, target, ids, method, budget, tokens, device, mode=0):
    """One warm-up, then one instrumented ``spec_generate`` -> per-round figures: ``rounds``,
    ``tau``, ``parts`` (ms a round for each of PARTS), ``round_ms`` (the decoding loop's time a
    round, prefill excluded) and ``outside`` (the share of a round spent outside the target's
    verify forward). benchmarks/gpu_check.py reuses it on a Qwen3-8B-shaped target."""
    drafter.spec_generate(target, ids, max_new_tokens=4, method=method, tree_budget=budget, mode=mode)  # warm-up
    clock = PartClock(device)
    undo = instrument(clock, drafter)
    try:
        clock.sync()
        started = time.perf_counter()
        out = drafter.spec_generate(target, ids, max_new_tokens=tokens, method=method, tree_budget=budget, mode=mode)
        clock.sync()
        total = time.perf_counter() - started
    finally:
        undo()
    loop = total - out.stage_seconds["prefill"]
    parts = dict(clock.seconds)
    parts["rest"] = loop - sum(parts.values())
    per_round = {p: 1e3 * parts.get(p, 0.0) / out.rounds for p in PARTS}
    round_ms = 1e3 * loop / out.rounds
    return {
        "rounds": out.rounds,
        "tau": out.tau,
        "parts": per_round,
        "round_ms": round_ms,
        "outside": 1 - per_round["target verify"] / round_ms,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--modes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    set_kernel_backend(args.backend)
    target, tokenizer = load_target("smollm2", device=device)
    drafter = tiny_drafter(target, num_modes=args.modes, num_layers=1, block_size=16).to(device)
    ids = encode_prompt(tokenizer, PROMPT).to(device)
    print(f"SmolLM2-135M target, untrained {args.modes}-mode drafter (1 layer), {device}, kernels: {args.backend}, "
          f"{args.threads} thread(s), {args.tokens} new tokens, ms per round")
    print(f"{'method':8} {'B':>4} {'rounds':>6} {'tau':>5} | " + " ".join(f"{p:>13}" for p in PARTS) + f" | {'round':>7} {'non-target':>10}")
    for method in ("chain", "product", "mixture"):
        budget = 15 if method == "chain" else args.budget
        m = measure_rounds(drafter, target, ids, method, budget, args.tokens, device)
        print(f"{method:8} {budget:>4} {m['rounds']:>6} {m['tau']:>5.2f} | " + " ".join(f"{m['parts'][p]:>13.3f}" for p in PARTS)
              + f" | {m['round_ms']:>7.2f} {m['outside']:>9.1%}")
    set_kernel_backend(None)


if __name__ == "__main__":
    main()
