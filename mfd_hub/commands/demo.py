"""``mfd-hub demo``: the miniature, offline: SmolLM2-135M with the shipped MFD drafter."""

import click

from ._common import MEASURED_DTYPE_HELP, budget_option, dtype_option, emit_json, examples, linears_option
from ._drafter import drafter_help
from ..errors import MfdHubError

DEFAULT_PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def describe_check(check):
    """One word (or phrase) for a lossless check of ``mfd_hub.near_tie.classify_divergence``."""
    if check is None:
        return ""
    if check["identical"]:
        return "identical"
    if check.get("near_tie"):
        return f"near-tie at token {check['step']} (exact gap {abs(check['gap']):.3f} <= {check['bound']:.3f})"
    reason = check.get("reason") or f"exact gap {abs(check['gap']):.3f} > bound {check['bound']:.3f}"
    return f"DIVERGED at token {check['step']} ({reason})"


@click.command(
    epilog=examples(
        "mfd-hub demo",
        "mfd-hub demo --budget 64 --max-new-tokens 200 'Write a function that reverses the words of a sentence.'",
        "mfd-hub demo --dtype float32 --budget 8",
        "mfd-hub demo --json",
    )
)
@click.argument("prompt", required=False, default=DEFAULT_PROMPT)
@click.option("--drafter", default="MFD-SmolLM2-135M", show_default=True, metavar="DRAFTER",
              help=drafter_help("A drafter trained for SmolLM2-135M"))
@budget_option(default="auto")
@dtype_option(help=MEASURED_DTYPE_HELP)
@linears_option()
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Interleaved timing repeats of every configuration (medians are reported).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the table.")
def demo(prompt, drafter, budget, dtype, linears, max_new_tokens, repeats, as_json):
    """Run speculative decoding on the embedded SmolLM2-135M target, offline.

    Loads SmolLM2-135M-Instruct and a drafter trained for it (through AutoModel with
    trust_remote_code, as any user of a published drafter would), decodes PROMPT greedily with
    plain decoding (fp32 and bf16: the baseline is the faster), a chain, a product tree and a
    mixture tree, all timed interleaved, and prints tau and the speedup of each over the fastest
    plain decoding. Checks every output against plain decoding in the same dtype: identical in
    fp32; in bf16/fp16 identical or diverging only at a near-tie (exit 1 otherwise).
    """
    from ..zoo.bench import ROUND_STAGES, round_stages_ms
    from ..zoo.demo import run_demo

    result = run_demo(prompt, drafter=drafter, budget=budget, max_new_tokens=max_new_tokens, dtype=dtype,
                      repeats=repeats, log=None if as_json else lambda line: click.echo(line, err=True), linears=linears)
    if as_json:
        emit_json(result)
    else:
        base = result["baseline"]
        click.echo(f"\n{result['text']}\n")
        click.echo(f"baseline: {base['method']} ({base['tokens_per_second']:.1f} tok/s, the faster plain decoding); "
                   f"speculation: target in {result['dtype']}, drafter in {result['drafter_dtype']}, budget "
                   f"{result['budget']}, {result['threads']} threads"
                   + {"onednn": ", fp32 products through oneDNN (packed weights)",
                      "onednn+bf16": ", fp32 and bf16 products through oneDNN (packed weights), plain decoding too",
                      "fp16-weights": ", fp32 rows times the weights rounded to fp16 (FBGEMM), plain float32 too"}
                   .get(result["linears"], ""))
        click.echo(f"{'method':<15} {'tokens':>6} {'rounds':>6} {'tau':>5} {'tok/s':>7} {'speedup':>8}  output")
        for row in result["runs"]:
            click.echo(
                f"{row['method']:<15} {row['new_tokens']:>6} {row['rounds'] or '':>6} "
                f"{'' if row['tau'] is None else format(row['tau'], '.2f'):>5} {row['tokens_per_second']:>7.1f} "
                f"{row['speedup']:>7.2f}x  {describe_check(row.get('lossless'))}"
            )
        # where a round's time goes, per method: what the speedups above are made of
        click.echo(f"\n{'ms a round':<15} {' / '.join(ROUND_STAGES):<30} modes drafted (mean)")
        for row in result["runs"]:
            if row["rounds"]:
                per_round = {k: v / row["rounds"] for k, v in row["stage_seconds"].items()}
                drafted = row.get("modes_drafted") or []
                modes = f"{sum(drafted) / len(drafted):.2f}" if drafted else ""
                click.echo(f"{row['method']:<15} {round_stages_ms(per_round):<30} {modes}")
    bad = [row["method"] for row in result["runs"] if row.get("lossless") and not row["lossless"]["explained"]]
    if bad:
        raise MfdHubError(f"{', '.join(bad)}: output differs from plain greedy decoding beyond what rounding in "
                          f"{result['dtype']} explains: this is a bug, please report it")
