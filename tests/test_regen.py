"""mfd-hub regen: the local engine, an OpenAI-compatible server on loopback, prompt sources."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from conftest import run_cli
from mfd_hub.recipes.regen import read_prompts, regenerate
from mfd_hub.testing import greedy_decode, save_tiny_target, tiny_target, tiny_tokenizer

PROMPTS = ["t3 t1 t4 t1 t5", "t9 t2 t6", "t5 t3 t5 t8 t9 t7", "t9 t3 t2", "t3 t8 t4 t6 t2 t6 t4"]


class _CompletionsServer(ThreadingHTTPServer):
    """A minimal OpenAI-compatible /v1/completions server over a real transformers model:
    greedy at temperature 0, token-id prompts, stops at EOS (id 0) without returning it, as
    serving engines do. ``with_ids``: answer ``token_ids`` (vLLM's return_token_ids) or text only."""

    def __init__(self, target, tokenizer, with_ids):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.target, self.tokenizer, self.with_ids, self.requests = target, tokenizer, with_ids, []


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.requests.append(body)
        if self.path != "/v1/completions" or body.get("temperature") != 0:
            self.send_error(400, "this test server only does greedy /v1/completions")
            return
        ids = torch.tensor([body["prompt"]])
        new = greedy_decode(server.target, ids, body["max_tokens"], stop_ids=[0])
        reason = "stop" if new and new[-1] == 0 else "length"
        new = new[:-1] if reason == "stop" else new
        choice = {"index": 0, "text": server.tokenizer.decode(new), "finish_reason": reason, "stop_reason": None}
        if server.with_ids and body.get("return_token_ids"):
            choice["token_ids"] = new
        payload = json.dumps({"object": "text_completion", "model": body["model"], "choices": [choice]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("regen")
    target = tiny_target("llama", vocab_size=16, init_std=0.2)
    save_tiny_target(root / "target", target)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "prompt": p}) + "\n"
                                                for i, p in enumerate(PROMPTS)))
    tokenizer = tiny_tokenizer(16)
    local = root / "local.jsonl"
    regenerate(target, tokenizer, read_prompts(root / "prompts.jsonl"), local, temperature=0.0, max_new_tokens=12,
               batch_size=2, chat=False)
    return root, target, tokenizer, [json.loads(line) for line in local.read_text().splitlines()]


@pytest.fixture
def serve(setup):
    servers = []

    def start(with_ids):
        server = _CompletionsServer(setup[1], setup[2], with_ids)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server, f"http://127.0.0.1:{server.server_address[1]}/v1"

    yield start
    for server in servers:
        server.shutdown()


def test_openai_engine_command_equals_the_local_engine_and_resumes(setup, serve):
    root, _, _, local = setup
    assert any(r["finish_reason"] == "stop" for r in local) and any(r["finish_reason"] == "length" for r in local)
    server, endpoint = serve(with_ids=True)
    out = root / "served.jsonl"
    args = ["regen", "--target", str(root / "target"), "--prompts", str(root / "prompts.jsonl"), "--out", str(out),
            "--engine", "openai", "--endpoint", endpoint, "--served-model", "tiny", "--temperature", "0",
            "--max-new-tokens", "12", "--no-chat-template", "--json"]
    first = run_cli(args + ["--limit", "2"], root)
    assert first.returncode == 0, first.stderr
    second = run_cli(args, root)
    assert second.returncode == 0, second.stderr
    assert json.loads(first.stdout)["written"] == 2
    assert json.loads(second.stdout)["written"] == 3 and json.loads(second.stdout)["already_done"] == 2
    assert len(server.requests) == 5  # finished prompts were not asked again
    assert all(r["model"] == "tiny" and r["return_token_ids"] for r in server.requests)
    # the same records as transformers on this machine, EOS included in the response ids
    assert [json.loads(line) for line in out.read_text().splitlines()] == local


def test_openai_engine_retokenizes_a_text_only_answer(setup, serve):
    from mfd_hub.recipes.regen import OpenAIEngine

    root, _, tokenizer, local = setup
    _, endpoint = serve(with_ids=False)
    out = root / "text-only.jsonl"
    engine = OpenAIEngine(endpoint, "tiny", tokenizer, stops=[0], concurrency=3)
    regenerate(engine, tokenizer, read_prompts(root / "prompts.jsonl"), out, temperature=0.0, max_new_tokens=12,
               batch_size=4, chat=False)
    assert [json.loads(line) for line in out.read_text().splitlines()] == local


def test_openai_engine_errors_are_one_line(setup):
    from click.testing import CliRunner

    from mfd_hub.cli import cli

    root = setup[0]
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = ["regen", "--target", str(root / "target"), "--out", str(root / "never.jsonl"), "--no-chat-template"]
    for args, message in (
        (["--prompts", str(root / "prompts.jsonl"), "--engine", "openai", "--endpoint", f"http://127.0.0.1:{port}/v1"],
         "cannot reach"),
        (["--prompts", "hf:no-such-owner/no-such-dataset"], "dataset"),  # offline, or no datasets package
    ):
        result = run_cli(base + args, root)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode != 0 and lines[-1].startswith("error:") and message in lines[-1], result.stderr
        assert "Traceback" not in result.stderr
    usage = CliRunner().invoke(cli, base + ["--prompts", str(root / "prompts.jsonl"), "--engine", "openai"])
    assert usage.exit_code != 0 and "--endpoint" in str(usage.exception or usage.output)
    assert not (root / "never.jsonl").exists() or not (root / "never.jsonl").read_text()


def test_prompt_records_of_every_supported_shape(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = ["just text", {"id": 7, "instruction": "do it"},
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]},
            {"conversations": [{"from": "human", "value": "sharegpt"}, {"from": "gpt", "value": "a"}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_prompts(path) == [("1", "just text"), ("7", "do it"), ("3", "hi"), ("4", "sharegpt")]
