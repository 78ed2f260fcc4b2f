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
