"""The repository holds code and measured results, not weights: no tracked file over 1 MB lies
outside the shipped drafters (``zoo/*/model.safetensors``). A training checkpoint is rebuilt from
its recipe (data/smollm2/retrain/REBUILD.md), so every clone stays small as experiments add up."""

import fnmatch
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 1_000_000
SHIPPED_WEIGHTS = "zoo/*/model.safetensors"


def oversized_tracked_files(repo):
    """The files git tracks in ``repo`` (its index) that exceed the limit and are not shipped
    weights, by their size in the index."""
    listed = subprocess.run(["git", "ls-files", "-s", "-z"], cwd=repo, capture_output=True, check=True).stdout
    entries = [line.decode().split("\t", 1) for line in listed.split(b"\0") if line]
    blobs = "".join(f"{meta.split()[1]}\n" for meta, _ in entries)
    sizes = subprocess.run(["git", "cat-file", "--batch-check=%(objectsize)"], cwd=repo, input=blobs.encode(),
                           capture_output=True, check=True).stdout.split()
    return sorted(path for (_, path), size in zip(entries, sizes)
                  if int(size) > LIMIT_BYTES and not fnmatch.fnmatch(path, SHIPPED_WEIGHTS))


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout")
def test_no_tracked_file_over_1mb_outside_the_shipped_drafters():
    found = oversized_tracked_files(REPO)
    assert not found, f"tracked files over 1 MB (rebuild weights from their recipe instead): {found}"


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout")
def test_weights_are_ignored_except_the_shipped_drafters():
    probe = ["data/smollm2/retrain/long/smollm2-mfd/final/model.safetensors", "runs/try/final/model.safetensors",
             "zoo/MFD-SmolLM2-135M/model.safetensors"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *probe], cwd=REPO, capture_output=True, text=True)
    assert ignored.stdout.split() == probe[:2]


def test_the_rule_finds_a_planted_file_and_spares_shipped_weights(tmp_path):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, env=env)
    big = os.urandom(LIMIT_BYTES + 1)
    for name, payload in (("data/run/final/model.safetensors", big), ("zoo/X/model.safetensors", big),
                          ("zoo/X/big.json", big), ("data/small.json", b"{}"), ("data/edge.bin", big[:LIMIT_BYTES])):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(payload)
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True, env=env)
    assert oversized_tracked_files(tmp_path) == ["data/run/final/model.safetensors", "zoo/X/big.json"]
