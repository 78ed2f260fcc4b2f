"""The measurement behind the bf16 near-tie rule (``mfd_hub.near_tie.NEAR_TIE_FACTOR``).

For each prompt, plain greedy decoding of the target in bf16 writes ``--tokens`` tokens with its own
logits, and one fp32 pass over the same tokens on the same (widened) weights gives every step's
exact logits. Then the shipped drafter speculates for the bf16 target (chain, product and mixture,
``--budget`` nodes) and, while its output still follows plain decoding, every verify row on the
accepted path is read against the exact row of its step. Reported:

- a verify row's error in the gap of the exact top two tokens, over plain decoding's
  ``rounding_error`` of the same step: the factor the rule must allow (the rule's derivation is in
  ``mfd_hub/precision.py``);
- the divergences of honest speculative decoding, their |exact gap| over the rounding error, and
  whether ``classify_divergence`` calls each a near-tie;
- at how many steps the runner-up (of plain decoding's logits) lies within the near-tie bound, and
  within the 20-ulp rule it replaced: how many steps a verifier emitting the runner-up could hide in.

    python benchmarks/near_tie_rule.py --prompts 6 --tokens 64
"""

import argparse
import copy
import math

import torch

from mfd_hub.near_tie import classify_divergence, exact_logits, near_tie_bound, rounding_error

METHODS = ("chain", "product", "mixture")


def twenty_ulps(row):
    """The rule the near-tie bound replaced: 20 units in the last place of the step's top logit (bf16)."""
    return 20 * 2.0 ** (math.floor(math.log2(float(row.abs().max()))) - 7)


def decode_both_ways(target, input_ids, max_new_tokens):
    """Plain greedy decoding of a bf16 ``target`` -> (tokens, its logits [N, V] in fp32, the exact
    logits [N, V] of the same steps)."""
    from mfd_hub.targets import greedy_decode

    tokens, logits = greedy_decode(target, input_ids, max_new_tokens, return_logits=True)
    return tokens, logits.float(), exact_logits(target, input_ids, tokens)[:-1]


def runner_up_counts(tokens, logits, exact):
    """-> (steps whose runner-up lies within the near-tie bound, ... within 20 ulps)."""
    within_bound = within_ulps = 0
    for step, token in enumerate(tokens):
        runner_up = int(logits[step].topk(2).indices[1])
        gap = abs(float(exact[step][token] - exact[step][runner_up]))
        within_bound += gap <= near_tie_bound(torch.bfloat16, logits[step], exact[step], (token, runner_up))
        within_ulps += float(logits[step][token] - logits[step][runner_up]) <= twenty_ulps(logits[step])
    return within_bound, within_ulps


def speculate_and_measure(drafter, target, input_ids, tokens, logits, exact, method, budget):
    """One honest speculative decoding -> (its lossless check, the verify rows' gap errors over
    plain decoding's rounding error, one per row on plain decoding's path)."""
    errors = [rounding_error(logits[step], exact[step]) for step in range(len(tokens))]
    ratios, walked = [], {"step": 1, "on_path": True}  # step 0 is the prefill's token

    def on_round(tree, node_tokens, node_logits, path):
        nodes = path.tolist()  # node i's logits chose the round's i-th emitted token
        emitted = node_tokens[path[1:]].tolist() + [int(node_logits[nodes[-1]].argmax())]
        for i, node in enumerate(nodes):
            step = walked["step"] + i
            if not walked["on_path"] or step >= len(tokens):
                break
            a, b = exact[step].topk(2).indices
            verify_gap = node_logits[node].float()[a] - node_logits[node].float()[b]
            ratios.append(abs(float(verify_gap - (exact[step][a] - exact[step][b]))) / errors[step])
            walked["on_path"] = emitted[i] == tokens[step]
        walked["step"] += len(nodes)

    out = drafter.spec_generate(target, input_ids, max_new_tokens=len(tokens), method=method, tree_budget=budget,
                                on_round=on_round)
    return classify_divergence(tokens, out.new_tokens, logits, torch.bfloat16, target, input_ids), ratios


def main(argv=None):
    from mfd_hub.checkpoint import load_draft
    from mfd_hub.targets import encode_prompt, load_target
    from mfd_hub.zoo.bench import load_prompt_set
    from mfd_hub.zoo.shipped import shipped_drafter_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=6,
                        help="HumanEval's first problems, asked as the bench asks them")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--budget", type=int, default=16, help="tree nodes (chain: its length)")
    args = parser.parse_args(argv)
    target32, tokenizer = load_target("smollm2")
    target = copy.deepcopy(target32).to(torch.bfloat16)
    drafter = load_draft(shipped_drafter_dir("MFD-SmolLM2-135M"))
    ratios, divergences, steps, within_bound, within_ulps, runs = [], [], 0, 0, 0, 0
    for _, text in load_prompt_set("humaneval", args.prompts):
        ids = encode_prompt(tokenizer, text)
        tokens, logits, exact = decode_both_ways(target, ids, args.tokens)
        counts = runner_up_counts(tokens, logits, exact)
        steps, within_bound, within_ulps = steps + len(tokens), within_bound + counts[0], within_ulps + counts[1]
        for method in METHODS:
            check, row_ratios = speculate_and_measure(drafter, target, ids, tokens, logits, exact, method, args.budget)
            ratios += row_ratios
            runs += 1
            if not check["identical"]:
                divergences.append(check)
    print(f"SmolLM2-135M in bf16, {args.prompts} prompts x {args.tokens} tokens, budget {args.budget}")
    print(f"verify rows: {len(ratios)}; gap error / plain decoding's rounding error: largest "
          f"{max(ratios):.2f}, median {sorted(ratios)[len(ratios) // 2]:.2f}")
    print(f"honest divergences: {len(divergences)} of {runs} runs, |exact gap| / rounding error up to "
          f"{max((abs(d['gap']) / d['rounding_error'] for d in divergences), default=0):.2f}, "
          f"near-ties: {sum(d['explained'] for d in divergences)}")
    print(f"runner-up within the near-tie bound at {within_bound} of {steps} steps, within 20 ulps at {within_ulps}")


if __name__ == "__main__":
    main()
