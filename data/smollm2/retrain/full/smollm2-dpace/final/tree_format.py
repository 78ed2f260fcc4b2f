# mfd-hub remote code 0.1.0, generated from kernels/tree_format.py; edit the source, not this copy.
"""What every tree builder shares: the ``DraftTree`` record and the fixed-point score scale.

In a file of its own so that the torch reference (``tree_build``) and the Triton kernels
(``tree_build_triton``) both import it and neither imports the other at module level.

This file is part of the remote-code bundle: torch only.
"""

from dataclasses import dataclass

import torch

SCORE_SCALE = float(2**32)
LOGPROB_FLOOR = -1024.0  # nats; quantised scores of one position lie in [-2^42, 0]
NEG_SCORE = -(2**43)  # the score of a -inf log-probability: below every finite one


@dataclass
class DraftTree:
    """A draft tree in DFS preorder. All tensors have N+1 entries (root first).

    tokens: draft token ids (root: the anchor); parents: parent index (root: -1);
    depths: 0 for the root; scores: int64 prefix scores (root 0); modes: the best mode of each
    prefix (root -1, chains and product trees: the mode drafted).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    modes: torch.Tensor

    @property
    def num_nodes(self):
        """Nodes excluding the root."""
        return self.tokens.shape[0] - 1
