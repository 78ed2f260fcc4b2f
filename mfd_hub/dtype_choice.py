"""Which dtype a drafter/target pair speculates in when ``demo`` and ``bench`` say ``--dtype auto``
(``load_pair(..., baselines=True)``): on a CPU, the dtype whose speculative decoding is fastest,
timed on this machine and kept in the user's cache; beside it the target in fp32 and bf16 for the
plain-decoding baselines that every speedup is measured against."""

import copy
import hashlib
import json
import statistics
import time

import torch

from .precision import drafter_dtype, dtype_name, resolve_dtype


def target_in_each_dtype(target, spec_dtype):
    """{dtype: the fp32 ``target`` in it} for fp32, bf16 and the speculation's dtype: plain decoding
    runs in each, and the fastest of them is the baseline every speedup is measured against."""
    targets = {torch.float32: target}
    for extra in (torch.bfloat16, spec_dtype):
        if extra not in targets:
            targets[extra] = copy.deepcopy(target).to(extra)
    return targets


DTYPE_CHOICE_CACHE = "dtype-choice"
# What ``--dtype auto`` times: a short greedy speculative decode of the first prompt, product tree
# (every drafter has one), budget ``auto`` (each dtype at the tree sizes its own costs afford).
CHOICE_TOKENS = 24
CHOICE_REPEATS = 3


def dtype_choice_key(target, dtypes, draft, linears):
    """What the fastest speculation dtype depends on: the target's shape, the drafter's, the
    candidate dtypes, the kind of fp32 products, the device (the CPU's model name), the thread
    count and torch's version (as the round costs' key)."""
    from .remote.budget_mfd import device_name, drafter_shape, target_shape

    parts = [target_shape(target), drafter_shape(draft) + [draft.config.block_size],
             sorted(dtype_name(d) for d in dtypes), linears, target.device.type, device_name(target.device),
             torch.get_num_threads(), torch.__version__]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def fastest_speculation_dtype(targets, draft, input_ids, linears, tokens=CHOICE_TOKENS, repeats=CHOICE_REPEATS):
    """``--dtype auto`` for the miniature on a CPU: of ``targets`` ({dtype: the target in it}), the
    dtype whose speculative decoding of ``input_ids`` is fastest on this machine -> (dtype, whether
    it came from the cache).

    Speculation, not plain decoding, is what this dtype runs, and the two rank dtypes differently:
    on a CPU with AMX-BF16 plain bf16 decodes 1.15x as fast as fp32 but a 65-node bf16 verify costs
    1.6 decode steps against 2.9 in fp32 (oneDNN). Each dtype (its drafter in
    ``precision.drafter_dtype``, fp32 products as ``linears`` says) decodes ``tokens`` greedy tokens
    with a product tree at budget ``auto``, ``repeats`` times round-robin after one warm-up run that
    also measures (and caches) its round costs; the median decides. The choice is kept in the user's
    cache (``dtype_choice_key``) and later runs reuse it."""
    from .cache import read_record, write_record
    from .packed_linear import packed_for_speculation

    by_name = {dtype_name(dtype): dtype for dtype in targets}
    fp32_target = targets[torch.float32]
    key = dtype_choice_key(fp32_target, targets, draft, linears)
    kept = read_record(DTYPE_CHOICE_CACHE, key)
    if kept and kept.get("dtype") in by_name:
        return by_name[kept["dtype"]], True
    drafts = {}  # one drafter per drafter dtype, shared by the dtypes that use it
    for dtype in targets:
        own = drafter_dtype(dtype, fp32_target.device)
        drafts.setdefault(own, copy.deepcopy(draft).to(own))
    runs = {dtype: (targets[dtype], drafts[drafter_dtype(dtype, fp32_target.device)]) for dtype in targets}

    def decode(dtype, count):
        target, drafter = runs[dtype]
        drafter.spec_generate(target, input_ids, max_new_tokens=count, method="product", tree_budget="auto",
                              stop_token_ids=())  # a stop would cut one dtype's run short

    seconds = {dtype: [] for dtype in targets}
    with packed_for_speculation(*targets.values(), *drafts.values(), linears=linears):
        for dtype in targets:  # first-call allocations and the cost measurement stay out of the timing
            decode(dtype, 2)
        for _ in range(repeats):
            for dtype in targets:
                began = time.perf_counter()
                decode(dtype, tokens)
                seconds[dtype].append(time.perf_counter() - began)
    median = {dtype: statistics.median(values) for dtype, values in seconds.items()}
    fastest = min(median, key=median.get)
    write_record(DTYPE_CHOICE_CACHE, key, {"dtype": dtype_name(fastest), "measured_by": "speculation",
                                           "tokens_per_second": {dtype_name(d): tokens / s for d, s in median.items()}})
    return fastest, False


def speculation_dtypes(dtype, target32, draft, input_ids, linears="onednn"):
    """(targets {dtype: target} for the plain baselines, the target's speculation dtype, the
    drafter's) for ``--dtype`` ``dtype`` and resolved ``linears``: ``auto`` on a CPU is float32
    where the fp32 target multiplies with fp16 weights (its decode step is as fast as bf16's and
    its verify far cheaper), else measured (``fastest_speculation_dtype`` with ``draft``, then
    ``precision.drafter_dtype``); elsewhere, or for a named dtype, both run in it."""
    spec_dtype = resolve_dtype(dtype, target32.device)
    targets = target_in_each_dtype(target32, spec_dtype)
    if dtype != "auto":
        return targets, spec_dtype, spec_dtype
    if target32.device.type == "cpu" and linears == "fp16":
        return targets, torch.float32, torch.float32
    if target32.device.type == "cpu":
        spec_dtype, _ = fastest_speculation_dtype(targets, draft, input_ids, linears)
    return targets, spec_dtype, drafter_dtype(spec_dtype, target32.device)
