"""bench's records: a finished journal kept packed (progress.jsonl.gz) resumes like the plain one; a refused
resume leaves it as it was; the report tables give ms a round per stage."""

import pytest

from mfd_hub.errors import MfdHubError
from mfd_hub.zoo.bench import PACKED_PROGRESS_NAME, PROGRESS_NAME, BenchJournal, RunStats, pack_journal

SETTINGS = {"target": "t", "methods": ["chain"], "budgets": [4]}


def _journal_with_two_prompts(folder):
    journal = BenchJournal(folder, SETTINGS)
    for name in ("p0", "p1"):
        journal.add(0.0, name, _ids(name), {"plain": {"tokens": 3}, "cells": [RunStats(drafter="d", method="chain", budget=4, temperature=0.0)]})
    return journal


def _ids(name):
    import torch

    return torch.tensor([[1, 2, 3 if name == "p0" else 4]])


def test_a_packed_journal_resumes_with_every_finished_prompt(tmp_path):
    _journal_with_two_prompts(tmp_path)
    plain_bytes = (tmp_path / PROGRESS_NAME).read_bytes()
    assert pack_journal(tmp_path) and not (tmp_path / PROGRESS_NAME).exists()
    packed = (tmp_path / PACKED_PROGRESS_NAME).read_bytes()
    assert len(packed) < len(plain_bytes)
    resumed = BenchJournal(tmp_path, SETTINGS, resume=True)
    assert len(resumed) == 2 and resumed.get(0.0, "p1", _ids("p1"))["plain"] == {"tokens": 3}
    assert resumed.get(0.0, "p2", _ids("p2")) is None
    assert (tmp_path / PROGRESS_NAME).read_bytes() == plain_bytes and not (tmp_path / PACKED_PROGRESS_NAME).exists()
    assert pack_journal(tmp_path) and (tmp_path / PACKED_PROGRESS_NAME).read_bytes() == packed  # reproducible bytes
    assert not pack_journal(tmp_path / "empty")


def test_a_refused_resume_leaves_the_packed_journal_untouched(tmp_path):
    _journal_with_two_prompts(tmp_path)
    pack_journal(tmp_path)
    packed = (tmp_path / PACKED_PROGRESS_NAME).read_bytes()
    with pytest.raises(MfdHubError, match="other settings \\(budgets\\)"):
        BenchJournal(tmp_path, {**SETTINGS, "budgets": [8]}, resume=True)
    assert (tmp_path / PACKED_PROGRESS_NAME).read_bytes() == packed and not (tmp_path / PROGRESS_NAME).exists()
    fresh = BenchJournal(tmp_path, SETTINGS, resume=False)  # without --resume an old journal is discarded
    assert len(fresh) == 0 and not (tmp_path / PACKED_PROGRESS_NAME).exists()


def test_the_report_tables_show_where_a_rounds_time_goes():
    """bench's markdown (and demo's table) give each configuration's ms a round per stage."""
    from mfd_hub.zoo.bench import markdown_table, round_stages_ms

    per_round = {"prefill": 0.5, "draft": 0.0042, "tree": 0.0008, "verify": 0.0374, "commit": 0.0015}
    assert round_stages_ms(per_round) == "4.2 / 0.8 / 37.4 / 1.5"
    assert round_stages_ms({}) == "0.0 / 0.0 / 0.0 / 0.0"
    row = {"drafter": "D", "method": "mixture", "budget": 16, "dtype": "bfloat16", "temperature": 0.0, "tau": 3.1,
           "speedup": 2.0, "tokens_per_second": 60.0, "plain_tokens_per_second": 30.0, "baseline_dtype": "bfloat16",
           "chimera_share": None, "mismatches": 0, "near_ties": 0, "stage_seconds_per_round": per_round}
    header, rule, line = markdown_table([row]).splitlines()
    assert header.endswith("| ms a round: draft / tree / verify / commit |") and rule.count("---") == 12
    assert line.endswith("| 4.2 / 0.8 / 37.4 / 1.5 |")


def test_a_cell_counts_the_modes_each_round_drafted_and_reads_old_journals():
    """auto chooses how many of the mixture's modes to draft: a cell keeps the rounds per mode count
    (through the journal's JSON), its row the shares and the mean; a cell journalled before the
    count existed reads back with none."""
    a = RunStats(drafter="d", method="mixture", budget="auto", temperature=0.0, rounds=3, rounds_by_modes={8: 1, 2: 2})
    b = RunStats(drafter="d", method="mixture", budget="auto", temperature=0.0, rounds=1, rounds_by_modes={2: 1})
    a.add(RunStats.from_json(b.to_json()))
    assert a.rounds_by_modes == {8: 1, 2: 3}
    row = a.row({"dtype": "float32", "tokens": 1, "seconds": 1.0})
    assert row["modes_drafted"] == {2: 0.75, 8: 0.25} and row["mean_modes_drafted"] == 3.5
    old = a.to_json()
    del old["rounds_by_modes"]
    assert RunStats.from_json(old).rounds_by_modes == {}
