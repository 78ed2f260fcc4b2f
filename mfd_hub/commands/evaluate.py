"""``mfd-hub evaluate``: a trained drafter's mode diagnostics on held-out regenerated answers."""

import click

from ._common import emit_json, examples
from ._drafter import drafter_argument


@click.command(
    epilog=examples(
        "mfd-hub evaluate MFD-SmolLM2-135M --target smollm2 --data heldout.jsonl",
        "mfd-hub evaluate ./MFD-Qwen3-4B --target ./Qwen3-4B --data heldout.jsonl --limit 100 --json",
        "mfd-hub evaluate MFD-SmolLM2-135M --trees --against DPACE-SmolLM2-135M --data heldout.jsonl --out analyses "
        "--resume --json",
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
@click.option("--trees", is_flag=True,
              help="The mode analyses instead: trees built as decoding builds them on the target's greedy answers "
                   "(mixture, mean marginals, shuffled modes, --against's product tree, the gate's, random "
                   "embeddings at the trained norms, leave-one-mode-out), forks and the modes' geometry.")
@click.option("--against", "against", default=None, metavar="DRAFTER",
              help="--trees: the single-mode drafter (D-PACE) whose product tree is construction (iv).")
@click.option("--budgets", default="16,32,64", show_default=True, help="--trees: tree budgets, comma-separated.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="--trees: length of each greedy answer, as the bench's.")
@click.option("--mass", is_flag=True, help="--trees: also the target mass each tree covers per depth (one target "
                                           "verification per anchor).")
@click.option("--mass-every", type=click.IntRange(min=1), default=1, show_default=True,
              help="--mass: weigh the trees at every N-th anchor only (a target pass over their union each).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="--trees: folder for progress.jsonl (one line per finished prompt) and analyses.json.")
@click.option("--resume", is_flag=True, help="--trees: go on from the prompts finished in --out.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
@drafter_argument()
def evaluate(drafter, target_spec, data, limit, anchors, seed, trees, against, budgets, max_new_tokens, mass,
             mass_every, out_dir, resume, as_json):
    """Mode diagnostics of a drafter on held-out answers: how often each mode wins a block (covers
    the true continuation best), the effective number of modes, how often the gate's top-1 mode
    is the winner (against 1/K chance), the mean accepted-length coverage of the gate's choice,
    of the best mode and of each mode, and the best mode's coverage per block depth (the chance
    its draft reaches each depth: where it is ~0, a longer block only costs).

    With --trees --against D-PACE-DRAFTER, the paper's mode analyses (docs/mode-analyses.md): offline
    accepted length per tree construction and budget, decoding's rounds replayed (tau_rounds, to hold
    against the bench), with --mass the covered target mass per depth, the forks, and the modes'
    norms, angles and gate."""
    from tqdm import tqdm

    from ..recipes.evaluate import evaluate_drafter

    bars = []

    def progress(done, total):  # the bar starts with the first batch: bad input fails before it
        if not bars:
            bars.append(tqdm(total=total, desc="evaluate", unit="record", disable=as_json, leave=False))
        bars[0].update(done)

    if trees:
        _analyses(drafter, target_spec, data, limit, seed, against, budgets, max_new_tokens, mass, mass_every, out_dir,
                  resume, as_json)
        return
    if against or mass or out_dir or resume:
        raise click.UsageError("--against, --mass, --out and --resume belong to --trees")
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


def _analyses(drafter, target_spec, data, limit, seed, against, budgets, max_new_tokens, mass, mass_every, out_dir,
              resume, as_json):
    from tqdm import tqdm

    from ..recipes.mode_analyses import analyse_modes

    if not against:
        raise click.UsageError("--trees needs --against DRAFTER (the single-mode drafter of construction (iv))")
    if resume and not out_dir:
        raise click.UsageError("--resume needs --out (the folder holding progress.jsonl)")
    try:
        sizes = sorted({int(b) for b in budgets.split(",") if b.strip()})
    except ValueError:
        raise click.UsageError(f"--budgets must be whole numbers separated by commas, not {budgets!r}") from None
    if not sizes or sizes[0] < 1:
        raise click.UsageError(f"--budgets must be whole numbers >= 1, not {budgets!r}")
    bars = []

    def progress(done, total):
        if not bars:
            bars.append(tqdm(total=total, desc="analyses", unit="prompt", disable=as_json, leave=False))
        bars[0].update(done)

    try:
        result = analyse_modes(drafter, against, target_spec, data, limit=limit, budgets=sizes,
                               max_new_tokens=max_new_tokens, mass=mass, seed=seed, out_dir=out_dir, resume=resume,
                               progress=progress, mass_every=mass_every)
    finally:
        for bar in bars:
            bar.close()
    if as_json:
        emit_json(result)
        return
    click.echo(f"{drafter} against {against}: {result['prompts']} greedy answers, {result['anchors']} anchors")
    header = "construction".ljust(20) + "".join(f"  tau@{b:<5} rounds@{b:<3}" for b in sizes)
    click.echo(header)
    for name, cells in result["constructions"].items():
        row = [f"  {cells[str(b)]['tau_offline']:<9.3f} {cells[str(b)]['tau_rounds']:<9.3f}" for b in sizes]
        click.echo(name.ljust(20) + "".join(row))
    click.echo("mixture / dpace (offline tau): " + "  ".join(
        f"B={b} {result['against_dpace']['mixture'][str(b)]['tau_offline']:.3f}x" for b in sizes))
    if mass:
        click.echo(f"mixture / dpace (mass, {result['mass_anchors']} anchors): " + "  ".join(
            f"B={b} {result['against_dpace']['mixture'][str(b)]['mass']:.3f}x" for b in sizes))
    forks = result["forks"]
    shares = ["-" if forks["gain_share"][str(b)] is None else f"{100 * forks['gain_share'][str(b)]:.1f}%"
              for b in sizes]
    click.echo(f"forks: {100 * forks['anchor_share']:.1f}% of anchors carry "
               + "  ".join(f"B={b} {share}" for b, share in zip(sizes, shares)) + " of the mixture's gain over dpace")
    gate, modes = result["gate"], result["modes"]
    click.echo(f"gate: top-1 right {100 * gate['top1_accuracy']:.1f}% (chance {100 * gate['chance']:.1f}%), entropy "
               f"{gate['mean_entropy']:.3f} of {gate['max_entropy']:.3f} nats")
    click.echo("mode norms " + " ".join(f"{n:.3f}" for n in modes["norms"]) +
               f" (mask token {modes['mask_token_norm']:.3f}); pairwise angles "
               f"{modes['pairwise_angle_degrees']['min']:.1f}-{modes['pairwise_angle_degrees']['max']:.1f} deg")
    if "cosine_to_start" in modes:
        click.echo("cosine to start " + " ".join(f"{c:.3f}" for c in modes["cosine_to_start"]))
