"""Where a drafter or checkpoint named by the user lives on disk: a folder, a Hub repo id (through
the Hugging Face cache) or a shipped drafter's name. Kept free of torch and transformers so that
commands resolve names and report bad ones without paying for those imports."""

import os
from pathlib import Path

from .errors import MfdHubError


def _is_hub_id(text):
    return text.count("/") == 1 and all(text.split("/")) and not text.startswith((".", "/", "~"))


def resolve_checkpoint_dir(path_or_repo, revision=None):
    """A local folder as is; a Hub repo id through the local cache (or a download when online).

    For drafters use ``resolve_drafter``, which also knows the shipped drafters' names."""
    if os.path.isdir(path_or_repo):
        return Path(path_or_repo)
    if os.path.exists(path_or_repo):
        raise MfdHubError(f"{path_or_repo} is a file, not a checkpoint folder")
    if not _is_hub_id(path_or_repo):
        raise MfdHubError(f"{path_or_repo} is neither a folder nor a Hub repo id (owner/name)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(
            snapshot_download(
                path_or_repo, revision=revision, allow_patterns=["*.json", "*.safetensors", "*.py", "*.md"]
            )
        )
    except (LocalEntryNotFoundError, RepositoryNotFoundError, HfHubHTTPError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise MfdHubError(f"cannot fetch {path_or_repo} from the Hub: {first}") from None


def resolve_drafter(spec, revision=None):
    """The local folder of a drafter named in any of the three ways mfd-hub accepts -> Path.

    - a shipped drafter's name (``mfd_hub.zoo.shipped.SHIPPED_DRAFTERS``, e.g. MFD-SmolLM2-135M):
      its loadable folder in the user's cache (weights, config, card and the remote-code bundle,
      written on first use);
    - a folder: itself;
    - a Hub repo id (owner/name): its snapshot, from the Hugging Face cache or downloaded.

    The rule for a spelling that fits two forms: a bare shipped name means the shipped drafter,
    even where a folder of that name exists (write ``./NAME`` for the folder), and a
    ``DrafterNameNote`` warning says so; an existing folder wins over the Hub repo id it spells.
    A ``pathlib.Path`` is always taken as a folder. Every command and library entry point that
    takes a drafter resolves it here.
    """
    if isinstance(spec, os.PathLike):
        return resolve_checkpoint_dir(os.fspath(spec), revision)
    spec = str(spec)
    from .zoo.shipped import SHIPPED_DRAFTERS, shipped_drafter_dir

    if spec in SHIPPED_DRAFTERS:
        if os.path.isdir(spec):
            import warnings

            from .errors import DrafterNameNote

            warnings.warn(f"{spec} names the shipped drafter; the folder {spec} here is not used "
                          f"(write ./{spec} for it)", DrafterNameNote, stacklevel=2)
        return shipped_drafter_dir(spec)
    if os.path.exists(spec) or _is_hub_id(spec):
        return resolve_checkpoint_dir(spec, revision)
    import difflib

    close = difflib.get_close_matches(spec, list(SHIPPED_DRAFTERS), n=1, cutoff=0.8)
    hint = f"; did you mean {close[0]}?" if close else f" ({', '.join(SHIPPED_DRAFTERS)})"
    raise MfdHubError(f"{spec} is not a checkpoint folder (none exists), a Hub repo id (owner/name) or a "
                      f"shipped drafter's name{hint}")
