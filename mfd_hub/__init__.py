"""mfd-hub: Multi-Future Drafting drafters, their lossless tree speculative decoding,
checkpoints, training and publication."""

__version__ = "0.1.0"

from .checkpoint import load_draft, save_draft  # noqa: E402
from .remote.configuration_mfd import DFlashConfig  # noqa: E402
from .remote.modeling_mfd import DFlashDraftModel, DraftContextCache  # noqa: E402

__all__ = ["DFlashConfig", "DFlashDraftModel", "DraftContextCache", "load_draft", "save_draft", "__version__"]
