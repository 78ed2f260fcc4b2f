"""``mfd-hub train``: train a drafter from a YAML recipe, on one process or under torchrun."""

import click

from ._common import emit_json, examples


@click.command(
    epilog=examples(
        "mfd-hub train --list",
        "mfd-hub train MFD-Qwen3-8B data.train=data/qwen3-8b.jsonl --check",
        "mfd-hub train my-recipe.yaml train.max_steps=200 output.dir=runs/try",
        "mfd-hub train my-recipe.yaml --resume",
        "mfd-hub train my-recipe.yaml --stop-after 100",
        "torchrun --nproc-per-node 8 -m mfd_hub train MFD-Qwen3-8B data.train=data/qwen3-8b.jsonl",
    )
)
@click.argument("recipe", required=False)
@click.argument("overrides", nargs=-1)
@click.option("--list", "list_recipes", is_flag=True, help="List the packaged recipes and exit.")
@click.option("--check", is_flag=True, help="Validate the recipe (with overrides), print it resolved, and exit.")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in the run folder.")
@click.option("--stop-after", type=click.IntRange(min=1), default=None,
              help="Stop (with a checkpoint) after this global step; the schedule is unchanged.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary when done.")
def train(recipe, overrides, list_recipes, check, resume, stop_after, as_json):
    """Train a block drafter as RECIPE says (a YAML file or a packaged recipe name).

    OVERRIDES are KEY=VALUE pairs (e.g. train.lr=2e-4 data.train=responses.jsonl). Launch it with
    torchrun to train on several GPUs (FSDP2) or CPU processes (gloo).
    """
    from ..errors import UsageError
    from ..recipes.config import load_recipe, packaged_recipes

    if list_recipes:
        names = sorted(packaged_recipes())
        if as_json:
            emit_json({"recipes": names})
        else:
            click.echo("\n".join(names))
        return
    if not recipe:
        raise UsageError("give a RECIPE (a YAML file or a packaged name; --list shows them)")
    loaded = load_recipe(recipe, overrides)
    if check:
        import yaml

        if as_json:
            emit_json(loaded.to_dict())
        else:
            click.echo(yaml.safe_dump(loaded.to_dict(), sort_keys=False).rstrip())
        return
    from ..recipes.trainer import train as run

    summary = run(loaded, resume=resume, stop_after=stop_after, verbose=not as_json)
    if summary is None:
        return
    if as_json:
        emit_json(summary)
    else:
        parts = [f"{summary['steps']}/{summary['total_steps']} steps"]
        if summary["final_loss"] is not None:
            parts.append(f"loss {summary['final_loss']:.4f}, {summary['steps_per_second']:.3f} steps/s")
        parts.append(f"run folder {summary['run_dir']}")
        if summary["exported"]:
            parts.append(f"drafter {summary['exported']}")
        click.echo("; ".join(parts), err=True)
