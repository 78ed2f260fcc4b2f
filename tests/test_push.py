"""`mfd-hub push` end to end: the real huggingface_hub client (Xet off, its own switch
HF_HUB_DISABLE_XET=1) against tests/fake_hub.py, a test double of the Hub's upload protocol run as
its own process on 127.0.0.1. Checkpoints are tiny real drafters saved by mfd_hub.save_draft with
the identity the registry gives MFD-Qwen3-8B."""

import hashlib
import json
import selectors
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from conftest import run_cli
from mfd_hub.cards.model_card import render_card
from mfd_hub.cards.registry import load_registry
from test_cards import registry_checkpoint

NAME = "MFD-Qwen3-8B"
REPO = "me/MFD-Qwen3-8B"
TOKEN = "hf_fake_secret_0123456789"
FAKE_HUB = Path(__file__).with_name("fake_hub.py")


class FakeHub:
    """Starts, stops and inspects tests/fake_hub.py over one state folder."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.folder.mkdir(exist_ok=True)
        self.process = None
        self.url = None

    def start(self, *faults):
        self.stop()
        self.process = subprocess.Popen(
            [sys.executable, str(FAKE_HUB), "--state", str(self.folder), "--token", TOKEN, "--idle", "300", *faults],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=60), "the fake hub did not start"
        line = self.process.stdout.readline()
        assert line.startswith("READY "), line
        self.url = f"http://127.0.0.1:{line.split()[1]}"
        return self

    def stop(self):
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None

    def requests(self):
        log = self.folder / "requests.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def clear_log(self):
        (self.folder / "requests.jsonl").unlink(missing_ok=True)

    def repo(self, repo_id=REPO):
        return json.loads((self.folder / "state.json").read_text())["repos"][repo_id]

    def files(self, ref="main", repo_id=REPO):
        """path -> bytes at a branch, tag or commit, read from the server's own storage."""
        repo = self.repo(repo_id)
        sha = repo["branches"].get(ref) or repo["tags"].get(ref) or ref
        return {path: (self.folder / "blobs" / meta["sha256"]).read_bytes()
                for path, meta in repo["commits"][sha]["files"].items()}


@pytest.fixture
def hub(tmp_path):
    server = FakeHub(tmp_path / "hub").start()
    yield server
    server.stop()


# The requests a first push makes (huggingface_hub 2.4, Xet off); LFS PUT + verify pairs run on
# the client's threads, so they are folded into one step.
PUSH_TO_A_NEW_REPO = [
    "GET refs 404", "POST create", "GET refs", "GET tree", "POST validate-yaml", "POST preupload",
    "POST lfs-batch", "lfs-upload", "POST commit", "POST tag",
]


def steps(log):
    """The request log as named steps (the client's telemetry fetch left out)."""
    named = []
    for r in log:
        path = r["path"]
        if path == "/api/agent-harnesses":
            continue
        if path.startswith("/lfs-storage/") or path.endswith("/objects/verify"):
            name = "lfs-upload"
        elif path.endswith("/objects/batch"):
            name = f"{r['method']} lfs-batch"
        elif path in ("/api/repos/create", "/api/validate-yaml"):
            name = f"{r['method']} {path.rsplit('/', 1)[1]}"
        else:  # /api/models/{owner}/{name}/{endpoint}[/{rev}]
            name = f"{r['method']} {path.split('/')[5]}"
        if r["status"] >= 400:
            name += f" {r['status']}"
        if not (named and named[-1] == name == "lfs-upload"):
            named.append(name)
    return named


def push(hub, tmp_path, *args, token=True, offline=False):
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "1" if offline else "0",
           "HF_HUB_DISABLE_TELEMETRY": "1", "MFD_HUB_CACHE": str(tmp_path / "mfd-hub-cache")}  # verdicts: this test's
    if token:
        env["HF_TOKEN"] = TOKEN
    result = run_cli(["push", NAME, "--repo-id", REPO, *args], tmp_path, extra_env=env)
    assert TOKEN not in result.stdout + result.stderr  # the token is never printed
    return result


def ok_json(result):
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def one_error_line(result):
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(("model", "Upload"))]
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    return lines[0]


def local_files(folder, card):
    files = {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}
    files["README.md"] = card.encode()
    return files


@pytest.fixture(scope="module")
def drafter():
    return load_registry().get(NAME)


def test_push_lands_the_folder_then_a_second_push_is_a_no_op(hub, tmp_path, drafter):
    folder = registry_checkpoint(tmp_path / "ck", drafter, max_shard_size="40KB")  # several LFS objects
    card = render_card(drafter, path=folder, repo_id=REPO)
    want = local_files(folder, card)

    # Offline dry run: the exact plan, no request at all.
    plan = ok_json(push(hub, tmp_path, "--path", str(folder), "--dry-run", "--json", offline=True))["plan"]
    assert hub.requests() == []
    assert plan["remote"]["checked"] == "offline" and plan["deleted"] == [] and plan["verification"] == "checked"
    assert {f["path"]: (f["size"], f["sha256"], f["status"]) for f in plan["files"]} == {
        p: (len(b), hashlib.sha256(b).hexdigest(), "new") for p, b in want.items()}
    assert sum(p.endswith(".safetensors") for p in want) >= 2

    # The push: one commit holding every file byte for byte, tagged.
    out = ok_json(push(hub, tmp_path, "--path", str(folder), "--json"))
    assert out["plan"]["verification"] == "reused"  # the same bytes the dry run verified
    repo = hub.repo()
    assert out["result"]["commit"] == repo["branches"]["main"] == repo["tags"]["v1.0"]
    assert len(repo["commits"]) == 2  # the Hub's initial commit + ours
    files = hub.files("main")
    assert files.pop(".gitattributes") and files == want
    meta = repo["commits"][repo["branches"]["main"]]["files"]
    assert all(meta[p]["lfs"] == p.endswith(".safetensors") for p in want)  # weights went through LFS
    assert steps(hub.requests()) == PUSH_TO_A_NEW_REPO
    puts = [r for r in hub.requests() if r["method"] == "PUT"]
    assert len(puts) == sum(p.endswith(".safetensors") for p in want) and all(r["status"] == 200 for r in puts)

    # Again, unchanged: reads only, no commit, no new tag.
    hub.clear_log()
    again = ok_json(push(hub, tmp_path, "--path", str(folder), "--json"))
    assert again["result"]["commit"] is None and again["plan"]["changes"] == 0
    assert {r["method"] for r in hub.requests()} == {"GET"}
    assert hub.repo() == repo

    # A dry run against the reachable remote: all unchanged, read-only.
    hub.clear_log()
    plan = ok_json(push(hub, tmp_path, "--path", str(folder), "--dry-run", "--json"))["plan"]
    assert {f["status"] for f in plan["files"]} == {"unchanged"} and plan["remote"]["checked"] == "yes"
    assert {r["method"] for r in hub.requests()} == {"GET"}


def test_a_changed_folder_commits_only_its_changes_under_a_new_tag(hub, tmp_path, drafter):
    folder = registry_checkpoint(tmp_path / "ck", drafter, max_shard_size="40KB")
    ok_json(push(hub, tmp_path, "--path", str(folder), "--json"))
    first = hub.repo()["branches"]["main"]
    # Other weights, saved unsharded: one new weights file, the shards and their index go.
    registry_checkpoint(folder, drafter, seed=2, overwrite=True)

    plan = ok_json(push(hub, tmp_path, "--path", str(folder), "--dry-run", "--json"))["plan"]
    assert plan["verification"] == "checked"  # other bytes: verified afresh
    status = {f["path"]: f["status"] for f in plan["files"]}
    assert status["model.safetensors"] == "new" and status["README.md"] == "unchanged"
    assert status["config.json"] == "unchanged" and {s for p, s in status.items() if p.endswith(".py")} == {"unchanged"}
    assert sorted(plan["deleted"]) == sorted(p for p in hub.files(first) if p.startswith("model-") or p.endswith(".index.json"))

    hub.clear_log()
    refused = push(hub, tmp_path, "--path", str(folder))  # the v1.0 tag already names the first commit
    assert "tag v1.0 already marks commit" in one_error_line(refused)
    assert {r["method"] for r in hub.requests()} == {"GET"} and hub.repo()["branches"]["main"] == first

    # The token from the stored login this time (HF_HOME/token), not HF_TOKEN.
    (tmp_path / "hf_home").mkdir(exist_ok=True)
    (tmp_path / "hf_home" / "token").write_text(TOKEN)
    out = ok_json(push(hub, tmp_path, "--path", str(folder), "--tag", "v1.1", "--json", token=False))
    repo = hub.repo()
    second = repo["branches"]["main"]
    assert out["result"]["commit"] == second and repo["commits"][second]["parent"] == first
    assert repo["tags"] == {"v1.0": first, "v1.1": second}
    before, after = hub.files(first), hub.files(second)
    assert after == {".gitattributes": before[".gitattributes"], **local_files(folder, render_card(drafter, path=folder, repo_id=REPO))}
    assert [p for p in after if before.get(p) != after[p]] == ["model.safetensors"]

    # To a branch that does not exist yet: made from main, committed to, main untouched.
    registry_checkpoint(folder, drafter, seed=4, overwrite=True)
    out = ok_json(push(hub, tmp_path, "--path", str(folder), "--revision", "dev", "--tag", "v2.0-rc", "--json"))
    repo = hub.repo()
    assert out["result"]["created_branch"] and repo["branches"]["main"] == second
    assert repo["commits"][repo["branches"]["dev"]]["parent"] == second == repo["tags"]["v1.1"]
    assert hub.files("v2.0-rc")["model.safetensors"] == (folder / "model.safetensors").read_bytes()


def test_a_failing_checkpoint_is_refused_before_any_request(hub, tmp_path, drafter):
    broken = registry_checkpoint(tmp_path / "nan", drafter)
    weights = load_file(broken / "model.safetensors")
    weights["fc.weight"][0, 0] = float("nan")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    wrong_k = registry_checkpoint(tmp_path / "k4", drafter, num_modes=4)
    good = registry_checkpoint(tmp_path / "good", drafter)
    for result, says in (
        (push(hub, tmp_path, "--path", str(broken)), "fails verification"),
        (push(hub, tmp_path, "--path", str(broken), "--dry-run"), "fails verification"),
        (push(hub, tmp_path, "--path", str(wrong_k)), "num_modes is 4, the registry says 8"),
        (push(hub, tmp_path, "--path", str(good), token=False), "no Hugging Face token"),
        (push(hub, tmp_path, "--path", str(tmp_path / "missing")), "is not a checkpoint folder"),
    ):
        assert says in one_error_line(result)
    assert hub.requests() == []  # the server saw nothing at all


def test_an_interrupted_upload_leaves_main_unchanged(hub, tmp_path, drafter):
    folder = registry_checkpoint(tmp_path / "ck", drafter)
    # A new repository whose first upload fails at an LFS PUT: main keeps only the Hub's own file.
    hub.start("--fail-lfs-put")
    failed = push(hub, tmp_path, "--path", str(folder))
    assert "all-or-nothing" in one_error_line(failed)
    repo = hub.repo()
    assert set(hub.files("main")) == {".gitattributes"} and repo["tags"] == {}
    assert not any("/commit/" in r["path"] for r in hub.requests())

    hub.start()
    ok_json(push(hub, tmp_path, "--path", str(folder), "--json"))
    published = hub.repo()["branches"]["main"]
    registry_checkpoint(folder, drafter, seed=3, overwrite=True)

    # The server dies when the commit arrives: the client fails, main is the old commit.
    hub.start("--die-before-commit")
    hub.clear_log()
    died = push(hub, tmp_path, "--path", str(folder), "--tag", "v1.1")
    one_error_line(died)
    assert hub.process.wait(timeout=30) == 3 and any("/commit/" in r["path"] for r in hub.requests())
    hub.start()
    repo = hub.repo()
    assert repo["branches"]["main"] == published and repo["tags"] == {"v1.0": published}

    # Pushing again finishes the job (the uploaded LFS object is not sent twice).
    hub.clear_log()
    ok_json(push(hub, tmp_path, "--path", str(folder), "--tag", "v1.1", "--json"))
    assert not any(r["method"] == "PUT" for r in hub.requests())
    files = hub.files("v1.1")
    files.pop(".gitattributes")
    assert files == local_files(folder, render_card(drafter, path=folder, repo_id=REPO))
