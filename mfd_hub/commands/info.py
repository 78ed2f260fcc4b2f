"""``mfd-hub info``: what a drafter checkpoint is, read from its config and weight headers."""

import click

from ._common import emit_json, examples
from ._drafter import drafter_argument
from ..describe import describe_checkpoint


@click.command(
    epilog=examples(
        "mfd-hub info MFD-SmolLM2-135M",
        "mfd-hub info ./MFD-Qwen3-8B",
        "mfd-hub info z-lab/Qwen3-8B-DFlash-b16 --json",
    )
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
@drafter_argument()
def info(drafter, as_json):
    """Describe a drafter checkpoint: format, shape, modes, target, parameters, dtypes (read from
    its config and weight headers; no weights are loaded)."""
    summary = describe_checkpoint(drafter)
    if as_json:
        emit_json(summary)
        return
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        click.echo(f"{key:<{width}}  {value}")
