"""The user's mfd-hub cache: folders that are expensive to build and cheap to reuse.

``MFD_HUB_CACHE`` names it; by default it is ``$XDG_CACHE_HOME/mfd-hub`` (``~/.cache/mfd-hub``).
Each entry is a folder ``KIND/NAME-DIGEST``: the digest is of everything the entry is built from,
so a changed source gets a new entry (and the stale ones of the same name are removed). An entry
is built once, under a file lock (two processes never build it twice or see it half-built), in a
staging folder renamed into place at the end.
"""

import hashlib
import os
import shutil
from pathlib import Path

from .atomic import atomic_directory
from .errors import MfdHubError

ENV_VAR = "MFD_HUB_CACHE"


def cache_dir(*parts):
    """The cache folder (created), or a sub-folder of it."""
    root = os.environ.get(ENV_VAR)
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "mfd-hub")
    folder = Path(root, *parts)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise MfdHubError(f"cannot create the cache folder {folder} ({err.strerror}); set {ENV_VAR}") from None
    return folder


def file_digest(path, chunk=1 << 22):
    """sha256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def cached_folder(kind, name, digest, build):
    """The folder ``KIND/NAME-DIGEST`` of the cache, made by ``build(staging_folder)`` when absent.

    Returns its path. Other entries ``NAME-*`` of the same kind are stale (built from another
    source) and are removed when a new one is built."""
    from filelock import FileLock

    parent = cache_dir(kind)
    dest = parent / f"{name}-{digest[:16]}"
    if dest.is_dir():
        return dest
    with FileLock(str(parent / f".{name}.lock")):
        if dest.is_dir():  # another process built it while we waited
            return dest
        with atomic_directory(dest) as staging:
            build(staging)
        for stale in parent.glob(f"{name}-*"):
            if stale != dest and stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
    return dest


def read_record(kind, key):
    """The JSON document kept as ``KIND/KEY.json`` in the cache, or None (absent or unreadable)."""
    import json

    try:
        return json.loads((cache_dir(kind) / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, MfdHubError):
        return None


def write_record(kind, key, document):
    """Keep ``document`` as ``KIND/KEY.json`` (written aside, then renamed: never seen half-written).
    A cache that cannot be written only costs the work again next time, so that is not an error."""
    import json

    try:
        path = cache_dir(kind) / f"{key}.json"
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        staging.write_text(json.dumps(document, indent=1), encoding="utf-8")
        os.replace(staging, path)
    except (OSError, MfdHubError):
        pass
