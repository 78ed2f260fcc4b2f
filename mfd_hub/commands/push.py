"""``mfd-hub push``: publish a verified drafter checkpoint with its generated card, in one commit."""

import click

from ._common import emit_json, examples
from ._drafter import drafter_help
from ..errors import MfdHubError


def _print_plan(plan):
    remote = plan.remote
    where = {"yes": f"compared with {plan.revision} at {str(remote.head or remote.base)[:12]}",
             "offline": "not compared (offline): every file counts as new",
             "no repository": "the repository does not exist yet: every file is new"}
    click.echo(f"{plan.name} -> {plan.repo_id} (branch {plan.revision}, tag {plan.tag})")
    click.echo(f"remote: {where.get(remote.checked, remote.checked)}")
    click.echo("verify: " + ("passed (the verdict on these same bytes, reused from the mfd-hub cache)"
                             if plan.verification == "reused" else "passed"))
    if plan.acceptance_override:
        click.echo(f"acceptance: FAILED, published anyway (--ignore-acceptance; the card says so): "
                   f"{plan.acceptance_override}")
    width = max(len(f.path) for f in plan.files)
    for item in plan.files:
        click.echo(f"  {item.status:<9} {item.path:<{width}} {item.size:>14,} B  sha256 {item.sha256}")
    for path in plan.deleted:
        click.echo(f"  {'delete':<9} {path}")
    changed = plan.changed
    click.echo(f"{len(changed)} file(s) to upload ({sum(f.size for f in changed):,} B), {len(plan.deleted)} to delete")


@click.command(
    epilog=examples(
        "mfd-hub push MFD-Qwen3-8B --path ./MFD-Qwen3-8B --dry-run",
        "mfd-hub push MFD-Qwen3-8B --path ./MFD-Qwen3-8B",
        "mfd-hub push MFD-D-Qwen3-4B --path ./ckpt --repo-id me/MFD-D-Qwen3-4B --private --tag v1.1 --json",
    )
)
@click.argument("name")
@click.option("--path", default=None, metavar="DRAFTER",
              help=drafter_help("The checkpoint to publish (default: the folder ./NAME)"))
@click.option("--repo-id", default=None, help="Hub repository owner/name (default: the registry's).")
@click.option("--revision", default="main", show_default=True, help="Branch to commit to (created from main if missing).")
@click.option("--tag", default=None, help="Tag for the new commit (default: the registry's release, e.g. v1.0).")
@click.option("--private", is_flag=True, help="Create the repository private (an existing one keeps its visibility).")
@click.option("--dry-run", is_flag=True,
              help="Print the plan and stop: no upload; the remote is only read (not at all with HF_HUB_OFFLINE=1).")
@click.option("--target", "target_spec", default=None,
              help="Verify against this target too (folder, Hub id or 'smollm2'): lossless decoding and the "
                   "acceptance check, which refuses a drafter that accepts far less than its record.")
@click.option("--ignore-acceptance", is_flag=True,
              help="With --target: publish even when the acceptance check fails; the card states it.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (the plan and the result).")
def push(name, path, repo_id, revision, tag, private, dry_run, target_spec, ignore_acceptance, as_json):
    """Verify drafter NAME's checkpoint, render its card and publish both in one commit."""
    from huggingface_hub import constants, get_token

    from ..cards.push import execute, plan_push

    if not dry_run:
        if constants.is_offline_mode():
            raise MfdHubError("HF_HUB_OFFLINE is set: pushing needs the network ('--dry-run' shows the plan)")
        if get_token() is None:
            raise MfdHubError("no Hugging Face token: set HF_TOKEN or run 'hf auth login'")
    if ignore_acceptance and target_spec is None:
        raise click.UsageError("--ignore-acceptance overrides the acceptance check, which needs --target.")
    plan, entries, api = plan_push(name, path=path, repo_id=repo_id, revision=revision, tag=tag, dry_run=dry_run,
                                   progress=not as_json, target=target_spec, ignore_acceptance=ignore_acceptance)
    problem = plan.tag_problem()
    if dry_run:
        if as_json:
            emit_json({"dry_run": True, "plan": plan.to_dict(), "tag_problem": problem})
        else:
            _print_plan(plan)
            if problem:
                click.echo(f"warning: {problem}", err=True)
            click.echo("dry run: nothing was uploaded")
        return
    if not as_json:
        _print_plan(plan)
    result = execute(plan, entries, api, private=private)
    if as_json:
        emit_json({"dry_run": False, "plan": plan.to_dict(), "result": result})
        return
    if result["commit"]:
        click.echo(f"committed {result['commit'][:12]}: {result['commit_url']}")
    else:
        click.echo(f"no changes: {plan.repo_id}@{plan.revision} already holds this folder (no new commit)")
    if result["tag_created"]:
        click.echo(f"tagged {plan.tag} -> {result['head'][:12]}")
