"""``mfd-hub verify``: a report of named checks on a drafter checkpoint; exit 1 on any failure."""

import click

from ._common import emit_json, examples
from ._drafter import drafter_argument
from ..errors import MfdHubError

_MARK = {"pass": "pass", "fail": "FAIL", "warn": "warn", "skip": "skip"}


@click.command(
    epilog=examples(
        "mfd-hub verify ./MFD-Qwen3-8B",
        "mfd-hub verify MFD-SmolLM2-135M --target smollm2",
        "mfd-hub verify z-lab/Qwen3-8B-DFlash-b16 --json",
    )
)
@click.option("--target", "target_spec", default=None,
              help="The drafter's target (folder, Hub id or 'smollm2'): size checks and a short lossless decoding check.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
@drafter_argument()
def verify(drafter, target_spec, as_json):
    """Check a drafter checkpoint: files, safetensors headers, index, tensors, config, remote code,
    loading with AutoModel, and (with --target) lossless decoding. Never unpickles anything. For a
    shipped drafter it checks the loadable folder that mfd-hub hands out (the bundle included).
    """
    from ..verify import verify_checkpoint

    def show(result):
        click.echo(f"  {_MARK.get(result.status, result.status)}  {result.name:<14} {result.reason}")

    if not as_json:
        click.echo(f"verifying {drafter}")
    report = verify_checkpoint(drafter, target=target_spec, listener=None if as_json else show)
    if as_json:
        emit_json(report.to_dict())
    failures = report.failures()
    if failures:
        names = ", ".join(c.name for c in failures)
        raise MfdHubError(f"{drafter} failed {len(failures)} check(s): {names} ({failures[0].reason})")
    if not as_json:
        warned = sum(c.status == "warn" for c in report.checks)
        click.echo(f"sound: {sum(c.status == 'pass' for c in report.checks)} checks passed" + (f", {warned} warning(s)" if warned else ""))
