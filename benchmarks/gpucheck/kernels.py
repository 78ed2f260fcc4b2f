"""Section ``kernels``: every Triton kernel against its torch reference, bit for bit where the
reference says so, to rounding otherwise."""

import random
import time

from .common import dtype_of, kernel_backend, max_error, sync
from .report import EXACT


def kernel_logits(m, length, vocab, kind, seed, device, dtype):
    """Logits [m, length, vocab] of one kind: drafter-like (benchmarks/tree_build.py), normal,
    ties (small integers: quantised ties across every cut), inf (every 7th token impossible),
    shared (every mode the same drafter-like distribution)."""
    import torch
    import tree_build as tree_bench

    g = torch.Generator().manual_seed(seed)
    if kind in ("drafter", "shared"):
        logits = tree_bench.synthetic_logits(m, seed=seed, vocab=vocab, positions=length)
        if kind == "shared":
            logits[:] = logits[0]
    elif kind == "ties":
        logits = torch.randint(-2, 2, (m, length, vocab), generator=g).float()
    else:
        logits = torch.randn(m, length, vocab, generator=g) * (4 if kind in ("normal", "inf") else 2)
        if kind == "inf":
            logits[..., ::7] = float("-inf")
    return logits.to(device=device, dtype=dtype_of(dtype))


def run_kernel_checks(report, device, shapes):
    import torch

    with torch.inference_mode(), kernel_backend("triton"):
        try:
            check_kernels(report, device, shapes, [])
        except Exception as error:  # e.g. no triton: one record says so
            def failed(error=error):
                raise error

            report.run("kernels", "kernels", EXACT, "every Triton kernel == its reference", failed)


def check_kernels(report, device, shapes, pool):
    from mfd_hub.testing import chain_tree, random_tree
    import torch

    from mfd_hub.kernels import backend
    from mfd_hub.kernels.accept import accept_walk, accept_walk_reference
    from mfd_hub.kernels.kv_compact import compact_kv, compact_kv_reference
    from mfd_hub.kernels.mode_attention import mode_attention, mode_attention_reference
    from mfd_hub.kernels.tree_attention import (
        ancestor_mask,
        ancestor_mask_reference,
        verify_attention_bias,
        verify_attention_bias_reference,
    )
    from mfd_hub.kernels.tree_build import (
        build_mixture_tree,
        draft_candidates,
        draft_tree,
        log_normaliser,
        top_candidates,
    )
    from mfd_hub.kernels.tree_build_triton import candidates_kernel_supports, tree_kernel_supports

    if backend.triton is None:
        raise RuntimeError("triton is not installed: the Triton kernels cannot be checked")
    if not backend.use_triton(torch.zeros(1, device=device)):
        raise RuntimeError("the Triton backend is not active: the kernels would be compared with themselves")
    section = "kernels"

    def candidates():
        rows, first_call = [], {}
        for i, (m, length, vocab, k, kind, dt) in enumerate(shapes["candidates"]):
            logits = kernel_logits(m, length, vocab, kind, 100 + i, device, dt)
            want = top_candidates(logits, k, log_normaliser(logits))
            started = time.perf_counter()
            got = draft_candidates(logits, k)
            sync(device)
            first_call[f"{m}x{length}x{vocab} k={k} {dt}"] = round(time.perf_counter() - started, 3)
            equal = torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            rows.append({"modes": m, "positions": length, "vocab": vocab, "k": k, "logits": kind, "dtype": dt,
                         "triton": candidates_kernel_supports(vocab), "equal": equal})
        good = sum(r["equal"] and r["triton"] for r in rows)
        return (f"{good}/{len(rows)} cases equal (scores and ids)", good == len(rows), good,
                {"cases": rows, "first_call_seconds": first_call})

    report.run(section, "kernels.vocab_topk", EXACT, "tree_build_triton top-k == top_candidates, bit for bit", candidates)

    def trees():
        rows = []
        for i, (budget, m, length, vocab, kind) in enumerate(shapes["trees"]):
            logits = kernel_logits(m, length, vocab, "normal" if kind == "fallback" else kind, 200 + i, device, "float32")
            scores, ids = top_candidates(logits, budget, log_normaliser(logits))
            want = build_mixture_tree(scores.cpu(), ids.cpu(), budget, anchor=3)
            got = draft_tree(scores, ids, budget, 3, vocab)
            fields = ("tokens", "parents", "depths", "scores", "modes")
            equal = all(torch.equal(getattr(got, f).cpu(), getattr(want, f)) for f in fields)
            uses_kernel = tree_kernel_supports(m, length, budget, vocab)
            rows.append({"budget": budget, "modes": m, "positions": length, "vocab": vocab, "logits": kind,
                         "nodes": got.num_nodes, "triton": uses_kernel, "equal": equal})
            if uses_kernel and got.num_nodes >= 8:
                pool.append((got.tokens, got.parents, got.depths))
        good = sum(r["equal"] and (r["triton"] or r["logits"] == "fallback") for r in rows)
        measured = f"{good}/{len(rows)} trees equal (tokens, parents, depths, scores, modes)"
        skipped = [{"budget": t[0], "modes": t[1], "positions": t[2], "vocab": t[3]}
                   for t in shapes.get("skipped_trees", [])]
        if skipped:
            shown = sorted({f"K = {t['modes']}, B = {t['budget']}" for t in skipped})
            needed = max(t["modes"] * t["budget"] for t in skipped)
            measured += f"; not run: {', '.join(shown)} (--max-tree-entries {needed})"
        return measured, good == len(rows), good, {"cases": rows, "skipped": skipped}

    report.run(section, "kernels.tree_build", EXACT, "draft_tree (Triton) == build_mixture_tree, bit for bit", trees)

    rng = random.Random(0)
    shaped = [random_tree(rng, n) for n in shapes["random_tree_sizes"]] + [chain_tree(n) for n in shapes["chains"]]
    # drafted-shaped trees: depth <= 15, from the tree build above (or random when it did not run)
    drafted = list(pool) or [random_tree(rng, 17, max_depth=15)]
    deepest = max(drafted, key=lambda t: (int(t[2].max()), t[0].shape[0]))  # the Qwen-shaped tree
    all_trees = shaped + drafted

    def masks():
        rows = []
        for tokens, parents, depths in all_trees:
            parents_d = parents.to(device)
            mask = ancestor_mask(parents_d, int(depths.max()))
            mask_ok = torch.equal(mask, ancestor_mask_reference(parents_d))
            bias_ok = True
            for dt in ("float32", "bfloat16", "float16"):
                for prefix in shapes["bias_prefixes"]:
                    bias = verify_attention_bias(mask, prefix, dtype_of(dt))
                    want = verify_attention_bias_reference(mask, prefix, dtype_of(dt))
                    bias_ok &= bias.dtype == want.dtype and torch.equal(bias, want)
            rows.append({"nodes": parents.shape[0], "depth": int(depths.max()), "mask": mask_ok, "bias": bias_ok})
        good = sum(r["mask"] and r["bias"] for r in rows)
        return (f"{good}/{len(rows)} trees: mask and bias equal (fp32/bf16/fp16)", good == len(rows), good,
                {"cases": rows})

    report.run(section, "kernels.tree_attention", EXACT, "ancestor mask and verify bias == reference, bit for bit", masks)

    def accept():
        rows = []
        for tokens, parents, depths in all_trees:
            n = tokens.shape[0]
            t_list, p_list = tokens.tolist(), parents.tolist()
            # along a random root-to-leaf path the target agrees: deep accepts with branches
            leaf = rng.randrange(n)
            along = torch.tensor([rng.randrange(3) for _ in range(n)])
            node = leaf
            while p_list[node] >= 0:
                along[p_list[node]] = t_list[node]
                node = p_list[node]
            targets = (torch.tensor([rng.randrange(3) for _ in range(n)]), torch.roll(tokens, -1), along)
            for target in targets:
                for extra in (0, 2):
                    max_depth = int(depths.max()) + extra
                    args = [x.to(device) for x in (tokens, parents, depths, target)]
                    path, info = accept_walk(*args, max_depth)
                    want_path, want_info = accept_walk_reference(*args, max_depth)
                    y, brute = target.tolist(), [0]
                    for i in range(1, n):
                        if p_list[i] == brute[-1] and t_list[i] == y[p_list[i]]:
                            brute.append(i)
                    ok = torch.equal(path, want_path) and torch.equal(info, want_info)
                    ok &= path[: len(brute)].tolist() == brute and info.tolist() == [
                        len(brute), int(brute == list(range(len(brute)))), y[brute[-1]]]
                    rows.append({"nodes": n, "max_depth": max_depth, "accepted": len(brute), "equal": ok})
        good = sum(r["equal"] for r in rows)
        return (f"{good}/{len(rows)} walks equal (path, info; brute force too)", good == len(rows), good,
                {"cases": rows, "deepest_accept": max(r["accepted"] for r in rows)})

    report.run(section, "kernels.accept_walk", EXACT, "accept walk (Triton) == reference == brute force", accept)

    def kv():
        rows = []
        for spec in shapes["kv"]:
            dt = dtype_of(spec["dtype"])
            rows_n = spec["rows"]
            tree = next((t for t in drafted if t[0].shape[0] <= rows_n), None) or random_tree(rng, rows_n, max_depth=15)
            # accepted paths: the root alone, the spine, a root-to-node path of a drafted tree
            p_list = tree[1].tolist()
            node, branchy = len(p_list) - 1, []
            while node >= 0:
                branchy.append(node)
                node = p_list[node]
            paths = [[0], list(range(min(16, rows_n))), branchy[::-1], [0, 2, 5][: max(1, min(3, rows_n - 4))]]
            for path in paths:
                if max(path) >= rows_n:
                    continue
                path_d = torch.tensor(path, device=device)
                g = torch.Generator().manual_seed(len(path))
                tensors = [torch.randn(1, spec["heads"], spec["prefix"] + rows_n, spec["head_dim"], generator=g)
                           .to(device=device, dtype=dt) for _ in range(2 * spec["layers"])]
                before = [t.clone() for t in tensors]
                want = [t.clone() for t in compact_kv_reference(before, spec["prefix"], path_d)]
                got = compact_kv(tensors, spec["prefix"], path_d)
                ok = all(torch.equal(a, b) for a, b in zip(got, want))
                spine = path == list(range(len(path)))
                if spine:  # nothing moves
                    ok &= all(torch.equal(a, b) for a, b in zip(tensors, before))
                rows.append({**spec, "path_length": len(path), "spine": spine, "equal": ok})
        good = sum(r["equal"] for r in rows)
        return (f"{good}/{len(rows)} compactions equal", good == len(rows), good, {"cases": rows})

    report.run(section, "kernels.kv_compact", EXACT, "KV compaction (Triton, in place) == reference, bit for bit", kv)

    def modes():
        rows = []
        for i, (b, hq, hkv, n, m, s, d, c, dt, permuted) in enumerate(shapes["mode_attention"]):
            g = torch.Generator().manual_seed(300 + i)
            dtype = dtype_of(dt)

            def block():
                if permuted:  # the drafter's layout: [B, N, M, S, H, D] permuted to [B, H, N, M, S, D]
                    return torch.randn(b, n, m, s, hq, d, generator=g).to(device, dtype).permute(0, 4, 1, 2, 3, 5)
                return torch.randn(b, hq, n, m, s, d, generator=g).to(device, dtype)

            def block_kv():
                if permuted:
                    return torch.randn(b, n, m, s, hkv, d, generator=g).to(device, dtype).permute(0, 4, 1, 2, 3, 5)
                return torch.randn(b, hkv, n, m, s, d, generator=g).to(device, dtype)

            q, k_blk, v_blk = block(), block_kv(), block_kv()
            k_ctx, v_ctx = (torch.randn(b, hkv, c, d, generator=g).to(device, dtype) for _ in range(2))
            ctx_visible = (torch.rand(b, n, 1, c, generator=g) < 0.6).to(device)
            steps = torch.arange(s, device=device)
            causal = steps[:, None] >= steps[None, :]
            band = (steps[:, None] - steps[None, :]).abs() < 4  # a sliding window inside the block
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            for label, cv, bv in (("all", None, None), ("ctx", ctx_visible, None), ("ctx+causal", ctx_visible, causal),
                                  ("ctx+band", ctx_visible, band & causal)):
                want = mode_attention_reference(q, k_ctx, v_ctx, k_blk, v_blk, cv, bv, 0.3)
                got = mode_attention(q, k_ctx, v_ctx, k_blk, v_blk, cv, bv, 0.3)
                err = max_error(got, want)
                close = got.dtype == dtype and bool(torch.isclose(got.float(), want.float(), rtol=tol, atol=tol).all())
                rows.append({"shape": [b, hq, hkv, n, m, s, d, c], "dtype": dt, "masks": label,
                             "permuted": permuted, "max_abs_error": err, "tolerance": tol, "close": close})
        good = sum(r["close"] for r in rows)
        worst = {dt: max((r["max_abs_error"] for r in rows if r["dtype"] == dt), default=0.0)
                 for dt in ("float32", "bfloat16")}
        measured = (f"{good}/{len(rows)} within tolerance; max |err| fp32 {worst['float32']:.1e}, "
                    f"bf16 {worst['bfloat16']:.1e}")
        return measured, good == len(rows), good, {"cases": rows}

    report.run(section, "kernels.mode_attention", EXACT,
               "mode attention (Triton) == reference: fp32 to 1e-5, bf16 to rounding (2e-2)", modes)

    def deltanet():
        from mfd_hub.kernels import tree_deltanet as td

        rows = []
        for i, spec in enumerate(shapes["deltanet"]):
            if spec["tree"] == "random":
                tokens, parents, depths = random_tree(random.Random(i), spec["nodes"], max_depth=15)
            else:  # the deepest drafted tree, or a 16-node chain
                tokens, parents, depths = deepest if spec["tree"] == "built" else chain_tree(16)
            n = parents.shape[0]
            g = torch.Generator().manual_seed(400 + i)

            def rand(*shape):
                return torch.randn(*shape, generator=g).to(device)

            hk, hv, dk, dv, width = spec["hk"], spec["hv"], spec["dk"], spec["dv"], spec["width"]
            channels = 2 * hk * dk + hv * dv
            layout = td.tree_layout(depths.to(device), ancestor_mask(parents.to(device)), width)
            q, k, v, gates, beta = td.delta_rule_inputs(
                rand(n, hk, dk), rand(n, hk, dk), rand(n, hv, dv),
                (-torch.rand(n, hv, generator=g) * spec["decay"]).to(device), torch.rand(n, hv, generator=g).to(device))
            state = rand(hv, dk, dv)
            tol = spec["tol"]
            errors = {}
            ref = td.tree_delta_rule(q, k, v, gates, beta, state, layout, backend="torch")
            tri = td.tree_delta_rule(q, k, v, gates, beta, state, layout, backend="triton")
            errors["delta_rule"] = (max_error(tri, ref), bool(torch.isclose(tri, ref, rtol=tol, atol=tol).all()))
            worst_state, states_ok = 0.0, True
            for node in sorted({0, n // 2, n - 1, int(depths.argmax())}):
                a = td.node_state(k, v, gates, beta, state, layout, node, backend="triton")
                b = td.node_state(k, v, gates, beta, state, layout, node, backend="torch")
                worst_state = max(worst_state, max_error(a, b))
                states_ok &= bool(torch.isclose(a, b, rtol=tol, atol=tol).all())
            errors["node_state"] = (worst_state, states_ok)
            for dt in ("float32", "bfloat16"):
                x = rand(n, channels).to(dtype_of(dt))
                conv_state, weight = rand(width - 1, channels).to(dtype_of(dt)), rand(channels, width)
                a = td.tree_causal_conv(x, conv_state, weight, layout, backend="triton")
                b = td.tree_causal_conv(x, conv_state, weight, layout, backend="torch")
                errors[f"conv_{dt}"] = (max_error(a, b), bool(torch.isclose(a, b, rtol=1e-5, atol=1e-5).all()))
            ok = all(flag for _, flag in errors.values())
            rows.append({**spec, "nodes": n, "channels": channels, "ok": ok,
                         "max_abs_error": {key: err for key, (err, _) in errors.items()}})
        good = sum(r["ok"] for r in rows)
        worst = max(max(r["max_abs_error"].values()) for r in rows)
        return (f"{good}/{len(rows)} within tolerance; max |err| {worst:.1e}", good == len(rows), good, {"cases": rows})

    report.run(section, "kernels.tree_deltanet", EXACT,
               "tree conv, delta rule and node state (Triton) == torch, fp32 to 1e-5 (1e-4 at Qwen3.5 shapes)", deltanet)
