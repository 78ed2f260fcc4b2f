"""``mfd-hub verify``: sound checkpoints pass; a corpus of damaged ones is each rejected by the
right named check, with one line, exit code 1, no traceback, and nothing written.

The damage is done to real checkpoints written by ``save_draft``, at the byte level where the
format is the point (safetensors headers are rewritten by hand here, not through the library).
"""

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import REPO, one_error_line, run_cli, tree_state
from mfd_hub import __version__, save_draft
from mfd_hub.bundle import HEADER_PREFIX
from mfd_hub.converters import reduce_vocabulary
from mfd_hub.testing import drafter_config_for, save_tiny_target, tiny_drafter, tiny_target, write_zlab_checkpoint
from mfd_hub.verify import CHECKS, FAIL, PASS, SKIP, WARN, read_safetensors_header, verify_checkpoint

INDEX = "model.safetensors.index.json"


# ---- raw safetensors surgery ----------------------------------------------------------------------------
def read_raw(path):
    data = Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def write_raw(path, header, body, length=None, header_bytes=None):
    header_bytes = header_bytes if header_bytes is not None else json.dumps(header).encode()
    size = len(header_bytes) if length is None else length
    Path(path).write_bytes(size.to_bytes(8, "little") + header_bytes + body)


def shard_of(folder, tensor):
    index = json.loads((folder / INDEX).read_text())
    return folder / index["weight_map"][tensor]


def edit_header(folder, tensor, edit):
    """Apply ``edit(header, tensor)`` to the header of the shard holding ``tensor``."""
    path = shard_of(folder, tensor)
    header, body = read_raw(path)
    edit(header, tensor)
    write_raw(path, header, body)


def edit_config(folder, edit):
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def edit_tensors(folder, edit, tensor="layers.0.mlp.up_proj.weight"):
    """Rewrite the shard holding ``tensor`` through the library (consistent headers) and keep
    the index in step with the shard's new tensor names."""
    path = shard_of(folder, tensor)
    weights = load_file(path)
    edit(weights)
    save_file(weights, path, metadata={"format": "pt"})
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != path.name}
    index["weight_map"].update({k: path.name for k in weights})
    (folder / INDEX).write_text(json.dumps(index))


def same_size_neighbour(folder, tensor):
    header, _ = read_raw(shard_of(folder, tensor))
    size = lambda name: header[name]["data_offsets"][1] - header[name]["data_offsets"][0]  # noqa: E731
    return next(n for n in header if n not in (tensor, "__metadata__") and size(n) == size(tensor))


class Evil:
    """A pickle that would leave a marker file if anything ever unpickled it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


NORM = "layers.0.self_attn.q_norm.weight"
UP = "layers.0.mlp.up_proj.weight"


def _overlap(folder):
    other = same_size_neighbour(folder, NORM)
    edit_header(folder, NORM, lambda h, t: h[t].update(data_offsets=list(h[other]["data_offsets"])))


def _gap(folder):
    path = shard_of(folder, NORM)
    header, body = read_raw(path)
    for info in header.values():
        if isinstance(info, dict) and "data_offsets" in info:
            info["data_offsets"] = [o + 8 for o in info["data_offsets"]]
    write_raw(path, header, b"\0" * 8 + body)


def _header_bytes(folder, text):
    path = shard_of(folder, NORM)
    header, body = read_raw(path)
    write_raw(path, None, body, header_bytes=text(header))


def _duplicate_key(header):
    text = json.dumps(header)
    entry = json.dumps({NORM: header[NORM]})[1:-1]
    return (text[:-1] + ", " + entry + "}").encode()


def _symlink_out(folder):
    shard = shard_of(folder, UP)
    outside = folder.parent / f"outside-{folder.name}.safetensors"
    shutil.copy(shard, outside)
    shard.unlink()
    os.symlink(outside, shard)


def _pickle(folder):
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Evil(folder.parent / f"PWNED-{folder.name}")))


def _both_weights(folder):
    shutil.copy(shard_of(folder, UP), folder / "model.safetensors")


def _extra_shard(folder):
    shutil.copy(shard_of(folder, UP), folder / "model-00009-of-00009.safetensors")


def _index_missing_shard(folder):
    index = json.loads((folder / INDEX).read_text())
    moved = shard_of(folder, UP)
    index["weight_map"] = {k: (v if v != moved.name else "model-00042-of-00042.safetensors") for k, v in index["weight_map"].items()}
    (folder / INDEX).write_text(json.dumps(index))
    moved.unlink()


def _tamper_code(folder):
    path = folder / "modeling_mfd.py"
    path.write_text(path.read_text() + "\nimport os  # harmless-looking addition\n")


def _nan(weights):
    weights[UP][0, 0] = float("nan")


def _inf(weights):
    weights[UP][1, 2] = float("-inf")


# name -> (base checkpoint, mutation, the check that must fail, extra CLI args)
DAMAGE = {
    "truncated-file": ("sharded", lambda f: shard_of(f, UP).write_bytes(shard_of(f, UP).read_bytes()[:1000]), "safetensors"),
    "tiny-file": ("sharded", lambda f: shard_of(f, UP).write_bytes(b"\x10\0\0"), "safetensors"),
    "header-length-past-end": ("sharded", lambda f: write_raw(shard_of(f, UP), *read_raw(shard_of(f, UP)), length=10**7), "safetensors"),
    "header-length-absurd": ("sharded", lambda f: write_raw(shard_of(f, UP), *read_raw(shard_of(f, UP)), length=2**62), "safetensors"),
    "header-not-json": ("sharded", lambda f: _header_bytes(f, lambda h: b"{" + b"\xff" * (len(json.dumps(h)) - 1)), "safetensors"),
    "header-duplicate-key": ("sharded", lambda f: _header_bytes(f, _duplicate_key), "safetensors"),
    "overlapping-offsets": ("sharded", _overlap, "safetensors"),
    "offsets-past-data": ("sharded", lambda f: edit_header(f, UP, lambda h, t: h[t].update(data_offsets=[h[t]["data_offsets"][0], 10**9])), "safetensors"),
    "dtype-x-shape-not-bytes": ("sharded", lambda f: edit_header(f, UP, lambda h, t: h[t].update(shape=[h[t]["shape"][0] // 2, h[t]["shape"][1]])), "safetensors"),
    "unknown-dtype": ("sharded", lambda f: edit_header(f, UP, lambda h, t: h[t].update(dtype="F12")), "safetensors"),
    "unclaimed-bytes": ("sharded", _gap, "safetensors"),
    "no-weights": ("sharded", lambda f: [p.unlink() for p in f.glob("*.safetensors")], "safetensors"),
    "index-names-missing-shard": ("sharded", _index_missing_shard, "index"),
    "shard-not-in-index": ("sharded", _extra_shard, "index"),
    "index-and-single-file": ("sharded", _both_weights, "index"),
    "index-not-json": ("sharded", lambda f: (f / INDEX).write_text('{"weight_map": {'), "index"),
    "wrong-dtype": ("sharded", lambda f: edit_tensors(f, lambda w: w.update({UP: w[UP].half()})), "tensors"),
    "integer-weight": ("sharded", lambda f: edit_tensors(f, lambda w: w.update({UP: w[UP].to(torch.int16)})), "tensors"),
    "missing-tensor": ("sharded", lambda f: edit_tensors(f, lambda w: w.pop(UP)), "tensors"),
    "extra-tensor": ("sharded", lambda f: edit_tensors(f, lambda w: w.update({"extra.weight": torch.ones(3)})), "tensors"),
    "wrong-mode-embed-shape": ("sharded", lambda f: edit_tensors(f, lambda w: w.update(mode_embed=torch.zeros(4, 32).bfloat16()), "mode_embed"), "tensors"),
    "nan": ("sharded", lambda f: edit_tensors(f, _nan), "finite"),
    "infinity": ("sharded", lambda f: edit_tensors(f, _inf), "finite"),
    "config-missing-fields": ("sharded", lambda f: edit_config(f, lambda c: [c.pop("hidden_size"), c.pop("num_modes")]), "config"),
    "config-not-json": ("sharded", lambda f: (f / "config.json").write_text("{\"model_type\": "), "config"),
    "config-negative-size": ("sharded", lambda f: edit_config(f, lambda c: c.update(num_hidden_layers=-2)), "config"),
    "config-auto-map-elsewhere": ("sharded", lambda f: edit_config(f, lambda c: c["auto_map"].update(AutoModel="evil.Model")), "config"),
    "layer-id-out-of-range": ("sharded", lambda f: edit_config(f, lambda c: c.update(target_layer_ids=[0, 4])), "target-layers"),
    "mask-id-out-of-vocab": ("sharded", lambda f: edit_config(f, lambda c: c.update(mask_token_id=64)), "mask-token"),
    "recorded-target-mismatch": ("sharded", lambda f: edit_config(f, lambda c: c["target"].update(hidden_size=48)), "target"),
    "tampered-remote-code": ("sharded", _tamper_code, "remote-code"),
    "remote-code-missing": ("sharded", lambda f: (f / "generation_mfd.py").unlink(), "remote-code"),
    "pickle-file": ("sharded", _pickle, "files"),
    "symlink-leaving-folder": ("sharded", _symlink_out, "files"),
    "symlink-to-system-file": ("sharded", lambda f: os.symlink("/etc/hostname", f / "README.md"), "files"),
    "d2t-as-int32": ("vocab", lambda f: _single_file_edit(f, lambda w: w.update(d2t=w["d2t"].int())), "tensors"),
    "d2t-collision": ("vocab", lambda f: _single_file_edit(f, _d2t_collision), "draft-vocab"),
    "t2d-disagrees": ("vocab", lambda f: _single_file_edit(f, _t2d_off), "draft-vocab"),
    "wrong-target-given": ("vocab", lambda f: None, "target", ["--target", "OTHER_TARGET"]),
}


def _single_file_edit(folder, edit):
    weights = load_file(folder / "model.safetensors")
    edit(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def _d2t_collision(weights):
    d2t = weights["d2t"].clone()
    d2t[1] = d2t[0] - 1  # draft ids 0 and 1 both reach the same target id
    weights["d2t"] = d2t


def _t2d_off(weights):
    t2d = weights["t2d"].clone()
    t2d[(~t2d).nonzero()[0, 0]] = True  # marks a target id that no draft id reaches
    weights["t2d"] = t2d


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Sound base checkpoints and one damaged copy per DAMAGE entry."""
    root = tmp_path_factory.mktemp("verify")
    target = tiny_target("qwen3")
    save_draft(tiny_drafter(target, num_modes=3), root / "sharded", dtype=torch.bfloat16, max_shard_size="20KB")
    keep = torch.tensor([0, 3, 5, 8, 13, 21, 34, 55])
    save_draft(reduce_vocabulary(tiny_drafter(target, num_modes=2), target.lm_head.weight.detach(), keep), root / "vocab")
    save_tiny_target(root / "target", target)
    save_tiny_target(root / "other-target", tiny_target("qwen3", hidden_size=48))
    assert len(list((root / "sharded").glob("model-*.safetensors"))) >= 2
    for name, (base, mutate, *_) in DAMAGE.items():
        shutil.copytree(root / base, root / name, symlinks=True)
        mutate(root / name)
    return root


def test_sound_checkpoints_pass(corpus):
    for base in ("sharded", "vocab"):
        report = verify_checkpoint(corpus / base)
        assert report.ok and [c.name for c in report.checks] == list(CHECKS), report.to_dict()
        assert {c.name for c in report.checks if c.status == PASS} >= {
            "files", "safetensors", "config", "tensors", "finite", "target-layers", "mask-token", "target",
            "remote-code", "auto-model",
        }, report.to_dict()
    assert verify_checkpoint(corpus / "vocab").checks[CHECKS.index("draft-vocab")].status == PASS


def test_a_clean_load_is_reused_only_while_the_load_cannot_differ(tmp_path, monkeypatch):
    """The auto-model check keeps a clean load's outcome under ``loading_key``: the same key for
    other weight values (same shapes), another for any change a load can see; a kept outcome
    answers without a process, and a key never seen loads for real."""
    from mfd_hub import verify

    monkeypatch.setenv("MFD_HUB_CACHE", str(tmp_path / "cache"))
    target = tiny_target("qwen3")
    save_draft(tiny_drafter(target, num_modes=2, seed=1), tmp_path / "a")
    save_draft(tiny_drafter(target, num_modes=2, seed=2), tmp_path / "b")  # other values, same shapes
    save_draft(tiny_drafter(target, num_modes=3, seed=1), tmp_path / "c")  # another shape
    shutil.copytree(tmp_path / "a", tmp_path / "d")
    edit_config(tmp_path / "d", lambda c: c.update(mask_token_id=c["mask_token_id"] - 1))
    shutil.copytree(tmp_path / "a", tmp_path / "e")
    weights = load_file(tmp_path / "e" / "model.safetensors")
    weights["fc.weight"] = weights["fc.weight"].half()  # the same shape, another dtype
    save_file(weights, tmp_path / "e" / "model.safetensors", metadata={"format": "pt"})
    key = verify.loading_key(tmp_path / "a")
    assert verify.loading_key(tmp_path / "b") == key
    assert len({key, *(verify.loading_key(tmp_path / n) for n in "cde")}) == 4

    assert verify_checkpoint(tmp_path / "a").ok  # loads for real, and keeps the outcome
    assert (tmp_path / "cache" / verify.AUTO_MODEL_CACHE / f"{key}.json").is_file()

    def no_process(*args, **kwargs):
        raise AssertionError("AutoModel was loaded again")

    monkeypatch.setattr(verify.subprocess, "run", no_process)
    report = verify_checkpoint(tmp_path / "b")
    assert report.ok and report.checks[CHECKS.index("auto-model")].status == PASS, report.to_dict()
    unseen = verify_checkpoint(tmp_path / "c").checks[CHECKS.index("auto-model")]
    assert unseen.status == FAIL and "AutoModel was loaded again" in unseen.reason  # it did try to load


def test_the_corpus_is_large_enough():
    assert len(DAMAGE) >= 20


@pytest.fixture(scope="module")
def damaged_reports(corpus):
    """Every damaged copy verified by the real CLI, one ``mfd-hub verify --json A B ...`` process per
    distinct set of extra arguments (a process per checkpoint would pay torch's import 40 times)
    -> {name: (that process's result, the name's report)}, and the corpus before and after."""
    groups = {}
    for name in sorted(DAMAGE):
        base, _, check, *extra = DAMAGE[name]
        args = tuple(a.replace("OTHER_TARGET", str(corpus / "other-target")) for a in (extra[0] if extra else []))
        groups.setdefault(args, []).append(name)
    before = tree_state(corpus)
    found = {}
    for args, names in groups.items():
        result = run_cli(["verify", "--json", *args, *(str(corpus / n) for n in names)], corpus)
        reports = json.loads(result.stdout) if result.stdout.strip() else []
        reports = reports if isinstance(reports, list) else [reports]
        assert len(reports) == len(names), result.stderr
        found.update({n: (result, r) for n, r in zip(names, reports)})
    return found, before, tree_state(corpus)


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_damaged_checkpoint_is_rejected(damaged_reports, name):
    found, before, after = damaged_reports
    check = DAMAGE[name][2]
    result, report = found[name]
    assert result.returncode == 1 and one_error_line(result), result.stderr
    assert name in result.stderr.splitlines()[-1]  # the error line names every failed drafter
    failed = {c["name"]: c["reason"] for c in report["checks"] if c["status"] == FAIL}
    assert not report["ok"] and check in failed, (name, report)
    assert all(reason and "\n" not in reason and "Traceback" not in reason for reason in failed.values())
    assert {k: v for k, v in after.items() if not k.startswith("hf_home")} == {
        k: v for k, v in before.items() if not k.startswith("hf_home")
    }  # verify wrote nothing (and executed nothing: no PWNED marker)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses.get("auto-model") in (SKIP, None)  # damaged code or weights are never executed


def test_one_damaged_checkpoint_alone_is_one_error_line_naming_its_check(corpus):
    result = run_cli(["verify", str(corpus / "nan"), "--json"], corpus)
    assert result.returncode == 1 and one_error_line(result), result.stderr
    report = json.loads(result.stdout)
    assert isinstance(report, dict) and not report["ok"]
    assert "check(s): finite" in result.stderr.splitlines()[-1]


def test_header_parser_accepts_what_the_library_writes(tmp_path):
    tensors = {"a": torch.zeros(0, 3), "b": torch.arange(6, dtype=torch.int64), "c": torch.ones(2, 2).bfloat16(),
               "d": torch.tensor([True, False, True])}
    save_file(tensors, tmp_path / "x.safetensors", metadata={"k": "v"})
    entries = read_safetensors_header(tmp_path / "x.safetensors")
    assert {n: (d, s) for n, (d, s, _, _) in entries.items()} == {
        "a": ("F32", (0, 3)), "b": ("I64", (6,)), "c": ("BF16", (2, 2)), "d": ("BOOL", (3,)),
    }


def test_version_drift_is_a_warning_and_not_executed(tmp_path):
    target = tiny_target("qwen3")
    save_draft(tiny_drafter(target, num_modes=2), tmp_path / "old")
    for file in (tmp_path / "old").glob("*.py"):
        text = file.read_text().replace(f"{HEADER_PREFIX} {__version__},", f"{HEADER_PREFIX} 0.0.1,", 1)
        file.write_text(text + "\n# an older release\n")
    report = verify_checkpoint(tmp_path / "old")
    statuses = {c.name: c for c in report.checks}
    assert report.ok and statuses["remote-code"].status == WARN and "version drift" in statuses["remote-code"].reason
    assert statuses["auto-model"].status == SKIP


def test_zlab_checkpoint_is_sound_but_its_code_is_not_run(tmp_path):
    target = tiny_target("llama")
    cfg = drafter_config_for(target)
    write_zlab_checkpoint(tmp_path / "zlab", cfg, tiny_drafter(target).state_dict())
    (tmp_path / "zlab" / "dflash.py").write_text("raise SystemExit('z-lab code must not run here')\n")
    report = verify_checkpoint(tmp_path / "zlab")
    statuses = {c.name: c.status for c in report.checks}
    assert report.ok and statuses["remote-code"] == SKIP and statuses["auto-model"] == SKIP
    assert statuses["tensors"] == PASS and statuses["config"] == PASS


def test_verify_with_a_target_in_text_mode(corpus):
    result = run_cli(["verify", str(corpus / "sharded"), "--target", str(corpus / "target")], corpus)
    lines = result.stdout.splitlines()
    assert any(line.split()[:2] == ["pass", "spec-decoding"] for line in lines), result.stdout
    # a random drafter, and no acceptance record: the floor fails it, the only check that does,
    # and the line under the verdict names a cause
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["FAIL", "acceptance"])
    assert "no record: below the floor of 1.1" in lines[at], result.stdout
    assert lines[at + 1].split()[:3] == ["cause:", "mask", "token:"], result.stdout
    assert [line.split()[1] for line in lines if line.split()[:1] == ["FAIL"]] == ["acceptance"], result.stdout
    assert result.returncode == 1 and one_error_line(result), result.stderr


def test_missing_path_is_one_line(tmp_path):
    result = run_cli(["verify", str(tmp_path / "nothing-here")], tmp_path)
    assert result.returncode == 1 and one_error_line(result), result.stderr


# ---- the auto-model and spec-decoding checks failing for real ----------------------------------
def altered_install(tmp_path, edits):
    """A copy of this mfd-hub, importable through PYTHONPATH, with ``edits`` ({file: (old, new)},
    paths in the installed package) applied: an mfd-hub release with a real defect. Its bundle is
    generated from its own files, so a drafter it saves passes the byte-identity gate."""
    site = tmp_path / "site"
    skip = shutil.ignore_patterns("__pycache__", "*.safetensors")
    for package, source in {"mfd_hub": "mfd_hub", "mfd_hub/kernels": "kernels", "mfd_hub/converters": "converters",
                            "mfd_hub/cards": "cards", "mfd_hub/recipes": "recipes", "mfd_hub/zoo": "zoo"}.items():
        shutil.copytree(REPO / source, site / package, ignore=skip, dirs_exist_ok=True)
    for name, (old, new) in edits.items():
        path = site / name
        text = path.read_text(encoding="utf-8")
        assert text.count(old) == 1, (name, old)
        path.write_text(text.replace(old, new), encoding="utf-8")
    return site


SAVE_AND_VERIFY = """
import json, sys, torch
import mfd_hub
assert mfd_hub.__file__.startswith(sys.argv[1]), mfd_hub.__file__  # the altered copy, not the checkout
from mfd_hub.checkpoint import save_draft
from mfd_hub.testing import save_tiny_target, tiny_drafter, tiny_target
from mfd_hub.verify import verify_checkpoint
target = tiny_target("qwen3", vocab_size=16, init_std=0.2)
save_tiny_target("target", target)
save_draft(tiny_drafter(target, num_modes=3, block_size=8), "drafter")
report = verify_checkpoint("drafter", target="target" if sys.argv[2] == "1" else None)
print(json.dumps({c.name: [c.status, c.reason] for c in report.checks}))
"""


def verify_under(site, tmp_path, with_target):
    """Save a drafter and verify it (against a target: spec-decoding runs), all in a real process
    running the altered install."""
    env = dict(os.environ, PYTHONPATH=str(site), MFD_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf"), TRANSFORMERS_VERBOSITY="error", PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, "-c", SAVE_AND_VERIFY, str(site), str(int(with_target))], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# appended to the bundle the altered release generates (its own modules stay importable)
BROKEN_BUNDLES = {
    "syntax-error": ('out["modeling_mfd.py"] += "\\ndef unfinished(:\\n"', "SyntaxError"),
    "missing-class": ('out["modeling_mfd.py"] = out["modeling_mfd.py"].replace("class DFlashDraftModel(", '
                      '"class DraftModelRenamed(")', "DFlashDraftModel"),
    "imports-mfd_hub": ('out["modeling_mfd.py"] += "\\nimport mfd_hub.remote\\n"', "mfd_hub"),
}


@pytest.mark.parametrize("defect", BROKEN_BUNDLES)
def test_a_bundle_that_does_not_load_fails_auto_model(tmp_path, defect):
    """The defect is in the bundle the release writes, so the drafter's code is byte-identical to
    the installed bundle and verify runs it: the load fails in verify's own AutoModel process."""
    change, named = BROKEN_BUNDLES[defect]
    site = altered_install(tmp_path, {"mfd_hub/bundle.py": ("        out[name] = header + flat\n",
                                                            f"        out[name] = header + flat\n    {change}\n")})
    checks = verify_under(site, tmp_path, with_target=False)
    assert checks["remote-code"][0] == PASS, checks  # past the byte-identity gate
    status, reason = checks["auto-model"]
    assert status == FAIL and reason.startswith("AutoModel.from_pretrained failed") and named in reason, checks


def test_a_verifier_bug_fails_spec_decoding(tmp_path):
    """A release whose attention verifier lets every tree node attend to every other (the tree
    mask dropped): its drafters load, and decode differently from the target."""
    bug = ("verify_attention_bias(tree_mask, ", "verify_attention_bias(torch.ones_like(tree_mask), ")
    checks = verify_under(altered_install(tmp_path, {"mfd_hub/remote/targets_mfd.py": bug}), tmp_path, with_target=True)
    assert checks["auto-model"][0] == PASS, checks
    status, reason = checks["spec-decoding"]
    assert status == FAIL and "departs from the target's greedy decoding at token" in reason, checks
