# mfd-hub remote code 0.1.0, generated from mfd_hub/remote/targets_mfd.py; edit the source, not this copy.
"""The target side of speculative decoding: prefill, tree verification, commit.

A verifier owns the target's cache. ``verify`` runs one target forward over the root and the
draft-tree nodes (positions ``start + depth``, each node seeing the committed prefix and its own
ancestors); ``commit`` keeps only the accepted path. Every transformers-cache detail lives here
(for hybrid Gated-DeltaNet targets: in ``hybrid_mfd.py``, which ``make_verifier`` picks):
the cache API changes between transformers versions (e.g. ``past_key_values=`` became
``cache=``, ``crop`` takes only negative counts), so nothing else touches it.

This file is part of the remote-code bundle: torch and transformers only.
"""

import inspect

import torch

from .kv_compact import compact_kv
from .tree_attention import verify_attention_bias
from .hybrid_mfd import HYBRID_FAMILIES, HybridVerifier, hybrid_layer_problem

# Attention-only families whose cache is a plain per-layer K/V (tested token-identical).
ATTENTION_FAMILIES = {"llama", "qwen3", "qwen2", "mistral"}


class UnsupportedTargetError(ValueError):
    """The target's architecture has no lossless tree verifier here."""


def target_family(target):
    return getattr(target.config, "model_type", None)


def make_verifier(target, tap_ids):
    """The verifier for ``target``'s architecture; an unsupported one raises, never guesses."""
    family = target_family(target)
    if family in ATTENTION_FAMILIES:
        cfg = target.config
        types = set(getattr(cfg, "layer_types", None) or [])
        if "sliding_attention" in types and getattr(cfg, "sliding_window", None):
            raise UnsupportedTargetError(
                f"target {family!r} has sliding-window layers; tree verification supports full attention only"
            )
        return AttentionVerifier(target, tap_ids)
    if family in HYBRID_FAMILIES:
        problem = hybrid_layer_problem(target)
        if problem:
            raise UnsupportedTargetError(f"target {family!r} cannot be tree-verified: {problem}")
        return HybridVerifier(target, tap_ids)
    raise UnsupportedTargetError(
        f"no lossless tree verifier for target architecture {family!r} "
        f"(supported: {', '.join(sorted(ATTENTION_FAMILIES | HYBRID_FAMILIES))})"
    )


def _forward_kwargs(target):
    params = inspect.signature(target.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    return cache_kw, "logits_to_keep" in params


def _cache_tensors(cache):
    """The per-layer [B, H, T, D] key/value holders of a transformers DynamicCache."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise RuntimeError("unsupported transformers cache layout (expected DynamicCache.layers)")
    return layers


class AttentionVerifier:
    """Tree verification for attention-only decoder targets (Llama, Qwen2/3, Mistral)."""

    def __init__(self, target, tap_ids):
        from transformers import DynamicCache

        self.target = target
        self.tap_ids = list(tap_ids)
        self.cache = DynamicCache()
        self.cache_kw, self.has_logits_to_keep = _forward_kwargs(target)
        self.length = 0  # committed positions held in the cache
        self.pending = 0  # positions the last verify added

    def _forward(self, input_ids, position_ids, attention_mask, last_only=False):
        kwargs = {self.cache_kw: self.cache}
        if last_only and self.has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.target(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=True,
            output_hidden_states=True,
            **kwargs,
        )
        taps = torch.cat([out.hidden_states[i + 1] for i in self.tap_ids], dim=-1)
        return out.logits[0], taps[0]

    def prefill(self, input_ids):
        """input_ids [1, L] -> (logits of the last position [V], taps [L, n_taps*H])."""
        n = input_ids.shape[1]
        positions = torch.arange(n, device=input_ids.device)[None]
        logits, taps = self._forward(input_ids, positions, None, last_only=True)
        self.length = n
        return logits[-1], taps

    def verify(self, tokens, depths, tree_mask):
        """One target pass over the tree -> (logits [N, V], taps [N, n_taps*H]) per node."""
        positions = (self.length + depths)[None]
        bias = verify_attention_bias(tree_mask, self.length, self.target.dtype)
        logits, taps = self._forward(tokens[None], positions, bias)
        self.pending = tokens.shape[0]
        return logits, taps

    def commit(self, path):
        """Keep the committed prefix plus the accepted nodes (indices into the last verify)."""
        layers = _cache_tensors(self.cache)
        kept = compact_kv([t for layer in layers for t in (layer.keys, layer.values)], self.length, path)
        for i, layer in enumerate(layers):  # every layer compacted together (one kernel launch)
            layer.keys, layer.values = kept[2 * i], kept[2 * i + 1]
        self.length += path.shape[0]
        self.pending = 0
