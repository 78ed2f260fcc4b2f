"""mfd-hub: Multi-Future Drafting drafters, their lossless tree speculative decoding,
checkpoints, training and publication."""

from .version import __version__

# The public names load on first use (PEP 562): `import mfd_hub.cli` must not pay for torch and
# transformers (8 s on 2 cores) before a command needs them; `--help` and usage errors do not.
_LAZY = {
    "load_draft": ".checkpoint",
    "load_pair": ".pair",
    "Pair": ".pair",
    "save_draft": ".checkpoint",
    "DFlashConfig": ".remote.configuration_mfd",
    "DFlashDraftModel": ".remote.modeling_mfd",
    "DraftContextCache": ".remote.modeling_mfd",
}

__all__ = ["DFlashConfig", "DFlashDraftModel", "DraftContextCache", "Pair", "load_draft", "load_pair", "save_draft",
           "__version__"]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'mfd_hub' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
