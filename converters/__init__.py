"""Converters: other checkpoints -> mfd-hub drafter checkpoints (``mfd-hub convert ...``).

Each reads its source without modifying it and writes through ``mfd_hub.save_draft``, which
stages the output beside its destination and renames it into place at the end: an interrupted
conversion (even SIGKILL) leaves no output folder.
"""

from .draft_vocab import convert_draft_vocab, count_token_frequencies, reduce_vocabulary, select_draft_vocab
from .mfd_d import convert_mfd_d
from .released import convert_released
from .train_ckpt import convert_train_checkpoint, find_train_checkpoint
from .zlab import convert_zlab

__all__ = [
    "convert_draft_vocab", "convert_mfd_d", "convert_released", "convert_train_checkpoint", "convert_zlab",
    "count_token_frequencies", "find_train_checkpoint", "reduce_vocabulary", "select_draft_vocab",
]
