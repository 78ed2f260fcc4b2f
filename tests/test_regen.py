"""mfd-hub regen: the local engine, an OpenAI-compatible server on loopback, prompt sources."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from conftest import run_cli, run_cli_many
from mfd_hub.packed_linear import packed_linears, packed_linears_available
from mfd_hub.recipes.regen import ContinuousEngine, read_prompts, regenerate
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
    cases = [
        (["--prompts", str(root / "prompts.jsonl"), "--engine", "openai", "--endpoint", f"http://127.0.0.1:{port}/v1"],
         "cannot reach"),
        (["--prompts", "hf:no-such-owner/no-such-dataset"], "dataset"),  # offline, or no datasets package
    ]
    for (_, message), result in zip(cases, run_cli_many([base + args for args, _ in cases], root)):
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


# -- the continuous engine, shards, readers ----------------------------------------------------
def _engine_prompts(count, seed, vocab):
    import random

    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randrange(1, 10))] for _ in range(count)]


class CountingShifts(ContinuousEngine):
    """The real continuous engine, also counting its cache shifts (so a test knows it reached them)."""

    shifts = 0

    def _shift(self, longest):
        self.shifts += 1
        return super()._shift(longest)


@pytest.mark.parametrize("stops", [[0], [0, 5]])
def test_continuous_engine_is_greedy_decoding_of_each_prompt_alone(stops):
    """T = 0, fp32: every answer equals transformers' greedy decoding of its prompt alone, token
    for token, ending exactly at the first stop id (kept) or at max_new_tokens; rows are refilled
    (more prompts than rows) and the cache shifts (small slack)."""
    target = tiny_target("llama", vocab_size=16, init_std=0.2)
    prompts = _engine_prompts(17, 1, 16)
    engine = CountingShifts(target, stops, pad_id=0, batch_size=4)
    engine.slack = 2
    answers = dict(engine.stream(prompts, 0.0, 0.8, 20, 12, seed=0))
    assert sorted(answers) == list(range(len(prompts))) and engine.shifts > 0
    for index, prompt in enumerate(prompts):
        response, reason = answers[index]
        assert response == greedy_decode(target, torch.tensor([prompt]), 12, stop_ids=stops), index
        ended = [i for i, token in enumerate(response) if token in stops]
        assert ended == ([len(response) - 1] if reason == "stop" else [])
        assert reason == "stop" or len(response) == 12
    assert {reason for _, reason in answers.values()} == {"stop", "length"}


def test_packed_linears_give_the_products_of_the_same_weights_and_leave_the_model_as_it_was():
    """Inside ``packed_linears`` every nn.Linear multiplies through oneDNN: the logits equal
    torch's to fp32 rounding (not bit for bit: another summation order), gradients still flow
    through torch's own product; outside it the model is exactly as before. The engine records
    which products it used, and ``linears="torch"`` keeps torch's."""
    target = tiny_target("qwen3", vocab_size=64, init_std=0.1)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        expected = target(ids).logits
    before = {name: tensor.clone() for name, tensor in target.state_dict().items()}
    linears = sum(type(module) is torch.nn.Linear for module in target.modules())
    assert packed_linears_available(target)
    with packed_linears(target, rows=4) as packed:
        assert packed == linears > 0
        assert all(type(module) is not torch.nn.Linear for module in target.modules())
        with torch.no_grad():
            got = target(ids).logits
        loss = target(ids).logits.sum()  # gradients on: torch's product, which autograd knows
        loss.backward()
        assert target.lm_head.weight.grad is not None
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5) and (got.argmax(-1) == expected.argmax(-1)).all()
    assert sum(type(module) is torch.nn.Linear for module in target.modules()) == linears
    assert not any(hasattr(module, "packed_weight") for module in target.modules())
    assert all(torch.equal(before[name], tensor) for name, tensor in target.state_dict().items())
    assert ContinuousEngine(target, [0], 0).describe()["linears"] == "onednn"
    assert ContinuousEngine(target, [0], 0, linears="torch").describe()["linears"] == "torch"


def test_bf16_linears_are_packed_only_where_the_cpu_computes_bf16(monkeypatch):
    """bf16 weights go through oneDNN packed only on a CPU with native bf16 (elsewhere oneDNN would
    emulate it); there the products are torch's own bf16 products (oneDNN's, without the reorder at
    every call), so the logits match torch's layers to bf16 rounding and the next tokens agree."""
    from mfd_hub import precision

    bf16 = tiny_target("qwen3", vocab_size=64, init_std=0.1).to(torch.bfloat16)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        expected = bf16(ids).logits.float()
    native = precision.cpu_has_native_bf16()
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert not packed_linears_available(bf16)
    with packed_linears(bf16, rows=4) as packed:
        assert packed == 0
    assert ContinuousEngine(bf16, [0], 0).describe()["linears"] == "torch"
    if not native:  # oneDNN refuses bf16 products on such a CPU: nothing more to run here
        pytest.skip("this CPU has no native bf16: the packed bf16 products cannot run")
    monkeypatch.undo()
    assert packed_linears_available(bf16)
    linears = sum(type(module) is torch.nn.Linear for module in bf16.modules())
    with packed_linears(bf16, rows=4) as packed:
        assert packed == linears > 0
        with torch.no_grad():
            got = bf16(ids).logits.float()
    assert torch.allclose(got, expected, atol=0.05) and (got.argmax(-1) == expected.argmax(-1)).all()
    assert ContinuousEngine(bf16, [0], 0).describe()["linears"] == "onednn+bf16"


def test_continuous_engine_samples_only_tokens_the_target_can_emit():
    """T > 0: each token is among the top-k of the target's own logits at its position (teacher
    forcing the prompt and the answer so far, one sequence alone) and inside the top-p nucleus."""
    target = tiny_target("qwen3", vocab_size=64, init_std=0.1)
    prompts = _engine_prompts(12, 2, 64)
    engine = CountingShifts(target, [0], pad_id=0, batch_size=5)
    top_k, top_p, temperature = 6, 0.7, 0.9
    answers = dict(engine.stream(prompts, temperature, top_p, top_k, 10, seed=3))
    not_argmax = 0
    for index, prompt in enumerate(prompts):
        response, _ = answers[index]
        with torch.no_grad():
            logits = target(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
        for step, token in enumerate(response):
            values, candidates = (logits[step] / temperature).topk(top_k)
            probs = values.softmax(-1)
            before = probs.cumsum(-1) - probs
            nucleus = candidates[before < top_p + 1e-5].tolist()
            assert token in nucleus, (index, step, token, nucleus)
            not_argmax += token != int(candidates[0])
    assert not_argmax > 0  # it samples, it is not greedy
    # the same seed draws the same answers
    assert dict(engine.stream(prompts, temperature, top_p, top_k, 10, seed=3)) == answers


def test_next_tokens_draws_from_the_distribution_of_transformers_warpers():
    """The one sampler (``next_tokens``) as regen calls it: many rows at once, top-k on."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from mfd_hub.remote.sampling_mfd import next_tokens

    torch.manual_seed(4)
    logits = torch.randn(1, 40) * 2
    scores = logits.clone()
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(8), TopPLogitsWarper(0.8)):
        scores = warper(None, scores)
    expected = scores.softmax(-1)[0]
    draws = next_tokens(logits.expand(20000, -1), temperature=0.7, top_k=8, top_p=0.8,
                        generator=torch.Generator().manual_seed(0))
    observed = torch.bincount(draws, minlength=40).float() / draws.numel()
    assert set(draws.unique().tolist()) <= set(torch.nonzero(expected).flatten().tolist())
    assert float((observed - expected).abs().sum()) < 0.03  # total variation, 20,000 draws
    assert next_tokens(logits, temperature=0.0, top_k=8, top_p=0.8).tolist() == [int(logits.argmax())]


def test_next_tokens_keeps_every_token_tied_at_the_kth_value():
    """Plain decoding's top-k keeps ties at the k-th value (transformers' TopKLogitsWarper), so a
    sampler that keeps only k candidates would never draw the tied ones beyond them."""
    from mfd_hub.remote.sampling_mfd import next_tokens

    logits = torch.full((4000, 10), -5.0)
    logits[:, 0] = 3.0
    logits[:, [2, 5, 7]] = 1.0  # top-2: token 0, then three tokens tied for second place
    draws = next_tokens(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(1))
    assert set(draws.tolist()) == {0, 2, 5, 7}
    untied = logits[:1].clone()
    untied[0, 5] = 1.5  # no tie: the two best only
    draws = next_tokens(untied.expand(2000, -1), temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(1))
    assert set(draws.tolist()) == {0, 5}


def _records(path):
    from mfd_hub.recipes.regen import json_lines

    return [record for _, _, record in json_lines(path)]


@pytest.fixture(scope="module")
def regen_workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    target = tiny_target("llama", vocab_size=16, init_std=0.2)
    tokenizer = tiny_tokenizer(16)
    prompts = [(f"p{i}", " ".join(f"t{t}" for t in ids)) for i, ids in enumerate(_engine_prompts(11, 5, 16))]
    reference = root / "reference.jsonl"
    regenerate(target, tokenizer, prompts, reference, temperature=0.0, max_new_tokens=10, batch_size=3, chat=False)
    return root, target, tokenizer, prompts, _records(reference)


def test_folder_output_resumes_after_interruptions_without_duplicates_or_losses(regen_workspace):
    import gzip
    import hashlib

    root, target, tokenizer, prompts, reference = regen_workspace
    out = root / "data"
    seen = []

    def crash_after(n):
        def progress(added):
            seen.append(added)
            if sum(seen) >= n:
                raise KeyboardInterrupt  # what an interrupted run (Ctrl-C) does
        return progress

    kwargs = dict(temperature=0.0, max_new_tokens=10, batch_size=3, chat=False, shard_size=3)
    with pytest.raises(KeyboardInterrupt):
        regenerate(target, tokenizer, prompts, out, progress=crash_after(4), **kwargs)
    first = len(_records(out))
    assert 4 <= first < 6
    assert sorted(p.name for p in out.iterdir()) == [".part-00001.jsonl", "part-00000.jsonl.gz", "regen.json"]
    shard = out / "part-00000.jsonl.gz"
    shard_bytes = shard.read_bytes()
    assert [json.loads(line) for line in gzip.decompress(shard_bytes).splitlines()] == reference[:3]
    # a write cut short, and a shard whose compression a crash interrupted
    with (out / ".part-00001.jsonl").open("a") as handle:
        handle.write('{"id": "p9", "prompt": "t1 t2", "respon')
    (out / ".part-00001.jsonl.gz.tmp").write_bytes(b"\x1f\x8b half a shard")
    assert _records(out) == reference[:first]  # readers skip both
    seen.clear()
    with pytest.raises(KeyboardInterrupt):
        regenerate(target, tokenizer, prompts, out, progress=crash_after(3), **kwargs)
    second = len(_records(out))
    assert second >= first + 3
    written = regenerate(target, tokenizer, prompts, out, **kwargs)
    assert written == len(prompts) - second
    assert shard.read_bytes() == shard_bytes  # complete shards are never rewritten
    # every prompt answered: the remainder is sealed as a short complete shard, nothing is hidden
    names = sorted(p.name for p in out.iterdir())
    assert names == ["part-00000.jsonl.gz", "part-00001.jsonl.gz", "part-00002.jsonl.gz", "part-00003.jsonl.gz",
                     "regen.json"]
    sizes = [len(gzip.decompress((out / f"part-{number:05d}.jsonl.gz").read_bytes()).splitlines()) for number in range(4)]
    assert sizes == [3, 3, 3, len(prompts) - 9]
    assert _records(out) == reference  # every prompt once, in prompt order, the same answers
    assert regenerate(target, tokenizer, prompts, out, **kwargs) == 0
    # gzip shards are byte-for-byte reproducible (no time stamp, no file name inside)
    again = root / "again"
    regenerate(target, tokenizer, prompts, again, **kwargs)
    for number in range(3):
        name = f"part-{number:05d}.jsonl.gz"
        assert hashlib.sha256((again / name).read_bytes()).digest() == hashlib.sha256((out / name).read_bytes()).digest()
    runs = json.loads((out / "regen.json").read_text())["runs"]
    assert [run["first_record"] for run in runs] == [0, first, second]
    assert all(run["engine"] == "continuous" and run["dtype"] == "float32" and run["top_k"] == 20 for run in runs)


def test_a_shard_left_beside_its_copy_in_progress_is_not_counted_twice(regen_workspace):
    import gzip

    root, target, tokenizer, prompts, reference = regen_workspace
    out = root / "leftover"
    kwargs = dict(temperature=0.0, max_new_tokens=10, batch_size=3, chat=False, shard_size=4)
    regenerate(target, tokenizer, prompts[:5], out, **kwargs)
    # a crash after the shard was renamed into place, before its copy in progress was removed
    (out / ".part-00000.jsonl").write_bytes(gzip.decompress((out / "part-00000.jsonl.gz").read_bytes()))
    assert _records(out) == reference[:5]
    regenerate(target, tokenizer, prompts, out, **kwargs)
    assert _records(out) == reference
    assert not (out / ".part-00000.jsonl").exists()


def test_every_reader_accepts_a_folder_a_gzip_file_and_a_plain_file(regen_workspace):
    import gzip

    from mfd_hub.converters import count_token_frequencies
    from mfd_hub.recipes.data import load_sequences

    root, target, tokenizer, prompts, reference = regen_workspace
    folder = root / "readers"
    regenerate(target, tokenizer, prompts, folder, temperature=0.0, max_new_tokens=10, chat=False, shard_size=5)
    plain = root / "reference.jsonl"
    packed = root / "reference.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    forms = [plain, packed, folder]
    sequences = [load_sequences(form, 64) for form in forms]
    assert all([(s.id, s.ids, s.prompt_len) for s in got[0]] == [(s.id, s.ids, s.prompt_len) for s in sequences[0][0]]
               for got in sequences)
    assert all(read_prompts(form) == [(r["id"], r["prompt"]) for r in reference] for form in forms)
    counts = [count_token_frequencies(form, 16) for form in forms]
    assert all(torch.equal(c, counts[0][0]) and n == len(reference) for c, n in counts)


def test_regen_command_writes_shards_and_refuses_bad_outputs(setup, tmp_path, capsys):
    """In process (mfd_hub.cli.main, the console script's entry point): a folder output with
    --shard-size, the old engine to a file, and bad outputs as one error line."""
    import subprocess

    from mfd_hub.cli import main

    def run(args):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        captured = capsys.readouterr()
        return exit_info.value.code, captured.out, captured.err

    root, _, _, local = setup
    base = ["regen", "--target", str(root / "target"), "--prompts", str(root / "prompts.jsonl"), "--temperature", "0",
            "--max-new-tokens", "12", "--no-chat-template"]
    main(base + ["--out", str(tmp_path / "data"), "--shard-size", "2", "--dtype", "float32", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["layout"] == "folder" and summary["engine"] == "continuous" and summary["dtype"] == "float32"
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [
        "part-00000.jsonl.gz", "part-00001.jsonl.gz", "part-00002.jsonl.gz", "regen.json"]
    assert _records(tmp_path / "data") == local
    main(base + ["--out", str(tmp_path / "old.jsonl"), "--engine", "generate", "--batch-size", "2", "--dtype", "float32"])
    assert [json.loads(line) for line in (tmp_path / "old.jsonl").read_text().splitlines()] == local
    assert json.loads((tmp_path / "old.jsonl.regen.json").read_text())["runs"][0]["engine"] == "generate"
    for args, message in ((["--out", str(tmp_path / "x.jsonl.gz")], "gzip"),
                          (["--out", str(tmp_path / "y.jsonl"), "--shard-size", "3"], "--shard-size"),
                          (["--out", str(tmp_path / "z"), "--prompts", str(tmp_path / "none.jsonl")], "not found")):
        code, _, err = run(base + args)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code != 0 and lines[-1].startswith("error:") and message in lines[-1], err
        assert "Traceback" not in err
    # git keeps complete shards and the sidecar, ignores the shard in progress
    repo = Path(__file__).resolve().parents[1]
    if (repo / ".git").exists():
        probe = subprocess.run(["git", "check-ignore", "--no-index", "data/.part-00002.jsonl", "data/part-00000.jsonl.gz",
                                "data/regen.json", "data/.part-00003.jsonl.gz.tmp"],
                               cwd=repo, capture_output=True, text=True)
        assert probe.stdout.split() == ["data/.part-00002.jsonl", "data/.part-00003.jsonl.gz.tmp"]


def test_the_continuous_engine_takes_more_rows_for_bf16_where_the_cpu_computes_it(monkeypatch):
    """``--batch-size`` by default: 128 rows, 384 for a bf16 target on a CPU with native bf16 (the
    more rows, the faster its AMX products) while their KV room fits; the other engines keep theirs."""
    from mfd_hub import precision
    from mfd_hub.recipes.regen import (DEFAULT_BATCH, NATIVE_BF16_CACHE_BYTES, NATIVE_BF16_ROWS, default_batch,
                                       kv_room_bytes, local_engine)

    fp32 = tiny_target("qwen3", vocab_size=64)
    bf16 = tiny_target("qwen3", vocab_size=64).to(torch.bfloat16)
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert default_batch("continuous", bf16) == NATIVE_BF16_ROWS > DEFAULT_BATCH["continuous"]
    assert default_batch("continuous", fp32) == DEFAULT_BATCH["continuous"] == 128
    assert default_batch("generate", bf16) == 8 and default_batch("openai") == 8
    tokenizer = tiny_tokenizer(64)
    assert local_engine(bf16, tokenizer).batch_size == NATIVE_BF16_ROWS
    assert local_engine(bf16, tokenizer, batch_size=16).batch_size == 16
    # rows whose KV room would not fit keep the default (the room is allocated up front)
    wide = tiny_target("qwen3", vocab_size=64, hidden_size=256, num_layers=24).to(torch.bfloat16)
    assert kv_room_bytes(wide, NATIVE_BF16_ROWS, 256 + 192 + 64) <= NATIVE_BF16_CACHE_BYTES
    assert default_batch("continuous", wide, max_new_tokens=192) == NATIVE_BF16_ROWS
    assert kv_room_bytes(wide, NATIVE_BF16_ROWS, 256 + 2048 + 64) > NATIVE_BF16_CACHE_BYTES
    assert default_batch("continuous", wide, max_new_tokens=2048) == 128
    assert local_engine(wide, tokenizer, max_new_tokens=2048).batch_size == 128
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert default_batch("continuous", bf16) == 128
