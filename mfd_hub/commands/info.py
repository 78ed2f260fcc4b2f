"""``mfd-hub info``: what a drafter checkpoint is, read from its config and weight headers."""

from pathlib import Path

import click

from ._common import emit_json, examples
from ..describe import describe_checkpoint


@click.command(
    epilog=examples(
        "mfd-hub info ./MFD-Qwen3-8B",
        "mfd-hub info z-lab/Qwen3-8B-DFlash-b16 --json",
    )
)
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
def info(path, as_json):
    """Describe a drafter checkpoint (a folder or a Hub repo id): format, shape, modes, target."""
    summary = describe_checkpoint(Path(path) if Path(path).exists() else path)
    if as_json:
        emit_json(summary)
        return
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        click.echo(f"{key:<{width}}  {value}")
