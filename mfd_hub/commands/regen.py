"""``mfd-hub regen``: target-regenerated training responses."""

import click

from ._common import emit_json, examples


@click.command(
    epilog=examples(
        "mfd-hub regen --target smollm2 --prompts prompts.jsonl --out responses.jsonl --max-new-tokens 256",
        "mfd-hub regen --target Qwen/Qwen3-8B --prompts prompts.jsonl --out data.jsonl --batch-size 32 --no-thinking",
        "mfd-hub regen --target Qwen/Qwen3-8B --prompts hf:mlabonne/open-perfectblend --out data.jsonl "
        "--engine openai --endpoint http://localhost:8000/v1 --concurrency 64",
    )
)
@click.option("--target", "target_spec", required=True, help="Target: folder, Hub id, or 'smollm2'.")
@click.option("--prompts", "prompts_path", required=True, type=click.Path(dir_okay=False),
              help="JSON Lines prompts, or hf:NAME[:SPLIT] for a Hub dataset (needs the datasets package).")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="JSON Lines output (appended).")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.7, show_default=True)
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=0.8, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=20, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=2048, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Prompts per generate call (per write, with --engine openai).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N prompts.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-chat-template", is_flag=True, help="Feed prompts as raw text.")
@click.option("--thinking/--no-thinking", default=None,
              help="Pass enable_thinking to the chat template (Qwen3-style); default: the template's own.")
@click.option("--engine", type=click.Choice(["transformers", "openai"]), default="transformers", show_default=True,
              help="transformers on this machine, or an OpenAI-compatible server (vLLM, SGLang) of the target.")
@click.option("--endpoint", default=None, help="Base URL of the server for --engine openai (e.g. http://host:8000/v1).")
@click.option("--served-model", default=None, help="Model name the server knows the target by (default: --target).")
@click.option("--concurrency", type=click.IntRange(min=1), default=16, show_default=True,
              help="Requests in flight with --engine openai.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def regen(target_spec, prompts_path, out_path, temperature, top_p, top_k, max_new_tokens, batch_size, limit, seed,
          no_chat_template, thinking, engine, endpoint, served_model, concurrency, as_json):
    """Answer every prompt with the target itself (resumable: finished prompts are skipped)."""
    from tqdm import tqdm

    from ..errors import UsageError
    from ..recipes.regen import OpenAIEngine, finished_ids, read_prompts, regenerate
    from ..targets import load_target, load_tokenizer

    if (engine == "openai") != (endpoint is not None):
        raise UsageError("--endpoint goes with --engine openai (and --engine openai needs --endpoint)")
    prompts = read_prompts(prompts_path)[:limit]
    done_before = len(finished_ids(out_path) & {rid for rid, _ in prompts})
    if engine == "openai":
        tokenizer, stops = load_tokenizer(target_spec)
        target = OpenAIEngine(endpoint, served_model or target_spec, tokenizer, stops, concurrency=concurrency)
    else:
        target, tokenizer = load_target(target_spec)
    with tqdm(total=len(prompts), initial=done_before, desc="regenerating", unit="prompt", disable=as_json) as bar:
        written = regenerate(
            target, tokenizer, prompts, out_path, temperature=temperature, top_p=top_p, top_k=top_k,
            max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed, chat=not no_chat_template,
            progress=bar.update, thinking=thinking,
        )
    summary = {"out": out_path, "prompts": len(prompts), "already_done": done_before, "written": written,
               "engine": engine}
    if as_json:
        emit_json(summary)
    else:
        click.echo(f"{written} responses written to {out_path} ({done_before} were already there)", err=True)
