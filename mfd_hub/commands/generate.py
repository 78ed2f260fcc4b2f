"""``mfd-hub generate``: speculative generation from the command line."""

import click

from ._common import emit_json, examples
from ..errors import MfdHubError, UsageError


@click.command(
    epilog=examples(
        "mfd-hub generate --draft ./MFD-SmolLM2 --target smollm2 'Write a haiku about trees.'",
        "mfd-hub generate --draft ./drafter --target Qwen/Qwen3-8B --method mixture --budget 32 --temperature 0 'Hi'",
        "mfd-hub generate --draft ./drafter --target ./Qwen3-4B --method product --mode 2 --json 'Explain RoPE.'",
    )
)
@click.option("--draft", "draft_path", required=True, help="Drafter checkpoint: folder or Hub repo id.")
@click.option("--target", "target_spec", required=True, help="Target: folder, Hub id, or 'smollm2' (embedded).")
@click.option("--method", type=click.Choice(["chain", "product", "mixture"]), default="mixture", show_default=True)
@click.option("--budget", type=click.IntRange(min=1), default=32, show_default=True, help="Tree nodes per round.")
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
def generate(draft_path, target_spec, method, budget, mode, temperature, top_p, top_k, max_new_tokens, stops,
             no_chat_template, seed, as_json, prompt):
    """Generate from PROMPT with a drafter speculating for a target (lossless)."""
    import torch

    from ..checkpoint import load_draft
    from ..targets import encode_prompt, load_target, stop_ids_of

    if mode is not None and mode not in ("gate", "default") and not mode.isdigit():
        raise UsageError(f"--mode must be a mode index, 'gate' or 'default', not {mode!r}")
    mode = int(mode) if mode is not None and mode.isdigit() else mode
    click.echo(f"loading drafter {draft_path} ...", err=True)
    draft = load_draft(draft_path)
    click.echo(f"loading target {target_spec} ...", err=True)
    target, tokenizer = load_target(target_spec)
    if tokenizer is None:
        raise MfdHubError(f"target {target_spec} has no tokenizer to encode the prompt")
    ids = encode_prompt(tokenizer, prompt, chat=not no_chat_template)
    try:
        out = draft.spec_generate(
            target, ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            stop_token_ids=sorted(set(stop_ids_of(tokenizer, target)) | set(stops)), method=method,
            tree_budget=budget, mode=mode, generator=torch.Generator().manual_seed(seed),
        )
    except ValueError as err:
        raise MfdHubError(str(err)) from None
    text = tokenizer.decode(out.new_tokens, skip_special_tokens=True)
    stats = out.stats()
    if as_json:
        emit_json({"text": text, "output_ids": out.new_tokens, "prompt_tokens": ids.shape[1], **stats})
        return
    click.echo(text)
    stage = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in stats["stage_seconds"].items())
    click.echo(
        f"\n[{method}, budget {budget}] {stats['new_tokens']} tokens in {stats['rounds']} rounds, "
        f"tau {stats['tau']:.2f}, {stats['tokens_per_second']:.1f} tok/s ({stage})",
        err=True,
    )
