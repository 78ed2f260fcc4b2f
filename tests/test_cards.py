"""The registry of the ten drafters and their generated model cards.

The paper's figures are never typed here: the registry is compared with the paper page's own text
(seed 000: Tables 1 and 2 and the "Code and models" table), and the MFD-Qwen3-8B card with the
published card (seed 002). Set MFD_HUB_SEEDS to the seeds folder when it is not the default.
"""

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerFast

from conftest import NO_MFD_HUB, run_cli, run_python
from mfd_hub import __version__, save_draft
from mfd_hub.cli import cli
from mfd_hub.errors import MfdHubError
from mfd_hub.cards.model_card import render_card
from mfd_hub.cards.registry import ENGINES, load_registry
from mfd_hub.testing import save_tiny_target, tiny_registry_drafter, tiny_target

SEEDS = Path(os.environ.get("MFD_HUB_SEEDS", Path(__file__).parent / "data" / "seeds"))
# The names the recipes use too (coordination: registry and recipes describe the same models).
TEN = ["MFD-Qwen3-4B", "MFD-Qwen3-8B", "MFD-Qwen3.5-4B", "MFD-Qwen3.6-27B", "MFD-Qwen3-4B-100K",
       "MFD-Qwen3-8B-100K", "MFD-Qwen3.5-4B-100K", "MFD-Qwen3.6-27B-100K", "MFD-D-Qwen3-4B", "MFD-D-Qwen3-8B"]
CARD_SECTIONS = ["Model", "Results (from the paper)", "Usage", "Limitations", "License and attribution", "Citation"]
MODEL_ROWS = ["Target", "Architecture", "Parameters", "Initialization", "Training data", "Training", "Objective"]


@pytest.fixture(scope="module")
def registry():
    return load_registry()


def seed(prefix):
    found = sorted(SEEDS.glob(f"{prefix}_*.txt"))
    if not found:
        pytest.skip(f"seed {prefix} not found in {SEEDS} (set MFD_HUB_SEEDS)")
    return found[0].read_text(encoding="utf-8")


# -- reading the paper page -------------------------------------------------------------------
# A speedup has one digit before the point (the page glues labels such as "EAGLE-3" to it).
PAPER_CELL = re.compile(r"(\d\.\d\d)× \((\d+\.\d\d)\)|–")
PAPER_COLUMN = re.compile(r"Qwen[\d.]+-\d+B(?: \(thinking\))?")


def paper_table(text, title):
    """A table of the paper page: (columns, [(section index, row label, {column: {t0, t1}})]).

    Row lines are the label followed by cells 'a× (b)' or '–' (two per column, T=0 then T=1); a
    line without cells starts a section; a blank line ends the table."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title + "."))
    columns = PAPER_COLUMN.findall(lines[start + 1])
    assert lines[start + 2] == "T=0T=1" * len(columns)
    rows, section = [], 0
    for line in lines[start + 3:]:
        if not line.strip():
            break
        cells = list(PAPER_CELL.finditer(line))
        if not cells:  # a section heading (the first block of Table 1 has none)
            section += 1
            continue
        assert len(cells) == 2 * len(columns), line
        values = [(float(m[1]), float(m[2])) if m[1] else None for m in cells]
        by_column = {c: {"t0": values[2 * j], "t1": values[2 * j + 1]} for j, c in enumerate(columns)
                     if values[2 * j] is not None}
        rows.append((section, line[:cells[0].start()], by_column))
    order = list(dict.fromkeys(s for s, _, _ in rows))  # sections numbered 0, 1, ... as they come
    return columns, [(order.index(s), label, cells) for s, label, cells in rows]


def paper_models(text):
    """The 'Code and models' table: one dict per drafter."""
    lines = text.splitlines()
    start = lines.index("DrafterTargetData, epochsIn the paperCheckpoint")
    pattern = re.compile(r"^(MFD-D|MFD)(Qwen[\d.]+-\d+B(?: \(thinking\))?)([\d.]+[MK]), (\d+)(.+?)(MFD-[\w.-]+)$")
    models = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        kind, target, data, epochs, in_paper, name = pattern.match(line).groups()
        models.append(dict(kind=kind, target=target, data=data, epochs=int(epochs), in_paper=in_paper, name=name))
    return models


@pytest.mark.parametrize("table_key", sorted(ENGINES.values()))
def test_registry_tables_are_the_papers(registry, table_key):
    """Every cell of Tables 1 and 2 is in the registry with the paper's value, and nothing else."""
    table = registry.tables[table_key]
    columns, rows = paper_table(seed("000"), table.title)
    assert columns == [registry.targets[c].paper_column for c in table.columns]
    to_paper = {c: registry.targets[c].paper_column for c in table.columns}
    sections = list(table.sections)  # the registry lists a table's sections in the paper's order
    paper = {(sections[s], label): cells for s, label, cells in rows}
    assert len(paper) == len(rows), "two paper rows share a label within a section"
    mine = {}
    for row in table.rows.values():
        label = row.method + (row.training if table_key == "table1" else "")
        mine[(row.section, label)] = {
            to_paper[c]: {t: (cell.speedup, cell.tau) for t, cell in temps.items()} for c, temps in row.cells.items()
        }
    assert mine == paper


def test_registry_drafters_are_the_papers(registry):
    models = paper_models(seed("000"))
    assert [m["name"] for m in models] == TEN == list(registry.drafters)
    for model in models:
        d = registry.get(model["name"])
        assert (d.kind, d.target.paper_column, d.data.key, d.epochs, d.in_paper) == (
            model["kind"], model["target"], model["data"], model["epochs"], model["in_paper"])
        # The tables the paper names are the ones the figures come from, in the right block.
        assert ("hf" in d.results) == ("Table 1" in model["in_paper"])
        assert ("sglang" in d.results) == ("Table 2" in model["in_paper"])
        if "hf" in d.results:
            row = d.results["hf"]
            assert (row.section == "full") == ("(full data)" in model["in_paper"]) == (d.data.key == "1.42M")
            assert row.training == f"FT {d.epochs} ep"
            assert row.method == f"{d.kind} (K={d.num_modes})"
        if "sglang" in d.results:
            assert d.results["sglang"].method == f"{d.kind} (ours)"
        assert d.default_path == (d.kind == "MFD-D")
        assert d.repo_id.endswith("/" + d.name)
        # Every comparison row is a different method on the same target.
        for engine, rows in d.compare.items():
            assert d.results[engine] not in rows and all(d.target.key in r.cells for r in rows)


def test_registry_parameter_count_matches_the_published_card(registry):
    """The 8B drafter's shape in the registry gives the parameter count seed 002 states."""
    stated = re.search(r"^Parameters (\d+)M", seed("002"), re.MULTILINE)[1]
    arch = render_card(registry.get("MFD-Qwen3-8B"), registry=registry)
    assert f"| Parameters | {stated}M, bf16;" in arch


@pytest.mark.parametrize("name", TEN)
def test_card_renders_parses_and_carries_the_registry(registry, name):
    d = registry.get(name)
    text = render_card(d, registry=registry)
    card = ModelCard(text)  # raises on invalid metadata or model-index
    data = card.data
    assert data.base_model == d.base.repo and data.base_model_relation == "finetune"
    assert data.license == d.license and data.library_name == "transformers" and data.pipeline_tag
    assert (data.datasets or []) == d.data.datasets
    assert {"mfd", "speculative-decoding"} <= set(data.tags)
    # model-index: exactly this drafter's figures, per engine and temperature
    got = {(r.dataset_config, r.metric_config, r.metric_type): r.metric_value for r in data.eval_results}
    want = {}
    for engine in d.results:
        for t, cell in d.figures(engine).items():
            config = registry.tables[ENGINES[engine]].engine
            label = {"t0": "T=0", "t1": "T=1"}[t]
            want[(config, label, "speedup")] = cell.speedup
            want[(config, label, "acceptance_length")] = cell.tau
    assert got == want
    # markdown: every section, the figures as the tables show them, the usage
    headings = re.findall(r"^## (.+)$", card.text, re.MULTILINE)
    assert headings == CARD_SECTIONS
    for engine in d.results:
        cells = d.figures(engine)
        assert f"| **This drafter** | {fmt(cells['t0'])} | {fmt(cells['t1'])} |" in card.text
        for row in d.compare[engine]:
            c = row.cells[d.target.key]
            assert f"| {row.label} | {fmt(c['t0'])} | {fmt(c['t1'])} |" in card.text
    assert f'AutoModel.from_pretrained("{d.repo_id}", trust_remote_code=True' in card.text
    assert "draft.spec_generate(target, ids" in card.text and f"mfd-hub generate --drafter {d.repo_id}" in card.text
    assert f"[{d.base.repo}](https://huggingface.co/{d.base.repo}) ({d.base.license.upper()})" in card.text
    assert d.target.repo in card.text and "@article{huang2026mfd" in card.text
    # deterministic (a re-push of an unchanged folder must not see a changed README)
    assert render_card(d, registry=registry) == text


def fmt(cell):
    return f"{cell.speedup:.2f}x ({cell.tau:.2f})"


def _section(text, heading, card=True):
    """The lines of a section: after '## heading' in a card, after the bare heading line in seed 002."""
    lines = text.splitlines()
    mark = f"## {heading}" if card else heading
    start = lines.index(mark) + 1
    ends = [i for i in range(start, len(lines)) if (lines[i].startswith("## ") if card else lines[i] in CARD_SECTIONS)]
    return "\n".join(lines[start:ends[0] if ends else len(lines)])


NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?%?M?(?![\w])")


def test_qwen3_8b_card_covers_the_published_card(registry):
    """Every section, model fact, figure, license and citation field of seed 002 is in our card."""
    published = seed("002")
    ours = render_card(registry.get("MFD-Qwen3-8B"), registry=registry)
    assert f"# {published.splitlines()[0]}" in ours.splitlines()  # the title
    for heading in CARD_SECTIONS:
        assert heading in published.splitlines(), heading  # the list above is seed 002's
    def row_key(line):  # the longest key a line starts with ("Training data" before "Training")
        return max((k for k in MODEL_ROWS if line.startswith(k + " ")), key=len, default=None)

    model = {row_key(line): line for line in _section(published, "Model", card=False).splitlines() if row_key(line)}
    assert sorted(model) == sorted(MODEL_ROWS)
    our_model = _section(ours, "Model")
    for key, line in model.items():
        row = next(r for r in our_model.splitlines() if r.startswith(f"| {key} |"))
        for number in NUMBER.findall(line[len(key):]):
            assert re.search(rf"(?<![\w.]){re.escape(number)}(?![\w])", row), (key, number, row)
        for repo in re.findall(r"[\w.-]+/[\w.-]+", line[len(key):]):
            assert repo in row, (key, repo)
    # figures and budgets
    results = _section(published, "Results (from the paper)", card=False)
    cells = re.findall(r"(\d+\.\d+)x \((\d+\.\d+)\)", results)
    assert len(cells) == 16
    for speedup, tau in cells:
        assert f"{speedup}x ({tau})" in ours
    for budget in re.findall(r"B = (\d+)", results):
        assert f"B = {budget}" in ours
    # usage: the bundled code path, and the SGLang launch facts
    usage = _section(ours, "Usage")
    assert "trust_remote_code=True" in usage and "spec_generate(" in usage and "mfd-hub generate" in usage
    for flag in ("--model", "--draft", "--draft-vocab", "--engine-config"):
        value = re.search(rf"{flag} (\S+)", published)[1]
        assert f"{flag} {value}" in usage, flag
    # limitations: batch sizes and the tie to the target
    limits = _section(ours, "Limitations")
    for phrase in ("batch sizes 1-2", "batch 8", "tied to its target"):
        assert phrase in _section(published, "Limitations", card=False) and phrase in limits
    # licenses: every "name (License)" of the published card
    ours_license = _section(ours, "License and attribution")
    published_license = _section(published, "License and attribution", card=False)
    assert re.search(r"License: (\S+)\.", published_license)[1] in ours_license
    for repo, lic in re.findall(r"([\w.-]+/[\w.-]+) \(([\w.-]+)\)", published_license):
        assert re.search(rf"{re.escape(repo)}\]\([^)]*\) \({re.escape(lic)}\)", ours_license), (repo, lic)
    # citation: the same BibTeX fields
    def fields(text):
        return {k: " ".join(v.split()) for k, v in re.findall(r"(\w+)\s*=\s*\{(.+?)\},?\s*$", text, re.MULTILINE)}

    assert fields(_section(published, "Citation", card=False)) == fields(_section(ours, "Citation"))
    assert len(fields(_section(ours, "Citation"))) == 4


def registry_checkpoint(folder, drafter, max_shard_size="5GB", seed=1, overwrite=False, **overrides):
    """A tiny real checkpoint folder with the identity the registry gives ``drafter``."""
    model = tiny_registry_drafter(drafter, seed=seed, **overrides)
    return save_draft(model, folder, max_shard_size=max_shard_size, overwrite=overwrite)


def test_card_from_checkpoint_states_its_shape(registry, tmp_path):
    d = registry.get("MFD-D-Qwen3-8B")
    folder = registry_checkpoint(tmp_path / "ck", d)
    text = render_card(d, path=folder, repo_id="me/MFD-D-Qwen3-8B", registry=registry)
    ModelCard(text)
    config = json.loads((folder / "config.json").read_text())
    params = sum(t.numel() for f in folder.glob("*.safetensors") for t in load_file(f).values())
    assert f"of width {config['hidden_size']} (MLP {config['intermediate_size']}" in text
    assert f"| Parameters | {params:,}, fp32;" in text
    assert "`default_embed`" in text and f"(mfd-hub {__version__})" in text
    assert 'AutoModel.from_pretrained("me/MFD-D-Qwen3-8B"' in text


def test_card_usage_code_runs_as_written(registry, tmp_path):
    """The card's Python example, pointed at a tiny local target and checkpoint (CPU, fp32, a few
    tokens), runs in a process that cannot import mfd_hub: the bundled remote code is enough."""
    d = registry.get("MFD-Qwen3-8B")
    folder = registry_checkpoint(tmp_path / "draft", d)
    target = tiny_target("qwen3", vocab_size=d.target.vocab_size, num_layers=d.target.num_hidden_layers)
    save_tiny_target(tmp_path / "target", target)
    tok = PreTrainedTokenizerFast.from_pretrained(tmp_path / "target")
    tok.chat_template = "{% for m in messages %}t5 t7 {% endfor %}{% if add_generation_prompt %}t9{% endif %}"
    tok.save_pretrained(tmp_path / "target")
    card = render_card(d, path=folder, registry=registry)
    code = re.search(r"```python\n(.+?)```", card, re.DOTALL)[1]
    for old, new in ((d.repo_id, str(folder)), (d.target.repo, str(tmp_path / "target")), (".cuda()", ""),
                     ("torch.bfloat16", "torch.float32"), ("max_new_tokens=512", "max_new_tokens=6")):
        assert old in code
        code = code.replace(old, new)
    result = run_python(NO_MFD_HUB + code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'tau'" in result.stdout


def test_card_command_writes_and_refuses(registry, tmp_path):
    d = registry.get("MFD-Qwen3-8B")
    good = registry_checkpoint(tmp_path / "good", d)
    wrong = registry_checkpoint(tmp_path / "wrong", d, num_modes=4)
    out = tmp_path / "README.md"
    result = run_cli(["card", "MFD-Qwen3-8B", "--path", str(good), "--out", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == render_card(d, path=good, registry=registry)
    printed = CliRunner().invoke(cli, ["card", "MFD-Qwen3-8B", "--repo-id", "me/x"])
    assert printed.exit_code == 0 and printed.output == render_card(d, repo_id="me/x", registry=registry)
    for args, says in ((["card", "MFD-Qwen3-8b"], "did you mean MFD-Qwen3-8B"),
                       (["card", "MFD-Qwen3-8B", "--path", str(wrong), "--out", str(tmp_path / "x.md")],
                        "num_modes is 4, the registry says 8")):
        bad = run_cli(args, tmp_path)
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode != 0 and len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], bad.stderr
    assert not (tmp_path / "x.md").exists()


def test_list_command(registry, tmp_path):
    result = run_cli(["list", "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)["drafters"]
    assert [e["name"] for e in listed] == TEN
    for entry in listed:
        d = registry.get(entry["name"])
        assert entry["base"] == d.base.repo and entry["target_layer_ids"] == d.base.target_layer_ids
        for engine, figures in entry["results"].items():
            assert figures["t0"]["speedup"] == d.figures(engine)["t0"].speedup
            assert figures["source"] == d.results[engine].source(d.target.paper_column)
    text = CliRunner().invoke(cli, ["list"])
    assert text.exit_code == 0
    for d in registry.drafters.values():
        line = next(line for line in text.output.splitlines() if line.startswith(d.name + " "))
        assert d.repo_id in line and all(fmt(d.figures(e)["t0"]) in line for e in d.results)


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["drafters"][1].update(base="z-lab/nope"), "drafters[1] (MFD-Qwen3-8B): base 'z-lab/nope' is not one of"),
    (lambda r: r["drafters"].append(dict(r["drafters"][0])), "list 'MFD-Qwen3-4B' twice"),
    (lambda r: r["drafters"][0].update(repo_id="me/other"), "repo_id 'me/other' must be owner/MFD-Qwen3-4B"),
    (lambda r: r["drafters"][0].pop("epochs"), "drafters[0] (MFD-Qwen3-4B): epochs is missing"),
    (lambda r: r["drafters"][2].update(results={"sglang": "mfd"}), "which has no Qwen3.5-4B figures in Table 2"),
    (lambda r: r["tables"]["table1"]["rows"][0]["cells"]["Qwen3-4B"].update(t0=[42.1, 6.46]), "is not a plausible"),
    (lambda r: r["bases"]["z-lab/Qwen3-8B-DFlash-b16"].update(target_layer_ids=[1, 40]), "must be layers of Qwen/Qwen3-8B"),
])
def test_registry_refuses_bad_entries(tmp_path, edit, message):
    raw = yaml.safe_load(Path(load_registry().path).read_text())
    edit(raw)
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(MfdHubError, match=re.escape(message)):
        load_registry(path)
