"""Small helpers every section shares: dtypes by name, device syncs, the kernel backend, timings."""

import contextlib
import time


def dtype_of(name):
    import torch

    return getattr(torch, name)


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def kernel_backend(name):
    from mfd_hub.kernels.backend import set_kernel_backend

    previous = set_kernel_backend(name)
    try:
        yield
    finally:
        set_kernel_backend(previous)


@contextlib.contextmanager
def default_dtype(dtype):
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def median_ms(fn, repeats, device, warmup=2, after=None):
    """Median wall time of ``fn`` in ms (synchronised on CUDA); ``after`` runs untimed."""
    import statistics

    samples = []
    for i in range(repeats + warmup):
        sync(device)
        started = time.perf_counter()
        fn()
        sync(device)
        if i >= warmup:
            samples.append((time.perf_counter() - started) * 1e3)
        if after is not None:
            after()
    return statistics.median(samples)


def max_error(got, want):
    diff = (got.double() - want.double()).abs()
    return float(diff.max()) if diff.numel() else 0.0
