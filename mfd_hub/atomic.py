"""Write a folder all at once: build it beside its destination, rename it into place at the end.

An interrupted writer (an exception, Ctrl-C, even SIGKILL) never leaves a partial folder at the
destination; the hidden staging folder it may leave behind is named ``.NAME.partial-*`` and is
removed by the next writer of the same destination.
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from .errors import MfdHubError


def _staging_prefix(dest):
    return f".{dest.name}.partial-"


def _ordinary_permissions(folder):
    """mkdtemp makes the staging folder private (0700), and some writers make files 0600; the
    published folder gets the modes an ordinary mkdir / open would give under the umask."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def atomic_directory(dest, overwrite=False):
    """Yield a staging folder; on success it becomes ``dest`` in one rename."""
    dest = Path(dest).absolute()
    if dest.exists() and not overwrite:
        raise MfdHubError(f"{dest} already exists (pass --overwrite to replace it)")
    if not dest.parent.is_dir():
        raise MfdHubError(f"the parent folder {dest.parent} does not exist")
    for stale in dest.parent.glob(_staging_prefix(dest) + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(dest), dir=dest.parent))
    try:
        yield staging
        _ordinary_permissions(staging)
        if dest.exists():
            old = dest.with_name(f".{dest.name}.replaced-{os.getpid()}")
            os.rename(dest, old)
            os.rename(staging, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def atomic_write_text(path, text):
    """Write a text file all at once: written beside it under a hidden name, then renamed over it,
    so a reader sees the old file or the new one, never half of either."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        staging.write_text(text, encoding="utf-8")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o666 & ~umask)
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
