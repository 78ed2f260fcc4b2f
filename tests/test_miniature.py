"""The SmolLM2-135M miniature: the shipped drafters, `mfd-hub demo` and `mfd-hub bench`."""

import json

import pytest
from conftest import NO_MFD_HUB, one_error_line, run_cli, run_python
from mfd_hub.bundle import bundle_sources
from mfd_hub.zoo.bench import load_prompt_set
from mfd_hub.zoo.ship import render_shipped_card
from mfd_hub.zoo.shipped import (
    BENCH_RESULTS,
    CARD,
    HUB_FILES,
    SHIPPED_DRAFTERS,
    VERIFY_REPORT,
    shipped_drafter_dir,
    zoo_dir,
    zoo_folder,
)


@pytest.mark.parametrize("name", sorted(SHIPPED_DRAFTERS))
def test_shipped_drafter_is_complete_and_current(name):
    folder = zoo_folder(name)
    # the zoo keeps weights, config, card and verify report: no copy of the remote code
    assert sorted(p.name for p in folder.iterdir()) == sorted([*HUB_FILES, VERIFY_REPORT])
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "mfd_dflash"
    assert config["target"]["vocab_size"] == 49152 and config["target"]["hidden_size"] == 576
    assert config["num_modes"] == (8 if name.startswith("MFD") else 0)
    training = config["mfd_metadata"]["training"]
    assert training["recipe"] == {"MFD": "smollm2-mfd", "DPACE": "smollm2-dpace", "DFlash": "smollm2-dflash"}[name.split("-")[0]]
    assert (folder / "model.safetensors").stat().st_size < 32 * 2**20  # a small checkpoint
    report = json.loads((folder / VERIFY_REPORT).read_text())
    assert report["ok"] and not [c for c in report["checks"] if c["status"] == "fail"]
    assert any(c["name"] == "spec-decoding" and c["status"] == "pass" for c in report["checks"])
    # the card is generated from what the zoo holds, never edited by hand
    assert (folder / CARD).read_text() == render_shipped_card(name)


@pytest.mark.parametrize("name", sorted(SHIPPED_DRAFTERS))
def test_loadable_folder_equals_a_hub_ready_export(name, tmp_path, monkeypatch):
    """The folder handed out for a shipped drafter holds, byte for byte, what a Hub repo of it
    holds: the checkpoint save_draft writes from the zoo's weights (bundle included) and the card."""
    import torch

    from mfd_hub import load_draft, save_draft

    monkeypatch.setenv("MFD_HUB_CACHE", str(tmp_path / "cache"))
    folder = shipped_drafter_dir(name)
    assert folder.is_relative_to(tmp_path / "cache")
    assert shipped_drafter_dir(name) == folder  # written once, then reused
    export = save_draft(load_draft(zoo_folder(name)), tmp_path / "export", dtype=torch.bfloat16,
                        extra_files={CARD: render_shipped_card(name)})
    files = sorted(p.name for p in export.iterdir())
    assert sorted(p.name for p in folder.iterdir()) == files
    assert set(bundle_sources()) < set(files)
    for file in files:
        assert (folder / file).read_bytes() == (export / file).read_bytes(), file


def test_shipped_drafter_loads_with_auto_model_without_mfd_hub(tmp_path):
    folder = shipped_drafter_dir("MFD-SmolLM2-135M")
    code = NO_MFD_HUB + f"""
import torch
from transformers import AutoModel
model = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True, dtype=torch.float32)
print(type(model).__name__, model.config.num_modes, tuple(model.mode_embed.shape))
"""
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["DFlashDraftModel", "8", "(8,", "576)"]


def test_fine_tunes_share_their_base_and_data():
    configs = {n: json.loads((zoo_folder(n) / "config.json").read_text()) for n in SHIPPED_DRAFTERS}
    base = configs["DFlash-SmolLM2-135M"]["mfd_metadata"]["training"]
    runs = [configs[n]["mfd_metadata"]["training"] for n in ("MFD-SmolLM2-135M", "DPACE-SmolLM2-135M")]
    assert [c["mfd_metadata"]["earlier_training"][-1] for n, c in configs.items() if n != "DFlash-SmolLM2-135M"] == [base, base]
    assert runs[0]["steps"] == runs[1]["steps"] and runs[0]["sequences"] == runs[1]["sequences"]
    assert {runs[0]["loss"], runs[1]["loss"]} == {"mfd", "dpace"}


def test_benchmark_results_cover_the_acceptance_grid():
    results = json.loads((zoo_dir() / BENCH_RESULTS).read_text())
    assert results["meta"]["prompts"] == "humaneval"
    cells = {(r["drafter"], r["method"], r["budget"]) for r in results["rows"] if r["temperature"] == 0}
    for budget in (16, 32, 64):
        assert ("MFD-SmolLM2-135M", "mixture", budget) in cells
        assert ("MFD-SmolLM2-135M", "product", budget) in cells
        assert ("DPACE-SmolLM2-135M", "product", budget) in cells
    assert all(r["mismatches"] == 0 for r in results["rows"] if r["temperature"] == 0)


def test_humaneval_is_not_in_the_training_prompts():
    import re

    from mfd_hub.zoo.prompts import derive_training_prompts

    humaneval = load_prompt_set("humaneval")
    assert len(humaneval) == 164 and humaneval[0][0] == "HumanEval/0"
    # each problem's task: the start of its docstring (a few use single quotes)
    tasks = {re.sub(r"\s+", " ", t.split('"""')[1]).strip()[:60] for _, t in humaneval if '"""' in t}
    assert len(tasks) > 120
    training = [re.sub(r"\s+", " ", t) for t in derive_training_prompts(1600)]
    assert not [t for t in training for task in tasks if task in t]


@pytest.mark.slow
def test_demo_runs_offline_and_every_method_matches_plain_decoding(tmp_path):
    result = run_cli(["demo", "--max-new-tokens", "40", "--budget", "16", "--json"], tmp_path,
                     extra_env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)
    assert out["drafter"] == "MFD-SmolLM2-135M"
    assert [r["method"] for r in out["runs"]] == ["plain", "chain", "product", "mixture"]
    assert all(r["identical"] for r in out["runs"])
    assert all(r["tau"] >= 1 for r in out["runs"][1:])
    assert out["runs"][0]["new_tokens"] <= 40 and out["text"].strip()


@pytest.mark.slow
def test_bench_writes_json_markdown_and_plots(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "Write a Python function that adds two numbers."}) + "\n")
    result = run_cli(["bench", "--prompts", str(prompts), "--budgets", "4,8", "--max-new-tokens", "12",
                      "--out", "out", "--json"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout)["rows"]
    # both shipped fine-tunes; the mixture only for the MFD drafter; chain once at the smallest budget
    got = sorted((r["drafter"], r["method"], r["budget"]) for r in rows)
    assert got == sorted([(d, "chain", 4) for d in ("MFD-SmolLM2-135M", "DPACE-SmolLM2-135M")]
                         + [(d, "product", b) for d in ("MFD-SmolLM2-135M", "DPACE-SmolLM2-135M") for b in (4, 8)]
                         + [("MFD-SmolLM2-135M", "mixture", b) for b in (4, 8)])
    for r in rows:
        assert r["mismatches"] == 0 and r["tau"] >= 1 and r["speedup"] > 0
        if r["method"] != "chain":
            assert 0 <= r["chimera_share"] <= 1
            assert r["mass_per_depth"] and all(0 <= m <= r["budget"] for m in r["mass_per_depth"].values())
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["results.json", "results.md", "speedup_T0.png", "tau_T0.png"]
    assert (tmp_path / "out" / "results.md").read_text().count("\n") == len(rows) + 2


@pytest.mark.parametrize("args,needle", [
    (["bench", "--budgets", "16,x"], "--budgets"),
    (["bench", "--methods", "tree"], "--methods"),
    (["bench", "--temperatures", "-1"], "--temperatures"),
    (["bench", "--prompts", "missing.jsonl"], "missing.jsonl"),
    (["bench", "--target", "./nowhere"], "--drafter"),
    (["demo", "--drafter", "./nowhere"], "nowhere"),
])
def test_bad_input_is_one_error_line(tmp_path, args, needle):
    result = run_cli(args, tmp_path)
    assert one_error_line(result), result.stderr[-2000:]
    assert needle in result.stderr
    assert not (tmp_path / "bench-results").exists()
