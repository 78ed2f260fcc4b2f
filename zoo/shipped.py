"""The shipped SmolLM2-135M drafters, and the loadable folders the project hands out for them.

A shipped drafter in ``zoo/NAME/`` (installed as ``mfd_hub.zoo``) is what only it can provide:
its weights, config, acceptance record, model card and verify report. Its loadable folder -- the
same files a Hub repo of it holds: weights, config, acceptance record, card and the remote-code
bundle -- is written into the user's
cache (``mfd_hub.cache``) the first time it is needed and reused afterwards; its name carries a
digest of the zoo files and the bundle, so a new mfd-hub version or a retrained drafter gets a
fresh one.

Commands and library functions name a shipped drafter by its name wherever they take a drafter:
``mfd_hub.locate.resolve_drafter`` turns a name into the loadable folder given here.
"""

import hashlib
import shutil
from pathlib import Path

from mfd_hub.errors import MfdHubError

# Trained by recipes/smollm2-{dflash,dpace,mfd}.yaml on SmolLM2's own answers to the derived
# prompts (zoo/prompts.py), and shipped in the repository so the demo and the benchmark run offline.
SHIPPED_DRAFTERS = {
    "MFD-SmolLM2-135M": "MFD fine-tune, K = 8 modes (recipe smollm2-mfd)",
    "DPACE-SmolLM2-135M": "D-PACE fine-tune, one mode (recipe smollm2-dpace)",
    "DFlash-SmolLM2-135M": "DFlash base trained from scratch (recipe smollm2-dflash)",
}
# What a zoo folder holds, and which of it a Hub repo (and so the loadable folder) holds too.
VERIFY_REPORT = "verify.json"
CARD = "README.md"
ACCEPTANCE_RECORD = "acceptance.json"  # mfd_hub.acceptance.RECORD_NAME (not imported: this module stays light)
HUB_FILES = ("config.json", "model.safetensors", ACCEPTANCE_RECORD, CARD)
BENCH_RESULTS = "bench-humaneval.json"  # zoo/<this>: the miniature's `mfd-hub bench` results
CACHE_KIND = "drafters"


def zoo_dir():
    """The installed ``zoo/`` folder."""
    from importlib.resources import files

    return Path(str(files("mfd_hub.zoo")))


def zoo_folder(name):
    """A shipped drafter's folder in the zoo (weights, config, acceptance record, card, verify
    report) -> Path."""
    if name not in SHIPPED_DRAFTERS:
        raise MfdHubError(f"no shipped drafter called {name!r}; shipped: {', '.join(SHIPPED_DRAFTERS)}")
    folder = zoo_dir() / name
    missing = [f for f in HUB_FILES if not (folder / f).is_file()]
    if missing:
        raise MfdHubError(f"the shipped drafter {name} lacks {', '.join(missing)} in {folder} (a broken install?)")
    return folder


def shipped_drafter_dir(name):
    """The loadable folder of a shipped drafter (in the user's cache, written on first use) -> Path.

    ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` loads it with only torch and
    transformers: it holds the zoo's weights, config, acceptance record and card and the
    remote-code bundle."""
    from mfd_hub.bundle import bundle_sources
    from mfd_hub.cache import cached_folder

    source = zoo_folder(name)
    bundle = bundle_sources()
    digest = hashlib.sha256()
    for file in HUB_FILES:
        digest.update(file.encode() + b"\0" + (source / file).read_bytes() + b"\0")
    for file, text in sorted(bundle.items()):
        digest.update(file.encode() + b"\0" + text.encode("utf-8") + b"\0")

    def build(staging):
        for file in HUB_FILES:
            shutil.copyfile(source / file, staging / file)
        for file, text in bundle.items():
            (staging / file).write_text(text, encoding="utf-8")

    return cached_folder(CACHE_KIND, name, digest.hexdigest(), build)


def load_with_auto_model(folder):
    """A drafter the way its users load it: AutoModel with trust_remote_code, from the folder."""
    import torch
    from transformers import AutoModel

    try:
        return AutoModel.from_pretrained(str(folder), trust_remote_code=True, dtype=torch.float32).eval()
    except (OSError, ValueError) as err:
        raise MfdHubError(f"cannot load the drafter in {folder}: {' '.join(str(err).split())[:300]}") from None
