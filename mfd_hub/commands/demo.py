"""``mfd-hub demo``: the miniature, offline: SmolLM2-135M with the shipped MFD drafter."""

import click

from ._common import emit_json, examples
from ..errors import MfdHubError

DEFAULT_PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


@click.command(
    epilog=examples(
        "mfd-hub demo",
        "mfd-hub demo --budget 64 --max-new-tokens 200 'Write a function that reverses the words of a sentence.'",
        "mfd-hub demo --json",
    )
)
@click.argument("prompt", required=False, default=DEFAULT_PROMPT)
@click.option("--drafter", default="MFD-SmolLM2-135M", show_default=True,
              help="A shipped drafter (MFD-SmolLM2-135M, DPACE-SmolLM2-135M, DFlash-SmolLM2-135M) or a "
                   "checkpoint folder trained for SmolLM2-135M.")
@click.option("--budget", type=click.IntRange(min=1), default=32, show_default=True, help="Tree nodes per round.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the table.")
def demo(prompt, drafter, budget, max_new_tokens, as_json):
    """Run speculative decoding on the embedded SmolLM2-135M target, offline.

    Loads SmolLM2-135M-Instruct and a drafter trained for it (through AutoModel with
    trust_remote_code, as any user of a published drafter would), decodes PROMPT greedily with
    plain decoding, a chain, a product tree and a mixture tree, checks that all four outputs are
    token-identical, and prints tau and the speedup of each over plain decoding.
    """
    from ..zoo.demo import run_demo

    result = run_demo(prompt, drafter=drafter, budget=budget, max_new_tokens=max_new_tokens,
                      log=None if as_json else lambda line: click.echo(line, err=True))
    if as_json:
        emit_json(result)
    else:
        click.echo(f"\n{result['text']}\n")
        click.echo(f"{'method':<10} {'tokens':>6} {'rounds':>6} {'tau':>5} {'tok/s':>7} {'speedup':>8}  identical")
        for row in result["runs"]:
            click.echo(
                f"{row['method']:<10} {row['new_tokens']:>6} {row['rounds'] or '':>6} "
                f"{'' if row['tau'] is None else format(row['tau'], '.2f'):>5} {row['tokens_per_second']:>7.1f} "
                f"{row['speedup']:>7.2f}x  {'yes' if row['identical'] else 'NO'}"
            )
    if not all(row["identical"] for row in result["runs"]):
        raise MfdHubError("speculative output differs from plain greedy decoding: this is a bug, please report it")
