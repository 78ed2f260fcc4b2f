"""Model cards for the published drafters, generated from the registry (never edited by hand).

``render_card(drafter)`` fills ``cards/model_card.md.j2`` with the registry's facts and, when a
checkpoint folder is given, that checkpoint's own shape (config.json and safetensors headers).
The YAML metadata is written by huggingface_hub's ``ModelCardData`` so the Hub parses it: license,
base_model (the z-lab drafter it was fine-tuned from), datasets, and a model-index that holds the
paper's figures and, for a checkpoint with an ``acceptance.json`` (``mfd_hub.acceptance``), the
acceptance mfd-hub measured.
"""

from collections import Counter
from importlib import resources

from mfd_hub.version import __version__
from mfd_hub.cards.registry import ENGINES, TEMPERATURES, load_registry

TEMPLATE = "model_card.md.j2"
_DTYPE_NAMES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "F64": "fp64", "F8_E4M3": "fp8"}
_TASKS = "GSM8K, MATH-500, HumanEval, MBPP, MT-Bench (mean)"
_TEMPERATURE_TEXT = {"t0": "T=0", "t1": "T=1"}


def _number(value):
    """1e-4 rather than 0.0001 or 1e-04; plain otherwise."""
    if value and abs(value) < 1e-3:
        mantissa, exponent = f"{value:e}".split("e")
        return f"{float(mantissa):g}e{int(exponent)}"
    return f"{value:g}"


def architecture(drafter, path=None):
    """The drafter's shape: from the checkpoint at ``path`` when given, else from the registry."""
    from mfd_hub.describe import config_summary, describe_checkpoint

    if path is not None:
        summary = describe_checkpoint(path)
        dtypes = [_DTYPE_NAMES.get(d, d.lower()) for d in summary["weight_dtypes"] if d in _DTYPE_NAMES]
        source = "checkpoint"
    else:
        import torch

        from mfd_hub.remote.modeling_mfd import DFlashDraftModel

        config = drafter.config()
        with torch.device("meta"):
            params = sum(t.numel() for t in DFlashDraftModel(config).state_dict().values())
        summary = {"format": "mfd-hub", **config_summary(config), "parameters": params, "bundle_version": None}
        dtypes = [drafter.base.shape["dtype"]]
        source = "registry"
    counts = Counter(summary["layer_types"])
    parts = []
    if counts.get("sliding_attention"):
        parts.append(f"{counts['sliding_attention']} sliding-window with window {summary['sliding_window']}")
    if counts.get("full_attention") and parts:
        parts.append(f"{counts['full_attention']} full-attention")
    params = summary["parameters"]
    return {
        **summary,
        "source": source,
        "layers_text": f"{summary['layers']} layers" + (f" ({', '.join(parts)})" if parts else ""),
        "parameters_text": f"{params / 1e6:.0f}M" if params >= 1e6 else f"{params:,}",
        "dtype_text": "/".join(dtypes) or "unknown dtype",
    }


def _results(drafter, registry):
    """Per engine: the paper table, the budget, and the rows the card shows (own row last)."""
    column = drafter.target.key
    out = []
    for engine, table_key in ENGINES.items():
        if engine not in drafter.results:
            continue
        rows = [{"label": r.label, "cells": r.cells[column], "source": r.source(drafter.target.paper_column),
                 "own": False} for r in drafter.compare[engine]]
        own = drafter.results[engine]
        rows.append({"label": "This drafter", "cells": own.cells[column], "source": own.source(drafter.target.paper_column),
                     "own": True})
        out.append({"engine": engine, "table": registry.tables[table_key], "budget": drafter.budget.get(engine),
                    "rows": rows})
    return out


def _eval_results(drafter, registry):
    from huggingface_hub import EvalResult

    results = []
    for engine in ENGINES:
        if engine not in drafter.results:
            continue
        row = drafter.results[engine]
        table = registry.tables[row.table]
        cells = drafter.figures(engine)
        for temp in TEMPERATURES:
            for metric, value, name in (("speedup", cells[temp].speedup, "Speedup over autoregressive decoding"),
                                        ("acceptance_length", cells[temp].tau, "Acceptance length (tau)")):
                results.append(EvalResult(
                    task_type="text-generation",
                    task_name="Speculative decoding, batch size 1",
                    dataset_type="mfd-five-task-mean",
                    dataset_name=_TASKS,
                    dataset_config=table.engine,  # one model-index entry per engine
                    metric_type=metric,
                    metric_value=value,
                    metric_name=f"{name}, {_TEMPERATURE_TEXT[temp]}",
                    metric_config=_TEMPERATURE_TEXT[temp],
                    source_name=f"arXiv:{registry.paper['arxiv']}, {row.source(drafter.target.paper_column)}",
                    source_url=registry.paper["url"],
                ))
    return results


def acceptance_of(path):
    """A checkpoint's acceptance record as the cards show it, or None (no path, or no record)."""
    from mfd_hub.acceptance import CHECK_METHOD, CHECK_PROMPTS, THRESHOLD, read_record

    record = read_record(path) if path is not None else None
    if record is None:
        return None
    return {
        "target": record["target"].get("name") or "its target",
        "version": record.get("mfd_hub_version"),
        "dtype": (record.get("measured") or {}).get("dtype"),
        "new_tokens": (record.get("measured") or {}).get("new_tokens"),
        "tree_budget": (record.get("measured") or {}).get("tree_budget"),
        "prompt_count": (record.get("prompts") or {}).get("count"),
        "prompts_sha256": (record.get("prompts") or {}).get("sha256") or "",
        "weights_dtype": record["drafter"].get("weights_dtype"),
        "tau": dict(record.get("tau") or {}),
        "check": {"method": CHECK_METHOD, "prompts": CHECK_PROMPTS, "threshold": THRESHOLD},
    }


ACCEPTANCE_TEMPLATE = "acceptance_section.md.j2"


def acceptance_section(acceptance, override=None):
    """The cards' markdown about the acceptance record (and a publication despite a failed
    acceptance check); empty when there is neither."""
    import jinja2

    source = resources.files("mfd_hub.cards").joinpath(ACCEPTANCE_TEMPLATE).read_text(encoding="utf-8")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    return env.from_string(source).render(acceptance=acceptance, acceptance_override=override).strip()


def acceptance_eval_results(acceptance):
    """The model-index entries of an acceptance record: tau per method, at T = 0."""
    from huggingface_hub import EvalResult

    if not acceptance:
        return []
    return [EvalResult(
        task_type="text-generation",
        task_name="Speculative decoding, batch size 1",
        dataset_type="mfd-hub-acceptance-prompts",
        dataset_name=f"mfd-hub acceptance prompts ({acceptance['prompt_count']}, sha256 {acceptance['prompts_sha256'][:12]})",
        metric_type="acceptance_length",
        metric_value=tau,
        metric_name=f"Acceptance length (tau), {method}, T=0",
        metric_config=method,
    ) for method, tau in acceptance["tau"].items()]


def card_metadata(drafter, registry, acceptance=None):
    """huggingface_hub ModelCardData for the card's YAML front matter."""
    from huggingface_hub import ModelCardData

    tags = ["mfd", "multi-future-drafting", "dflash", "speculative-decoding", "draft-model", "mfd-hub",
            *drafter.target.tags]
    return ModelCardData(
        model_name=drafter.name,
        license=drafter.license,
        base_model=drafter.base.repo,
        base_model_relation="finetune",
        datasets=list(drafter.data.datasets) or None,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=tags,
        eval_results=_eval_results(drafter, registry) + acceptance_eval_results(acceptance),
    )


def render_card(drafter, path=None, repo_id=None, registry=None, acceptance_override=None):
    """The complete README.md (YAML metadata + markdown) for ``drafter``; with ``path``, its
    checkpoint's shape and acceptance record. ``acceptance_override``: why the acceptance check
    failed when the owner published anyway (``push --ignore-acceptance``), stated on the card."""
    import jinja2

    registry = registry or load_registry()
    source = resources.files("mfd_hub.cards").joinpath(TEMPLATE).read_text(encoding="utf-8")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters["x"] = lambda cell: f"{cell.speedup:.2f}x ({cell.tau:.2f})"
    env.filters["num"] = _number
    # Same-target drafters trained on more data or as another kind, for the card's pointers.
    better = [s for s in registry.siblings(drafter)
              if s.kind == drafter.kind and "hf" in s.results and "hf" in drafter.results
              and s.figures("hf")["t0"].speedup > drafter.figures("hf")["t0"].speedup]
    acceptance = acceptance_of(path)
    text = env.from_string(source).render(
        d=drafter,
        acceptance_section=acceptance_section(acceptance, acceptance_override),
        repo_id=repo_id or drafter.repo_id,
        paper=registry.paper,
        recipe=registry.recipe,
        tables=registry.tables,
        arch=architecture(drafter, path),
        results=_results(drafter, registry),
        better=better,
        metadata=card_metadata(drafter, registry, acceptance).to_yaml(),
        version=__version__,
    )
    return text


# -- the SmolLM2 miniature's shipped drafters ------------------------------------------------------
MINIATURE_TEMPLATE = "miniature_card.md.j2"
_KINDS = {"mfd": "MFD", "dpace": "D-PACE", "dflash": "DFlash"}


def render_miniature_card(folder, summary, bench=None, verify_report=None):
    """README.md of a shipped SmolLM2 drafter: its shape and training runs from the checkpoint,
    ``bench`` (a results.json dict of ``mfd-hub bench``) rows for this drafter, and the checks of
    ``verify_report`` (a ``verify_checkpoint(...).to_dict()``)."""
    import json
    from pathlib import Path

    import jinja2
    from huggingface_hub import ModelCardData

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    meta = config.get("mfd_metadata") or {}
    training = [*meta.get("earlier_training", []), *([meta["training"]] if "training" in meta else [])]
    kind = _KINDS.get(training[-1]["loss"], "DFlash") if training else "DFlash"
    rows = [r for r in (bench or {}).get("rows", []) if r["drafter"] == folder.name and r["temperature"] == 0]
    # fixed budgets in order, then "auto"
    rows.sort(key=lambda r: (["chain", "product", "mixture"].index(r["method"]), r["budget"] == "auto",
                             0 if r["budget"] == "auto" else r["budget"]))
    baseline = ({"dtype": rows[0]["baseline_dtype"], "tokens_per_second": rows[0]["plain_tokens_per_second"]}
                if rows and "baseline_dtype" in rows[0] else None)
    bench_meta = dict((bench or {}).get("meta", {}))
    bench_meta["temperature"] = 0
    if bench_meta.get("linears"):
        # the card shows a command that reruns the bench: an option value, not the report's label
        from mfd_hub.packed_linear import linears_option

        bench_meta["linears"] = linears_option(bench_meta["linears"])
    checks = (verify_report or {}).get("checks", [])
    verify = None
    if checks:
        verify = {s: sum(c["status"] == key for c in checks)
                  for s, key in (("passed", "pass"), ("warned", "warn"), ("failed", "fail"))}
    acceptance = acceptance_of(folder)
    metadata = ModelCardData(
        model_name=folder.name, license="apache-2.0", library_name="transformers", pipeline_tag="text-generation",
        tags=["mfd", "multi-future-drafting", "dflash", "speculative-decoding", "draft-model", "mfd-hub", "smollm2"],
        eval_results=acceptance_eval_results(acceptance) or None,
    )
    source = resources.files("mfd_hub.cards").joinpath(MINIATURE_TEMPLATE).read_text(encoding="utf-8")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    return env.from_string(source).render(
        name=folder.name, kind=kind, summary=summary, arch=architecture(None, folder), training=training,
        results=rows, baseline=baseline, bench=bench_meta, verify=verify, metadata=metadata.to_yaml(), version=__version__,
        acceptance_section=acceptance_section(acceptance),
        paper=load_registry().paper,
    )
