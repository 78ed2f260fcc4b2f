"""Tau against training-data size: one line per drafter and method, from `mfd-hub bench` results.

Each point is a data size and the results.json that `mfd-hub bench --out DIR` wrote for the
drafters trained on that many regenerated answers (the same prompts, budgets and temperature in
every run). One line per drafter and method (a chain at its own length, the trees at --budget);
--drafter keeps the drafters whose label contains it. Prints the table and writes the plot:

    python benchmarks/scaling_plot.py --point 1200=bench/n1200/results.json \\
        --point 5000=bench/n5000/results.json --point 12000=bench/n12000/results.json \\
        --budget 16 --out docs/miniature/scaling_T0.png
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


def series_of(points, budget, temperature, drafter):
    """{(drafter, method): {size: tau}} over every point: a chain at its own budget, trees at ``budget``."""
    series = {}
    for size, rows in points:
        for row in rows:
            if row["temperature"] != temperature or row["method"] not in METHODS:
                continue
            if row["method"] != "chain" and str(row["budget"]) != str(budget):
                continue
            if drafter is not None and drafter.lower() not in row["drafter"].lower():
                continue
            # bench labels a drafter folder DIR/final as "DIR/final": the folder names it
            series.setdefault((row["drafter"].removesuffix("/final"), row["method"]), {})[size] = row["tau"]
    return series


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--point", action="append", required=True, help="SIZE=RESULTS_JSON (repeat)")
    parser.add_argument("--budget", default="16", help="the tree budget of product and mixture")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--drafter", default=None, help="only rows whose drafter label contains this")
    parser.add_argument("--out", default=None, help="the plot (PNG); none: the table only")
    args = parser.parse_args(argv)

    points = sorted(read_point(spec) for spec in args.point)
    sizes = [size for size, _ in points]
    series = series_of(points, args.budget, args.temperature, args.drafter)
    if not series:
        sys.exit(f"error: no chain, product or mixture rows at T = {args.temperature:g}"
                 + (f" for a drafter matching {args.drafter!r}" if args.drafter else ""))
    names = sorted(series, key=lambda key: (key[0], METHODS.index(key[1])))
    print("| answers | " + " | ".join(f"{d} {m} tau" for d, m in names) + " |")
    print("|---|" + "---|" * len(names))
    for size in sizes:
        cells = [f"{series[key][size]:.2f}" if size in series[key] else "" for key in names]
        print(f"| {size:,} | " + " | ".join(cells) + " |")
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        styles = {"chain": ":", "product": "--", "mixture": "-"}
        for drafter, method in names:
            xs = sorted(series[(drafter, method)])
            ys = [series[(drafter, method)][x] for x in xs]
            label = f"{drafter} {method}" + ("" if method == "chain" else f" (B = {args.budget})")
            ax.plot(xs, ys, marker="o", linestyle=styles[method], label=label)
        ax.set_xscale("log")
        ax.set_xticks(sizes, [f"{size:,}" for size in sizes])
        ax.minorticks_off()  # the sizes themselves label the axis
        ax.set_xlabel("regenerated training answers")
        ax.set_ylabel("tau (tokens per round)")
        ax.set_title(f"SmolLM2-135M miniature, T = {args.temperature:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=110)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
