"""Converters: z-lab -> MFD, training checkpoints (2-rank FSDP2), draft vocabularies, MFD-D.

Real checkpoints written by the real writers, the CLI in real subprocesses, a real 2-process
gloo group for the sharded training checkpoint.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import one_error_line, run_cli, run_cli_many, tree_state
from mfd_hub import DFlashDraftModel, load_draft, save_draft
from mfd_hub.converters import count_token_frequencies, select_draft_vocab
from mfd_hub.converters.zlab import init_modes
from mfd_hub.testing import (
    drafter_config_for,
    greedy_decode,
    save_tiny_target,
    target_taps,
    tiny_drafter,
    tiny_target,
    tiny_tokenizer,
    write_zlab_checkpoint,
)
from mfd_hub.verify import FAIL, PASS, verify_checkpoint


def all_weights(folder):
    """Every tensor of a checkpoint folder (single file or shards)."""
    weights = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        weights.update(load_file(file))
    return weights


def zlab_source(folder, target, seed=7, **overrides):
    cfg = drafter_config_for(target, num_modes=0, **overrides)
    torch.manual_seed(seed)
    return write_zlab_checkpoint(folder, cfg, DFlashDraftModel(cfg).float().state_dict())


def block_inputs(drafter, target, ctx_len=9, anchor_token=5):
    ids = torch.randint(0, target.config.vocab_size - 1, (1, ctx_len), generator=torch.Generator().manual_seed(0))
    taps = target_taps(target, ids, drafter.target_layer_ids)
    block = torch.full((1, 1, drafter.block_size), drafter.mask_token_id)
    block[:, :, 0] = anchor_token
    return drafter.embed_block(block, target.get_input_embeddings()), torch.tensor([[ctx_len]]), taps


# ---- z-lab -> MFD --------------------------------------------------------------------------------
def test_zlab_round_trip_exact_weights_sharded_and_verified(tmp_path):
    target = tiny_target("qwen3")
    src = zlab_source(tmp_path / "zlab", target)
    before = tree_state(src)
    result = run_cli(["convert", "zlab", str(src), str(tmp_path / "mfd"), "--modes", "4", "--seed", "3",
                      "--max-shard-size", "20KB", "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["num_modes"] == 4 and summary["dtype"] == "bfloat16" and summary["exact"] is True
    assert tree_state(src) == before  # the source is never modified

    out = tmp_path / "mfd"
    assert (out / "model.safetensors.index.json").exists() and len(list(out.glob("model-*.safetensors"))) > 1
    source_w, out_w = load_file(src / "model.safetensors"), all_weights(out)
    assert set(out_w) == set(source_w) | {"mode_embed", "mode_gate.weight"}
    for name, tensor in source_w.items():
        assert out_w[name].dtype == torch.bfloat16 and torch.equal(out_w[name], tensor), name
    embed, gate = init_modes(4, target.config.hidden_size, seed=3, mode_std=0.02, gate_std=0.02)
    assert torch.equal(out_w["mode_embed"], embed.bfloat16()) and torch.equal(out_w["mode_gate.weight"], gate.bfloat16())
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "mfd_dflash" and config["num_modes"] == 4 and config["dtype"] == "bfloat16"
    assert config["mfd_metadata"]["mode_init"]["seed"] == 3
    assert config["mfd_metadata"]["conversions"][0]["kind"] == "zlab"

    verified = run_cli(["verify", str(out), "--json"], tmp_path)
    assert verified.returncode == 0, verified.stderr
    report = json.loads(verified.stdout)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert report["ok"] and statuses["auto-model"] == PASS and statuses["remote-code"] == PASS
    assert statuses["safetensors"] == PASS and statuses["index"] == PASS and FAIL not in statuses.values()


def test_mfd_with_modes_zeroed_reproduces_the_zlab_drafter(tmp_path):
    target = tiny_target("llama")
    src = zlab_source(tmp_path / "zlab", target, layer_types=["sliding_attention", "full_attention"], sliding_window=5)
    from mfd_hub.converters import convert_zlab

    convert_zlab(src, tmp_path / "mfd", num_modes=3, seed=0, mode_std=0.5)
    zlab, mfd = load_draft(src), load_draft(tmp_path / "mfd")
    embeds, anchors, taps = block_inputs(mfd, target)
    want = zlab(embeds, anchors, context_taps=taps, modes=None, lm_head=target.lm_head).logits[:, :, 0]
    seeded = mfd(embeds, anchors, context_taps=taps, modes="all", lm_head=target.lm_head).logits
    assert (seeded - want[:, :, None]).abs().max() > 1e-3  # the seeded modes do move the drafts
    with torch.no_grad():
        mfd.mode_embed.zero_()
    got = mfd(embeds, anchors, context_taps=taps, modes="all", lm_head=target.lm_head).logits
    for k in range(3):
        assert (got[:, :, k] - want).abs().max() < 1e-5


def test_same_arguments_give_the_same_checkpoint(tmp_path):
    from mfd_hub.converters import convert_zlab

    src = zlab_source(tmp_path / "zlab", tiny_target("qwen3"))
    for name in ("a", "b"):
        convert_zlab(src, tmp_path / name, num_modes=2, seed=5)
    digest = {name: hashlib.sha256((tmp_path / name / "model.safetensors").read_bytes()).hexdigest() for name in "ab"}
    assert digest["a"] == digest["b"]


def write_hub_cache(hf_home, repo_id, folder, commit="0123456789abcdef0123456789abcdef01234567"):
    """Lay ``folder`` out as huggingface_hub's cache does (blobs + snapshot symlinks + refs)."""
    repo = Path(hf_home) / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in Path(folder).iterdir():
        data = file.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snapshot / file.name)
    return snapshot


def test_zlab_from_a_hub_id_and_verify_a_hub_cache(tmp_path):
    """A Hub id resolves through huggingface_hub's real cache (offline here): conversion works,
    and verify accepts a snapshot whose files are links into the repository's own blobs."""
    target = tiny_target("qwen3")
    zlab_source(tmp_path / "staging-zlab", target)
    write_hub_cache(tmp_path / "hf_home", "z-lab/tiny-DFlash", tmp_path / "staging-zlab")
    result = run_cli(["convert", "zlab", "z-lab/tiny-DFlash", str(tmp_path / "mfd"), "--modes", "2",
                      "--target-name", "tiny/qwen3"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "mfd" / "config.json").read_text())["target"]["name_or_path"] == "tiny/qwen3"
    write_hub_cache(tmp_path / "hf_home", "mfd/tiny-MFD", tmp_path / "mfd")
    verified = run_cli(["verify", "mfd/tiny-MFD", "--json"], tmp_path)
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["ok"]


# ---- an interrupted conversion ---------------------------------------------------------------------
def test_sigkill_midway_leaves_no_output_folder(tmp_path):
    target = tiny_target("qwen3", hidden_size=128, vocab_size=64)
    src = zlab_source(tmp_path / "zlab", target, num_layers=4, intermediate_size=1024)
    before = tree_state(src)
    out = tmp_path / "mfd"
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1")
    cmd = [str(Path(sys.executable).with_name("mfd-hub")), "convert", "zlab", str(src), str(out), "--modes", "8",
           "--max-shard-size", "8KB"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed_with_shards = 0
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        staging = list(tmp_path.glob(".mfd.partial-*"))
        shards = list(staging[0].glob("*.safetensors")) if staging else []
        if shards:
            os.kill(proc.pid, signal.SIGKILL)
            killed_with_shards = len(shards)
            break
        time.sleep(0.002)
    proc.wait(timeout=60)
    assert killed_with_shards, "the conversion finished before the test could kill it midway"
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()  # no partial output at the destination
    assert tree_state(src) == before
    # the next run replaces the stale staging folder and succeeds
    done = run_cli(["convert", "zlab", str(src), str(out), "--modes", "8", "--max-shard-size", "8KB"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert out.is_dir() and not list(tmp_path.glob(".mfd.partial-*"))
    assert verify_checkpoint(out).ok


# ---- MFD-D ---------------------------------------------------------------------------------------------
def test_mfd_d_default_path_equals_the_chosen_mode(tmp_path):
    target = tiny_target("qwen3")
    save_draft(tiny_drafter(target, num_modes=3), tmp_path / "mfd")
    before = tree_state(tmp_path / "mfd")
    result = run_cli(["convert", "mfd-d", str(tmp_path / "mfd"), str(tmp_path / "mfdd"), "--default-from", "mode:1",
                      "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["default_path_init"] == "mode 1"
    assert tree_state(tmp_path / "mfd") == before
    mfd, mfdd = load_draft(tmp_path / "mfd"), load_draft(tmp_path / "mfdd")
    assert mfdd.config.default_path and mfdd.config.mfd_metadata["default_path_init"] == "mode 1"
    embeds, anchors, taps = block_inputs(mfd, target)
    mode1 = mfd(embeds, anchors, context_taps=taps, modes=[1], lm_head=target.lm_head).logits
    default = mfdd(embeds, anchors, context_taps=taps, modes=None, lm_head=target.lm_head).logits
    modes = mfdd(embeds, anchors, context_taps=taps, modes="all", lm_head=target.lm_head).logits
    assert (default - mode1).abs().max() < 1e-6
    assert torch.equal(modes, mfd(embeds, anchors, context_taps=taps, modes="all", lm_head=target.lm_head).logits)
    assert verify_checkpoint(tmp_path / "mfdd").ok

    from mfd_hub.converters import convert_mfd_d

    convert_mfd_d(tmp_path / "mfd", tmp_path / "mean", default_from="mean")
    assert torch.allclose(load_draft(tmp_path / "mean").default_embed, mfd.mode_embed.mean(0))
    convert_mfd_d(tmp_path / "mfd", tmp_path / "zeros", default_from="zeros")
    zeros = load_draft(tmp_path / "zeros")
    assert not zeros.default_embed.any() and zeros.config.mfd_metadata["default_path_init"] == "zeros"


# ---- training checkpoints -----------------------------------------------------------------------------
FSDP_SCRIPT = r"""
import sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from pathlib import Path
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from mfd_hub.testing import tiny_target, tiny_drafter, target_taps
from mfd_hub.recipes.train_checkpoint import save_model_state, save_train_config

def rank_main(rank, world, init_file, folder):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    target = tiny_target("qwen3", hidden_size=40, num_layers=4)
    draft = tiny_drafter(target, num_modes=3)  # K=3 rows do not split evenly over 2 ranks
    # One FSDP2 unit for the whole drafter: the context K/V of every layer is computed from the
    # root's forward (layer.self_attn.context_kv), outside the layers' own forwards, so per-layer
    # units would not be unsharded there.
    fully_shard(draft, mesh=mesh)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    ids = torch.randint(0, 63, (1, 10), generator=torch.Generator().manual_seed(rank))
    taps = target_taps(target, ids, draft.target_layer_ids)
    block = torch.full((1, 1, draft.block_size), draft.mask_token_id)
    block[..., 0] = ids[0, -1]
    embeds = draft.embed_block(block, target.get_input_embeddings()).detach()
    for _ in range(2):  # real optimizer steps: every rank's shard moves away from the init
        out = draft(embeds, torch.tensor([[10]]), context_taps=taps, modes="all", lm_head=target.lm_head)
        loss = out.logits.logsumexp(-1).mean() + out.gate_logits.pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    state = draft.state_dict()
    assert all(type(v).__name__ == "DTensor" for v in state.values())
    if rank == 0:
        save_train_config(folder, draft.config)
    save_model_state(folder, state)
    full = {k: v.full_tensor().contiguous() for k, v in state.items()}  # collective: every rank
    if rank == 0:
        save_file(full, str(Path(sys.argv[2]) / "reference.safetensors"))
    dist.destroy_process_group()

if __name__ == "__main__":
    folder = sys.argv[1]
    # forked ranks start with torch and the model code imported: two fresh interpreters less
    mp.start_processes(rank_main, args=(2, str(Path(sys.argv[2]) / "init"), folder), nprocs=2, start_method="fork")
    print("written", folder)
"""


@pytest.fixture(scope="module")
def sharded_train_checkpoint(tmp_path_factory):
    """A training checkpoint written by 2 ranks under FSDP2 (gloo, CPU), and the full state dict
    gathered from the same ranks."""
    root = tmp_path_factory.mktemp("fsdp")
    (root / "script.py").write_text(FSDP_SCRIPT)
    folder = root / "run" / "checkpoints" / "step-000002"
    folder.parent.mkdir(parents=True)
    done = subprocess.run([sys.executable, str(root / "script.py"), str(folder), str(root)], cwd=root, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    shards = sorted(p.name for p in (folder / "model").glob("*.distcp"))
    assert len(shards) == 2, shards  # one file per rank: really sharded
    return folder, load_file(root / "reference.safetensors")


def test_train_ckpt_from_two_fsdp_ranks_equals_the_full_state_dict(sharded_train_checkpoint, tmp_path):
    folder, reference = sharded_train_checkpoint
    before = tree_state(folder)
    result = run_cli(["convert", "train-ckpt", str(folder), str(tmp_path / "out"), "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["saved_dtype"] == "float32" and summary["dtype"] == "float32"
    converted = all_weights(tmp_path / "out")
    assert set(converted) == set(reference)
    for name, tensor in reference.items():
        assert torch.equal(converted[name], tensor), name
    init = tiny_drafter(tiny_target("qwen3", hidden_size=40, num_layers=4), num_modes=3).state_dict()
    assert not torch.equal(converted["layers.0.mlp.up_proj.weight"], init["layers.0.mlp.up_proj.weight"])
    assert tree_state(folder) == before
    assert verify_checkpoint(tmp_path / "out").ok


def test_train_ckpt_of_a_run_folder_casts_and_picks_the_newest(sharded_train_checkpoint, tmp_path):
    folder, reference = sharded_train_checkpoint
    from mfd_hub.converters import convert_train_checkpoint, find_train_checkpoint

    (folder.parent / "step-000001").mkdir(exist_ok=True)  # older and incomplete: never chosen
    assert find_train_checkpoint(folder.parent.parent) == folder
    summary = convert_train_checkpoint(folder.parent.parent, tmp_path / "bf16", dtype=torch.bfloat16)
    assert summary["dtype"] == "bfloat16" and summary["source"] == str(folder)
    converted = all_weights(tmp_path / "bf16")
    for name, tensor in reference.items():
        assert converted[name].dtype == torch.bfloat16 and torch.equal(converted[name], tensor.bfloat16()), name


def test_train_ckpt_single_process_matches(tmp_path):
    from mfd_hub.recipes.train_checkpoint import load_train_checkpoint, save_model_state, save_train_config

    drafter = tiny_drafter(tiny_target("llama"), num_modes=2, seed=4)
    save_train_config(tmp_path / "ck", drafter.config)
    save_model_state(tmp_path / "ck", drafter.state_dict())
    loaded = load_train_checkpoint(tmp_path / "ck")
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


# ---- draft vocabulary --------------------------------------------------------------------------------
def test_select_draft_vocab_equals_brute_force():
    generator = torch.Generator().manual_seed(0)
    for trial in range(50):
        vocab = int(torch.randint(4, 40, (1,), generator=generator))
        counts = torch.randint(0, 4, (vocab,), generator=generator)  # many ties and zeros
        counts[0] = max(int(counts[0]), 1)
        keep = [int(torch.randint(0, vocab, (1,), generator=generator))]
        size = int(torch.randint(1, vocab + 1, (1,), generator=generator))
        ranked = sorted((t for t in range(vocab) if counts[t] > 0 and t not in keep), key=lambda t: (-int(counts[t]), t))
        want = sorted(keep + ranked[: size - len(keep)])
        assert select_draft_vocab(counts, size, keep=keep).tolist() == want, trial


def test_counts_from_ids_and_from_text_agree(tmp_path):
    tokenizer = tiny_tokenizer(16)
    records = [[3, 4, 4, 9], [9, 9, 1], [15]]
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps({"response_ids": r}) + "\n" for r in records))
    text = [{"response": " ".join(f"t{i}" for i in r)} for r in records]
    (tmp_path / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in text) + "\n")
    by_ids, n = count_token_frequencies(tmp_path / "ids.jsonl", 16)
    by_text, m = count_token_frequencies(tmp_path / "text.jsonl", 16, tokenizer=tokenizer)
    assert n == m == 3 and torch.equal(by_ids, by_text)
    assert by_ids.tolist() == [0, 1, 0, 1, 2, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 1]


@pytest.fixture
def vocab_pair(tmp_path):
    """A tiny target that really repeats itself (large init) and a 2-mode drafter, on disk, with a
    response corpus regenerated by the target itself (the regen writer)."""
    from mfd_hub.recipes.regen import regenerate

    target = tiny_target("llama", vocab_size=96, init_std=0.2)
    save_tiny_target(tmp_path / "target", target)
    save_draft(tiny_drafter(target, num_modes=2), tmp_path / "draft")
    tokenizer = tiny_tokenizer(96)
    prompts = [(str(i), " ".join(f"t{(7 * i + j) % 95 + 1}" for j in range(6))) for i in range(12)]
    regenerate(target, tokenizer, prompts, tmp_path / "corpus.jsonl", temperature=1.0, top_p=1.0, top_k=0,
               max_new_tokens=40, batch_size=4, chat=False)
    return target, tmp_path


def test_draft_vocab_is_lossless_and_maps_ids(vocab_pair):
    target, tmp_path = vocab_pair
    before = tree_state(tmp_path / "draft")
    result = run_cli(["convert", "draft-vocab", str(tmp_path / "draft"), str(tmp_path / "dv"), "--target",
                      str(tmp_path / "target"), "--corpus", str(tmp_path / "corpus.jsonl"), "--size", "24", "--json"],
                     tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["draft_vocab_size"] == 24 and summary["always_kept"] == [0] and 0 < summary["coverage"] < 1
    assert tree_state(tmp_path / "draft") == before

    full, reduced = load_draft(tmp_path / "draft"), load_draft(tmp_path / "dv")
    keep = torch.arange(24) + reduced.d2t
    assert reduced.config.draft_vocab_size == 24 and reduced.d2t.dtype == torch.int64 and 0 in keep.tolist()
    assert bool((keep[1:] > keep[:-1]).all()) and reduced.t2d.sum() == 24 and reduced.t2d[keep].all()
    assert torch.equal(reduced.lm_head.weight, target.lm_head.weight[keep])
    embeds, anchors, taps = block_inputs(full, target)
    whole = full(embeds, anchors, context_taps=taps, lm_head=target.lm_head).logits
    draft = reduced(embeds, anchors, context_taps=taps).logits
    assert draft.shape[-1] == 24 and (draft - whole[..., keep]).abs().max() < 1e-5

    for prompt in ([3, 1, 4, 1, 5, 9], [10, 20, 30], [77, 2, 91, 14, 14]):
        ids = torch.tensor([prompt])
        want = greedy_decode(target, ids, 40)
        assert any(not reduced.t2d[t] for t in want)  # the greedy text leaves the draft vocabulary
        for method in ("chain", "product", "mixture"):
            out = reduced.spec_generate(target, ids, max_new_tokens=40, method=method, tree_budget=12)
            assert out.new_tokens == want, (prompt, method)

    report = verify_checkpoint(tmp_path / "dv", target=str(tmp_path / "target"))
    statuses = {c.name: c.status for c in report.checks}
    # a random drafter accepts next to nothing, which only the acceptance check may hold against it
    assert {c.name for c in report.failures()} <= {"acceptance"}, report.to_dict()
    assert statuses["draft-vocab"] == PASS and statuses["spec-decoding"] == PASS, report.to_dict()


# ---- bad input ----------------------------------------------------------------------------------------
def test_bad_conversions_are_one_line_and_write_nothing(vocab_pair):
    target, tmp_path = vocab_pair
    zlab = zlab_source(tmp_path / "zlab", target)
    (tmp_path / "bad.jsonl").write_text('{"response_ids": [1, 2, 3]}\n{"response_ids": [4, 500]}\n')
    (tmp_path / "broken.jsonl").write_text('{"response_ids": [1, 2, 3]}\n{"response_ids": [4,\n')
    other = tiny_target("llama", vocab_size=32)
    save_tiny_target(tmp_path / "other-target", other)
    draft, dv = str(tmp_path / "draft"), ["--target", str(tmp_path / "target"), "--size", "8"]
    cases = [
        ["convert", "zlab", draft, "OUT"],  # already ours
        ["convert", "zlab", str(tmp_path / "missing"), "OUT"],
        ["convert", "zlab", str(zlab), "OUT", "--modes", "-1"],
        ["convert", "zlab", str(zlab), str(zlab), "--overwrite"],  # would replace the source
        ["convert", "zlab", str(zlab), str(tmp_path / "draft")],  # exists
        ["convert", "mfd-d", str(zlab), "OUT", "--default-from", "mode:0"],  # no modes to copy
        ["convert", "mfd-d", draft, "OUT", "--default-from", "mode:7"],
        ["convert", "mfd-d", draft, "OUT", "--default-from", "best"],
        ["convert", "train-ckpt", draft, "OUT"],  # not a training checkpoint
        ["convert", "draft-vocab", draft, "OUT", "--corpus", str(tmp_path / "bad.jsonl"), *dv],
        ["convert", "draft-vocab", draft, "OUT", "--corpus", str(tmp_path / "broken.jsonl"), *dv],
        ["convert", "draft-vocab", draft, "OUT", "--corpus", str(tmp_path / "corpus.jsonl"), *dv[:2], "--size", "999"],
        ["convert", "draft-vocab", draft, "OUT", "--corpus", str(tmp_path / "corpus.jsonl"), "--size", "8",
         "--target", str(tmp_path / "other-target")],
    ]
    before = tree_state(tmp_path)
    for args, result in zip(cases, run_cli_many(cases, tmp_path, watch=tmp_path)):
        assert one_error_line(result), (args, result.stderr)
        assert result.state == before, args  # nothing written, nothing modified


@pytest.mark.slow
def test_smollm2_draft_vocab_from_text_is_lossless_and_verified(tmp_path):
    """The real SmolLM2-135M target (GGUF): a text corpus tokenised by the target's tokenizer, the
    LM head taken from the loaded model, and verify's decoding check against it."""
    from mfd_hub.converters import convert_draft_vocab
    from mfd_hub.zoo.prompts import derive_training_prompts
    from mfd_hub.targets import encode_prompt, load_target

    target, tokenizer = load_target("smollm2")
    save_draft(tiny_drafter(target, num_modes=2, num_layers=1, block_size=16), tmp_path / "draft")
    with (tmp_path / "corpus.jsonl").open("w") as handle:
        for prompt in derive_training_prompts(300):
            handle.write(json.dumps({"text": prompt}) + "\n")
    summary = convert_draft_vocab(tmp_path / "draft", tmp_path / "dv", "smollm2", tmp_path / "corpus.jsonl", 512)
    assert summary["draft_vocab_size"] == 512 and tokenizer.eos_token_id in summary["always_kept"]
    reduced = load_draft(tmp_path / "dv")
    assert torch.equal(reduced.lm_head.weight, target.lm_head.weight[torch.arange(512) + reduced.d2t])
    for prompt in ("def add(a, b):\n    return", "Write a haiku about the sea."):
        ids = encode_prompt(tokenizer, prompt)
        want = greedy_decode(target, ids, 24)
        out = reduced.spec_generate(target, ids, max_new_tokens=24, method="mixture", tree_budget=8)
        assert out.new_tokens == want
    report = verify_checkpoint(tmp_path / "dv", target="smollm2")
    # a random drafter accepts next to nothing: the acceptance check's floor fails it, and only it
    assert [c.name for c in report.failures()] == ["acceptance"], report.to_dict()
    assert "below the floor of 1.1" in report.failures()[0].reason
