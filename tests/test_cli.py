"""The command line: examples in every --help, one-line errors, one way to name a drafter, real
subprocesses."""

import json
import re
import warnings
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner

from conftest import run_cli, run_cli_many
from mfd_hub import save_draft
from mfd_hub.locate import resolve_drafter
from mfd_hub.cli import cli
from mfd_hub.errors import DrafterNameNote, MfdHubError
from mfd_hub.testing import greedy_decode, save_tiny_target, tiny_drafter, tiny_target
from mfd_hub.zoo.shipped import SHIPPED_DRAFTERS, shipped_drafter_dir

# every command that takes a drafter checkpoint, and how it takes it
TAKES_A_DRAFTER = {
    ("generate",): "--drafter DRAFTER", ("bench",): "--drafter DRAFTER", ("demo",): "--drafter DRAFTER",
    ("verify",): "DRAFTER", ("info",): "DRAFTER", ("card",): "--path DRAFTER", ("push",): "--path DRAFTER",
    ("convert", "zlab"): "SOURCE", ("convert", "draft-vocab"): "SOURCE", ("convert", "mfd-d"): "SOURCE",
    ("convert", "released"): "SOURCE",
}


def _all_commands(group, prefix=()):
    for name, command in sorted(group.commands.items()):
        yield prefix + (name,), command
        if isinstance(command, click.Group):
            yield from _all_commands(command, prefix + (name,))


def test_every_help_shows_examples():
    runner = CliRunner()
    top = runner.invoke(cli, ["--help"])
    assert top.exit_code == 0 and "Examples:" in top.output
    commands = list(_all_commands(cli))
    assert commands
    for path, _ in commands:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, path
        assert "Examples:" in result.output and "mfd-hub " + path[0] in result.output, path


def test_bad_input_is_one_line_and_nonzero(tmp_path):
    (tmp_path / "notadrafter").mkdir()
    (tmp_path / "notadrafter" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    cases = [
        ["info", str(tmp_path / "missing")],
        ["info", str(tmp_path / "notadrafter")],
        ["info", str(tmp_path / "broken")],
        ["info", "--no-such-option", "x"],
        ["generate", "--drafter", str(tmp_path / "missing"), "--target", "x", "hi"],
        ["generate", "--drafter", "d", "--target", "t", "--budget", "0", "hi"],
    ]
    for args, result in zip(cases, run_cli_many(cases, tmp_path)):
        assert result.returncode != 0, args
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error:")]
        # progress lines ("loading ...") may come first; the error is one line, and the last
        assert len(errors) == 1 and lines[-1] == errors[0], (args, result.stderr)
        assert all(line.startswith(("error:", "loading ")) for line in lines), (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_one_process_for_many_commands_behaves_as_the_console_script(tmp_path):
    """cli_batch, which the bad-input tests use, gives each command what its own process gives:
    the same exit code, stdout and stderr."""
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    cases = [["info", str(tmp_path / "missing")], ["info", str(tmp_path / "broken")], ["--version"],
             ["info", "--no-such-option"]]
    batch = run_cli_many(cases, tmp_path)
    for args, together in zip(cases, batch):
        alone = run_cli(args, tmp_path)
        assert (together.returncode, together.stdout, together.stderr) == (alone.returncode, alone.stdout,
                                                                          alone.stderr), args
    assert [r.returncode for r in batch] == [batch[0].returncode, batch[1].returncode, 0, 2]
    assert batch[0].returncode != 0 and batch[2].stdout.strip()


def _main(args, capsys):
    """The console script's entry point in this process -> (exit code, stdout, stderr)."""
    from mfd_hub.cli import main

    with pytest.raises(SystemExit) as done:
        main(args)
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


@pytest.mark.parametrize("args, says", [
    (["info", "MFD-SmolLM2-135m"], "did you mean MFD-SmolLM2-135M?"),
    (["verify", "nowhere"], "a shipped drafter's name (MFD-SmolLM2-135M, DPACE-SmolLM2-135M, DFlash-SmolLM2-135M)"),
    (["generate", "--target", "t", "hi"], "Missing option '--drafter'"),
    (["generate", "--drafter", "a", "--draft", "b", "--target", "t", "hi"], "give only --drafter"),
])
def test_a_bad_drafter_is_one_error_line(args, says, capsys):
    code, out, err = _main(args, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and lines[-1].startswith("error:") and says in lines[-1], err
    assert sum(line.startswith("error:") for line in lines) == 1 and "Traceback" not in err


def test_info_describes_ours_and_json(tmp_path):
    target = tiny_target("qwen3")
    save_draft(tiny_drafter(target, num_modes=3), tmp_path / "ck")
    result = run_cli(["info", str(tmp_path / "ck"), "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["num_modes"] == 3 and summary["format"] == "mfd-hub"
    assert summary["bundle_version"] is not None and summary["parameters"] > 0


@pytest.mark.parametrize("method", ["chain", "mixture"])
def test_generate_command_is_lossless(tmp_path, method):
    target = tiny_target("llama", vocab_size=16, init_std=0.2)
    save_tiny_target(tmp_path / "target", target)
    save_draft(tiny_drafter(target, num_modes=2), tmp_path / "draft")
    result = run_cli(
        ["generate", "--drafter", str(tmp_path / "draft"), "--target", str(tmp_path / "target"), "--method", method,
         "--budget", "12", "--max-new-tokens", "20", "--no-chat-template", "--json", "t3 t1 t4 t1 t5"],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    want = greedy_decode(target, torch.tensor([[3, 1, 4, 1, 5]]), 20, stop_ids=[0])
    assert payload["output_ids"] == want
    assert payload["method"] == method and payload["tau"] >= 1.0 and set(payload["stage_seconds"]) >= {"draft", "verify"}


def _flat(text):
    """Help text as one line (click wraps, and breaks names at their hyphens)."""
    return re.sub(r"-\s+", "-", " ".join(text.split()))


def test_every_command_that_takes_a_drafter_says_the_three_forms():
    runner = CliRunner()
    for path, how in TAKES_A_DRAFTER.items():
        text = _flat(runner.invoke(cli, [*path, "--help"]).output)
        assert how in text, (path, how)
        for form in ("checkpoint folder", "Hub repo id (owner/name)", "shipped drafter's name", *SHIPPED_DRAFTERS):
            assert form in text, (path, form)
    generate = _flat(runner.invoke(cli, ["generate", "--help"]).output)
    assert "--draft " not in generate  # the old spelling works, hidden


def test_one_function_names_a_drafter_three_ways(tmp_path, monkeypatch):
    """A shipped name -> its loadable folder (bundle included); a folder -> itself; a Path is
    always a folder; a bare shipped name beats a same-named folder here, with a note."""
    monkeypatch.chdir(tmp_path)
    name = "MFD-SmolLM2-135M"
    loadable = shipped_drafter_dir(name)
    assert (loadable / "modeling_mfd.py").is_file()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_drafter(name) == loadable  # no folder of that name here: no note
    save_draft(tiny_drafter(tiny_target("qwen3")), tmp_path / name)
    with pytest.warns(DrafterNameNote, match=rf"write ./{name} for it"):
        assert resolve_drafter(name) == loadable
    assert resolve_drafter(f"./{name}") == Path(f"./{name}")
    assert resolve_drafter(Path(name)) == Path(name)
    with pytest.raises(MfdHubError, match=f"did you mean {name}"):
        resolve_drafter("MFD-SmolLM2-135m")
    with pytest.raises(MfdHubError, match="not a checkpoint folder .* a Hub repo id .* a shipped drafter's name"):
        resolve_drafter(str(tmp_path / "missing"))


def test_an_ambiguous_name_is_resolved_by_the_rule_and_said_on_stderr(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "DFlash-SmolLM2-135M"
    save_draft(tiny_drafter(tiny_target("qwen3"), num_modes=3), tmp_path / name)
    runner = CliRunner()
    shipped = runner.invoke(cli, ["info", name, "--json"])
    assert shipped.exit_code == 0, shipped.output
    assert json.loads(shipped.stdout)["path"] == str(shipped_drafter_dir(name))
    assert shipped.stderr.strip() == (f"note: {name} names the shipped drafter; the folder {name} here is not used "
                                      f"(write ./{name} for it)")
    local = runner.invoke(cli, ["info", f"./{name}", "--json"])
    assert local.exit_code == 0 and json.loads(local.stdout)["num_modes"] == 3 and not local.stderr


def test_generate_reports_on_stderr_and_keeps_the_old_option(tmp_path):
    """stdout is the generated text alone; the report (method, budget, tau, tok/s, rounds) is on
    stderr; --draft still works, with a note."""
    target = tiny_target("llama", vocab_size=16, init_std=0.2)
    save_tiny_target(tmp_path / "target", target)
    save_draft(tiny_drafter(target, num_modes=2), tmp_path / "draft")
    args = ["--target", str(tmp_path / "target"), "--method", "product", "--budget", "6", "--dtype", "float32",
            "--max-new-tokens", "12", "--no-chat-template", "t3 t1 t4 t1 t5"]
    runner = CliRunner()
    new = runner.invoke(cli, ["generate", "--drafter", str(tmp_path / "draft"), *args])
    old = runner.invoke(cli, ["generate", "--draft", str(tmp_path / "draft"), *args])
    assert new.exit_code == 0 and old.exit_code == 0, new.output + old.output
    want = greedy_decode(target, torch.tensor([[3, 1, 4, 1, 5]]), 12, stop_ids=[0])
    text = " ".join(f"t{i}" for i in want if i != 0)
    assert new.stdout.strip() == old.stdout.strip() == text
    assert re.search(r"^method product, budget 6, float32, temperature 0$", new.stderr, re.MULTILINE)
    assert re.search(r"^\d+ tokens in \d+ rounds: tau \d\.\d\d, [\d.]+ tok/s$", new.stderr, re.MULTILINE)
    assert "note: --draft is deprecated, write --drafter" in old.stderr
    assert "deprecated" not in new.stderr
