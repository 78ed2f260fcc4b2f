"""``mfd-hub convert``: other checkpoints -> mfd-hub drafters (the converters in ``converters/``)."""

import re
from pathlib import Path

import click

from ._common import emit_json, examples
from ._drafter import drafter_argument
from ..errors import UsageError

DTYPE_CHOICE = click.Choice(["bfloat16", "float16", "float32"])
_SIZE = re.compile(r"^\d+(\.\d+)?\s*[KMGT]B$")  # what huggingface_hub's shard splitter parses


def _destination(source, out, overwrite):
    """Refuse early what the writer would refuse late, and any OUT that would touch the source."""
    out = Path(out).absolute()
    if out.exists() and not overwrite:
        raise UsageError(f"{out} already exists (pass --overwrite to replace it)")
    if Path(source).exists():
        src = Path(source).resolve()
        if out.resolve() == src or src.is_relative_to(out.resolve()) or out.resolve().is_relative_to(src):
            raise UsageError(f"OUT {out} overlaps the source {src}: the source is never modified")
    return out


def _done(summary, as_json):
    if as_json:
        emit_json(summary)
        return
    click.echo(f"wrote {summary['out']}")
    click.echo(f"check it with: mfd-hub verify {summary['out']}", err=True)


def _output_options(function):
    """--max-shard-size, --overwrite and --json: how every converter writes OUT and reports."""
    function = click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")(function)
    function = click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")(function)
    return click.option(
        "--max-shard-size", default="5GB", show_default=True, callback=_check_size,
        help="Split the weights into shards of at most this size (with an index), as the Hub does.",
    )(function)


def _check_size(ctx, param, value):
    if not _SIZE.match(value):
        raise click.BadParameter(f"{value!r} is not a size such as 5GB, 500MB or 20KB")
    return value


@click.group(
    epilog=examples(
        "mfd-hub convert zlab z-lab/Qwen3-8B-DFlash-b16 ./MFD-Qwen3-8B-init --modes 8",
        "mfd-hub convert released ./MFD-Qwen3-8B-released ./MFD-Qwen3-8B",
        "mfd-hub convert train-ckpt runs/mfd-qwen3-8b ./MFD-Qwen3-8B --dtype bfloat16",
        "mfd-hub convert draft-vocab ./MFD-SmolLM2 ./MFD-SmolLM2-dv8k --target smollm2 --corpus regen.jsonl --size 8192",
        "mfd-hub convert mfd-d ./MFD-Qwen3-8B ./MFD-D-Qwen3-8B --default-from mode:0",
    )
)
def convert():
    """Convert checkpoints into mfd-hub drafters (atomic: an interrupted run writes nothing).

    Every converter leaves its source untouched and writes OUT all at once; check the result
    with 'mfd-hub verify OUT'.
    """


@convert.command(
    "zlab",
    epilog=examples(
        "mfd-hub convert zlab z-lab/Qwen3-8B-DFlash-b16 ./MFD-Qwen3-8B-init --modes 8",
        "mfd-hub convert zlab ./Qwen3-4B-DFlash-b16 ./mfd-4b --modes 8 --seed 1 --target-name Qwen/Qwen3-4B --json",
    ),
)
@drafter_argument("source", "SOURCE")
@click.argument("out", type=click.Path())
@click.option("--modes", "num_modes", type=click.IntRange(min=0), default=8, show_default=True, help="K, the number of modes.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the mode initialisation.")
@click.option("--mode-std", type=click.FloatRange(min=0), default=None, help="Std of mode_embed (default: initializer_range).")
@click.option("--gate-std", type=click.FloatRange(min=0), default=None, help="Std of mode_gate (default: initializer_range).")
@click.option("--dtype", type=DTYPE_CHOICE, default="bfloat16", show_default=True)
@click.option("--revision", default=None, help="Hub revision of SOURCE (a branch, tag or commit).")
@click.option("--target-name", default=None, help="Record the target's name (e.g. Qwen/Qwen3-8B) in the config.")
@_output_options
def convert_zlab_command(source, out, num_modes, seed, mode_std, gate_std, dtype, max_shard_size, revision, target_name,
                         overwrite, as_json):
    """A z-lab DFlash drafter (SOURCE) -> an MFD drafter with K seeded modes.

    The z-lab weights are carried over exactly; mode_embed and mode_gate start from a seeded
    N(0, std^2), recorded in the checkpoint's mfd_metadata.
    """
    from ..converters import convert_zlab
    from ..converters.common import parse_dtype

    out = _destination(source, out, overwrite)
    click.echo(f"converting {source} ...", err=True)
    summary = convert_zlab(source, out, num_modes=num_modes, seed=seed, mode_std=mode_std, gate_std=gate_std,
                           dtype=parse_dtype(dtype), max_shard_size=max_shard_size, revision=revision,
                           target_name=target_name, overwrite=overwrite)
    _done(summary, as_json)


@convert.command(
    "released",
    epilog=examples(
        "mfd-hub convert released ./MFD-Qwen3-8B-released ./MFD-Qwen3-8B",
        "mfd-hub convert released ./MFD-D-Qwen3-8B-released ./MFD-D-Qwen3-8B --map default_vector=default_embed "
        "--map gate_temperature=- --json",
    ),
)
@drafter_argument("source", "SOURCE")
@click.argument("out", type=click.Path())
@click.option("--map", "name_map", multiple=True, metavar="OLD=NEW",
              help="Give SOURCE's tensor OLD our name NEW (OLD=- drops it on purpose); repeatable. Recorded in "
                   "the config's metadata.")
@click.option("--dtype", type=DTYPE_CHOICE, default=None, help="Weight dtype (default: the source's, bit for bit).")
@click.option("--revision", default=None, help="Hub revision of SOURCE (a branch, tag or commit).")
@_output_options
def convert_released_command(source, out, name_map, dtype, revision, max_shard_size, overwrite, as_json):
    """A released MFD drafter (DFlash format with K mode embeddings, as the MFD authors publish
    them) -> an mfd-hub drafter that AutoModel loads with trust_remote_code.

    Every tensor is kept bit for bit under our names: mode_embed [K, H], the gate mode_gate
    (with its bias, if any) and, for MFD-D, the default path (default_embed). K is read from
    mode_embed and must agree with any config field that states it. A tensor that fits no role
    is an error naming it: place it with --map OLD=NEW or drop it with --map OLD=-.
    """
    from ..converters.common import parse_dtype
    from ..converters.released import convert_released

    out = _destination(source, out, overwrite)
    summary = convert_released(source, out, name_map=name_map, dtype=parse_dtype(dtype), revision=revision,
                               max_shard_size=max_shard_size, overwrite=overwrite)
    _done(summary, as_json)


@convert.command(
    "train-ckpt",
    epilog=examples(
        "mfd-hub convert train-ckpt runs/mfd-smollm2/checkpoints/step-000600 ./MFD-SmolLM2",
        "mfd-hub convert train-ckpt runs/mfd-qwen3-8b ./MFD-Qwen3-8B --dtype bfloat16 --json",
    ),
)
@click.argument("source", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path())
@click.option("--dtype", type=DTYPE_CHOICE, default=None, help="Cast the weights (default: the dtype training saved).")
@_output_options
def convert_train_ckpt_command(source, out, dtype, max_shard_size, overwrite, as_json):
    """A training checkpoint (or a run folder: its newest one) -> a Hub-ready drafter.

    Reads config.json + the torch.distributed checkpoint model/, also when several ranks wrote
    it sharded. DCP metadata is pickled: convert only training checkpoints you wrote.
    """
    from ..converters import convert_train_checkpoint
    from ..converters.common import parse_dtype

    out = _destination(source, out, overwrite)
    summary = convert_train_checkpoint(source, out, dtype=parse_dtype(dtype), max_shard_size=max_shard_size,
                                       overwrite=overwrite)
    _done(summary, as_json)


@convert.command(
    "draft-vocab",
    epilog=examples(
        "mfd-hub convert draft-vocab ./MFD-SmolLM2 ./MFD-SmolLM2-dv8k --target smollm2 --corpus regen.jsonl --size 8192",
        "mfd-hub convert draft-vocab ./MFD-Qwen3-8B ./MFD-Qwen3-8B-dv64k --target Qwen/Qwen3-8B "
        "--corpus responses.jsonl --field response --size 65536 --json",
    ),
)
@drafter_argument("source", "SOURCE")
@click.argument("out", type=click.Path())
@click.option("--target", "target_spec", required=True, help="The drafter's target (folder, Hub id or 'smollm2').")
@click.option("--corpus", required=True, type=click.Path(dir_okay=False),
              help="JSON Lines responses: token ids (e.g. regen's response_ids) or text.")
@click.option("--size", type=click.IntRange(min=1), required=True, help="N, the draft vocabulary size.")
@click.option("--field", default=None, help="The record field to count (default: response_ids, token_ids, input_ids, "
              "ids, then the text fields response, text, completion).")
@click.option("--tokenizer", default=None, help="Tokenizer for text records (default: the target's).")
@click.option("--dtype", type=DTYPE_CHOICE, default=None, help="Weight dtype (default: the source's).")
@_output_options
def convert_draft_vocab_command(source, out, target_spec, corpus, size, field, tokenizer, dtype, max_shard_size,
                                overwrite, as_json):
    """Give a drafter a reduced draft vocabulary: the N tokens most frequent in a response corpus.

    The drafter gets its own lm_head (those rows of the target's LM head) and d2t / t2d maps;
    it drafts over N tokens, the target verifies over all of them (still lossless). The
    target's end-of-sequence tokens are always kept. When SOURCE has an acceptance record, the
    result's acceptance is measured and reported against it (and recorded when it holds).
    """
    from tqdm import tqdm

    from ..converters import convert_draft_vocab
    from ..converters.common import parse_dtype

    out = _destination(source, out, overwrite)
    total = Path(corpus).stat().st_size if Path(corpus).is_file() else None
    with tqdm(total=total, unit="B", unit_scale=True, desc="counting tokens", disable=as_json) as bar:
        summary = convert_draft_vocab(
            source, out, target_spec, corpus, size, field=field, tokenizer=tokenizer, dtype=parse_dtype(dtype),
            max_shard_size=max_shard_size, overwrite=overwrite, progress=bar.update,
            log=None if as_json else (lambda message: click.echo(message, err=True)),
        )
    if not as_json:
        click.echo(
            f"draft vocabulary {summary['draft_vocab_size']} of {summary['distinct_tokens']} distinct tokens seen, "
            f"covering {100 * summary['coverage']:.2f}% of {summary['tokens']:,} corpus tokens",
            err=True,
        )
    _report_acceptance(source, out, target_spec, summary, as_json)
    _done(summary, as_json)


def _report_acceptance(source, out, target_spec, summary, as_json):
    """The converted drafter's acceptance against the source's record, into ``summary`` and (for
    a person) one line on stderr."""
    from ..acceptance import compare_conversion, conversion_line
    from ..locate import resolve_drafter

    summary["acceptance"] = compare_conversion(resolve_drafter(source), out, target_spec)
    if not as_json:
        click.echo(conversion_line(summary["acceptance"]), err=True)


@convert.command(
    "mfd-d",
    epilog=examples(
        "mfd-hub convert mfd-d ./MFD-Qwen3-8B ./MFD-D-Qwen3-8B-init --default-from mode:0",
        "mfd-hub convert mfd-d ./MFD-Qwen3-4B ./MFD-D-Qwen3-4B-init --default-from zeros --json",
    ),
)
@drafter_argument("source", "SOURCE")
@click.argument("out", type=click.Path())
@click.option("--default-from", default="zeros", show_default=True,
              help="Start of the default path: 'zeros' (plain DFlash), 'mean' (of the modes) or 'mode:K'.")
@click.option("--dtype", type=DTYPE_CHOICE, default=None, help="Weight dtype (default: the source's).")
@_output_options
def convert_mfd_d_command(source, out, default_from, dtype, max_shard_size, overwrite, as_json):
    """An MFD drafter -> its MFD-D form: the K modes plus a single-mode default path.

    The choice of the default path's start is recorded in mfd_metadata.
    """
    from ..converters import convert_mfd_d
    from ..converters.common import parse_dtype

    out = _destination(source, out, overwrite)
    summary = convert_mfd_d(source, out, default_from=default_from, dtype=parse_dtype(dtype),
                            max_shard_size=max_shard_size, overwrite=overwrite)
    _done(summary, as_json)
