"""A TEST DOUBLE of the Hugging Face Hub's HTTP upload protocol, for end-to-end tests of
`mfd-hub push` with the real huggingface_hub client. Not the Hub; never used outside tests.

It answers the endpoints huggingface_hub 2.x calls to create a repository and commit to it when
Xet is off (HF_HUB_DISABLE_XET=1), in the shapes the client parses (hf_api.py, _commit_api.py,
lfs.py):

  GET  /api/agent-harnesses                            the client's telemetry registry (answered empty)
  POST /api/repos/create                               create (409 if it exists), initial commit
  GET  /api/models/{repo}/refs                         branches and tags
  GET  /api/models/{repo}/tree/{rev}[/{path}]          file list (git blob ids, LFS sha256)
  GET  /api/models/{repo}[/revision/{rev}]             model info (sha, siblings)
  POST /api/validate-yaml                              README metadata check
  POST /api/models/{repo}/preupload/{rev}              upload mode per file (lfs / regular) + oid
  POST /{repo}.git/info/lfs/objects/batch              LFS batch: upload actions for new objects
  PUT  /lfs-storage/{oid}                              the "presigned" upload URL (checks sha256)
  POST /{repo}.git/info/lfs/objects/verify             LFS verify
  POST /api/models/{repo}/commit/{rev}                 NDJSON commit (header, file, lfsFile, deleted*)
  POST /api/models/{repo}/branch/{branch}              create a branch
  POST /api/models/{repo}/tag/{rev}                    create a tag

A commit is applied all at once: every lfsFile must name an uploaded object, parentCommit must be
the branch head, and the new state is written with one rename. State lives in a folder
(state.json + blobs/ by sha256) so a test can kill the server and start another on the same
state. Every request is appended to requests.jsonl. Faults for tests: --fail-lfs-put (answer
every upload PUT with 403, as an expired presigned URL would) and --die-before-commit (exit
without answering when the commit request arrives).

Runs on 127.0.0.1 only, one request at a time, and stops by itself after --max-requests requests
or --idle seconds without one. Prints "READY <port>" when listening.

    python tests/fake_hub.py --state DIR --token hf_test [--port 0] [--fail-lfs-put] [--die-before-commit]
"""

import argparse
import base64
import fnmatch
import hashlib
import json
import os
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

LFS_THRESHOLD = 10 * 1024 * 1024  # larger files go to LFS whatever their name
GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.h5", "*.onnx", "*.msgpack",
                    "*.npy", "*.npz", "*.zip", "*.tar.gz", "*.parquet", "*.arrow")
)
REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256, size):
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class State:
    """repos -> {private, branches, tags, commits: {sha: {parent, message, files}}}; files map a
    path to {sha256, size, lfs}. Blobs (regular and LFS) live in blobs/<sha256>."""

    def __init__(self, folder):
        self.folder = folder
        self.blobs = os.path.join(folder, "blobs")
        os.makedirs(self.blobs, exist_ok=True)
        path = os.path.join(folder, "state.json")
        self.data = json.load(open(path)) if os.path.exists(path) else {"repos": {}, "counter": 0}

    def save(self):
        tmp = os.path.join(self.folder, "state.json.tmp")
        with open(tmp, "w") as handle:
            json.dump(self.data, handle, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(self.folder, "state.json"))  # the one atomic step of a change

    def has_blob(self, sha256):
        return os.path.exists(os.path.join(self.blobs, sha256))

    def read_blob(self, sha256):
        with open(os.path.join(self.blobs, sha256), "rb") as handle:
            return handle.read()

    def write_blob(self, data):
        sha = hashlib.sha256(data).hexdigest()
        if not self.has_blob(sha):
            tmp = os.path.join(self.blobs, f".{sha}.tmp")
            with open(tmp, "wb") as handle:
                handle.write(data)
            os.replace(tmp, os.path.join(self.blobs, sha))
        return sha

    def new_commit(self, repo, parent, message, files):
        self.data["counter"] += 1
        body = json.dumps([parent, message, files, self.data["counter"]], sort_keys=True).encode()
        sha = hashlib.sha1(body).hexdigest()
        repo["commits"][sha] = {"parent": parent, "message": message, "files": files}
        return sha


class HttpError(Exception):
    def __init__(self, status, message, code=None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class Handler(BaseHTTPRequestHandler):
    server_version = "FakeHub/1"

    def log_message(self, *args):  # the request log is requests.jsonl
        pass

    # -- plumbing ---------------------------------------------------------------------------
    def _body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status, payload=None, headers=None):
        body = json.dumps(payload if payload is not None else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
        return status

    def _authorized(self):
        return self.headers.get("Authorization") == f"Bearer {self.server.token}"

    def _repo(self, repo_id, write=False):
        repo = self.server.state.data["repos"].get(repo_id)
        if repo is None or (repo["private"] and not self._authorized()):
            raise HttpError(404, "Repository not found", "RepoNotFound")
        if write and not self._authorized():
            raise HttpError(401, "Invalid credentials in Authorization header")
        return repo

    def _resolve(self, repo, rev):
        rev = unquote(rev)
        sha = repo["branches"].get(rev) or repo["tags"].get(rev) or (rev if rev in repo["commits"] else None)
        if sha is None:
            raise HttpError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return sha

    def _dispatch(self, method):
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        for verb, pattern, handler in ROUTES:
            match = re.fullmatch(pattern, url.path)
            if verb == method and match:
                return handler(self, **match.groupdict())
        raise HttpError(404, f"{method} {url.path} is not implemented by the fake hub", "FakeHubUnknownEndpoint")

    def _handle(self, method):
        self.server.handled += 1
        status = 500
        try:
            status = self._dispatch(method)
        except HttpError as err:
            headers = {"X-Error-Message": err.message}
            if err.code:
                headers["X-Error-Code"] = err.code
            status = self._send(err.status, {"error": err.message}, headers)
        finally:
            self._log(method, status)

    def _log(self, method, status):
        with open(os.path.join(self.server.state.folder, "requests.jsonl"), "a") as log:
            log.write(json.dumps({"method": method, "path": urlsplit(self.path).path, "status": status}) + "\n")

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    # -- endpoints ----------------------------------------------------------------------------
    def agent_harnesses(self):
        return self._send(200, {"standardEnvVars": [], "harnesses": {}})

    def create_repo(self):
        if not self._authorized():
            raise HttpError(401, "Invalid credentials in Authorization header")
        payload = json.loads(self._body() or b"{}")
        if payload.get("type", "model") != "model":
            raise HttpError(400, "the fake hub only hosts model repositories")
        repo_id = f"{payload.get('organization') or 'user'}/{payload['name']}"
        state = self.server.state
        if repo_id in state.data["repos"]:
            raise HttpError(409, "You already created this model repo")
        repo = {"private": payload.get("visibility") == "private" or bool(payload.get("private")),
                "branches": {}, "tags": {}, "commits": {}}
        sha = state.write_blob(GITATTRIBUTES.encode())
        files = {".gitattributes": {"sha256": sha, "size": len(GITATTRIBUTES), "lfs": False}}
        repo["branches"]["main"] = state.new_commit(repo, None, "initial commit", files)
        state.data["repos"][repo_id] = repo
        state.save()
        return self._send(200, {"url": f"{self.server.base}/{repo_id}", "name": repo_id, "id": repo_id})

    def refs(self, repo):
        data = self._repo(repo)
        return self._send(200, {
            "branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": s} for n, s in data["branches"].items()],
            "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": s} for n, s in data["tags"].items()],
            "converts": [],
        })

    def _entry(self, path, meta):
        if not meta["lfs"]:
            return {"type": "file", "path": path, "size": meta["size"],
                    "oid": git_blob_id(self.server.state.read_blob(meta["sha256"]))}
        pointer = lfs_pointer(meta["sha256"], meta["size"])
        return {"type": "file", "path": path, "size": meta["size"], "oid": git_blob_id(pointer),
                "lfs": {"oid": meta["sha256"], "size": meta["size"], "pointerSize": len(pointer)}}

    def tree(self, repo, rev, path=None):
        data = self._repo(repo)
        files = data["commits"][self._resolve(data, rev)]["files"]
        prefix = unquote(path).strip("/") + "/" if path else ""
        recursive = self.query.get("recursive", ["false"])[0].lower() in ("1", "true")
        entries, folders = [], set()
        for name in sorted(files):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):].split("/")
            for depth in range(1, len(rest)):
                folders.add(prefix + "/".join(rest[:depth]))
            if recursive or len(rest) == 1:
                entries.append(self._entry(name, files[name]))
        for folder in sorted(folders):
            if recursive or "/" not in folder[len(prefix):]:
                entries.append({"type": "directory", "path": folder, "size": 0, "oid": "0" * 40})
        if path and not entries:
            raise HttpError(404, f"{prefix} does not exist", "EntryNotFound")
        return self._send(200, entries)

    def model_info(self, repo, rev="main"):
        data = self._repo(repo)
        sha = self._resolve(data, rev)
        return self._send(200, {"id": repo, "modelId": repo, "sha": sha, "private": data["private"],
                                "siblings": [{"rfilename": n} for n in sorted(data["commits"][sha]["files"])]})

    def validate_yaml(self):
        import yaml

        content = json.loads(self._body())["content"]
        errors = []
        if content.startswith("---\n"):
            try:
                meta = yaml.safe_load(content.split("\n---", 1)[0][4:])
                if not isinstance(meta, dict):
                    errors.append({"message": "metadata must be a mapping"})
            except yaml.YAMLError as err:
                errors.append({"message": f"invalid YAML: {err}"})
        if errors:
            return self._send(400, {"errors": errors, "warnings": []})
        return self._send(200, {"errors": [], "warnings": []})

    def preupload(self, repo, rev):
        data = self._repo(repo, write=True)
        files = data["commits"][self._resolve(data, rev)]["files"]
        attributes = self.server.state.read_blob(files[".gitattributes"]["sha256"]).decode() if ".gitattributes" in files else ""
        patterns = [line.split()[0] for line in attributes.splitlines() if "filter=lfs" in line]
        answer = []
        for item in json.loads(self._body())["files"]:
            name, size = item["path"], item["size"]
            sample = base64.b64decode(item["sample"])
            lfs = (size >= LFS_THRESHOLD or b"\0" in sample
                   or any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(name.rsplit("/", 1)[-1], p) for p in patterns))
            old = files.get(name)
            oid = None
            if old is not None:  # the client compares this with its own oid to skip unchanged files
                oid = old["sha256"] if old["lfs"] else git_blob_id(self.server.state.read_blob(old["sha256"]))
            answer.append({"path": name, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
        return self._send(200, {"files": answer})

    def lfs_batch(self, repo):
        self._repo(repo, write=True)
        payload = json.loads(self._body())
        if payload.get("operation") != "upload":
            raise HttpError(400, "the fake hub only supports LFS uploads")
        objects = []
        for obj in payload["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if not self.server.state.has_blob(obj["oid"]):  # already stored: no action, the client skips it
                entry["actions"] = {
                    "upload": {"href": f"{self.server.base}/lfs-storage/{obj['oid']}?size={obj['size']}", "header": {}},
                    "verify": {"href": f"{self.server.base}/{repo}.git/info/lfs/objects/verify", "header": {}},
                }
            objects.append(entry)
        return self._send(200, {"transfer": "basic", "objects": objects})

    def lfs_put(self, oid):
        data = self._body()
        if self.server.fail_lfs_put:
            raise HttpError(403, "Request has expired (fault injected by the fake hub)")
        if hashlib.sha256(data).hexdigest() != oid or str(len(data)) != self.query.get("size", [""])[0]:
            raise HttpError(400, "uploaded content does not match its oid and size")
        self.server.state.write_blob(data)
        self.send_response(200)
        self.send_header("ETag", f'"{oid}"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return 200

    def lfs_verify(self, repo):
        self._repo(repo, write=True)
        payload = json.loads(self._body())
        if not self.server.state.has_blob(payload["oid"]):
            raise HttpError(404, f"object {payload['oid']} was never uploaded")
        return self._send(200, {})

    def commit(self, repo, rev):
        data = self._repo(repo, write=True)
        body = self._body()
        if self.server.die_before_commit:
            self._log("POST", 0)  # logged as unanswered
            os._exit(3)  # the connection drops; nothing of the commit is applied
        branch = unquote(rev)
        if branch not in data["branches"]:
            raise HttpError(404, f"branch {branch} does not exist", "RevisionNotFound")
        head = data["branches"][branch]
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HttpError(400, "the commit payload must start with a header line")
        header = lines[0]["value"]
        parent = header.get("parentCommit")
        if parent and not head.startswith(parent):
            raise HttpError(412, "A commit has happened since. Please refresh and try again.")
        state = self.server.state
        files = dict(data["commits"][head]["files"])
        staged = []  # regular contents are stored only once the whole commit checks out
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            if key == "file":
                content = base64.b64decode(value["content"])
                staged.append(content)
                files[value["path"]] = {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content), "lfs": False}
            elif key == "lfsFile":
                if not state.has_blob(value["oid"]):
                    raise HttpError(422, f"LFS object {value['oid']} for {value['path']} was not uploaded")
                size = len(state.read_blob(value["oid"]))
                if value.get("size") not in (None, size):
                    raise HttpError(422, f"LFS object {value['oid']} has {size} bytes, not {value['size']}")
                files[value["path"]] = {"sha256": value["oid"], "size": size, "lfs": True}
            elif key == "deletedFile":
                if files.pop(value["path"], None) is None:
                    raise HttpError(404, f"A file with this name doesn't exist: {value['path']}", "EntryNotFound")
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                files = {k: v for k, v in files.items() if not k.startswith(prefix)}
            else:
                raise HttpError(400, f"unknown commit operation {key!r}")
        for content in staged:
            state.write_blob(content)
        sha = state.new_commit(data, head, header.get("summary", ""), files)
        data["branches"][branch] = sha
        state.save()
        return self._send(200, {"commitUrl": f"{self.server.base}/{repo}/commit/{sha}", "commitOid": sha,
                                "success": True, "hookOutput": "", "pullRequestUrl": None})

    def create_branch(self, repo, branch):
        data = self._repo(repo, write=True)
        branch = unquote(branch)
        if branch in data["branches"]:
            raise HttpError(409, f"Branch {branch} already exists")
        payload = json.loads(self._body() or b"{}")
        data["branches"][branch] = self._resolve(data, payload.get("startingPoint") or "main")
        self.server.state.save()
        return self._send(200, {})

    def create_tag(self, repo, rev):
        data = self._repo(repo, write=True)
        payload = json.loads(self._body())
        if payload["tag"] in data["tags"]:
            raise HttpError(409, f"Tag {payload['tag']} already exists")
        data["tags"][payload["tag"]] = self._resolve(data, rev)
        self.server.state.save()
        return self._send(200, {})


class Server(HTTPServer):
    request_queue_size = 64  # the client uploads with several threads; one request is served at a time


ROUTES = [
    ("GET", r"/api/agent-harnesses", Handler.agent_harnesses),
    ("POST", r"/api/repos/create", Handler.create_repo),
    ("POST", r"/api/validate-yaml", Handler.validate_yaml),
    ("GET", rf"/api/models/{REPO}/refs", Handler.refs),
    ("GET", rf"/api/models/{REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?", Handler.tree),
    ("GET", rf"/api/models/{REPO}/revision/(?P<rev>[^/]+)", Handler.model_info),
    ("GET", rf"/api/models/{REPO}", Handler.model_info),
    ("POST", rf"/api/models/{REPO}/preupload/(?P<rev>[^/]+)", Handler.preupload),
    ("POST", rf"/api/models/{REPO}/commit/(?P<rev>[^/]+)", Handler.commit),
    ("POST", rf"/api/models/{REPO}/branch/(?P<branch>[^/]+)", Handler.create_branch),
    ("POST", rf"/api/models/{REPO}/tag/(?P<rev>[^/]+)", Handler.create_tag),
    ("POST", rf"/{REPO}\.git/info/lfs/objects/batch", Handler.lfs_batch),
    ("POST", rf"/{REPO}\.git/info/lfs/objects/verify", Handler.lfs_verify),
    ("PUT", r"/lfs-storage/(?P<oid>[0-9a-f]{64})", Handler.lfs_put),
]


def main(argv=None):
    parser = argparse.ArgumentParser(description="A test double of the Hub's upload protocol (tests only).")
    parser.add_argument("--state", required=True, help="state folder (kept across restarts)")
    parser.add_argument("--token", required=True, help="the one token that may write")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-requests", type=int, default=500)
    parser.add_argument("--idle", type=float, default=60.0, help="stop after this many seconds without a request")
    parser.add_argument("--fail-lfs-put", action="store_true")
    parser.add_argument("--die-before-commit", action="store_true")
    args = parser.parse_args(argv)
    server = Server(("127.0.0.1", args.port), Handler)
    server.timeout = 0.2
    server.state = State(args.state)
    server.token = args.token
    server.base = f"http://127.0.0.1:{server.server_port}"
    server.fail_lfs_put = args.fail_lfs_put
    server.die_before_commit = args.die_before_commit
    server.handled = 0
    print(f"READY {server.server_port}", flush=True)
    last = time.monotonic()
    while server.handled < args.max_requests and time.monotonic() - last < args.idle:
        before = server.handled
        server.handle_request()
        if server.handled != before:
            last = time.monotonic()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
