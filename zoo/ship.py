"""Shipping a trained drafter into ``zoo/`` (maintainers: ``scripts/ship_miniature.py``).

A run's ``final/`` drafter is saved in bf16, verified against the SmolLM2 target as the full
checkpoint a user would load (bundle included) while its acceptance record is measured
(``mfd_hub.acceptance``), and then only what the zoo keeps is copied in: weights, config and the
record; then the shipped drafter is verified as users get it, for its verify report and card.
"""

import json
import shutil
import tempfile
from pathlib import Path

from mfd_hub.errors import MfdHubError

from .shipped import BENCH_RESULTS, CARD, SHIPPED_DRAFTERS, VERIFY_REPORT, shipped_drafter_dir, zoo_dir, zoo_folder


def render_shipped_card(name):
    """The card of a shipped drafter from what the zoo holds: its checkpoint, its verify report and
    the miniature's benchmark results (when present)."""
    from mfd_hub.cards.model_card import render_miniature_card

    folder = zoo_folder(name)
    report = folder / VERIFY_REPORT
    bench = zoo_dir() / BENCH_RESULTS
    return render_miniature_card(
        folder, SHIPPED_DRAFTERS[name] + ".",
        bench=json.loads(bench.read_text(encoding="utf-8")) if bench.is_file() else None,
        verify_report=json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None,
    )


def ship_drafter(trained, name, log=print):
    """Copy a trained drafter (a run's ``final/``) into zoo/NAME in bf16 with its acceptance record,
    verify it against the SmolLM2 target, and write its verify report and card beside it."""
    from mfd_hub.checkpoint import load_draft

    if name not in SHIPPED_DRAFTERS:
        raise MfdHubError(f"{name} is not one of the shipped drafters: {', '.join(SHIPPED_DRAFTERS)}")
    _record_into_zoo(load_draft(trained), name, ("config.json", "model.safetensors"), log)
    return _verify_into_zoo(name, log)


def record_shipped_acceptance(name, log=print):
    """Measure the acceptance record of a drafter already in the zoo (its weights as shipped),
    then verify it again and rewrite its verify report and card."""
    from mfd_hub.checkpoint import load_draft

    if name not in SHIPPED_DRAFTERS:
        raise MfdHubError(f"{name} is not one of the shipped drafters: {', '.join(SHIPPED_DRAFTERS)}")
    _record_into_zoo(load_draft(zoo_dir() / name), name, (), log)
    return _verify_into_zoo(name, log)


def reverify_shipped(name, log=print):
    """Verify a shipped drafter (with its record) again: a new verify report and card."""
    return _verify_into_zoo(name, log)


def _record_into_zoo(draft, name, files, log):
    """Save ``draft`` as the full bf16 checkpoint a user loads, verify it against SmolLM2 with
    ``record=True`` (so it is measured as shipped), then copy ``files`` and the record into the zoo."""
    import torch

    from mfd_hub.acceptance import RECORD_NAME
    from mfd_hub.checkpoint import save_draft
    from mfd_hub.verify import verify_checkpoint

    with tempfile.TemporaryDirectory() as scratch:
        full = save_draft(draft, Path(scratch) / name, dtype=torch.bfloat16)
        report = verify_checkpoint(full, target="smollm2", record=True,
                                   listener=lambda c: log(f"  {c.status:<4} {c.name}: {c.reason}"))
        if not report.ok:
            raise MfdHubError(f"{name} failed verification: {report.failures()[0].reason}")
        folder = zoo_dir() / name
        folder.mkdir(exist_ok=True)
        for file in (*files, RECORD_NAME):
            shutil.copyfile(full / file, folder / file)


def _verify_into_zoo(name, log):
    """Verify the shipped drafter as users get it (its loadable folder's files, in a folder called
    NAME, so the report does not name the cache's digest) against SmolLM2; keep the report and
    regenerate the card."""
    from mfd_hub.verify import verify_checkpoint

    with tempfile.TemporaryDirectory() as scratch:
        folder = shutil.copytree(shipped_drafter_dir(name), Path(scratch) / name)
        report = verify_checkpoint(folder, target="smollm2",
                                   listener=lambda c: log(f"  {c.status:<4} {c.name}: {c.reason}"))
    if not report.ok:
        raise MfdHubError(f"{name} failed verification as shipped: {report.failures()[0].reason}")
    folder = zoo_dir() / name
    report.path = name
    (folder / VERIFY_REPORT).write_text(json.dumps(report.to_dict(), indent=1) + "\n", encoding="utf-8")
    write_shipped_card(name)
    return folder


def write_shipped_card(name):
    folder = zoo_dir() / name
    (folder / CARD).write_text(render_shipped_card(name), encoding="utf-8")
