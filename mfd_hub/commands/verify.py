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
        "mfd-hub verify MFD-SmolLM2-135M DPACE-SmolLM2-135M DFlash-SmolLM2-135M",
    )
)
@click.option("--target", "target_spec", default=None,
              help="The drafter's target (folder, Hub id or 'smollm2'): size checks, a short lossless decoding check "
                   "and the acceptance check (tau against the drafter's acceptance.json).")
@click.option("--record", is_flag=True,
              help="With --target: give a checkpoint that has no acceptance.json one, measured now, when every "
                   "check passes.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as one JSON document (several drafters: a list of reports, in order).")
@drafter_argument(name="drafters", metavar="DRAFTER...", nargs=-1)
def verify(drafters, target_spec, record, as_json):
    """Check a drafter checkpoint: files, safetensors headers, index, tensors, config, remote code,
    loading with AutoModel, and (with --target) lossless decoding. Never unpickles anything. For a
    shipped drafter it checks the loadable folder that mfd-hub hands out (the bundle included).
    Several drafters are checked one after another in one process (each against --target), and
    the exit code is 1 when any of them fails.
    """
    from ..verify import verify_checkpoint

    if not drafters:
        raise click.UsageError("Missing argument 'DRAFTER...'.")
    if record and target_spec is None:
        raise click.UsageError("--record measures acceptance against a target: pass --target too.")

    def show(result):
        click.echo(f"  {_MARK.get(result.status, result.status)}  {result.name:<14} {result.reason}")
        for line in result.details:
            click.echo(f"  {'':4}  {'':<14}   cause: {line}")

    reports, failed = [], []
    for drafter in drafters:
        if not as_json:
            click.echo(f"verifying {drafter}")
        report = verify_checkpoint(drafter, target=target_spec, listener=None if as_json else show, record=record)
        reports.append(report)
        failures = report.failures()
        if failures:
            failed.append((drafter, failures))
        elif not as_json:
            warned = sum(c.status == "warn" for c in report.checks)
            click.echo(f"sound: {sum(c.status == 'pass' for c in report.checks)} checks passed"
                       + (f", {warned} warning(s)" if warned else ""))
    if as_json:
        emit_json(reports[0].to_dict() if len(reports) == 1 else [r.to_dict() for r in reports])
    if len(failed) == 1 and len(drafters) == 1:
        drafter, failures = failed[0]
        names = ", ".join(c.name for c in failures)
        raise MfdHubError(f"{drafter} failed {len(failures)} check(s): {names} ({failures[0].reason})")
    if failed:
        which = "; ".join(f"{d} ({', '.join(c.name for c in f)})" for d, f in failed)
        raise MfdHubError(f"{len(failed)} of {len(drafters)} drafters failed verification: {which}")
