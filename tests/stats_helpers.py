"""The T > 0 losslessness check shared by the generation tests: sample whole continuations with
spec_generate and compare their counts with the exact distribution of plain sampling."""

import itertools

import torch

from mfd_hub.remote.sampling_mfd import sampling_probs
from mfd_hub.testing import tiny_drafter, tiny_target

# Power: against the biased verifier of test_generation (argmax instead of a sample 15% of the
# time), measured with this file's seed: 1,000 samples give p = 5e-11, 1,500 give 7e-17, 2,000
# give 2e-20 and 5,000 1e-45, all far below the 1e-6 the test demands; 1,000 keep four orders of
# magnitude of margin there at two thirds of the cost (the eleven sampling cases are a sixth of
# the suite's CPU time). The honest cases' false-alarm rate is the 1e-3 threshold whatever the
# sample size.
SAMPLES = 1_000
NEW_TOKENS = 3

SAMPLING_CASES = [
    ("mixture", dict(temperature=0.9, top_k=3, top_p=0.95)),
    ("product", dict(temperature=1.0, top_k=0, top_p=1.0)),
    ("chain", dict(temperature=1.2, top_k=0, top_p=0.9)),
]


def exact_sequence_probs(target, prompt, rule):
    """P(y_1..y_n | prompt) under plain sampling for every sequence of NEW_TOKENS tokens."""
    vocab = target.config.vocab_size
    seqs = list(itertools.product(range(vocab), repeat=NEW_TOKENS))
    batch = torch.tensor([prompt + list(s) for s in seqs])
    with torch.no_grad():
        logits = target(batch).logits
    probs = sampling_probs(logits, **rule)
    p = torch.ones(len(seqs), dtype=torch.float64)
    for i in range(NEW_TOKENS):
        pos = len(prompt) - 1 + i
        p *= probs[torch.arange(len(seqs)), pos, batch[:, pos + 1]].double()
    return {s: float(x) for s, x in zip(seqs, p)}


def chi_square_pvalue(counts, expected_probs, n):
    """Pearson's test; outcomes with expected count < 5 are pooled into one cell."""
    chi, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for seq, p in expected_probs.items():
        e, o = n * p, counts.get(seq, 0)
        if e < 5:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
            continue
        chi += (o - e) ** 2 / e
        cells += 1
    if pooled_exp > 0:
        chi += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-9)
        cells += 1
    dof = cells - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(chi / 2)))


def sample_distribution(drafter, target, prompt, rule, method):
    gen = torch.Generator().manual_seed(1234)
    counts = {}
    for _ in range(SAMPLES):
        out = drafter.spec_generate(
            target, torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, method=method, tree_budget=6,
            generator=gen, **rule,
        )
        key = tuple(out.new_tokens)
        counts[key] = counts.get(key, 0) + 1
    return counts


def tiny_sampling_pair(family, **target_overrides):
    target = tiny_target(family, vocab_size=4, hidden_size=16, num_layers=2, init_std=0.3, **target_overrides)
    drafter = tiny_drafter(target, num_modes=3, num_layers=1, block_size=4, target_layer_ids=[0, 1])
    return target, drafter
