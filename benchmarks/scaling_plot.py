"""Tau against training-data size: one line per method, from `mfd-hub bench` results.

Each point is a data size and the results.json that `mfd-hub bench --out DIR` wrote for the
drafters trained on that many regenerated answers (the same prompts, budgets and temperature in
every run). Prints the table and writes the plot:

    python benchmarks/scaling_plot.py --point 1200=bench/n1200/results.json \\
        --point 5000=bench/n5000/results.json --point 12000=bench/n12000/results.json \\
        --drafter MFD --budget 16 --out docs/miniature/scaling_T0.png
"""

import argparse
import json
import sys
from pathlib import Path

METHODS = ("chain", "product", "mixture")


def read_point(spec):
    size, _, path = spec.partition("=")
    if not size.isdigit() or not path:
        sys.exit(f"error: --point wants SIZE=RESULTS_JSON, got {spec!r}")
    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))["rows"]
    except (OSError, ValueError, KeyError) as err:
        sys.exit(f"error: {path} is not a results.json of mfd-hub bench ({err})")
    return int(size), rows


def tau_of(rows, method, budget, temperature, drafter):
    """The tau of ``method`` (at ``budget``; a chain at its own) in ``rows``, or None."""
    for row in rows:
        if (row["method"] == method and row["temperature"] == temperature
                and (method == "chain" or str(row["budget"]) == str(budget))
                and (drafter is None or drafter.lower() in row["drafter"].lower())):
            return row["tau"]
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--point", action="append", required=True, help="SIZE=RESULTS_JSON (repeat)")
    parser.add_argument("--budget", default="16", help="the tree budget of product and mixture")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--drafter", default=None, help="only rows whose drafter label contains this")
    parser.add_argument("--out", default=None, help="the plot (PNG); none: the table only")
    args = parser.parse_args(argv)

    points = sorted(read_point(spec) for spec in args.point)
    table = {m: [tau_of(rows, m, args.budget, args.temperature, args.drafter) for _, rows in points] for m in METHODS}
    print("| answers | " + " | ".join(f"{m} tau" for m in METHODS) + " |")
    print("|---|" + "---|" * len(METHODS))
    for i, (size, _) in enumerate(points):
        cells = ["" if table[m][i] is None else f"{table[m][i]:.2f}" for m in METHODS]
        print(f"| {size:,} | " + " | ".join(cells) + " |")
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for method in METHODS:
            xs = [size for (size, _), tau in zip(points, table[method]) if tau is not None]
            ys = [tau for tau in table[method] if tau is not None]
            if xs:
                label = method if method == "chain" else f"{method} (B = {args.budget})"
                ax.plot(xs, ys, marker="o", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("regenerated training answers")
        ax.set_ylabel("tau (tokens per round)")
        ax.set_title(f"SmolLM2-135M miniature, T = {args.temperature:g}")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=110)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
