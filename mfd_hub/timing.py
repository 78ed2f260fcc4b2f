"""Timing things side by side on a noisy machine."""

import time

import torch


def round_robin_ms(fns, repeats, device):
    """Median wall time in ms of each of ``fns``, measured round-robin (one call of each per
    round, after two warm-up rounds) so that drifting machine load hits every one alike."""
    import statistics

    times = [[] for _ in fns]
    for round_ in range(repeats + 2):
        for fn, samples in zip(fns, times):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if round_ >= 2:
                samples.append((time.perf_counter() - start) * 1000)
    return [statistics.median(samples) for samples in times]
