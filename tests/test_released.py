"""Released MFD drafters (DFlash format with K = 8 mode embeddings) -> ``mfd-hub convert released``.

Drafters built natively (MFD; MFD-D with a gate bias and a default path), exported by
``mfd_hub.testing.save_released_layout`` into the layout the authors publish, and converted back
by the real CLI: the same bits, the same hidden states and gate logits (also through AutoModel in
a process that cannot import mfd_hub) and the same speculative decoding, equal to greedy. Every
command line runs in ONE process (``run_cli_many``): the bad ones first, each checked to leave
the folder untouched.
"""

import copy
import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import NO_MFD_HUB, one_error_line, run_cli_many, run_python
from mfd_hub import load_draft
from mfd_hub.cards.model_card import render_card
from mfd_hub.cards.registry import load_registry
from mfd_hub.errors import MfdHubError
from mfd_hub.testing import greedy_decode, save_released_layout, tiny_drafter, tiny_registry_drafter, tiny_target

K = 8
NEW_TOKENS = 12
CONVERT = "mfd-hub convert released"


def weights(folder):
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def mfd_d_drafter(target):
    """A native MFD-D drafter whose gate has a bias; default path and bias drawn away from zero."""
    drafter = tiny_drafter(target, num_modes=K, default_path=True, mode_gate_bias=True, seed=2)
    with torch.no_grad():
        drafter.default_embed.normal_(0.0, 0.5)
        drafter.mode_gate.bias.normal_(0.0, 1.0)
    return drafter


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """Native bf16 drafters, their released folders, bad variants, and every CLI case's result."""
    root = tmp_path_factory.mktemp("released")
    target = tiny_target("qwen3")
    native = {"MFD": tiny_drafter(target, num_modes=K, seed=1).to(torch.bfloat16),
              "MFD-D": mfd_d_drafter(target).to(torch.bfloat16)}
    save_released_layout(native["MFD"], root / "MFD-released")  # bf16 files, as the authors publish
    save_released_layout(native["MFD-D"], root / "MFD-D-released", mode_embed_name="mode_embed.weight",
                         default_name="default_mode_embed", k_field={"dflash_config": {"num_modes": K}})
    registry = load_registry()
    entry = registry.get("MFD-Qwen3-8B")
    save_released_layout(tiny_registry_drafter(entry), root / "Qwen3-8B-released", dtype=torch.bfloat16)

    hidden = target.config.hidden_size
    gate_w = native["MFD"].mode_gate.weight
    save_released_layout(native["MFD"], root / "bad-k", k_field={"num_mode_embeddings": 4})
    save_released_layout(native["MFD"], root / "bad-k-inside", k_field={"dflash_config": {"n_modes": 6}})
    save_released_layout(native["MFD"], root / "bad-extra", extra_tensors={
        "mode_temperature": torch.ones(K), "router.proj.weight": torch.zeros(K, hidden)})
    save_released_layout(native["MFD"], root / "bad-gate", extra_tensors={"mode_gate.weight": gate_w[:7].clone()})
    save_released_layout(native["MFD-D"], root / "bad-bias", extra_tensors={"mode_gate.bias": torch.zeros(K + 1)})
    src = "MFD-released"
    bad = [  # (args, what the error line must say)
        (["convert", "released", "bad-k", "OUT"], "num_mode_embeddings says K=4"),
        (["convert", "released", "bad-k-inside", "OUT"], "dflash_config.n_modes says K=6"),
        (["convert", "released", "bad-extra", "OUT"], "['mode_temperature', 'router.proj.weight']"),
        (["convert", "released", "bad-gate", "OUT"], "mode_gate.weight has shape [7, 32], expected [8, 32]"),
        (["convert", "released", "bad-bias", "OUT"], "mode_gate.bias has shape [9], expected [8]"),
        (["convert", "released", src, "OUT", "--map", "mode_embed"], "--map takes OLD=NEW"),
        (["convert", "released", src, "OUT", "--map", "=mode_embed"], "--map takes OLD=NEW"),
        (["convert", "released", src, "OUT", "--map", "absent=-"], "holds no such tensor"),
        (["convert", "released", src, "OUT", "--map", "norm.weight=nonsense"], "nonsense is not a tensor"),
        (["convert", "released", src, "OUT", "--map", "fc.weight=-", "--map", "fc.weight=-"], "names fc.weight twice"),
        (["convert", "released", src, "OUT", "--map", "mode_gate.weight=mode_embed"], "would all become"),
        (["convert", "released", src, "OUT", "--map", "fc.weight=-"], "lacks tensor(s) ['fc.weight']"),
        (["convert", "released", src, src, "--overwrite"], "overlaps the source"),
        (["verify", src], f"released MFD drafter (DFlash format with K=8 mode embeddings), which mfd-hub loads "
                          f"only once converted: {CONVERT} {src} {src}-mfd"),
        (["verify", "./MFD-D-released/"], f"released MFD-D drafter (DFlash format with K=8 mode embeddings), which "
                                          f"mfd-hub loads only once converted: {CONVERT} ./MFD-D-released "
                                          "./MFD-D-released-mfd"),
        (["push", "MFD-Qwen3-8B", "--path", "Qwen3-8B-released", "--dry-run"],
         f"{CONVERT} Qwen3-8B-released Qwen3-8B-released-mfd"),
        (["convert", "zlab", src, "OUT"], f"{CONVERT} {src} {src}-mfd"),
        (["convert", "mfd-d", "MFD-D-released", "OUT"], f"{CONVERT} MFD-D-released MFD-D-released-mfd"),
    ]
    good = [
        ["info", src, "--json"],
        ["convert", "released", src, "MFD", "--json"],
        ["convert", "released", "MFD-D-released", "MFD-D", "--json"],
        ["convert", "released", "Qwen3-8B-released", "Qwen3-8B", "--json"],
        ["verify", "Qwen3-8B", "--json"],
        ["push", "MFD-Qwen3-8B", "--path", "Qwen3-8B", "--dry-run", "--json"],
    ]
    from cli_batch import tree_state

    before = tree_state(root)
    results = run_cli_many([args for args, _ in bad] + good, root, watch=root)
    card = render_card(entry, path=root / "Qwen3-8B", repo_id=entry.repo_id, registry=registry)
    exact32 = {name: copy.deepcopy(model).float() for name, model in native.items()}  # bf16 values, held exactly
    return {"root": root, "target": target, "native": native, "native32": exact32, "bad": list(zip(bad, results)), "before": before,
            "good": dict(zip((" ".join(a[:2]) + " " + a[2] for a in good), results[len(bad):])), "card": card}


def good(released, line):
    result = released["good"][line]
    assert result.returncode == 0, (line, result.stderr[-2000:])
    return json.loads(result.stdout)


def test_bad_input_and_unconverted_folders_are_one_line_and_write_nothing(released):
    for (args, words), result in released["bad"]:
        assert one_error_line(result), (args, result.stderr)
        assert words in result.stderr, (args, result.stderr)
        assert result.state == released["before"], args  # nothing written, the source untouched
    verify_line = next(result.stderr for (args, _), result in released["bad"] if args == ["verify", "MFD-released"])
    assert "failed 1 check(s): config (" in verify_line and "tensor" not in verify_line  # no generic mismatch


def test_conversion_is_bit_for_bit_and_recorded(released):
    root = released["root"]
    for name, source_name in (("MFD", "MFD-released"), ("MFD-D", "MFD-D-released")):
        summary = good(released, f"convert released {source_name}")
        assert summary["num_modes"] == K and summary["dtype"] == summary["source_dtype"] == "bfloat16"
        native = {k: v for k, v in released["native"][name].state_dict().items()}
        out = weights(root / name)
        assert sorted(out) == sorted(native)
        for key, tensor in native.items():
            assert out[key].dtype == torch.bfloat16 and torch.equal(out[key], tensor), (name, key)
        config = json.loads((root / name / "config.json").read_text())
        record = config["mfd_metadata"]["conversions"][-1]
        assert config["model_type"] == "mfd_dflash" and config["num_modes"] == K and config["dtype"] == "bfloat16"
        assert record["kind"] == "released" and record["source"] == source_name and record["num_modes"] == K
        assert record["source_dtype"] == "bfloat16" and record["format"].startswith("released MFD")
    d_config = json.loads((root / "MFD-D" / "config.json").read_text())
    d_record = d_config["mfd_metadata"]["conversions"][-1]
    assert d_config["default_path"] is True and d_config["mode_gate_bias"] is True
    assert d_record["default_path"] == "default_mode_embed" and d_record["k_fields"] == {"dflash_config.num_modes": K}
    assert d_record["renamed"] == {"default_mode_embed": "default_embed", "mode_embed.weight": "mode_embed"}
    assert "mode_gate_bias" not in json.loads((root / "MFD" / "config.json").read_text())  # our usual bytes


def test_info_names_the_released_format(released):
    info = good(released, "info MFD-released --json")
    assert info["format"] == "released MFD (DFlash format with modes)" and info["num_modes"] == K
    assert info["convert"] == f"{CONVERT} MFD-released MFD-released-mfd"


def test_verify_passes_and_push_plans_the_upload_with_the_generated_card(released):
    report = good(released, "verify Qwen3-8B --json")
    assert report["ok"] and {c["name"]: c["status"] for c in report["checks"]}["auto-model"] == "pass"
    plan = good(released, "push MFD-Qwen3-8B --path")["plan"]
    files = {f["path"]: f for f in plan["files"]}
    card = released["card"].encode()
    assert plan["name"] == "MFD-Qwen3-8B" and plan["remote"]["checked"] == "offline"
    assert files["README.md"]["sha256"] == hashlib.sha256(card).hexdigest() and "model.safetensors" in files


def block_inputs(drafter, target):
    ids = torch.randint(0, target.config.vocab_size - 1, (1, 9), generator=torch.Generator().manual_seed(0))
    from mfd_hub.testing import target_taps

    taps = target_taps(target, ids, drafter.target_layer_ids)
    block = torch.full((1, 2, drafter.block_size), drafter.mask_token_id)
    block[:, :, 0] = torch.tensor([5, 11])
    return {"embeds": drafter.embed_block(block, target.get_input_embeddings()).float(),
            "anchors": torch.tensor([[6, 9]]), "taps": taps.float()}


def outputs(drafter, inputs):
    """Hidden states and gate logits of every mode and (MFD-D) of the default path."""
    with torch.no_grad():
        out = {}
        for modes, tag in (("all", "all"), (None, "default")):
            result = drafter(inputs["embeds"], inputs["anchors"], context_taps=inputs["taps"], modes=modes)
            out[f"hidden_{tag}"] = result.hidden_states
            out[f"gate_{tag}"] = result.gate_logits
    return out


def test_hidden_states_and_gate_logits_match_exactly_also_through_auto_model(released, tmp_path):
    root, target = released["root"], released["target"]
    for name in ("MFD", "MFD-D"):
        inputs = block_inputs(released["native32"][name], target)
        save_file(inputs, tmp_path / f"{name}-inputs.safetensors")
        want = outputs(released["native32"][name], inputs)
        got = outputs(load_draft(root / name), inputs)
        for key in want:
            assert torch.equal(got[key], want[key]), (name, key)
    code = NO_MFD_HUB + f"""
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel
for name in ("MFD", "MFD-D"):
    model = AutoModel.from_pretrained({str(root)!r} + "/" + name, trust_remote_code=True, dtype=torch.float32)
    x = load_file(name + "-inputs.safetensors")
    out = {{}}
    with torch.no_grad():
        for modes, tag in (("all", "all"), (None, "default")):
            result = model(x["embeds"], x["anchors"], context_taps=x["taps"], modes=modes)
            out["hidden_" + tag], out["gate_" + tag] = result.hidden_states, result.gate_logits
    save_file(out, name + "-outputs.safetensors")
"""
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("MFD", "MFD-D"):
        want = outputs(released["native32"][name], load_file(tmp_path / f"{name}-inputs.safetensors"))
        got = load_file(tmp_path / f"{name}-outputs.safetensors")
        assert all(torch.equal(got[key], want[key]) for key in want), name


RUNS = [  # (drafter, method, mode, budget)
    ("MFD", "chain", None, 6), ("MFD", "product", None, 8), ("MFD", "mixture", None, 12),
    ("MFD-D", "chain", "default", 6), ("MFD-D", "product", "default", 8), ("MFD-D", "mixture", None, 10),
]


def decoding_statistics(drafter, target, ids, method, mode, budget):
    out = drafter.spec_generate(target, ids, max_new_tokens=NEW_TOKENS, method=method, tree_budget=budget, mode=mode)
    return out.new_tokens, out.acceptance_lengths, out.tree_sizes


def test_speculative_decoding_is_identical_and_lossless(released):
    root, target = released["root"], released["target"]
    ids = torch.tensor([[3, 17, 40, 8, 22, 5]])
    want = greedy_decode(target, ids, NEW_TOKENS)
    converted = {name: load_draft(root / name) for name in ("MFD", "MFD-D")}
    for name, method, mode, budget in RUNS:
        native = decoding_statistics(released["native32"][name], target, ids, method, mode, budget)
        again = decoding_statistics(converted[name], target, ids, method, mode, budget)
        assert again == native, (name, method, mode)
        assert native[0] == want, (name, method, mode)


def test_load_draft_refuses_the_unconverted_folder(released):
    source = released["root"] / "MFD-D-released"
    with pytest.raises(MfdHubError, match=f"MFD-D drafter .*K=8.*{CONVERT} {source} {source}-mfd"):
        load_draft(source)


def test_the_printed_command_converts_what_the_user_named():
    from mfd_hub.checkpoint_config import convert_command

    assert convert_command("authors/MFD-Qwen3-8B") == f"{CONVERT} authors/MFD-Qwen3-8B ./MFD-Qwen3-8B-mfd"  # a Hub id
    assert convert_command("my drafters/MFD/") == f"{CONVERT} 'my drafters/MFD' 'my drafters/MFD-mfd'"


def test_map_renames_and_drops_on_purpose_and_an_absent_gate_becomes_zeros(released, tmp_path):
    """A gate stored under another name and an extra tensor: placed and dropped by --map, both
    recorded; a folder without any gate converts with a zero gate, recorded too."""
    from mfd_hub.converters import convert_released

    source = released["root"] / "MFD-released"
    tensors = load_file(source / "model.safetensors")
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    (renamed / "config.json").write_bytes((source / "config.json").read_bytes())
    gate = tensors.pop("mode_gate.weight")
    save_file({**tensors, "router.weight": gate, "mode_temperature": torch.ones(K, dtype=torch.bfloat16)},
              renamed / "model.safetensors")
    summary = convert_released(renamed, tmp_path / "out", name_map=["router.weight=mode_gate.weight",
                                                                     "mode_temperature=-"])
    assert summary["renamed"] == {"router.weight": "mode_gate.weight"} and summary["dropped"] == ["mode_temperature"]
    record = json.loads((tmp_path / "out" / "config.json").read_text())["mfd_metadata"]["conversions"][-1]
    assert record["renamed"] == summary["renamed"] and record["dropped"] == ["mode_temperature"]
    assert torch.equal(weights(tmp_path / "out")["mode_gate.weight"], gate)

    no_gate = tmp_path / "no-gate"
    no_gate.mkdir()
    (no_gate / "config.json").write_bytes((source / "config.json").read_bytes())
    save_file(tensors, no_gate / "model.safetensors")
    summary = convert_released(no_gate, tmp_path / "zero-gate")
    assert summary["mode_gate"] == "absent in the source: zeros"
    out = weights(tmp_path / "zero-gate")
    assert not out["mode_gate.weight"].any() and torch.equal(out["mode_embed"], tensors["mode_embed"])


@pytest.mark.slow
def test_smollm2_shipped_drafter_round_trips_bit_for_bit_and_decodes_identically(tmp_path):
    """The shipped MFD drafter (K = 8, bf16, a draft vocabulary) given a default path (a copy of
    mode 3), exported in the released layout and converted back: the shipped bits, and on the
    real SmolLM2 target the same tokens, acceptance lengths and tree sizes as before, equal to
    greedy, for chain, product and mixture and for the default path."""
    from mfd_hub.converters import convert_released
    from mfd_hub.converters.common import build_drafter, copy_config
    from mfd_hub.targets import encode_prompt, load_target
    from mfd_hub.zoo.shipped import zoo_folder

    shipped = load_draft(zoo_folder("MFD-SmolLM2-135M"))  # float32 holding the stored bf16 values exactly
    state = {**shipped.state_dict(), "default_embed": shipped.mode_embed[3].detach().clone()}
    native = build_drafter(copy_config(shipped.config, default_path=True), state)
    save_released_layout(native, tmp_path / "released", dtype=torch.bfloat16)
    summary = convert_released(tmp_path / "released", tmp_path / "converted")
    assert summary["num_modes"] == K and summary["dtype"] == "bfloat16"
    stored = weights(tmp_path / "converted")
    for name, tensor in load_file(zoo_folder("MFD-SmolLM2-135M") / "model.safetensors").items():
        assert stored[name].dtype == tensor.dtype and torch.equal(stored[name], tensor), name
    converted = load_draft(tmp_path / "converted")
    assert converted.config.draft_vocab_size == shipped.config.draft_vocab_size and converted.config.default_path

    target, tokenizer = load_target("smollm2")
    ids = encode_prompt(tokenizer, "Write a Python function that returns the n-th Fibonacci number.")
    new_tokens = 16
    want = greedy_decode(target, ids, new_tokens)
    longest = 0
    for method, mode, budget in (("chain", None, 8), ("product", None, 12), ("mixture", None, 16),
                                 ("chain", "default", 8)):
        runs = [drafter.spec_generate(target, ids, max_new_tokens=new_tokens, method=method, tree_budget=budget,
                                      mode=mode) for drafter in (native, converted)]
        before, after = ((r.new_tokens, r.acceptance_lengths, r.tree_sizes) for r in runs)
        assert after == before and before[0] == want, (method, mode)
        longest = max(longest, *before[1])
    assert longest > 1  # trained modes get runs accepted: equal acceptance lengths say something


def test_the_docs_example_writes_a_folder_verify_refuses_as_the_docs_show(tmp_path, monkeypatch):
    """docs/released-drafters.md: its Python block writes the released folder its commands use,
    and verify refuses that folder with the line the page prints."""
    import re
    from pathlib import Path

    from mfd_hub.verify import verify_checkpoint

    page = (Path(__file__).resolve().parents[1] / "docs" / "released-drafters.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.+?)```", page, re.DOTALL)[1]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "released-drafters.md", "exec"), {})
    report = verify_checkpoint("./MFD-Qwen3-8B-released")
    (failed,) = report.failures()
    line = f"error: ./MFD-Qwen3-8B-released failed 1 check(s): {failed.name} ({failed.reason})"
    assert line in page
