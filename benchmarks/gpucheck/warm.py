"""Compiling the large Triton kernels ahead, in background processes, while the other sections run."""

import time

from .bootstrap import prepare_process
from .common import dtype_of, sync
from .shapes import QWEN_VOCABS


def warm_configs(shapes):
    """Every (modes, positions, vocab, k, dtype, with a tree) that this run sends through the Triton
    top-k and tree kernels at a large tile: the Qwen-shaped kernel cases, and generation's
    configurations at every depth 1..15 (a round near max_new_tokens drafts fewer positions, and
    each depth class is another compile; the largest take minutes on one core)."""
    configs = set()
    for m, length, vocab, k, kind, dt in shapes["candidates"]:
        if vocab > 4100:
            configs.add((m, length, vocab, k, dt, False))
    for budget, m, length, vocab, kind in shapes["trees"]:
        if vocab > 4100:
            configs.add((m, length, vocab, budget, "bfloat16", True))
    loss, qwen = shapes["lossless"], shapes["qwen"]
    for depth in range(1, 16):
        for vocab, dt, budgets, modes in ((loss["vocab"], "float32", loss["budgets"], loss["modes"]),
                                          (qwen["vocab"], "bfloat16", dict(qwen["rounds"]), 8)):
            configs.add((0, depth, vocab, 1, dt, False))  # chain: one mode's top-1, [depth, V]
            configs.add((1, depth, vocab, budgets["product"], dt, True))
            configs.add((modes, depth, vocab, budgets["mixture"], dt, True))
    configs.add((8, 15, shapes["tree_speed"]["vocab"], shapes["tree_speed"]["budget"], "bfloat16", True))
    # Both Qwen vocabularies give the same kernels (the tree kernels never see V; the top-k sees
    # only multiples of 16): one of them is enough. The biggest first: they decide the wall time.
    # Depths compile alike when their padded sizes agree (positions and path words rounded up to
    # powers of two; row counts of 1 or multiples of 16 are specialised), so one depth per class.
    unique = {}
    for m, length, vocab, k, dt, tree in sorted(configs, key=lambda c: (-c[5], c)):
        vocab = vocab if vocab < QWEN_VOCABS[0] else QWEN_VOCABS[0]
        rows = max(m, 1) * length
        key = (m, vocab, k, dt, 1 << (length - 1).bit_length(), 1 << ((length + 2) // 3 - 1).bit_length(),
               length == 1, rows == 1, rows % 16 == 0)
        if key not in unique:
            unique[key] = (m, length, vocab, k, dt, tree)
    return sorted(unique.values(), key=lambda c: (-(max(c[0], 1) * c[3] * c[5]), -c[3], c))


def warm_one(config, device="cuda"):
    """In a worker process: run the top-k (and tree) kernels once at ``config`` so that Triton's
    on-disk cache holds them -> seconds taken."""
    started = time.perf_counter()
    prepare_process(device)
    import torch

    from mfd_hub.kernels.backend import set_kernel_backend
    from mfd_hub.kernels.tree_build import draft_candidates, draft_tree

    set_kernel_backend("triton")
    m, length, vocab, k, dt, tree = config
    shape = (length, vocab) if m == 0 else (m, length, vocab)
    with torch.inference_mode():
        logits = torch.randn(*shape, device=device).to(dtype_of(dt))
        scores, ids = draft_candidates(logits, k)
        if tree:
            draft_tree(scores, ids, k, 0, vocab)
        sync(torch.device(device))
    return time.perf_counter() - started


class WarmPool:
    """Compiles the large Triton kernels in ``jobs`` processes, in the background (with an empty
    Triton cache, one by one they would take most of the run). The run meanwhile checks what needs
    only small kernels, then ``wait``s. Failures only cost time: a check compiles whatever is
    missing itself."""

    def __init__(self, configs, jobs, device="cuda"):
        import concurrent.futures as futures
        import multiprocessing

        self.started = time.perf_counter()
        self.configs, self.jobs = configs, jobs
        self.pool = futures.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
        self.pending = {self.pool.submit(warm_one, c, device): c for c in configs}

    def wait(self, limit_s, only=None):
        """Wait until the configs that ``only(config)`` selects (default: all) are compiled, or
        until ``limit_s`` after the start -> what has happened so far."""
        import concurrent.futures as futures

        chosen = [f for f, c in self.pending.items() if only is None or only(c)]
        left = max(0.0, limit_s - (time.perf_counter() - self.started))
        _, late = futures.wait(chosen, timeout=left)
        seconds, problems = {}, []
        for future, config in self.pending.items():
            if future.done() and not future.cancelled():
                error = future.exception()
                if error is None:
                    seconds[str(config)] = round(future.result(), 1)
                else:
                    problems.append(f"{config}: {type(error).__name__}: {str(error)[:200]}")
        if late:
            problems.append(f"{len(late)} still compiling {limit_s} s after the start: the checks compile them")
        slowest = dict(sorted(seconds.items(), key=lambda kv: -kv[1])[:10])
        return {"configs": len(self.configs), "compiled": len(seconds), "jobs": self.jobs,
                "seconds": time.perf_counter() - self.started, "slowest_seconds": slowest, "problems": problems[:20]}

    def close(self):
        processes = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # a compile still running would hold the exit
            if process.is_alive():
                process.terminate()
