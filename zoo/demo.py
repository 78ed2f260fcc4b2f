"""``mfd-hub demo``: the miniature's first contact. SmolLM2-135M and a shipped drafter, one prompt,
plain greedy decoding against the chain, the product tree and the mixture tree.

Honest numbers: the baseline is the faster of plain fp32 and plain bf16 decoding (transformers
``generate``) of the same target on this machine, and every configuration, plain ones included,
is timed ``repeats`` times interleaved (one run of each per repeat), so drifting machine load hits
them all alike; each figure is the median. Speculation runs in ``dtype`` (``auto``, on a CPU: fp32
with fp16 weights where bf16 is emulated, else the dtype whose speculative decoding is fastest,
measured here, the drafter in fp32 unless bf16 is native: ``mfd_hub.dtype_choice``) with
``budget`` (``auto``: chosen per round from this machine's measured costs). Outputs are checked against plain decoding in the same dtype:
identical in fp32, identical or diverging only at a near-tie in bf16/fp16 (``mfd_hub.precision``).
"""

import statistics
import time

from mfd_hub.pair import load_pair

DEMO_METHODS = ("chain", "product", "mixture")


def run_demo(prompt, drafter="MFD-SmolLM2-135M", budget="auto", max_new_tokens=128, dtype="auto", repeats=3, log=None,
             linears="auto"):
    """-> a dict: the text, the baseline, and per configuration tokens, tau, tok/s, speedup over the
    fastest plain decoding, and the lossless check."""
    import os

    import torch

    from mfd_hub.near_tie import classify_divergence
    from mfd_hub.precision import dtype_name
    from mfd_hub.targets import SMOLLM2, greedy_decode

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything the demo needs is on disk
    # the drafter through AutoModel with trust_remote_code, as its users load it; fp32 and bf16
    # targets for the plain baselines
    pair = load_pair(drafter, SMOLLM2, dtype=dtype, linears=linears, device="cpu", baselines=True, timing_prompt=prompt,
                     remote_code=True, log=log)
    ids = pair.encode(prompt)
    stops = pair.stop_ids
    draft, targets = pair.draft, pair.plain_targets
    spec_dtype, draft_dtype = pair.dtype, pair.draft_dtype
    target32 = targets[torch.float32]
    methods = DEMO_METHODS if draft.config.num_modes > 0 else ("chain", "product")

    def plain(dt):
        return lambda: greedy_decode(targets[dt], ids, max_new_tokens, stop_ids=stops, return_logits=True)

    def spec(method):
        return lambda: pair.generate(ids, max_new_tokens=max_new_tokens, method=method, tree_budget=budget)

    configs = [(f"plain {dtype_name(dt)}", plain(dt)) for dt in targets]  # fp32, bf16, then the spec dtype
    configs += [(method, spec(method)) for method in methods]

    # on CPU: targets (plain and speculating alike) and drafter multiply through oneDNN (fp32, and bf16
    # where native) or with fp16 weights (fp32)
    with pair.packed():
        # warm-up: first-call allocations, and (budget "auto") the one-time cost measurement
        if log:
            log("warming up" + (" and measuring this machine's round costs (cached)" if budget == "auto" else ""))
        greedy_decode(target32, ids, 4, stop_ids=stops)
        for method in methods:
            pair.generate(ids, max_new_tokens=4, method=method, tree_budget=budget)

        if log:
            log(f"decoding {ids.shape[1]} prompt tokens -> up to {max_new_tokens} new tokens, greedy (T = 0), "
                f"speculation in {dtype_name(spec_dtype)}, {repeats} interleaved repeats")
        seconds = {name: [] for name, _ in configs}
        last = {}
        for _ in range(repeats):
            for name, fn in configs:
                began = time.perf_counter()
                last[name] = fn()
                seconds[name].append(time.perf_counter() - began)
    median = {name: statistics.median(values) for name, values in seconds.items()}

    def tokens_of(name):
        result = last[name]
        return result[0] if name.startswith("plain") else result.new_tokens

    rates = {name: len(tokens_of(name)) / median[name] for name, _ in configs}
    plain_names = [name for name, _ in configs if name.startswith("plain")]
    baseline = max(plain_names, key=lambda n: rates[n])
    reference_tokens, reference_logits = last[f"plain {dtype_name(spec_dtype)}"]

    runs = []
    for name, _ in configs:
        row = {"method": name, "new_tokens": len(tokens_of(name)), "seconds": median[name],
               "tokens_per_second": rates[name], "speedup": rates[name] / rates[baseline]}
        if name.startswith("plain"):
            row.update(budget=None, rounds=None, tau=None, dtype=name.split()[1])
        else:
            out = last[name]
            check = classify_divergence(reference_tokens, out.new_tokens, reference_logits, spec_dtype,
                                        targets[spec_dtype], ids)
            row.update(budget=budget, rounds=out.rounds, tau=out.tau, dtype=dtype_name(spec_dtype),
                       mean_tree_size=sum(out.tree_sizes) / max(1, len(out.tree_sizes)),
                       modes_drafted=out.modes_drafted, stage_seconds=dict(out.stage_seconds), lossless=check)
        runs.append(row)
        if log and not name.startswith("plain"):
            log(f"  {name:<8} tau {row['tau']:.2f}, {row['tokens_per_second']:.1f} tok/s")
    return {
        "prompt": prompt,
        "drafter": os.path.basename(os.path.normpath(str(drafter))),  # as named, not the cache folder
        "target": "SmolLM2-135M-Instruct",
        "threads": torch.get_num_threads(),
        "dtype": dtype_name(spec_dtype),
        "drafter_dtype": dtype_name(draft_dtype),
        "linears": pair.linears,
        "budget": budget,
        "repeats": repeats,
        "baseline": {"method": baseline, "tokens_per_second": rates[baseline]},
        "text": pair.decode(reference_tokens),
        "runs": runs,
    }
