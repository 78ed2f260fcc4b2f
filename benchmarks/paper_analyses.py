"""The paper's analyses of the miniature, as markdown tables, from `mfd-hub bench` and
`mfd-hub evaluate` outputs (no model is run here):

- tau of chain, product and mixture per budget and temperature;
- mixture against product at equal budget: the MFD drafter's mixture tree over the D-PACE
  drafter's product tree (same base, data and compute) and over its own gate-mode product tree
  (paper: mixture tau >= 1.05x product tau);
- the target probability mass the tree covers, summed over depths and per depth (paper: the
  mixture covers 8-10% more at equal budget);
- the chimera share of the product tree at the largest budget (paper: 27-33% at B = 64);
- with --evaluate, the mode diagnostics of held-out answers (paper: 7.9-8.0 effective modes of 8,
  the gate picks the winning mode 28% of the time against 12.5% chance).

    python benchmarks/paper_analyses.py --results data/smollm2/retrain/full/bench-humaneval-164-T0/results.json \\
        --results data/smollm2/retrain/full/bench-humaneval-164-T0.7/results.json --evaluate data/smollm2/retrain/full/evaluate.json
"""

import argparse
import json
import sys
from pathlib import Path


def read_json(path, what):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        sys.exit(f"error: {path} is not {what} ({err})")


def find(rows, drafter, method, budget=None, temperature=None):
    """The row of ``method`` (at ``budget``, any for a chain) for the drafter whose label contains
    ``drafter`` (case-insensitive), at ``temperature``; None if the run has none."""
    for row in rows:
        if (drafter.lower() in row["drafter"].lower() and row["method"] == method and row["temperature"] == temperature
                and (method == "chain" or budget is None or str(row["budget"]) == str(budget))):
            return row
    return None


def total_mass(row):
    return sum(row["mass_per_depth"].values()) if row and row.get("mass_per_depth") else None


def ratio(a, b):
    return f"{a / b:.3f}x" if a is not None and b else ""


def number(x, digits=2):
    return "" if x is None else f"{x:.{digits}f}"


def budgets_of(rows):
    return sorted({int(r["budget"]) for r in rows if r["method"] != "chain" and str(r["budget"]).isdigit()})


def tau_table(rows, temperature, mfd, dpace):
    budgets = budgets_of(rows)
    lines = ["| drafter | chain | " + " | ".join(f"product B={b} | mixture B={b}" for b in budgets) + " |",
             "|---|---|" + "---|---|" * len(budgets)]
    for label in (dpace, mfd):
        named = [row["drafter"] for row in rows if label.lower() in row["drafter"].lower()]
        if not named:
            continue
        chain = find(rows, label, "chain", temperature=temperature)
        cells = [number(chain and chain["tau"])]
        for b in budgets:
            for method in ("product", "mixture"):
                row = find(rows, label, method, b, temperature)
                cells.append(number(row and row["tau"]))
        lines.append(f"| {named[0]} | " + " | ".join(cells) + " |")
    return lines


def mixture_table(rows, temperature, mfd, dpace):
    # mass: the target probability of the tree's nodes summed over depths (the expected accepted drafts)
    lines = ["| B | mixture tau | over D-PACE product | over MFD gate-mode product | mixture mass | over D-PACE product | over MFD product |",
             "|---|---|---|---|---|---|---|"]
    for b in budgets_of(rows):
        mix, own, other = (find(rows, mfd, "mixture", b, temperature), find(rows, mfd, "product", b, temperature),
                           find(rows, dpace, "product", b, temperature))
        if mix is None:
            continue
        lines.append(f"| {b} | {number(mix['tau'])} | {ratio(mix['tau'], other and other['tau'])} | "
                     f"{ratio(mix['tau'], own and own['tau'])} | {number(total_mass(mix), 3)} | "
                     f"{ratio(total_mass(mix), total_mass(other))} | {ratio(total_mass(mix), total_mass(own))} |")
    return lines


def depth_table(rows, temperature, mfd, dpace, budget):
    mix, other = find(rows, mfd, "mixture", budget, temperature), find(rows, dpace, "product", budget, temperature)
    if not (mix and other and mix.get("mass_per_depth")):
        return []
    depths = sorted(int(d) for row in (mix, other) for d, mass in row["mass_per_depth"].items() if mass >= 0.0005)
    depths = list(range(1, max(depths) + 1)) if depths else []  # up to the deepest with mass to show
    lines = ["| depth | " + " | ".join(str(d) for d in depths) + " |", "|---|" + "---|" * len(depths)]
    for label, row in (("mixture (MFD)", mix), ("product (D-PACE)", other)):
        lines.append(f"| {label} | " + " | ".join(number(row["mass_per_depth"].get(str(d), 0.0), 3) for d in depths) + " |")
    return lines


def chimera_lines(rows, temperature, mfd, dpace):
    budget = max(budgets_of(rows), default=None)
    out = []
    for label in (dpace, mfd):
        for method in ("product", "mixture"):
            row = find(rows, label, method, budget, temperature)
            if row and row.get("chimera_share") is not None:
                out.append(f"- {label} {method}, B = {budget}: chimera share {100 * row['chimera_share']:.1f}%")
    return out


def evaluate_lines(report):
    k = report["num_modes"]
    return [f"- held-out answers: {report['sequences']} sequences, {report['blocks']} blocks, K = {k}",
            f"- effective modes (exp of the entropy of which mode wins a block): {report['effective_modes']:.2f} of {k}",
            f"- the gate picks the winning mode {100 * report['gate_top1_accuracy']:.1f}% of the time "
            f"(chance {100 * report['chance']:.1f}%)",
            f"- coverage: best mode {report['best_mode_coverage']:.3f}, the gate's mode {report['gate_choice_coverage']:.3f}, "
            f"mean mode {sum(report['coverage_per_mode']) / k:.3f}"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", action="append", required=True, help="a results.json of mfd-hub bench (repeat)")
    parser.add_argument("--evaluate", help="the JSON of mfd-hub evaluate --json for the MFD drafter")
    parser.add_argument("--mfd", default="mfd", help="the MFD drafter's label contains this")
    parser.add_argument("--dpace", default="dpace", help="the D-PACE drafter's label contains this")
    args = parser.parse_args(argv)
    rows = [row for path in args.results for row in read_json(path, "a results.json of mfd-hub bench").get("rows", [])]
    if not rows:
        sys.exit("error: no result rows in " + ", ".join(args.results))
    for temperature in sorted({row["temperature"] for row in rows}):
        at = [row for row in rows if row["temperature"] == temperature]
        prompts = max(row["prompts"] for row in at)
        print(f"\n#### T = {temperature:g} ({prompts} prompts)\n")
        print("\n".join(tau_table(at, temperature, args.mfd, args.dpace)))
        print("\nMixture against product at equal budget (tau, and the target mass the tree covers summed over depths):\n")
        print("\n".join(mixture_table(at, temperature, args.mfd, args.dpace)))
        budget = max(budgets_of(at), default=None)
        depth = depth_table(at, temperature, args.mfd, args.dpace, budget)
        if depth:
            print(f"\nTarget mass covered per depth, B = {budget}:\n")
            print("\n".join(depth))
        chimeras = chimera_lines(at, temperature, args.mfd, args.dpace)
        if chimeras:
            print()
            print("\n".join(chimeras))
    if args.evaluate:
        print("\n#### Modes\n")
        print("\n".join(evaluate_lines(read_json(args.evaluate, "a JSON of mfd-hub evaluate"))))


if __name__ == "__main__":
    main()
