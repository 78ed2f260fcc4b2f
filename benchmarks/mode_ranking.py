"""Which modes a subset-drafting mixture should draft: does the gate, or do the modes that won
recent rounds, predict the mode that wins the next one?

Runs the MFD drafter's mixture over all K modes at a fixed budget on HumanEval problems (as
``bench`` encodes them, stopping where plain decoding stops) and, for every round that accepted at
least one drafted token, takes its winner: the best mode of the deepest accepted node (the
smallest index reaching its score, as the tree records it). Each ranking is read before the round:
  gate     the gate's logits on the anchor's feature (what ``num_modes`` drafts today)
  recent   the modes by how often they won the last ``--window`` rounds (ties: the gate's order)
  mix      the gate's probability plus the recent share of wins, halves weighted equally
and the report gives, per ranking, how often the winner is among its best 1, 2 and 4 modes
(chance: m / K). The rankings are only read: decoding itself is the all-mode mixture's.

    python benchmarks/mode_ranking.py [--drafter MFD-SmolLM2-135M] [--limit 20] [--budget 16] [--json out.json]
"""

import argparse
import json
from collections import deque

import torch

from mfd_hub import load_pair
from mfd_hub.remote import generation_mfd
from mfd_hub.zoo.prompts import humaneval_prompts

TOPS = (1, 2, 4)


def rankings(gate_logits, recent, k):
    """{ranking name: the K modes best first} before a round."""
    gate_order = gate_logits.argsort(descending=True, stable=True).tolist()
    position = {m: i for i, m in enumerate(gate_order)}
    wins = [sum(1 for w in recent if w == m) for m in range(k)]
    share = [w / max(1, len(recent)) for w in wins]
    probs = torch.softmax(gate_logits.float(), -1).tolist()
    return {
        "gate": gate_order,
        "recent": sorted(range(k), key=lambda m: (-wins[m], position[m])),
        "mix": sorted(range(k), key=lambda m: (-(0.5 * probs[m] + 0.5 * share[m]), position[m])),
    }


def measure(pair, prompts, budget, tokens, window):
    """Per ranking: hits of the winner among its best m, for m in TOPS, and the rounds counted."""
    draft = pair.draft
    k = draft.config.num_modes
    hits = {name: {m: 0 for m in TOPS} for name in ("gate", "recent", "mix")}
    counted = 0
    resolve = generation_mfd._resolve_modes
    for _, text in prompts:
        recent = deque(maxlen=window)
        pending = {}

        def watched(draft_, method, mode, cache, num_modes):
            pending["gate"] = draft_.mode_gate(cache.last_feature)[0].detach()
            return resolve(draft_, method, mode, cache, num_modes)

        def on_round(tree, tokens_, logits, path):
            nonlocal counted
            if len(path) < 2:  # nothing drafted was accepted: no winner
                return
            winner = int(tree.modes[path[-1]])
            for name, order in rankings(pending["gate"], recent, k).items():
                for m in TOPS:
                    hits[name][m] += winner in order[:m]
            counted += 1
            recent.append(winner)

        generation_mfd._resolve_modes = watched
        try:
            pair.generate(text, method="mixture", tree_budget=budget, max_new_tokens=tokens, on_round=on_round)
        finally:
            generation_mfd._resolve_modes = resolve
    return hits, counted


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default="MFD-SmolLM2-135M")
    parser.add_argument("--limit", type=int, default=20, help="the first N HumanEval problems")
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--window", type=int, default=8, help="rounds the recent ranking counts wins over")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    pair = load_pair(args.drafter, "smollm2", dtype=args.dtype)
    k = pair.draft.config.num_modes
    if k < 2:
        parser.error(f"{args.drafter} has {k} modes: there is nothing to rank")
    hits, counted = measure(pair, humaneval_prompts()[: args.limit], args.budget, args.tokens, args.window)
    report = {"drafter": args.drafter, "problems": args.limit, "budget": args.budget, "dtype": str(pair.dtype),
              "window": args.window, "rounds_with_a_winner": counted, "modes": k,
              "hit_rate": {name: {str(m): by_m[m] / max(1, counted) for m in TOPS} for name, by_m in hits.items()},
              "chance": {str(m): m / k for m in TOPS}}
    print(f"{args.drafter}, mixture over {k} modes at B = {args.budget}, {args.limit} HumanEval problems, "
          f"{pair.dtype}: {counted} rounds with a winner")
    print(f"{'ranking':8} " + " ".join(f"{'top-' + str(m):>7}" for m in TOPS))
    for name, rates in report["hit_rate"].items():
        print(f"{name:8} " + " ".join(f"{rates[str(m)]:>7.1%}" for m in TOPS))
    print(f"{'chance':8} " + " ".join(f"{m / k:>7.1%}" for m in TOPS))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
