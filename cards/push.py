"""Publishing a drafter to the Hugging Face Hub (``mfd-hub push``).

The order is the safety argument:

1. ``verify_checkpoint`` and the registry's identity check run first; a checkpoint that fails
   either is refused before any network call. The verdict is kept in the mfd-hub cache keyed by
   the folder's bytes and the versions (``verify_checkpoint_once``): pushing the same bytes again
   (after a dry run, or a failed upload) reuses it. With a target the checks include decoding and
   acceptance, and the key covers the target's files too; a failed acceptance check refuses the
   push unless the owner overrides it, and the card then says so.
2. The card is rendered from the registry (a README.md in the folder is replaced, never sent).
3. The plan: every file's size, sha256 and git blob id, compared with the remote branch (from its
   refs and tree listing) as new / changed / unchanged, plus remote files the folder no longer
   has (deleted, except ``.gitattributes``).
4. The upload is ONE ``create_commit`` (never ``upload_folder``, which in huggingface_hub 2.x
   splits large folders into several commits when Xet is available) with ``parent_commit`` set to
   the head the plan was made against, so a branch that moved in between makes it fail instead of
   silently overwriting. Large files go the client's way (LFS batch + PUT, or Xet when installed)
   before the commit; until the commit lands, the branch is untouched.
5. The release tag is put on the new commit. An unchanged folder makes no commit at all.

The token is the client's (``HF_TOKEN`` or the stored login); it is never printed, and any text
that could carry it is scrubbed.
"""

import hashlib
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mfd_hub.version import __version__
from mfd_hub.errors import MfdHubError, UsageError

CARD_NAME = "README.md"
KEEP_REMOTE = {".gitattributes"}  # the Hub's own file: never deleted by a push
_CHUNK = 8 * 1024 * 1024


@dataclass
class PlannedFile:
    path: str
    size: int
    sha256: str
    git_oid: str  # git blob id: what the Hub lists for a regular (non-LFS) file
    status: str = "new"  # new / changed / unchanged
    source: str = ""  # local file, or "generated card"

    def to_dict(self):
        return {k: v for k, v in asdict(self).items() if k != "git_oid"}


@dataclass
class RemoteState:
    checked: str  # "yes", "offline", "no repository", or "not compared (why)" for a dry run
    exists: bool = False
    head: str | None = None  # head of the branch pushed to (None: branch missing)
    base: str | None = None  # the commit compared with (branch head, else main's)
    branches: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)  # path -> (size, git_oid, sha256 or None)


@dataclass
class PushPlan:
    name: str
    repo_id: str
    revision: str
    tag: str
    folder: str
    files: list
    deleted: list
    remote: RemoteState
    verification: str = "checked"  # or "reused": the same bytes passed under the same versions before
    acceptance_override: str | None = None  # the failed acceptance check published anyway

    @property
    def changed(self):
        return [f for f in self.files if f.status != "unchanged"]

    @property
    def has_changes(self):
        return bool(self.changed or self.deleted)

    def tag_problem(self):
        """Why the release tag cannot be put where this push would put it (None: it can)."""
        at = self.remote.tags.get(self.tag)
        if at is None:
            return None
        if self.has_changes:
            return f"tag {self.tag} already marks commit {at[:12]}; pass --tag to name the new version"
        if at != self.remote.head:
            return f"tag {self.tag} marks commit {at[:12]}, not the head {str(self.remote.head)[:12]} of {self.revision}"
        return None

    def to_dict(self):
        return {
            "name": self.name,
            "repo_id": self.repo_id,
            "revision": self.revision,
            "tag": self.tag,
            "folder": self.folder,
            "verification": self.verification,
            "acceptance_override": self.acceptance_override,
            "remote": {"checked": self.remote.checked, "exists": self.remote.exists, "head": self.remote.head},
            "files": [f.to_dict() for f in self.files],
            "deleted": list(self.deleted),
            "changes": len(self.changed) + len(self.deleted),
            "total_bytes": sum(f.size for f in self.files),
            "upload_bytes": sum(f.size for f in self.changed),
        }


def _hash(read_chunks, size):
    sha = hashlib.sha256()
    git = hashlib.sha1(b"blob %d\0" % size)
    for chunk in read_chunks:
        sha.update(chunk)
        git.update(chunk)
    return sha.hexdigest(), git.hexdigest()


def collect_files(folder, card_text):
    """(path_in_repo, local Path or bytes) for every file to publish, sorted; the card replaces
    any README.md. Hidden files and folders and __pycache__ stay behind."""
    entries = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts) or not path.is_file():
            continue
        name = rel.as_posix()
        if name != CARD_NAME:
            entries.append((name, path))
    entries.append((CARD_NAME, card_text.encode("utf-8")))
    return sorted(entries, key=lambda e: e[0])


def hash_entries(entries, progress=True):
    """PlannedFile per entry (sha256 and git blob id in one read)."""
    from tqdm import tqdm

    total = sum(len(src) if isinstance(src, bytes) else src.stat().st_size for _, src in entries)
    planned = []
    with tqdm(total=total, unit="B", unit_scale=True, desc="hashing", disable=not progress or total < 64 << 20,
              leave=False) as bar:
        for name, src in entries:
            if isinstance(src, bytes):
                sha, git = _hash([src], len(src))
                planned.append(PlannedFile(name, len(src), sha, git, source="generated card"))
                continue
            size = src.stat().st_size

            def chunks(handle):
                while block := handle.read(_CHUNK):
                    bar.update(len(block))
                    yield block

            with open(src, "rb") as handle:
                sha, git = _hash(chunks(handle), size)
            planned.append(PlannedFile(name, size, sha, git, source=str(src)))
    return planned


def remote_state(api, repo_id, revision):
    """The remote repository as the plan needs it: refs, and the file list of the branch (or of
    main when the branch does not exist yet)."""
    from huggingface_hub.errors import RepositoryNotFoundError
    from huggingface_hub.hf_api import RepoFile

    try:
        refs = api.list_repo_refs(repo_id)
    except RepositoryNotFoundError:
        return RemoteState(checked="no repository")
    branches = {b.name: b.target_commit for b in refs.branches}
    tags = {t.name: t.target_commit for t in refs.tags}
    head = branches.get(revision)
    base = head or branches.get("main")
    files = {}
    if base:
        for entry in api.list_repo_tree(repo_id, revision=base, recursive=True):
            if isinstance(entry, RepoFile):
                files[entry.path] = (entry.size, entry.blob_id, entry.lfs.sha256 if entry.lfs else None)
    return RemoteState(checked="yes", exists=True, head=head, base=base, branches=branches, tags=tags, files=files)


def compare(planned, state):
    """Mark each planned file new / changed / unchanged; return the remote paths to delete."""
    for item in planned:
        remote = state.files.get(item.path)
        if remote is None:
            item.status = "new"
        else:
            size, git_oid, sha256 = remote
            same = (sha256 == item.sha256) if sha256 else (git_oid == item.git_oid)
            item.status = "unchanged" if same and size == item.size else "changed"
    local = {item.path for item in planned}
    return sorted(p for p in state.files if p not in local and p not in KEEP_REMOTE)


def _scrub(text, token):
    text = " ".join(str(text).split())
    return text.replace(token, "***") if token else text


def _first_line(err):
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else type(err).__name__
    server = getattr(err, "server_message", None)
    if server and server.strip() not in text:
        text += f": {server.strip()}"
    return text.rstrip(".")


def _hub_error(err, what, token):
    """One line for a failed Hub call (with the root cause the client wrapped), without the token."""
    detail, cause = _first_line(err), err.__cause__ or err.__context__
    while cause is not None and cause.__cause__ is not None:
        cause = cause.__cause__
    if cause is not None and _first_line(cause) not in detail:
        detail += f" ({_first_line(cause)})"
    return MfdHubError(_scrub(f"{what} failed: {detail}", token))


def check_checkpoint(drafter, folder, target=None, ignore_acceptance=False):
    """Refuse, before anything touches the network, a checkpoint that is unsound or is not the
    drafter the registry describes -> ("checked" or "reused", the failed acceptance check's reason
    when ``ignore_acceptance`` let it through, else None)."""
    from mfd_hub.describe import checkpoint_config
    from mfd_hub.verify import verify_checkpoint_once

    report, reused = verify_checkpoint_once(folder, target=target)
    override = None
    acceptance = [c for c in report.failures() if c.name == "acceptance"]
    if acceptance and len(report.failures()) == 1:
        if not ignore_acceptance:
            raise MfdHubError(f"{folder} fails the acceptance check, not pushing: {acceptance[0].reason} "
                              f"(--ignore-acceptance publishes it anyway, and the card says so)")
        override = acceptance[0].reason
    elif not report.ok:
        first = report.failures()[0]
        more = len(report.failures()) - 1
        extra = f" (and {more} more; see 'mfd-hub verify {folder}')" if more else ""
        raise MfdHubError(f"{folder} fails verification, not pushing: {first.name}: {first.reason}{extra}")
    _, config = checkpoint_config(folder)
    problems = drafter.mismatches(config)
    if problems:
        raise MfdHubError(f"{folder} is not {drafter.name} as the registry describes it: " + "; ".join(problems))
    return ("reused" if reused else "checked"), override


def plan_push(name, path=None, repo_id=None, revision="main", tag=None, offline=None, dry_run=False, progress=True,
              registry=None, target=None, ignore_acceptance=False):
    """Check the checkpoint, render the card and build the plan. Network: read-only calls (refs,
    tree) unless ``offline`` (default: huggingface_hub's offline mode), and none before the
    checks; a dry run that cannot read the remote plans every file as new. ``target``: verify
    against it too (decoding and acceptance); ``ignore_acceptance``: publish a drafter whose
    acceptance check fails, saying so on the card. Returns (plan, entries, api or None)."""
    from huggingface_hub import HfApi, constants, get_token

    from mfd_hub.cards.model_card import render_card
    from mfd_hub.cards.registry import load_registry
    from mfd_hub.checkpoint_config import refuse_released
    from mfd_hub.locate import resolve_drafter

    registry = registry or load_registry()
    drafter = registry.get(name)
    if path:
        folder = resolve_drafter(path)  # a folder, a Hub repo id or a shipped drafter's name
    else:
        folder = Path(name)
        if not folder.is_dir():
            raise UsageError(f"{folder} is not a checkpoint folder (pass --path)")
    refuse_released(folder, path or name)  # before verify, which would only name the failed check
    repo_id = repo_id or drafter.repo_id
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise UsageError(f"--repo-id must be owner/name, not {repo_id!r}")
    verification, override = check_checkpoint(drafter, folder, target=target, ignore_acceptance=ignore_acceptance)
    card = render_card(drafter, path=folder, repo_id=repo_id, registry=registry, acceptance_override=override)
    entries = collect_files(folder, card)
    planned = hash_entries(entries, progress=progress)
    offline = constants.is_offline_mode() if offline is None else offline
    api = None
    if offline:
        state = RemoteState(checked="offline")
    else:
        api = HfApi()
        try:
            state = remote_state(api, repo_id, revision)
        except Exception as err:  # unreachable, refused, malformed: one line, no token
            error = _hub_error(err, "reading the remote repository", get_token())
            if not dry_run:
                raise error from None
            state = RemoteState(checked=f"not compared ({error}): every file counts as new")
    deleted = compare(planned, state)
    plan = PushPlan(name=drafter.name, repo_id=repo_id, revision=revision, tag=tag or drafter.release,
                    folder=str(folder), files=planned, deleted=deleted, remote=state, verification=verification,
                    acceptance_override=override)
    return plan, entries, api


def execute(plan, entries, api, private=False):
    """Carry out a plan made by ``plan_push`` against a reachable remote: create the repository
    and branch if needed, make the one commit, tag it. Returns a result dict."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, get_token
    from huggingface_hub.utils import disable_progress_bars

    token = get_token()
    if not sys.stderr.isatty():  # per-file upload bars only where someone watches them
        disable_progress_bars()
    problem = plan.tag_problem()
    if problem:
        raise MfdHubError(problem + " (nothing was uploaded)")
    result = {"commit": None, "commit_url": None, "created_repo": False, "created_branch": False, "tag_created": False}
    try:
        stage = "creating the repository"
        if not plan.remote.exists:
            api.create_repo(plan.repo_id, private=private, exist_ok=True)
            result["created_repo"] = True
            fresh = remote_state(api, plan.repo_id, plan.revision)
            plan.deleted = compare(plan.files, fresh)
            plan.remote = fresh
        stage = f"creating branch {plan.revision}"
        if plan.remote.head is None:
            api.create_branch(plan.repo_id, branch=plan.revision, revision=plan.remote.base)
            result["created_branch"] = True
            plan.remote.head = plan.remote.base
        head = plan.remote.head
        if plan.has_changes:
            stage = "uploading"
            sources = dict(entries)
            operations = []
            for item in plan.changed:
                op = CommitOperationAdd(path_in_repo=item.path, path_or_fileobj=sources[item.path])
                op.upload_info.sha256 = bytes.fromhex(item.sha256)  # hashed once, for the plan
                operations.append(op)
            operations += [CommitOperationDelete(path_in_repo=p) for p in plan.deleted]
            info = api.create_commit(
                plan.repo_id, operations, revision=plan.revision, parent_commit=head,
                commit_message=f"Publish {plan.name} {plan.tag} (mfd-hub {__version__})",
                commit_description=f"{len(plan.changed)} file(s) added or changed, {len(plan.deleted)} deleted, "
                f"by mfd-hub push.",
            )
            head = info.oid
            result["commit"], result["commit_url"] = info.oid, info.commit_url
        if plan.remote.tags.get(plan.tag) != head:
            stage = f"tagging {plan.tag}"
            api.create_tag(plan.repo_id, tag=plan.tag, revision=head, tag_message=f"{plan.name} {plan.tag}")
            result["tag_created"] = True
    except Exception as err:  # any client or connection failure: one line, no token
        error = _hub_error(err, stage, token)
        if stage == "uploading":
            error = MfdHubError(f"{error}. The commit is all-or-nothing, so {plan.revision} holds either all of it "
                                "or none; push again to finish (an unchanged folder makes no commit)")
        raise error from None
    result["head"] = head
    return result
