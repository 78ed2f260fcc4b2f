"""``mfd-hub bench``: tau, speedup and tree statistics over a prompt set, side by side."""

import click

from ._common import MEASURED_DTYPE_HELP, dtype_option, emit_json, examples, linears_option
from ._drafter import drafter_help
from ..errors import UsageError


def _numbers(text, name, kind, minimum):
    """A comma-separated option value -> list of ``kind`` (int or float), each >= ``minimum``."""
    words = "whole numbers" if kind is int else "numbers"
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{name} takes comma-separated {words}, not {text!r}") from None
    if not values or min(values) < minimum:
        raise UsageError(f"{name} takes {words} >= {minimum:g}, not {text!r}")
    return values


def _budgets(text):
    """--budgets: whole numbers >= 1 and/or 'auto', comma-separated."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    fixed = _numbers(",".join(w for w in words if w != "auto"), "--budgets", int, 1) if any(w != "auto" for w in words) else []
    if not words:
        raise UsageError(f"--budgets takes whole numbers >= 1 and/or 'auto', not {text!r}")
    return fixed + (["auto"] if "auto" in words else [])


@click.command(
    epilog=examples(
        "mfd-hub bench --limit 20",
        "mfd-hub bench --limit 20 --budgets 4,8,16,32,64,auto --methods product --dtype float32",
        "mfd-hub bench --budgets 16,32,64 --temperatures 0,1 --out bench/humaneval",
        "mfd-hub bench --limit 164 --out bench-results --resume",
        "mfd-hub bench --prompts my-prompts.jsonl --drafter MFD-SmolLM2-135M --methods product,mixture --json",
        "mfd-hub bench --target ./Qwen3-4B --drafter ./MFD-Qwen3-4B --limit 10",
    )
)
@click.option("--target", "target_spec", default="smollm2", show_default=True,
              help="Target: 'smollm2' (embedded), a folder or a Hub id.")
@click.option("--drafter", "drafters", multiple=True, metavar="DRAFTER",
              help=drafter_help("Drafter to measure (repeatable)")
              + " Default with smollm2: MFD-SmolLM2-135M and DPACE-SmolLM2-135M.")
@click.option("--prompts", "prompt_spec", default="humaneval", show_default=True,
              help="'humaneval' (164 problems, built in) or a JSON Lines file with a prompt field.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use the first N prompts only.")
@click.option("--methods", default="chain,product,mixture", show_default=True,
              help="Comma-separated subset of chain, product, mixture (mixture needs an MFD drafter).")
@click.option("--budgets", default="16,32,64", show_default=True,
              help="Tree budgets B, and/or 'auto' (chosen per round from this machine's costs); chain: the smallest.")
@dtype_option(help=MEASURED_DTYPE_HELP)
@linears_option()
@click.option("--temperatures", default="0", show_default=True, help="Sampling temperatures (0 = greedy).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", "out_dir", default="bench-results", show_default=True,
              help="Folder for results.json, results.md and the PNG plots.")
@click.option("--resume", is_flag=True,
              help="Go on with the run in --out: its finished prompts (progress.jsonl) are read back, not run again; "
                   "the settings must be the same. Without it, a run starts afresh.")
@click.option("--json", "as_json", is_flag=True, help="Print the result rows as one JSON document.")
def bench(target_spec, drafters, prompt_spec, limit, methods, budgets, dtype, linears, temperatures, max_new_tokens,
          seed, out_dir, resume, as_json):
    """Benchmark drafters against a target over a prompt set: plain decoding and every
    drafter x method x budget x temperature, back to back per prompt (ratios, not absolute
    times, are what a noisy machine can report). Reports tau, speedup over plain decoding,
    time per stage, the share of tree nodes that are chimeras, and the target probability mass
    the tree covers per depth; at T = 0 every output is also checked against plain decoding.
    Each finished prompt is kept in --out (progress.jsonl): with --resume, a run stopped part
    way, or asked again with a larger --limit, runs only the prompts it has not done.
    """
    from ..zoo.bench import run_bench_command

    method_list = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = sorted(set(method_list) - {"chain", "product", "mixture"})
    if unknown or not method_list:
        raise UsageError(f"--methods takes chain, product and/or mixture, not {methods!r}")
    result = run_bench_command(
        target_spec, list(drafters), prompt_spec, limit, method_list, _budgets(budgets),
        _numbers(temperatures, "--temperatures", float, 0), max_new_tokens, seed, out_dir,
        log=None if as_json else lambda line: click.echo(line, err=True), dtype=dtype, resume=resume, linears=linears,
    )
    if as_json:
        emit_json(result)
    else:
        click.echo(result["markdown"])
        click.echo(f"written to {out_dir}: {', '.join(result['files'])}")
