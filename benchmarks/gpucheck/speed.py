"""Section ``speed``: the tree build over the Qwen3 vocabulary, and on a Qwen3-8B-shaped target a
decode step, verify passes and a speculative round split into stages."""

import time

from .common import default_dtype, kernel_backend, median_ms, sync
from .report import GOAL, INFO


def check_speed(report, device, shapes):
    import torch

    with torch.inference_mode():
        speed_checks(report, device, shapes)


def speed_checks(report, device, shapes):
    import torch

    import tree_build as tree_bench
    from mfd_hub.timing import round_robin_ms
    from mfd_hub.kernels.tree_build import draft_candidates, draft_tree

    spec = shapes["tree_speed"]
    vocab, budget, modes = spec["vocab"], spec["budget"], spec["modes"]

    def tree():
        logits = tree_bench.synthetic_logits(modes, device=device, vocab=vocab, positions=spec["positions"])
        heap_logits = logits[0]
        values, heap_ids = tree_bench.heap_vocab(heap_logits, budget)
        low = logits.to(torch.bfloat16)
        with kernel_backend("triton"):
            scores, ids = draft_candidates(low, budget)
            t_heap_vocab, t_heap, t_vocab, t_tree = round_robin_ms([
                lambda: tree_bench.heap_vocab(heap_logits, budget),
                lambda: tree_bench.heap_build(values, heap_ids, budget),
                lambda: draft_candidates(low, budget),
                lambda: draft_tree(scores, ids, budget, 0, vocab),
            ], spec["repeats"], device)
        total, heap_total = t_vocab + t_tree, t_heap_vocab + t_heap
        details = {"triton_vocab_topk_ms": t_vocab, "triton_tree_ms": t_tree, "triton_total_ms": total,
                   "heap1_vocab_ms": t_heap_vocab, "heap1_build_ms": t_heap, "heap1_total_ms": heap_total,
                   "speedup_vs_heap1": heap_total / total, "modes": modes, "budget": budget, "vocab": vocab,
                   "positions": spec["positions"], "paper_ms": 0.35}
        measured = (f"{total:.3f} ms (top-k {t_vocab:.3f} + tree {t_tree:.3f}); heap, 1 mode: {heap_total:.3f} ms "
                    f"({heap_total / total:.1f}x)")
        return measured, total <= 0.1, total, details

    report.run("speed", f"speed.tree_build.k{modes}_b{budget}", GOAL,
               "Triton top-k + tree <= 0.1 ms a round (paper: 0.35 ms)", tree)

    qwen = shapes["qwen"]
    state = {}

    def build():
        target, drafter = qwen3_8b_shaped(device, qwen)
        g = torch.Generator().manual_seed(0)
        state.update(target=target, drafter=drafter,
                     ids=torch.randint(0, qwen["vocab"] - 1, (1, qwen["context"]), generator=g).to(device))
        params = sum(p.numel() for p in target.parameters())
        draft_params = sum(p.numel() for p in drafter.parameters())
        return (f"target {params / 1e6:,.1f}M parameters ({str(next(target.parameters()).dtype)[6:]}), drafter "
                f"{draft_params / 1e6:,.1f}M, context {qwen['context']} tokens", True, params / 1e9,
                {"config": {k: v for k, v in qwen.items() if k != "rounds"}, "target_parameters": params,
                 "drafter_parameters": draft_params})

    made = report.run("speed", "speed.qwen3_8b_shape.build", INFO, "Qwen3-8B-shaped target (random weights)", build)
    if made["status"] != "info":
        return
    target, drafter, ids = state["target"], state["drafter"], state["ids"]
    decode_ms = {}

    anchors = qwen["anchors"]

    def decode():
        decode_ms["ms"] = plain_decode_step_ms(target, ids, qwen["decode_steps"], device)
        note = f" (H200 anchor: {anchors['decode']} ms)" if "decode" in anchors else ""
        return f"{decode_ms['ms']:.2f} ms a token{note}", True, decode_ms["ms"], {"anchor_ms": anchors.get("decode")}

    report.run("speed", "speed.decode_step", INFO,
               f"plain greedy step after {qwen['context']} tokens (for the ratios below)", decode)

    for budget in qwen["verify_budgets"]:
        def verify(budget=budget):
            ms = verify_ms(target, drafter, ids, budget, qwen["repeats"], device)
            ratio = ms / decode_ms["ms"] if decode_ms.get("ms") else float("nan")
            anchor = anchors.get(budget)
            note = f" (H200 anchor {anchor} ms)" if anchor else ""
            return (f"{ms:.2f} ms for {budget + 1} tokens = {ratio:.2f}x a decode step{note}", True, ms,
                    {"tokens": budget + 1, "ratio_to_decode_step": ratio, "anchor_ms": anchor})

        report.run("speed", f"speed.verify_{budget}", INFO, "one verify pass over root + B tree nodes", verify)

    import round_breakdown

    for method, budget in qwen["rounds"]:
        def one_round(method=method, budget=budget):
            m = round_breakdown.measure_rounds(drafter, target, ids, method, budget, qwen["round_tokens"], device)
            out = drafter.spec_generate(target, ids, max_new_tokens=qwen["round_tokens"], method=method,
                                        tree_budget=budget, mode=0)
            plain = 1e3 * (out.seconds - out.stage_seconds["prefill"]) / out.rounds
            parts = ", ".join(f"{p} {v:.2f}" for p, v in m["parts"].items() if v >= 0.005)
            measured = (f"{m['outside']:.1%} outside the target ({m['round_ms']:.2f} ms a round instrumented, "
                        f"{plain:.2f} ms plain; {parts})")
            return measured, m["outside"] <= 0.10, m["outside"], {**m, "plain_round_ms": plain, "budget": budget,
                                                                   "tokens": qwen["round_tokens"]}

        report.run("speed", f"speed.round.{method}_b{budget}", GOAL,
                   f"share of a round outside the target's forward <= 10% (untrained drafter, {qwen['context']}-token "
                   "context)", one_round)
    state.clear()
    del target, drafter
    if device.type == "cuda":
        torch.cuda.empty_cache()


def qwen3_8b_shaped(device, cfg):
    """A transformers Qwen3 target and an 8-mode, 5-layer drafter of the published shapes
    (DESIGN §3), random weights, built directly on ``device`` (bf16 on CUDA, fp32 on CPU)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from mfd_hub.remote.modeling_mfd import DFlashDraftModel
    from mfd_hub.testing import drafter_config_for

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = Qwen3Config(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["intermediate"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
        head_dim=cfg["head_dim"], max_position_embeddings=4096, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    with default_dtype(dtype), torch.device(device):
        target = Qwen3ForCausalLM(config).eval()
        draft_config = drafter_config_for(
            target, num_modes=8, num_layers=cfg["draft_layers"], block_size=16, target_layer_ids=cfg["taps"],
            intermediate_size=cfg["intermediate"], num_attention_heads=cfg["heads"],
            num_key_value_heads=cfg["kv_heads"], head_dim=cfg["head_dim"], mask_token_id=cfg["mask_id"],
        )
        drafter = DFlashDraftModel(draft_config).eval()
    with torch.no_grad():
        drafter.mode_embed.normal_(0.0, 0.5)
    target.requires_grad_(False)
    drafter.requires_grad_(False)
    return target, drafter


def plain_decode_step_ms(target, ids, steps, device):
    """Median time of one greedy step of plain decoding after ``ids`` (a transformers cache)."""
    import statistics

    import torch
    from transformers import DynamicCache

    from mfd_hub.remote.targets_mfd import _forward_kwargs

    cache_kw, _ = _forward_kwargs(target)
    cache = DynamicCache()
    with torch.inference_mode():
        out = target(input_ids=ids, use_cache=True, **{cache_kw: cache})
        token = out.logits[:, -1:].argmax(-1)
        samples = []
        for step in range(steps + 2):
            position = torch.full((1, 1), ids.shape[1] + step, device=device)
            sync(device)
            started = time.perf_counter()
            out = target(input_ids=token, position_ids=position, use_cache=True, **{cache_kw: cache})
            token = out.logits[:, -1:].argmax(-1)
            sync(device)
            if step >= 2:
                samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def verify_ms(target, drafter, ids, budget, repeats, device):
    """Median time of the verifier's forward over root + a ``budget``-node mixture tree (of
    drafter-like logits) after ``ids``; each pass is then committed as the root alone, so the
    context grows by one token a repeat."""
    import torch

    import tree_build as tree_bench
    from mfd_hub.kernels.tree_attention import ancestor_mask
    from mfd_hub.kernels.tree_build import draft_candidates, draft_tree
    from mfd_hub.remote.targets_mfd import make_verifier

    vocab = target.config.vocab_size
    with torch.inference_mode():
        logits = tree_bench.synthetic_logits(8, seed=budget, device=device, vocab=vocab, positions=15)
        with kernel_backend("torch"):  # the tree's shape is all that matters here: no compile for it
            scores, cand = draft_candidates(logits, budget)
            tree = draft_tree(scores, cand, budget, 0, vocab)
            mask = ancestor_mask(tree.parents, 15)
        verifier = make_verifier(target, drafter.target_layer_ids)
        verifier.prefill(ids)
        root = torch.zeros(1, dtype=torch.long, device=device)
        return median_ms(lambda: verifier.verify(tree.tokens, tree.depths, mask), repeats, device,
                         after=lambda: verifier.commit(root))
