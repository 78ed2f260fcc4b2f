"""The target's next-token rule, exactly as plain decoding applies it.

Greedy at temperature 0; otherwise the distribution transformers' ``generate`` samples from:
logits in float32, divided by the temperature, then top-k (ties at the k-th value kept), then
top-p (the smallest set of most probable tokens whose mass exceeds top_p, at least one token).

This file is part of the remote-code bundle: torch only.
"""

import torch


def check_sampling(temperature, top_p, top_k):
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")


def sampling_probs(logits, temperature, top_k=0, top_p=1.0):
    """Probabilities [..., V] that plain sampling draws the next token from (temperature > 0)."""
    scores = logits.float() / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(scores, dim=-1)
        mass_below = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop = mass_below <= 1.0 - top_p
        drop[..., -1] = False  # the most probable token always stays
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores.softmax(dim=-1)


def next_tokens(logits, temperature=0.0, top_k=0, top_p=1.0, generator=None):
    """One target token per row of logits [..., V]: argmax at T=0, else an independent sample from
    ``sampling_probs``' distribution.

    With top-k on, only the k candidates are scaled and sorted: over a batch of 128 rows, sorting
    the whole vocabulary for top-p costs about as much as a CPU forward pass (the regeneration
    recipe samples so). Where the k-th value is tied with tokens beyond it, plain decoding keeps
    them all, so those logits take the whole-vocabulary path instead."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        values, candidates = logits.topk(top_k, dim=-1)  # most probable first
        if not bool(((logits >= values[..., -1:]).sum(dim=-1) > top_k).any()):
            # a positive temperature keeps the order, so the top-k logits are the candidates
            probs = (values.float() / temperature).softmax(dim=-1)
            if top_p < 1.0:
                before = probs.cumsum(dim=-1) - probs  # the mass of the more probable candidates
                probs = probs.masked_fill(before >= top_p, 0.0)  # the most probable one always stays
            flat = probs.reshape(-1, top_k)
            picked = torch.multinomial(flat, 1, generator=generator).reshape(*probs.shape[:-1], 1)
            return candidates.gather(-1, picked).squeeze(-1)
    probs = sampling_probs(logits, temperature, top_k, top_p)
    flat = probs.reshape(-1, vocab)
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
