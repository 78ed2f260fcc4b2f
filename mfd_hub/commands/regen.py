"""``mfd-hub regen``: target-regenerated training responses."""

import click

from ._common import emit_json, examples, linears_option


@click.command(
    epilog=examples(
        "mfd-hub regen --target smollm2 --prompts prompts.jsonl --out data/smollm2-regen --max-new-tokens 256",
        "mfd-hub regen --target smollm2 --prompts prompts.jsonl --out responses.jsonl --engine generate --batch-size 8",
        "mfd-hub regen --target Qwen/Qwen3-8B --prompts prompts.jsonl --out data.jsonl --batch-size 32 --no-thinking",
        "mfd-hub regen --target Qwen/Qwen3-8B --prompts hf:mlabonne/open-perfectblend --out data/qwen3-8b "
        "--engine openai --endpoint http://localhost:8000/v1 --concurrency 64",
    )
)
@click.option("--target", "target_spec", required=True, help="Target: folder, Hub id, or 'smollm2'.")
@click.option("--prompts", "prompts_path", required=True, type=click.Path(),
              help="JSON Lines prompts (a .jsonl or .jsonl.gz file, or a regen folder), or hf:NAME[:SPLIT] for a "
                   "Hub dataset (needs the datasets package).")
@click.option("--out", "out_path", required=True, type=click.Path(),
              help="A folder of shards (an existing folder, or a new path without suffix: part-NNNNN.jsonl.gz "
                   "complete shards, safe to commit, and the hidden .part-NNNNN.jsonl in progress), or a .jsonl "
                   "file (appended).")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.7, show_default=True)
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=0.8, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=20, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=2048, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Rows decoding together (continuous; default 128, or 384 for a bf16 target on a CPU with native "
                   "bf16 while their KV cache fits in 6 GiB), prompts per generate call (generate; "
                   "default 8) or per write (openai; default 8).")
@click.option("--shard-size", type=click.IntRange(min=1), default=None,
              help="Records per complete shard of a folder output (default 500).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N prompts.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-chat-template", is_flag=True, help="Feed prompts as raw text.")
@click.option("--thinking/--no-thinking", default=None,
              help="Pass enable_thinking to the chat template (Qwen3-style); default: the template's own.")
@click.option("--engine", type=click.Choice(["continuous", "generate", "transformers", "openai"]), default="continuous",
              show_default=True,
              help="continuous: continuous batching on this machine (a finished row takes the next prompt); "
                   "generate (old name: transformers): transformers generate over static batches; openai: an "
                   "OpenAI-compatible server (vLLM, SGLang) of the target.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default=None,
              help="Dtype of the target on this machine (default auto: bfloat16 on CPUs with native bf16, AMX or "
                   "AVX512-BF16, and on CUDA; float32 elsewhere, where bf16 is emulated and slower).")
@linears_option("Products of the continuous engine: auto multiplies the target on CPU through oneDNN with its "
                "weights packed once (fp32: 1.2x the tokens/s on 2 AVX2 cores; bf16 where the CPU has it natively: "
                "1.1x on an AMX Xeon); torch: torch's own linear layers.",
                choices=("auto", "torch"))
@click.option("--endpoint", default=None, help="Base URL of the server for --engine openai (e.g. http://host:8000/v1).")
@click.option("--served-model", default=None, help="Model name the server knows the target by (default: --target).")
@click.option("--concurrency", type=click.IntRange(min=1), default=16, show_default=True,
              help="Requests in flight with --engine openai.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def regen(target_spec, prompts_path, out_path, temperature, top_p, top_k, max_new_tokens, batch_size, shard_size, limit,
          seed, no_chat_template, thinking, engine, dtype, linears, endpoint, served_model, concurrency, as_json):
    """Answer every prompt with the target itself (resumable: finished prompts are skipped)."""
    from tqdm import tqdm

    from ..errors import UsageError
    from ..precision import dtype_name, resolve_dtype
    from ..recipes.regen import (SHARD_SIZE, OpenAIEngine, RegenOutput, default_batch, is_folder_output, read_prompts,
                                  regenerate)
    from ..targets import load_target, load_tokenizer

    engine = "generate" if engine == "transformers" else engine
    if (engine == "openai") != (endpoint is not None):
        raise UsageError("--endpoint goes with --engine openai (and --engine openai needs --endpoint)")
    if engine == "openai" and dtype is not None:
        raise UsageError("--dtype is for the engines on this machine; the server chooses its own")
    folder = is_folder_output(out_path)
    if shard_size is not None and not folder:
        raise UsageError(f"--shard-size is for a folder output; {out_path} is a file")
    shard_size = shard_size or SHARD_SIZE
    prompts = read_prompts(prompts_path)[:limit]
    done_before = len(RegenOutput(out_path, shard_size).done & {rid for rid, _ in prompts})
    if engine == "openai":
        tokenizer, stops = load_tokenizer(target_spec)
        batch_size = batch_size or default_batch(engine)
        target = OpenAIEngine(endpoint, served_model or target_spec, tokenizer, stops, concurrency=concurrency,
                              batch_size=batch_size)
        dtype = None
    else:
        dtype = resolve_dtype(dtype or "auto")
        target, tokenizer = load_target(target_spec, dtype=dtype)
        batch_size = batch_size or default_batch(engine, target, max_new_tokens)
    with tqdm(total=len(prompts), initial=done_before, desc="regenerating", unit="prompt", disable=as_json) as bar:
        written = regenerate(
            target, tokenizer, prompts, out_path, temperature=temperature, top_p=top_p, top_k=top_k,
            max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed, chat=not no_chat_template,
            progress=bar.update, thinking=thinking, engine=engine, shard_size=shard_size,
            provenance={"target": target_spec}, linears=linears,
        )
    summary = {"out": out_path, "layout": "folder" if folder else "file", "prompts": len(prompts),
               "already_done": done_before, "written": written, "engine": engine,
               "dtype": dtype_name(dtype) if dtype is not None else None, "batch_size": batch_size}
    if as_json:
        emit_json(summary)
    else:
        click.echo(f"{written} responses written to {out_path} ({done_before} were already there)", err=True)
