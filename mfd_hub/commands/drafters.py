"""``mfd-hub list``: the published drafters the registry describes."""

import click

from ._common import emit_json, examples


@click.command(
    "list",
    epilog=examples(
        "mfd-hub list",
        "mfd-hub list --json",
    ),
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (every field, every figure).")
def list_drafters(as_json):
    """List the ten published drafters: target, base, data, modes and the paper's figures."""
    from ..cards.registry import load_registry

    registry = load_registry()
    if as_json:
        emit_json({"registry": registry.path, "drafters": [d.to_dict() for d in registry.drafters.values()]})
        return
    rows = [("NAME", "TARGET", "BASE", "DATA", "EP", "K", "HF T=0", "SGLANG T=0", "REPO")]
    for d in registry.drafters.values():
        figures = {e: f"{d.figures(e)['t0'].speedup:.2f}x ({d.figures(e)['t0'].tau:.2f})" if e in d.results else "-"
                   for e in ("hf", "sglang")}
        rows.append((d.name, d.target.repo, d.base.repo, d.data.label, str(d.epochs),
                     f"{d.num_modes}{'+D' if d.default_path else ''}", figures["hf"], figures["sglang"], d.repo_id))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    click.echo("\nFigures: speedup (tau), batch size 1, from the paper's Table 1 (HF) and Table 2 (SGLang).")
