"""``mfd-hub demo``: the miniature's first contact. SmolLM2-135M and a shipped drafter, one prompt,
plain greedy decoding against the chain, the product tree and the mixture tree."""

from .shipped import drafter_folder, load_with_auto_model

DEMO_METHODS = ("chain", "product", "mixture")


def run_demo(prompt, drafter="MFD-SmolLM2-135M", budget=32, max_new_tokens=128, log=None):
    """Plain greedy decoding, then chain, product tree and mixture tree on SmolLM2-135M with the
    drafter -> a dict: the text, and per method tokens, tau, tok/s, speedup, identical."""
    import os

    import torch
    from tqdm import tqdm

    from mfd_hub.targets import SMOLLM2, encode_prompt, greedy_decode, load_target, stop_ids_of

    from .bench import plain_decode

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything the demo needs is on disk
    folder = drafter_folder(drafter)
    with tqdm(total=2, desc="loading", unit="model", disable=log is None) as bar:
        bar.set_postfix_str("SmolLM2-135M-Instruct")
        target, tokenizer = load_target(SMOLLM2)
        bar.update(1)
        bar.set_postfix_str(f"{folder.name} (AutoModel, trust_remote_code)")
        draft = load_with_auto_model(folder)
        bar.update(1)
    ids = encode_prompt(tokenizer, prompt)
    stops = stop_ids_of(tokenizer, target)
    methods = DEMO_METHODS if draft.config.num_modes > 0 else ("chain", "product")

    # one short warm-up of every path, so no method pays for first-call allocations
    greedy_decode(target, ids, 4, stop_ids=stops)
    for method in methods:
        draft.spec_generate(target, ids, max_new_tokens=4, method=method, tree_budget=budget, stop_token_ids=stops)

    if log:
        log(f"decoding {ids.shape[1]} prompt tokens -> up to {max_new_tokens} new tokens, greedy (T = 0)")
    plain, plain_seconds = plain_decode(target, ids, max_new_tokens, 0.0, stops, seed=0)
    runs = [{"method": "plain", "budget": None, "new_tokens": len(plain), "rounds": None, "tau": None,
             "seconds": plain_seconds, "tokens_per_second": len(plain) / plain_seconds, "speedup": 1.0,
             "identical": True}]
    for method in methods:
        out = draft.spec_generate(target, ids, max_new_tokens=max_new_tokens, method=method, tree_budget=budget,
                                  stop_token_ids=stops)
        runs.append({
            "method": method, "budget": budget, "new_tokens": len(out.new_tokens), "rounds": out.rounds,
            "tau": out.tau, "seconds": out.seconds, "tokens_per_second": out.tokens_per_second,
            "speedup": plain_seconds / out.seconds if out.seconds > 0 else float("nan"),
            "identical": out.new_tokens == plain, "stage_seconds": dict(out.stage_seconds),
        })
        if log:
            log(f"  {method:<8} tau {out.tau:.2f}, {out.tokens_per_second:.1f} tok/s")
    return {
        "prompt": prompt,
        "drafter": folder.name,
        "target": "SmolLM2-135M-Instruct",
        "threads": torch.get_num_threads(),
        "text": tokenizer.decode(plain, skip_special_tokens=True),
        "runs": runs,
    }
