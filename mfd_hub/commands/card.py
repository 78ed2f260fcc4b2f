"""``mfd-hub card``: a published drafter's model card, generated from the registry."""

import os
import tempfile
from pathlib import Path

import click

from ._common import examples
from ._drafter import drafter_help
from ..errors import UsageError


def write_text_atomically(dest, text):
    """Write ``dest`` whole or not at all (a temporary file renamed into place)."""
    dest = Path(dest)
    if dest.is_dir():
        raise UsageError(f"--out {dest} is a folder; name the file (e.g. {dest / 'README.md'})")
    if not dest.parent.is_dir():
        raise UsageError(f"the folder of --out {dest} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise


@click.command(
    epilog=examples(
        "mfd-hub card MFD-Qwen3-8B",
        "mfd-hub card MFD-Qwen3-8B --path ./MFD-Qwen3-8B --out ./MFD-Qwen3-8B/README.md",
        "mfd-hub card MFD-D-Qwen3-4B --repo-id me/MFD-D-Qwen3-4B --out README.md",
    )
)
@click.argument("name")
@click.option("--path", "path", default=None, metavar="DRAFTER",
              help=drafter_help("A checkpoint whose own shape, parameter count and dtype the card states"))
@click.option("--repo-id", default=None, help="The repo the usage examples load from (default: the registry's).")
@click.option("--out", type=click.Path(dir_okay=True, path_type=Path), default=None,
              help="Write the card to this file instead of printing it.")
def card(name, path, repo_id, out):
    """Render the model card of drafter NAME (see 'mfd-hub list') as README.md markdown."""
    from ..locate import resolve_drafter
    from ..describe import checkpoint_config
    from ..cards.model_card import render_card
    from ..cards.registry import load_registry

    registry = load_registry()
    drafter = registry.get(name)
    if path is not None:
        path = resolve_drafter(path)
        _, config = checkpoint_config(path)  # a clear error for a folder that is not a drafter checkpoint
        problems = drafter.mismatches(config)
        if problems:
            raise UsageError(f"{path} is not {drafter.name} as the registry describes it: " + "; ".join(problems))
    text = render_card(drafter, path=path, repo_id=repo_id, registry=registry)
    if out is None:
        click.echo(text, nl=False)
    else:
        write_text_atomically(out, text)
        click.echo(f"wrote {out}", err=True)
