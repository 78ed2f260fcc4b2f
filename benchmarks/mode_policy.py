"""How well ``auto`` chooses the mixture's mode count, without the machine's timing noise.

Every policy decodes the same HumanEval problems with ``tree_budget="auto"`` (the product tree;
the mixture choosing its mode count; the mixture fixed to 1, 2, 4 or K modes), each starting from
fresh acceptance tables. Its speed is then modeled rather than timed: each round costs what
``auto`` itself was told it costs (this machine's cached measurement: the drafting side for the
modes the round drafted, the verify for its tree), so two policies compare by tokens per modeled
second with no load drifting between them. On a 2-core CPU, where a policy's edge is a few
percent and one run's timings move by more, this is what can tell a better choice from luck; the
bench's timed ratios remain the measure of speed. The choices themselves are deterministic given
the cached costs, so the report does not depend on what else runs.

    python benchmarks/mode_policy.py [--drafter MFD-SmolLM2-135M] [--limit 20] [--threads 2]
"""

import argparse

import torch

from mfd_hub.kernels.tree_attention import ancestor_mask
from mfd_hub.remote import budget_mfd
from mfd_hub.remote.targets_mfd import make_verifier


def policies(num_modes):
    """(label, method, num_modes) for every policy compared."""
    rows = [("product (gate's mode)", "product", None), ("mixture, auto modes", "mixture", None)]
    return rows + [(f"mixture, {m} modes", "mixture", m) for m in budget_mfd.mode_options(num_modes)]


def modeled(pair, prompts, method, num_modes, costs):
    """-> (tokens per modeled second, tau, {modes drafted: rounds}) of one policy over ``prompts``."""
    pair.draft.__dict__.pop("_auto_calibration", None)  # each policy learns from the drafter's own claims
    tokens = rounds = 0
    seconds = 0.0
    drafted = {}
    for _, text in prompts:
        out = pair.generate(text, method=method, tree_budget="auto", max_new_tokens=128, num_modes=num_modes)
        for size, modes in zip(out.tree_sizes, out.modes_drafted):
            seconds += (costs.draft(modes) if modes else 0.0) + costs.verify(size + 1)
            drafted[modes] = drafted.get(modes, 0) + 1
        tokens += sum(out.acceptance_lengths)
        rounds += out.rounds
    return tokens / seconds, tokens / rounds, dict(sorted(drafted.items()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default="MFD-SmolLM2-135M")
    parser.add_argument("--limit", type=int, default=20, help="the first N HumanEval problems")
    parser.add_argument("--threads", type=int, default=2, help="the thread count whose cached costs are used")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from mfd_hub.pair import load_pair
    from mfd_hub.zoo.prompts import humaneval_prompts

    pair = load_pair(args.drafter, "smollm2", dtype="auto")
    prompts = humaneval_prompts()[: args.limit]
    k = pair.draft.config.num_modes
    if k < 2:
        parser.error(f"{args.drafter} has {k} modes: there is no mode count to choose")
    with pair.packed():
        costs = budget_mfd.round_costs(pair.draft, pair.target, pair.encode(prompts[0][1]), make_verifier, ancestor_mask)
        print(f"{args.drafter}, {args.limit} HumanEval problems, {pair.dtype}, {args.threads} threads; cached costs "
              f"{costs.key}: drafting side " + ", ".join(f"{m} modes {1e3 * s:.2f} ms" for m, s in costs.draft_s.items())
              + f"; verify of 9 nodes {1e3 * costs.verify(9):.1f} ms")
        print(f"{'policy':24} {'tok/modeled s':>13} {'tau':>6}  rounds by modes drafted (0: plain step)")
        for label, method, modes in policies(k):
            rate, tau, drafted = modeled(pair, prompts, method, modes, costs)
            print(f"{label:24} {rate:>13.2f} {tau:>6.3f}  {drafted}", flush=True)


if __name__ == "__main__":
    main()
