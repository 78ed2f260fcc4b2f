"""Timing things side by side on a noisy machine (the round-robin itself lives in the bundle's
``budget_mfd``, which measures a machine's round costs the same way)."""

from .remote.budget_mfd import round_robin_seconds


def round_robin_ms(fns, repeats, device):
    """Median wall time in ms of each of ``fns``, measured round-robin (one call of each per
    round, after three warm-up rounds) so that drifting machine load hits every one alike."""
    return [1000 * s for s in round_robin_seconds(fns, repeats, device)]
