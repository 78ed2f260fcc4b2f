"""``mfd-hub generate``: speculative generation from the command line."""

import click

from ._common import budget_option, dtype_option, emit_json, examples, linears_option
from ._drafter import drafter_help, given_drafter
from ..errors import MfdHubError, UsageError


@click.command(
    epilog=examples(
        "mfd-hub generate --drafter MFD-SmolLM2-135M --target smollm2 'Write a palindrome check.'",
        "mfd-hub generate --drafter ./drafter --target Qwen/Qwen3-8B --method mixture --budget 32 --temperature 0 'Hi'",
        "mfd-hub generate --drafter ./drafter --target ./Qwen3-4B --method product --mode 2 --json 'Explain RoPE.'",
    )
)
@click.option("--drafter", default=None, metavar="DRAFTER", help=drafter_help("The drafter (required)"))
@click.option("--draft", "old_drafter", default=None, hidden=True, help="Deprecated spelling of --drafter.")
@click.option("--target", "target_spec", required=True, help="Target: folder, Hub id, or 'smollm2' (embedded).")
@click.option("--method", type=click.Choice(["chain", "product", "mixture"]), default="mixture", show_default=True)
@budget_option(default="auto")
@dtype_option()
@linears_option()
@click.option("--mode", default=None, help="chain/product on an MFD drafter: a mode index, 'gate' or 'default'.")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0 = off.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--stop", "stops", multiple=True, type=int, help="Extra stop token id (repeatable); EOS is always one.")
@click.option("--no-chat-template", is_flag=True, help="Feed the prompt as raw text.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed (T > 0).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (text, ids, statistics).")
@click.argument("prompt")
def generate(drafter, old_drafter, target_spec, method, budget, dtype, linears, mode, temperature, top_p, top_k,
             max_new_tokens, stops, no_chat_template, seed, as_json, prompt):
    """Generate from PROMPT with a drafter speculating for a target (lossless)."""
    import torch

    from ..pair import load_pair
    from ..precision import dtype_name

    if mode is not None and mode not in ("gate", "default") and not mode.isdigit():
        raise UsageError(f"--mode must be a mode index, 'gate' or 'default', not {mode!r}")
    mode = int(mode) if mode is not None and mode.isdigit() else mode
    drafter = given_drafter(drafter, old_drafter)
    pair = load_pair(drafter, target_spec, dtype=dtype, linears=linears, log=lambda line: click.echo(line, err=True))
    ids = pair.encode(prompt, chat=not no_chat_template)
    try:
        out = pair.generate(
            ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            stop_token_ids=sorted(set(pair.stop_ids) | set(stops)), method=method, tree_budget=budget, mode=mode,
            generator=torch.Generator().manual_seed(seed),
        )
    except ValueError as err:
        raise MfdHubError(str(err)) from None
    text = pair.decode(out.new_tokens)
    stats = out.stats()
    stats["dtype"] = dtype_name(pair.dtype)
    stats["linears"] = pair.linears
    if as_json:
        emit_json({"text": text, "output_ids": out.new_tokens, "prompt_tokens": ids.shape[1], **stats})
        return
    click.echo(text)  # stdout holds the generated text only; the report goes to stderr
    for line in report_lines(out, dtype_name(pair.dtype)):
        click.echo(line, err=True)


def report_lines(out, dtype):
    """generate's report on stderr (what demo shows per method), read from the SpecDecodingOutput:
    the method, budget and dtype used, then tokens, rounds, tau, tokens/s and the time per stage."""
    budget = out.tree_budget
    if budget == "auto" and out.tree_sizes:
        plain = sum(1 for m in out.modes_drafted if m == 0)
        budget = (f"auto (trees of {min(out.tree_sizes)} to {max(out.tree_sizes)} nodes, mean "
                  f"{sum(out.tree_sizes) / len(out.tree_sizes):.1f}" + (f"; {plain} plain steps" if plain else "") + ")")
    stages = ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in out.stage_seconds.items())
    return [
        f"method {out.method}, budget {budget}, {dtype}, temperature {out.temperature:g}",
        f"{len(out.new_tokens)} tokens in {out.rounds} rounds: tau {out.tau:.2f}, {out.tokens_per_second:.1f} tok/s",
        f"time per stage: {stages}",
    ]
