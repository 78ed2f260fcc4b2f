# mfd-hub remote code 0.1.0, generated from mfd_hub/remote/context_mfd.py; edit the source, not this copy.
"""The drafter's context cache, kept apart from the model so that the generation loop can make
one without importing the model module (which imports the generation loop).

This file is part of the remote-code bundle: torch only.
"""


class DraftContextCache:
    """The drafter's context between rounds: per-layer keys/values of committed positions only.

    Keys are stored after k_norm and RoPE, so a round only projects the positions it adds. All
    modes share these tensors (no K-fold copy).
    """

    def __init__(self):
        self.keys = []  # per layer [B, Hkv, C, D]
        self.values = []
        self.positions = None  # [B, C] absolute positions
        self.last_feature = None  # [B, H] projected feature of the newest position (gate input)

    @property
    def length(self):
        return 0 if self.positions is None else self.positions.shape[1]
