"""mfd-hub: Multi-Future Drafting drafters, their lossless tree speculative decoding,
checkpoints, training and publication."""

from .checkpoint import load_draft, save_draft
from .remote.configuration_mfd import DFlashConfig
from .remote.modeling_mfd import DFlashDraftModel, DraftContextCache
from .version import __version__

__all__ = ["DFlashConfig", "DFlashDraftModel", "DraftContextCache", "load_draft", "save_draft", "__version__"]
