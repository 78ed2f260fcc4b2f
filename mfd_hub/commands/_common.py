"""What every command shares: example epilogs and JSON output (kept apart from ``mfd_hub.cli``
so that importing a command never imports the CLI group that registers it)."""

import json

import click


def examples(*lines):
    """An epilog of runnable examples for a command's --help (kept verbatim by click)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def emit_json(payload):
    """Machine-readable output: one JSON document on stdout."""
    click.echo(json.dumps(payload, indent=2, sort_keys=False, default=str))


class BudgetType(click.ParamType):
    """A tree budget: a whole number >= 1, or ``auto`` (chosen per round from measured costs)."""

    name = "budget"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == "auto":
            return value
        try:
            number = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is neither 'auto' nor a whole number", param, ctx)
        if number < 1:
            self.fail(f"{number} is below 1", param, ctx)
        return number


def budget_option(default="auto"):
    return click.option(
        "--budget", type=BudgetType(), default=default, show_default=True,
        help="Tree nodes per round, or 'auto': each round picks the budget (and, for the mixture, how many "
             "of the gate's best modes to draft: 1, 2, 4 or all) with the most expected tokens per second on this machine.")


MEASURED_DTYPE_HELP = ("Dtype of target and drafter for speculation; auto: on a CPU without native bf16, float32 "
                       "with fp16 weights (--linears auto); otherwise on a CPU, the dtype whose speculative decoding "
                       "is fastest, timed here once and then cached (the drafter in float32 unless the CPU has "
                       "native bf16); on CUDA bfloat16.")


def linears_option(help=None, choices=("auto", "onednn", "fp16", "torch")):
    return click.option(
        "--linears", type=click.Choice(list(choices)), default="auto", show_default=True,
        help=help or "Products of target and drafter on CPU: fp16 multiplies fp32 rows by the weights "
                     "rounded to fp16 (FBGEMM: half the bytes, so a decode step is as fast as bf16's and a 4-node "
                     "verify costs 1.3 steps); onednn by the weights packed once for oneDNN (fp32, and bf16 on a CPU "
                     "with native bf16); torch: torch's "
                     "own layers; auto: fp16 on a CPU without native bf16, else onednn.")


def dtype_option(default="auto", help=None):
    return click.option(
        "--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default=default, show_default=True,
        help=help or "Dtype of target and drafter for speculation; auto: bfloat16 on CPUs with native bf16 "
             "(AMX/AVX512-BF16) and on CUDA, float32 elsewhere.")
