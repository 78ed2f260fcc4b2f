"""How much tau moves when nothing about the drafter changes: the measurement behind the
acceptance check's threshold (``mfd_hub.acceptance.THRESHOLD``).

The same shipped drafter and the SmolLM2 target are measured on the acceptance prompts exactly as
a record is (T = 0, ``NEW_TOKENS`` tokens, every method) under settings that must not matter to a
sound drafter: repeated runs, thread counts, the precision both models compute in (float32,
float16, bfloat16) and, in float32, products through weights rounded to fp16 or packed by oneDNN
(``--linears fp16`` / ``onednn``, ``mfd_hub/packed_linear.py``: the acceptance check multiplies
with whichever of them is faster on the machine). Each setting's tau per method is compared with the first float32
run's; the largest relative move is the spread, and the threshold is one minus three spreads,
rounded down to a multiple of 5%.

    python benchmarks/acceptance_spread.py                       # data/smollm2/acceptance-spread.json
    python benchmarks/acceptance_spread.py --drafter DPACE-SmolLM2-135M --runs 2 --threads 1 --out spread.json

Each setting costs about one acceptance record (a minute or two of one core on the miniature).
"""

import argparse
import json
import math
import time
from pathlib import Path

import torch

from mfd_hub.acceptance import NEW_TOKENS, PROMPTS, THRESHOLD, TREE_BUDGET, count_acceptance, methods_of, prompt_ids
from mfd_hub.acceptance import prompts_fingerprint, tau_of
from mfd_hub.checkpoint import load_draft
from mfd_hub.packed_linear import packed_for_speculation
from mfd_hub.precision import dtype_name
from mfd_hub.targets import load_target

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "data" / "smollm2" / "acceptance-spread.json"
# (label, dtype, linears): float32 with torch's products is the reference every other is compared with
# (the coarsest precision early: it decides the spread; the file is rewritten after every setting)
SETTINGS = (
    ("float32", torch.float32, "torch"),
    ("bfloat16", torch.bfloat16, "torch"),
    ("float32, fp16-rounded products", torch.float32, "fp16"),
    ("float32, oneDNN-packed products", torch.float32, "onednn"),
    ("float16", torch.float16, "torch"),
)


def measure(draft, target, prompt_list, methods, linears):
    with packed_for_speculation(draft, target, linears=linears):
        return {m: count_acceptance(draft, target, prompt_list, m) for m in methods}


def derive_threshold(spread):
    """1 - 3 x spread, rounded down to a multiple of 5%."""
    return math.floor((1 - 3 * spread) * 20 + 1e-9) / 20


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", default="MFD-SmolLM2-135M")
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--runs", type=int, default=1, help="float32 runs per thread count")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    rows = []
    reference = None
    for label, dtype, linears in SETTINGS:
        draft = load_draft(args.drafter, dtype=dtype)
        target, tokenizer = load_target(args.target, dtype=dtype)
        prompt_list = prompt_ids(tokenizer, target.config.vocab_size)
        methods = methods_of(draft)
        # thread counts and repeats only where they could show a difference: the reference precision
        plan = [(t, r) for t in args.threads for r in range(args.runs)] if label == "float32" else [(args.threads[0], 0)]
        for threads, run in plan:
            torch.set_num_threads(threads)
            began = time.perf_counter()
            counts = measure(draft, target, prompt_list, methods, linears)
            tau = {m: tau_of(c) for m, c in counts.items()}
            reference = reference or tau
            moved = {m: abs(tau[m] - reference[m]) / reference[m] for m in tau}
            rows.append({"setting": label, "dtype": dtype_name(dtype), "linears": linears, "threads": threads, "run": run,
                         "tau": tau, "relative_move": moved, "per_prompt": counts,
                         "seconds": round(time.perf_counter() - began, 1)})
            print(f"{label:<32} threads {threads} run {run}: "
                  + ", ".join(f"{m} {tau[m]:.3f} ({100 * moved[m]:+.2f}%)" for m in tau), flush=True)
            write(args, rows)


def write(args, rows):
    """The spread document over the rows measured so far, written to ``args.out``."""
    spread = max(max(r["relative_move"].values()) for r in rows)
    worst = max(rows, key=lambda r: max(r["relative_move"].values()))
    document = {
        "drafter": args.drafter,
        "target": args.target,
        "prompts": {"sha256": prompts_fingerprint(), "count": len(PROMPTS)},
        "measured": {"temperature": 0, "new_tokens": NEW_TOKENS, "tree_budget": TREE_BUDGET},
        "rows": rows,
        "spread": spread,
        "spread_setting": worst["setting"],
        "threshold_derived": derive_threshold(spread),
        "threshold_in_use": THRESHOLD,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"spread so far {100 * spread:.2f}% ({worst['setting']}): threshold 1 - 3 x spread, rounded down = "
          f"{derive_threshold(spread):.2f} (in use: {THRESHOLD:.2f}) -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
