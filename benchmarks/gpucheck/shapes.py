"""Every size the check uses: the full Qwen-scale shapes on a GPU, small ones in quick mode."""

QWEN_VOCABS = (151_936, 248_320)  # Qwen3, Qwen3.5 / 3.6
METHODS = ("chain", "product", "mixture")


def plan(quick, max_tree_entries=None):
    """Every size the check uses, full (the GPU) or quick (the CPU test: Triton's interpreter
    pays per operation, so the vocabularies there are tiny). Tree cases whose mode merge would
    sort more than ``max_tree_entries`` (modes x budget) entries are set aside in
    ``skipped_trees``: that one kernel's compile grows steeply (K = 8, B = 256: many minutes)."""
    shapes = _quick_plan() if quick else _full_plan()
    if max_tree_entries is not None:
        big = [t for t in shapes["trees"] if t[0] * t[1] > max_tree_entries and t[4] != "fallback"]
        shapes["trees"] = [t for t in shapes["trees"] if t not in big]
        shapes["skipped_trees"] = big
    return shapes


def _quick_plan():
    return dict(
        candidates=[(1, 1, 2, 1, "normal", "float32"), (3, 4, 7, 5, "ties", "float32"),
                    (2, 3, 16, 16, "ties", "float32"), (2, 2, 9, 40, "normal", "float32"),
                    (1, 1, 130, 4, "inf", "float32"), (2, 3, 16, 8, "drafter", "bfloat16")],
        trees=[(5, 1, 6, 1, "normal"), (1, 3, 4, 5, "normal"), (16, 2, 3, 16, "drafter"),
               (8, 2, 3, 16, "shared"), (300, 2, 3, 5, "fallback")],
        random_tree_sizes=(1, 2, 9, 33), chains=(1, 7), bias_prefixes=(5,),
        kv=[dict(layers=3, heads=3, prefix=5, rows=9, head_dim=6, dtype="float32")],
        mode_attention=[(2, 2, 2, 2, 1, 8, 16, 0, "float32", False), (1, 2, 1, 3, 2, 5, 12, 70, "float32", True),
                        (1, 4, 2, 1, 2, 4, 16, 9, "bfloat16", True)],
        deltanet=[dict(tree="random", nodes=9, hk=1, hv=2, dk=8, dv=12, width=4, decay=2.0, tol=1e-5)],
        # the interpreter runs a round in about a second: Triton decodes fewer methods here
        lossless=dict(families=("qwen3", "qwen3_5_text"), vocab=32, hidden=32, layers=4, init_std=0.2,
                      hybrid_target=dict(num_layers=2, layer_types=["linear_attention", "full_attention"],
                                         linear_num_key_heads=1, linear_num_value_heads=2),
                      triton_methods=dict(attention=("chain", "mixture"), hybrid=("mixture",)),
                      sync_families=("qwen3", "qwen3_5_text"), profile_tokens=12,
                      modes=2, draft_layers=1, block=8, budgets=dict(chain=8, product=8, mixture=8),
                      new_tokens=12, prompts=1, prompt_len=6, train_seqs=16, train_steps=100,
                      anchors=8, lr=3e-3, min_tau=1.5),
        tree_speed=dict(vocab=16, positions=3, modes=2, budget=8, repeats=1),
        qwen=dict(vocab=256, hidden=64, intermediate=128, layers=4, heads=4, kv_heads=2, head_dim=16,
                  draft_layers=1, taps=[0, 1, 2], mask_id=255, context=32, decode_steps=4,
                  verify_budgets=(4, 8, 16), repeats=2, round_tokens=12, anchors={},
                  rounds=(("chain", 15), ("product", 16), ("mixture", 16))),
    )


def _full_plan():
    candidates = [(1, 1, 2, 1, "normal", "float32"), (3, 4, 7, 5, "ties", "float32"),
                  (2, 3, 16, 16, "ties", "float32"), (2, 2, 9, 40, "normal", "float32"),
                  (1, 5, 300, 33, "inf", "float32"), (2, 1, 4100, 3, "ties", "float32")]
    for vocab in QWEN_VOCABS:
        candidates += [(8, 15, vocab, b, "drafter", "bfloat16") for b in (64, 128, 256)]
        candidates += [(1, 15, vocab, 128, "drafter", "bfloat16"), (1, 15, vocab, 1, "drafter", "bfloat16")]
    candidates += [(8, 15, QWEN_VOCABS[0], 128, "drafter", "float32"), (8, 15, QWEN_VOCABS[0], 128, "ties", "bfloat16"),
                   (8, 15, QWEN_VOCABS[1], 64, "inf", "bfloat16"), (8, 3, QWEN_VOCABS[0], 128, "drafter", "bfloat16")]
    trees = [(128, 2, 3, 6, "normal"), (32, 8, 2, 40, "shared"), (1, 3, 4, 5, "normal"), (5, 1, 6, 1, "normal"),
             (300, 2, 3, 5, "fallback")]
    for vocab in QWEN_VOCABS:
        trees += [(b, m, 15, vocab, "drafter") for m, b in ((8, 64), (8, 128), (1, 128), (1, 256))]
    trees += [(128, 8, 3, QWEN_VOCABS[0], "drafter"), (128, 8, 15, QWEN_VOCABS[0], "shared"),
              (128, 8, 15, QWEN_VOCABS[0], "ties")]
    trees += [(256, 8, 15, vocab, "drafter") for vocab in QWEN_VOCABS]  # last: the longest compile
    return dict(
        candidates=candidates, trees=trees,
        random_tree_sizes=(1, 2, 9, 33, 129, 257), chains=(1, 7, 16), bias_prefixes=(1, 1024),
        kv=[dict(layers=3, heads=3, prefix=5, rows=9, head_dim=6, dtype="float32"),
            dict(layers=36, heads=8, prefix=1024, rows=129, head_dim=128, dtype="bfloat16"),
            dict(layers=8, heads=4, prefix=100, rows=33, head_dim=128, dtype="float16")],
        mode_attention=[(1, 4, 2, 1, 3, 4, 8, 5, "float32", False), (2, 2, 2, 2, 1, 8, 16, 0, "float32", False),
                        (1, 2, 1, 3, 2, 5, 12, 70, "float32", False),
                        (1, 32, 8, 1, 8, 16, 128, 1024, "bfloat16", True), (1, 32, 8, 1, 8, 16, 128, 1024, "float32", True),
                        (1, 32, 8, 1, 1, 16, 128, 1024, "bfloat16", True), (1, 32, 8, 1, 8, 16, 128, 1, "bfloat16", False),
                        (1, 40, 8, 1, 8, 16, 128, 3000, "bfloat16", True)],
        deltanet=[dict(tree="built", hk=16, hv=32, dk=128, dv=128, width=4, decay=2.0, tol=1e-4),
                  dict(tree="chain", hk=16, hv=32, dk=128, dv=128, width=4, decay=40.0, tol=1e-4),
                  dict(tree="random", nodes=20, hk=2, hv=6, dk=5, dv=7, width=4, decay=2.0, tol=1e-5)],
        lossless=dict(families=("qwen3", "llama", "qwen3_5_text", "qwen3_next"), vocab=256, hidden=64, layers=4,
                      init_std=0.2, triton_methods=dict(attention=METHODS, hybrid=METHODS), modes=4,
                      # MoE targets (qwen3_next) read the device in their own routing, in plain decoding too
                      sync_families=("qwen3", "llama", "qwen3_5_text"), profile_tokens=32,
                      draft_layers=2, block=16, budgets=dict(chain=16, product=32, mixture=32),
                      new_tokens=64, prompts=2, prompt_len=8, train_seqs=16, train_steps=150, anchors=16,
                      lr=2e-3, min_tau=2.0),
        tree_speed=dict(vocab=QWEN_VOCABS[0], positions=15, modes=8, budget=128, repeats=50),
        qwen=dict(vocab=151_936, hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, head_dim=128,
                  draft_layers=5, taps=[1, 9, 17, 25, 33], mask_id=151_669, context=1024, decode_steps=32,
                  verify_budgets=(16, 64, 128), repeats=20, round_tokens=64,
                  anchors={"decode": 28.9, 64: 28.7, 128: 33.1},  # DESIGN §4: H200, eager, ms
                  rounds=(("chain", 15), ("product", 128), ("mixture", 128))),
    )
