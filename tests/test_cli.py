"""The command line: examples in every --help, one-line errors, real subprocesses."""

import json

import click
import pytest
import torch
from click.testing import CliRunner

from conftest import run_cli
from mfd_hub import save_draft
from mfd_hub.cli import cli
from mfd_hub.testing import greedy_decode, save_tiny_target, tiny_drafter, tiny_target


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
    for args in (
        ["info", str(tmp_path / "missing")],
        ["info", str(tmp_path / "notadrafter")],
        ["info", str(tmp_path / "broken")],
        ["info", "--no-such-option", "x"],
        ["generate", "--draft", str(tmp_path / "missing"), "--target", "x", "hi"],
        ["generate", "--draft", "d", "--target", "t", "--budget", "0", "hi"],
    ):
        result = run_cli(args, tmp_path)
        assert result.returncode != 0, args
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error:")]
        # progress lines ("loading ...") may come first; the error is one line, and the last
        assert len(errors) == 1 and lines[-1] == errors[0], (args, result.stderr)
        assert all(line.startswith(("error:", "loading ")) for line in lines), (args, result.stderr)
        assert "Traceback" not in result.stderr


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
        ["generate", "--draft", str(tmp_path / "draft"), "--target", str(tmp_path / "target"), "--method", method,
         "--budget", "12", "--max-new-tokens", "20", "--no-chat-template", "--json", "t3 t1 t4 t1 t5"],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    want = greedy_decode(target, torch.tensor([[3, 1, 4, 1, 5]]), 20, stop_ids=[0])
    assert payload["output_ids"] == want
    assert payload["method"] == method and payload["tau"] >= 1.0 and set(payload["stage_seconds"]) >= {"draft", "verify"}
