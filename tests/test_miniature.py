"""The SmolLM2-135M miniature: the shipped drafters, `mfd-hub demo` and `mfd-hub bench`."""

import json

import pytest
from conftest import NO_MFD_HUB, load_script, one_error_line, run_cli, run_cli_many, run_python
from mfd_hub.bundle import bundle_sources
from mfd_hub.packed_linear import speculation_linears
from mfd_hub.zoo.bench import load_prompt_set
from mfd_hub.zoo.ship import render_shipped_card
from mfd_hub.zoo.shipped import (
    ACCEPTANCE_RECORD,
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
    # the zoo keeps weights, config, acceptance record, card and verify report: no remote code
    assert sorted(p.name for p in folder.iterdir()) == sorted([*HUB_FILES, VERIFY_REPORT])
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "mfd_dflash"
    assert config["target"]["vocab_size"] == 49152 and config["target"]["hidden_size"] == 576
    assert config["num_modes"] == (8 if name.startswith("MFD") else 0)
    training = config["mfd_metadata"]["training"]
    assert training["recipe"] == {"MFD": "smollm2-mfd", "DPACE": "smollm2-dpace", "DFlash": "smollm2-dflash"}[name.split("-")[0]]
    assert (folder / "model.safetensors").stat().st_size < 32 * 2**20  # a small checkpoint
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
                        extra_files={CARD: render_shipped_card(name),
                                     ACCEPTANCE_RECORD: (zoo_folder(name) / ACCEPTANCE_RECORD).read_text()})
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


def test_paper_analyses_read_the_shipped_results(capsys):
    """benchmarks/paper_analyses.py on the shipped bench results: each mixture-over-product ratio
    it prints is the ratio of those rows' tau and of their summed mass per depth, a missing cell
    stays empty, and a file that is not bench results is one error."""
    analyses = load_script("benchmarks/paper_analyses.py")
    path = zoo_dir() / BENCH_RESULTS
    rows = json.loads(path.read_text())["rows"]
    analyses.main(["--results", str(path)])
    printed = capsys.readouterr().out
    table = {}
    for line in printed.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0].isdigit():
            table[int(cells[0])] = cells

    def row(drafter, method, budget):
        return next(r for r in rows if r["drafter"] == drafter and r["method"] == method and r["budget"] == budget)

    assert sorted(table) == [16, 32, 64]
    for budget, cells in table.items():
        mix, own, other = (row("MFD-SmolLM2-135M", "mixture", budget), row("MFD-SmolLM2-135M", "product", budget),
                           row("DPACE-SmolLM2-135M", "product", budget))
        mass = [sum(r["mass_per_depth"].values()) for r in (mix, own, other)]
        assert cells[1:] == [f"{mix['tau']:.2f}", f"{mix['tau'] / other['tau']:.3f}x", f"{mix['tau'] / own['tau']:.3f}x",
                             f"{mass[0]:.3f}", f"{mass[0] / mass[2]:.3f}x", f"{mass[0] / mass[1]:.3f}x"]
    dpace_line = next(line for line in printed.splitlines() if line.startswith("| DPACE-SmolLM2-135M |"))
    assert dpace_line.count("|  |") == 3  # D-PACE has no mixture tree: its three mixture cells are empty
    assert f"chimera share {100 * row('DPACE-SmolLM2-135M', 'product', 64)['chimera_share']:.1f}%" in printed
    with pytest.raises(SystemExit, match="not a results.json"):
        analyses.main(["--results", str(zoo_dir() / "MFD-SmolLM2-135M" / "model.safetensors")])


def test_scaling_plot_draws_a_line_per_drafter_and_method(tmp_path, capsys):
    """benchmarks/scaling_plot.py: every (drafter, method) of the points is a column holding its tau
    at each size (a chain at its own budget, a tree at --budget), a size lacking it an empty cell,
    the PNG is written, and a file that is not bench results is one error."""
    scaling = load_script("benchmarks/scaling_plot.py")
    rows = json.loads((zoo_dir() / BENCH_RESULTS).read_text())["rows"]
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"rows": rows}))
    small = tmp_path / "small.json"  # a smaller run without the mixture, its tau halved
    small.write_text(json.dumps({"rows": [{**r, "tau": r["tau"] / 2} for r in rows if r["method"] != "mixture"]}))
    scaling.main(["--point", f"12000={big}", "--point", f"1200={small}", "--budget", "32", "--out", str(tmp_path / "s.png")])
    lines = capsys.readouterr().out.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    table = {int(cells[0].replace(",", "")): cells[1:] for cells in
             ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:4])}
    assert sorted(table) == [1200, 12000]

    def tau(drafter, method):
        return next(r["tau"] for r in rows if r["drafter"] == drafter and r["method"] == method
                    and r["temperature"] == 0 and (method == "chain" or r["budget"] == 32))

    expected = {f"{d} {m} tau": (d, m) for d in ("DPACE-SmolLM2-135M", "MFD-SmolLM2-135M") for m in ("chain", "product", "mixture")
                if (d, m) != ("DPACE-SmolLM2-135M", "mixture")}
    assert sorted(header[1:]) == sorted(expected)
    for column, name in enumerate(header[1:]):
        drafter, method = expected[name]
        assert table[12000][column] == f"{tau(drafter, method):.2f}"
        assert table[1200][column] == ("" if method == "mixture" else f"{tau(drafter, method) / 2:.2f}")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit, match="not a results.json"):
        scaling.main(["--point", f"5000={zoo_dir() / 'MFD-SmolLM2-135M' / 'model.safetensors'}"])


def _humaneval_overlap(prompts):
    """The prompts (text, subject name or None) that overlap HumanEval: a problem's task (the start
    of any of its docstrings) in the text, a problem's function name as the subject (also without
    underscores: `isprime` is `is_prime`), or a distinctive function name (`has_close_elements`)
    anywhere in the text."""
    import re

    from mfd_hub.zoo.prompts import humaneval_problems

    problems = humaneval_problems()
    assert len(problems) == 164 and problems[0]["task_id"] == "HumanEval/0"
    assert [task for task, _ in load_prompt_set("humaneval")] == [p["task_id"] for p in problems]  # what bench runs
    docstrings = [d for p in problems for _, d in re.findall(r"(\"\"\"|''')(.*?)\1", p["prompt"], re.DOTALL)]
    tasks = {re.sub(r"\s+", " ", d).strip().lower()[:60] for d in docstrings}
    tasks = {t for t in tasks if len(t) >= 20}
    assert len(tasks) > 150
    names = {p["entry_point"] for p in problems}
    names |= {n for p in problems for n in re.findall(r"def (\w+)\(", p["prompt"])}
    assert {"has_close_elements", "is_prime", "median", "add"} <= names
    flat = {n.lower().replace("_", "") for n in names}
    distinctive = re.compile(r"\b(?:" + "|".join(sorted(n for n in names if "_" in n)) + r")\b", re.IGNORECASE)
    bad = []
    for text, subject in prompts:
        flat_text = re.sub(r"\s+", " ", text).lower()
        if any(task in flat_text for task in tasks) or distinctive.search(text):
            bad.append(text)
        elif subject is not None and subject.lower().replace("_", "") in flat:
            bad.append(text)
    return bad


def test_humaneval_is_not_in_the_training_prompts(prompt_set):
    from mfd_hub.zoo.prompts import derive_training_prompts

    # the prompt set: no task, no function name of HumanEval, in training and held-out prompts
    prompts = [(p.prompt, p.source.rsplit(".", 1)[-1]) for p in (*prompt_set.training, *prompt_set.heldout)]
    assert not _humaneval_overlap(prompts)
    # the earlier set the shipped drafters were trained on: no task (it does name `add`, `median` ...)
    assert not _humaneval_overlap([(t, None) for t in derive_training_prompts(1600)])


def test_the_committed_answers_reply_to_the_fingerprinted_prompts_and_share_nothing_with_humaneval():
    """data/smollm2 (the retraining's data, kept in git): every prompt of the fingerprinted set
    answered once, in order, by SmolLM2 as the sidecar says, nothing of HumanEval in them, and the
    held-out prompts apart from the training ones."""
    import hashlib
    from pathlib import Path

    from mfd_hub.recipes.regen import json_lines

    data = Path(__file__).resolve().parents[1] / "data" / "smollm2"
    fingerprint = json.loads((data / "prompts.json").read_text())
    splits = {}
    for split, size, digest in (("train", "size", "sha256"), ("heldout", "heldout_size", "heldout_sha256")):
        folder = data / split
        assert not list(folder.glob(".part-*")), "a finished regeneration has no shard in progress"
        records = [record for _, _, record in json_lines(folder)]
        assert len(records) == fingerprint[size] and len({r["id"] for r in records}) == len(records)
        texts = [r["prompt"] for r in records]
        assert hashlib.sha256(json.dumps(texts, ensure_ascii=False).encode()).hexdigest() == fingerprint[digest]
        runs = json.loads((folder / "regen.json").read_text())["runs"]
        assert all(run["target"] == "smollm2" and run["max_new_tokens"] == 192 and run["temperature"] == 0.7
                   for run in runs)
        assert all(0 < len(r["response_ids"]) <= 192 and r["finish_reason"] in ("stop", "length") for r in records)
        splits[split] = records
    assert fingerprint["size"] >= 10000
    assert not {r["prompt"] for r in splits["train"]} & {r["prompt"] for r in splits["heldout"]}
    assert not _humaneval_overlap([(r["prompt"], None) for records in splits.values() for r in records])


@pytest.fixture(scope="module")
def _derived_prompt_set():
    """The miniature's prompt set and the CPU seconds its derivation took: derived once per
    process (derive_prompt_set caches it)."""
    import time

    from mfd_hub.zoo.prompts import derive_prompt_set

    start = time.process_time()
    prompts = derive_prompt_set()
    return prompts, time.process_time() - start


@pytest.fixture
def prompt_set(_derived_prompt_set):
    return _derived_prompt_set[0]


def test_prompts_are_many_unique_and_quick(_derived_prompt_set):
    import re

    prompts, seconds = _derived_prompt_set
    # "well under 30 s on one core": CPU seconds of the first derivation in this process (0 if an
    # earlier test of this process already derived it)
    assert seconds < 20, seconds
    assert len(prompts.training) >= 10000 and len(prompts.heldout) == 200
    texts = prompts.texts("training") + prompts.texts("heldout")
    normalised = {re.sub(r"\s+", " ", t).strip().lower() for t in texts}
    assert len(normalised) == len(texts)
    ids = [p.id for p in (*prompts.training, *prompts.heldout)]
    assert len(set(ids)) == len(ids)


def test_prompts_hold_out_other_subjects(prompt_set):
    training_subjects = {p.source for p in prompt_set.training}
    heldout_subjects = [p.source for p in prompt_set.heldout]
    assert len(set(heldout_subjects)) == len(heldout_subjects) == 200  # one prompt per subject
    assert not training_subjects & set(heldout_subjects)
    assert not set(prompt_set.texts("training")) & set(prompt_set.texts("heldout"))
    assert prompt_set.fingerprint["heldout_size"] == 200


def test_prompts_are_varied_and_reasonable(prompt_set):
    import ast
    import collections
    import re

    from mfd_hub.zoo.prompts import CLASS_TEMPLATES, FUNCTION_TEMPLATES

    texts = prompt_set.texts("training")
    assert all(40 <= len(t) <= 600 for t in texts)
    # the templates, told apart by the text around their fields (the most specific one that matches)
    templates = FUNCTION_TEMPLATES + CLASS_TEMPLATES
    patterns = [re.compile(re.sub(r"\\\{\w+\\\}", ".+?", re.escape(t)) + r"\Z", re.DOTALL) for t in templates]
    literal = [len(re.sub(r"\{\w+\}", "", t)) for t in templates]
    shapes = collections.Counter()
    for text in texts:
        shapes[max((literal[i], i) for i, p in enumerate(patterns) if p.match(text))[1]] += 1
    assert len(shapes) == len(patterns) >= 15
    assert max(shapes.values()) < 0.12 * len(texts)
    assert sum(t.startswith("Write pytest") or "pytest tests" in t for t in texts) > 0.1 * len(texts)
    # programming requests: each asks for code, and every code block in them is valid Python
    assert all(re.search(r"\b(?:Python|function|class)\b", t) for t in texts)
    for text in texts:
        for code in re.findall(r"```python\n(.*?)```", text, re.DOTALL):
            ast.parse(code)
    # many sources, none the bulk of the set
    sources = collections.Counter(p.source.split(":")[0] for p in prompt_set.training)
    assert len(sources) >= 20 and max(sources.values()) < 0.4 * len(texts)


def test_prompts_fingerprint_is_deterministic_and_written_by_the_cli(prompt_set, tmp_path):
    import hashlib
    import os
    import subprocess
    import sys

    from mfd_hub.zoo.prompts import prompts_sha256

    fingerprint = prompt_set.fingerprint
    assert fingerprint["size"] == len(prompt_set.training)
    assert fingerprint["sha256"] == prompts_sha256(prompt_set.texts("training"))
    assert fingerprint["sha256"] == hashlib.sha256(
        json.dumps(prompt_set.texts("training"), ensure_ascii=False).encode()).hexdigest()
    sources = {s["name"]: s for s in fingerprint["sources"]}
    assert sources["python-stdlib"]["version"] and sources["numpy"]["version"] and sources["torch"]["prompts"] > 0
    assert sum(s["prompts"] for s in fingerprint["sources"]) == fingerprint["size"]
    # a fresh process, another hash seed: the same prompts, written as JSON Lines
    env = dict(os.environ, PYTHONHASHSEED="12345")
    result = subprocess.run([sys.executable, "-m", "mfd_hub.zoo.prompts", "--out", "p.jsonl"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == fingerprint
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert rows == [p.as_dict() for p in prompt_set.training]
    assert set(rows[0]) == {"id", "prompt", "source"}
    heldout = [json.loads(line) for line in (tmp_path / "p.heldout.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in heldout] == prompt_set.texts("heldout")


def test_prompts_skip_a_missing_package():
    from mfd_hub.zoo.prompts import _collect_subjects, _HumanEvalGuard

    sources = ({"name": "packaging"}, {"name": "no-such-package-mfd"})
    subjects, records, _ = _collect_subjects(sources, _HumanEvalGuard())
    assert records[0]["version"] and records[0]["subjects"] == len(subjects) > 0
    assert records[1] == {"name": "no-such-package-mfd", "version": None, "files": 0, "subjects": 0, "missing": True}


def test_prompts_asked_for_too_many_is_an_error(prompt_set):
    from mfd_hub.errors import MfdHubError
    from mfd_hub.zoo.prompts import derive_prompt_set

    with pytest.raises(MfdHubError, match="can be derived"):
        derive_prompt_set(count=10**6)


@pytest.mark.slow
def test_demo_runs_offline_and_every_method_matches_plain_decoding(tmp_path):
    result = run_cli(["demo", "--max-new-tokens", "40", "--budget", "16", "--dtype", "float32", "--repeats", "1",
                      "--json"], tmp_path, extra_env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)
    assert out["drafter"] == "MFD-SmolLM2-135M" and out["dtype"] == "float32"
    # --linears auto: fp32 rows times fp16 weights where bf16 is emulated, plain float32 on the same target;
    # elsewhere oneDNN with packed weights, the plain bf16 target's too where the CPU computes bf16 natively
    from mfd_hub.precision import cpu_has_native_bf16

    assert out["linears"] == {"fp16": "fp16-weights",
                              "onednn": "onednn+bf16" if cpu_has_native_bf16() else "onednn"}[speculation_linears("auto")]
    methods = [r["method"] for r in out["runs"]]
    assert methods == ["plain float32", "plain bfloat16", "chain", "product", "mixture"]
    speculative = out["runs"][2:]
    assert all(r["lossless"]["identical"] for r in speculative)  # fp32: token-identical, not only explained
    assert all(r["tau"] >= 1 and r["budget"] == 16 for r in speculative)
    # the baseline is the faster plain decoding, and every speedup is against it
    plain = {r["method"]: r["tokens_per_second"] for r in out["runs"][:2]}
    assert out["baseline"]["method"] == max(plain, key=plain.get)
    for r in out["runs"]:
        assert abs(r["speedup"] - r["tokens_per_second"] / out["baseline"]["tokens_per_second"]) < 1e-9
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
        # lossless: identical in fp32; in bf16 (auto on a CPU with native bf16) only at near-ties
        assert r["unexplained"] == 0 and (r["mismatches"] == 0 or r["dtype"] != "float32"), r
        assert r["tau"] >= 1 and r["speedup"] > 0
        if r["method"] != "chain":
            assert 0 <= r["chimera_share"] <= 1
            assert r["mass_per_depth"] and all(0 <= m <= r["budget"] for m in r["mass_per_depth"].values())
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["progress.jsonl", "results.json", "results.md", "speedup_T0.png", "tau_T0.png"]
    assert (tmp_path / "out" / "results.md").read_text().count("\n") == len(rows) + 2


def test_bench_resumes_from_the_prompts_it_finished(tmp_path, monkeypatch):
    """A bench run keeps each finished prompt in OUT/progress.jsonl: resumed with more prompts, it
    runs only the new ones and reports exactly what one uninterrupted run reports (timing apart);
    a line cut by a crash is ignored; other settings are refused with one clear error; a run
    without --resume starts afresh."""
    from mfd_hub.checkpoint import save_draft
    from mfd_hub.errors import MfdHubError
    from mfd_hub.testing import save_tiny_target, tiny_drafter, tiny_target
    from mfd_hub.zoo import bench

    target = tiny_target("llama", vocab_size=16, init_std=0.2)
    save_tiny_target(tmp_path / "target", target)
    save_draft(tiny_drafter(target, num_modes=2), tmp_path / "draft")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n"
                               for i, text in enumerate(["t3 t1 t4 t1 t5", "t9 t2 t6", "t5 t3 t5 t8"])))
    calls = []
    real = bench._bench_one_prompt

    def counted(*args, **kwargs):
        calls.append(args[3])  # the prompt's index
        return real(*args, **kwargs)

    def run(out, limit, **options):
        return bench.run_bench_command(str(tmp_path / "target"), [str(tmp_path / "draft")], str(prompts), limit,
                                       ["chain", "product", "mixture"], [4, 8], [0.0, 1.0], max_new_tokens=10,
                                       out_dir=str(out), dtype="float32", resume=True, **options)

    def comparable(rows):  # everything but the clock
        drop = {"tokens_per_second", "plain_tokens_per_second", "speedup", "stage_seconds_per_round", "baseline_dtype"}
        return sorted(json.dumps({k: v for k, v in r.items() if k not in drop}, sort_keys=True) for r in rows)

    monkeypatch.setattr(bench, "_bench_one_prompt", counted)
    whole = run(tmp_path / "whole", 3)
    assert calls == [0, 1, 2] * 2
    calls.clear()
    run(tmp_path / "parts", 1)
    journal = tmp_path / "parts" / bench.PROGRESS_NAME
    with open(journal, "a") as handle:
        handle.write('{"temperature": 0.0, "prompt": "p1", "ids"')  # a line cut by a crash
    resumed = run(tmp_path / "parts", 3)
    assert calls == [0, 0, 1, 2, 1, 2]  # limit 1 (two temperatures), then only the new prompts
    assert comparable(resumed["rows"]) == comparable(whole["rows"])
    assert all(r["prompts"] == 3 for r in resumed["rows"]) and all(r["mismatches"] == 0 for r in resumed["rows"])
    calls.clear()
    again = run(tmp_path / "parts", 3)  # everything is there now, the cut line's neighbours included
    assert calls == [] and comparable(again["rows"]) == comparable(whole["rows"])
    with pytest.raises(MfdHubError, match="other settings .*max_new_tokens.*without --resume"):
        bench.run_bench_command(str(tmp_path / "target"), [str(tmp_path / "draft")], str(prompts), 3,
                                ["chain", "product", "mixture"], [4, 8], [0.0, 1.0], max_new_tokens=12,
                                out_dir=str(tmp_path / "parts"), dtype="float32", resume=True)
    assert calls == []
    bench.run_bench_command(str(tmp_path / "target"), [str(tmp_path / "draft")], str(prompts), 1,
                            ["chain", "product", "mixture"], [4, 8], [0.0, 1.0], max_new_tokens=10,
                            out_dir=str(tmp_path / "parts"), dtype="float32")  # no --resume: afresh
    assert calls == [0, 0]
    assert len(journal.read_text().splitlines()) == 1 + 2  # the header and the two new prompt runs


BAD_INPUT = [
    (["bench", "--budgets", "16,x"], "--budgets"),
    (["bench", "--methods", "tree"], "--methods"),
    (["bench", "--temperatures", "-1"], "--temperatures"),
    (["bench", "--prompts", "missing.jsonl"], "missing.jsonl"),
    (["bench", "--target", "./nowhere"], "--drafter"),
    (["demo", "--drafter", "./nowhere"], "nowhere"),
]


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory):
    """Every BAD_INPUT command run in one process (cli_batch), with the folder's state after each."""
    root = tmp_path_factory.mktemp("bad-input")
    return run_cli_many([args for args, _ in BAD_INPUT], root, watch=root)


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_error_line(bad_input_runs, case):
    result, needle = bad_input_runs[case], BAD_INPUT[case][1]
    assert one_error_line(result), result.stderr[-2000:]
    assert needle in result.stderr
    assert not any(path.startswith("bench-results") for path in result.state)
