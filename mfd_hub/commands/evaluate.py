"""``mfd-hub evaluate``: a trained drafter's mode diagnostics on held-out regenerated answers."""

import click

from ._common import emit_json, examples
from ._drafter import drafter_argument


@click.command(
    epilog=examples(
        "mfd-hub evaluate MFD-SmolLM2-135M --target smollm2 --data heldout.jsonl",
        "mfd-hub evaluate ./MFD-Qwen3-4B --target ./Qwen3-4B --data heldout.jsonl --limit 100 --json",
    )
)
@click.option("--target", "target_spec", default="smollm2", show_default=True,
              help="The drafter's target: 'smollm2', a folder or a Hub repo id.")
@click.option("--data", "data", required=True, type=click.Path(),
              help="Held-out regen records (a .jsonl / .jsonl.gz file or a regen folder), not the training data.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N records.")
@click.option("--anchors", type=click.IntRange(min=1), default=16, show_default=True,
              help="Blocks drafted per record (anchors drawn as in training, seeded).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
@drafter_argument()
def evaluate(drafter, target_spec, data, limit, anchors, seed, as_json):
    """Mode diagnostics of a drafter on held-out answers: how often each mode wins a block (covers
    the true continuation best), the effective number of modes, how often the gate's top-1 mode
    is the winner (against 1/K chance), the mean accepted-length coverage of the gate's choice,
    of the best mode and of each mode, and the best mode's coverage per block depth (the chance
    its draft reaches each depth: where it is ~0, a longer block only costs)."""
    from tqdm import tqdm

    from ..recipes.evaluate import evaluate_drafter

    bars = []

    def progress(done, total):  # the bar starts with the first batch: bad input fails before it
        if not bars:
            bars.append(tqdm(total=total, desc="evaluate", unit="record", disable=as_json, leave=False))
        bars[0].update(done)

    try:
        result = evaluate_drafter(drafter, target_spec, data, anchors_per_sequence=anchors, limit=limit, seed=seed,
                                  progress=progress)
    finally:
        for bar in bars:
            bar.close()
    if as_json:
        emit_json(result)
        return
    click.echo(f"{result['drafter']} on {result['sequences']} held-out records, {result['blocks']} blocks")
    per_mode = "  ".join(f"{c:.2f}" for c in result["coverage_per_mode"])
    if result["num_modes"] > 1:
        click.echo(f"effective modes       {result['effective_modes']:.2f} of {result['num_modes']}")
        click.echo(f"gate picks the winner {100 * result['gate_top1_accuracy']:.1f}% (chance "
                   f"{100 * result['chance']:.1f}%)")
        click.echo(f"coverage: gate's mode {result['gate_choice_coverage']:.3f}, best mode "
                   f"{result['best_mode_coverage']:.3f}")
        click.echo("win rate per mode     " + "  ".join(f"{100 * w:.1f}%" for w in result["win_rate_per_mode"]))
    else:
        click.echo(f"coverage              {result['best_mode_coverage']:.3f} (one path)")
    click.echo(f"coverage per mode     {per_mode}")
    click.echo("best mode, per depth  " + "  ".join(f"{c:.3g}" for c in result["best_mode_coverage_per_depth"]))
    click.echo(f"loss per block        {result['loss_per_block']:.4f} ({result['loss']})")
