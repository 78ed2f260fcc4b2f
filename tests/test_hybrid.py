"""Hybrid Gated-DeltaNet targets (Qwen3.5 / Qwen3-Next): the tree kernels equal sequential
decoding on every path, verification equals brute force, spec_generate is lossless."""

import json

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_fn, torch_recurrent_gated_delta_rule

from conftest import NO_MFD_HUB, NO_TRITON, run_python
from mfd_hub.checkpoint import save_draft
from mfd_hub.kernels import tree_deltanet
from mfd_hub.kernels.tree_attention import ancestor_mask
from mfd_hub.remote.hybrid_mfd import HybridVerifier
from mfd_hub.remote.targets_mfd import AttentionVerifier, UnsupportedTargetError, make_verifier
from mfd_hub.testing import greedy_decode, save_tiny_target, spine_tree, tiny_drafter, tiny_target

LINEAR, FULL = "linear_attention", "full_attention"
# (family, layer count, layer_types): None is the config's default, one full layer in four
PATTERNS = {
    "qwen3_5-interval": ("qwen3_5_text", 8, None),
    "qwen3_5-one-attention": ("qwen3_5_text", 5, [LINEAR, LINEAR, FULL, LINEAR, LINEAR]),
    "qwen3_next-interval": ("qwen3_next", 4, None),
}
METHODS = ("chain", "product", "mixture")
BUDGETS = {"chain": 16, "product": 32, "mixture": 32}
NEW_TOKENS = 220


def hybrid_target(pattern, vocab_size=16, **kw):
    family, layers, types = PATTERNS[pattern]
    extra = {} if types is None else {"layer_types": types}
    return tiny_target(family, vocab_size=vocab_size, num_layers=layers, init_std=0.2, **extra, **kw)



# ---- kernels ------------------------------------------------------------------------------------
def kernel_inputs(n, hk=2, hv=4, dk=8, dv=6, channels=20, width=4, seed=0, decay=2.0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    return dict(
        q=rand(n, hk, dk), k=rand(n, hk, dk), v=rand(n, hv, dv), g=-torch.rand(n, hv, generator=gen) * decay,
        beta=torch.rand(n, hv, generator=gen), state=rand(hv, dk, dv), x=rand(n, channels),
        conv_state=rand(width - 1, channels), weight=rand(channels, width),
    )


@pytest.mark.parametrize("n,spine,decay", [(1, 1, 2.0), (9, 9, 2.0), (24, 7, 2.0), (24, 7, 40.0)])
def test_tree_kernels_equal_sequential_decoding_on_every_path(n, spine, decay):
    """Node i's conv output, delta-rule output and state are those of transformers' sequential
    functions run over the committed state and the root-to-i path (also under decays strong
    enough that the committed state fades out within the tree)."""
    t = kernel_inputs(n, decay=decay)
    parents, depths = spine_tree(n, spine, seed=n)
    mask = ancestor_mask(parents)
    layout = tree_deltanet.tree_layout(depths, mask, width=4)
    for i in range(n):  # row i of the ancestor table: the root-to-i path
        path = layout.ancestors[i, : depths[i] + 1]
        assert path[-1] == i and all(parents[path[1:]] == path[:-1])
    conv = tree_deltanet.tree_causal_conv(t["x"], t["conv_state"], t["weight"], layout, backend="torch")
    q, k, v, g, beta = tree_deltanet.delta_rule_inputs(t["q"], t["k"], t["v"], t["g"], t["beta"])
    out = tree_deltanet.tree_delta_rule(q, k, v, g, beta, t["state"], layout, backend="torch")
    for i in range(n):
        path = mask[i].nonzero().flatten()
        seq = torch.cat([t["conv_state"], t["x"][path]]).t()[None]
        want_conv = causal_conv1d_fn(seq, t["weight"])[0, :, -1]
        torch.testing.assert_close(conv[i], want_conv, rtol=1e-5, atol=1e-5)
        want_out, want_state = torch_recurrent_gated_delta_rule(
            *(t[name][path][None] for name in ("q", "k", "v", "g", "beta")),
            initial_state=t["state"][None], output_final_state=True, use_qk_l2norm_in_kernel=True,
        )
        torch.testing.assert_close(out[i], want_out[0, -1], rtol=1e-5, atol=1e-5)
        got_state = tree_deltanet.node_state(k, v, g, beta, t["state"], layout, i, backend="torch")
        torch.testing.assert_close(got_state, want_state[0], rtol=1e-5, atol=1e-5)
        if len(path) >= 3:
            committed = tree_deltanet.conv_state_after(t["x"], t["conv_state"], layout, i)
            assert torch.equal(committed, t["x"][path[-3:]])


TRITON_CHECK = """
import torch
from mfd_hub.kernels import tree_deltanet as td
from mfd_hub.kernels.tree_attention import ancestor_mask
from mfd_hub.kernels.kv_compact import compact_kv
from mfd_hub.remote.hybrid_mfd import HybridVerifier
from mfd_hub.testing import tiny_target
assert td.triton is not None
torch.manual_seed(0)
# kernels: odd sizes, grouped value heads, a deep spine with branches
for n, hk, hv, dk, dv, c in [(1, 1, 1, 4, 4, 8), (13, 2, 4, 8, 12, 40), (20, 2, 6, 5, 7, 33)]:
    parents = [-1] + [max(0, i - 1) if i < 8 else int(torch.randint(0, i, (1,))) for i in range(1, n)]
    parents = torch.tensor(parents)
    depths = torch.zeros(n, dtype=torch.long)
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    layout = td.tree_layout(depths, ancestor_mask(parents), 4)
    q, k, v, g, beta = td.delta_rule_inputs(torch.randn(n, hk, dk), torch.randn(n, hk, dk), torch.randn(n, hv, dv),
                                            -torch.rand(n, hv), torch.rand(n, hv))
    s0 = torch.randn(hv, dk, dv)
    ref = td.tree_delta_rule(q, k, v, g, beta, s0, layout, backend="torch")
    tri = td.tree_delta_rule(q, k, v, g, beta, s0, layout, backend="triton")
    torch.testing.assert_close(tri, ref, rtol=1e-5, atol=1e-5)
    for node in sorted({0, n // 2, n - 1}):
        states = [td.node_state(k, v, g, beta, s0, layout, node, backend=b) for b in ("triton", "torch")]
        torch.testing.assert_close(*states, rtol=1e-5, atol=1e-5)
    x, cs, w = torch.randn(n, c), torch.randn(3, c), torch.randn(c, 4)
    torch.testing.assert_close(td.tree_causal_conv(x, cs, w, layout, backend="triton"),
                               td.tree_causal_conv(x, cs, w, layout, backend="torch"), rtol=1e-5, atol=1e-5)
# the verifier on the Triton path: verify, commit, verify again
target = tiny_target("qwen3_5_text", vocab_size=16, init_std=0.2)
parents = torch.tensor([-1, 0, 1, 2, 3, 4, 1, 0, 7])
depths = torch.tensor([0, 1, 2, 3, 4, 5, 2, 1, 2])
mask = ancestor_mask(parents)
results = []
for backend in ("torch", "triton"):
    v = HybridVerifier(target, [0, 2], backend=backend)
    with torch.no_grad():
        v.prefill(torch.tensor([[3, 1, 4]]))
        first = v.verify(torch.tensor([5, 2, 7, 1, 1, 3, 9, 4, 4]), depths, mask)
        v.commit(torch.tensor([0, 1, 2, 3, 4]))
        second = v.verify(torch.tensor([6, 2, 2, 8, 1, 0, 3, 4, 5]), depths, mask)
    results.append(first + second)
for a, b in zip(*results):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
print("ok")
"""


def test_triton_path_equals_torch_reference(tmp_path):
    """Runs in a fresh process: TRITON_INTERPRET must be set before triton is imported."""
    proc = run_python(TRITON_CHECK, tmp_path, extra_env={"TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


# ---- verification against brute force -----------------------------------------------------------
def _vision_language(text_family):
    """Qwen3.5 as published: the vision-language wrapper (model_type qwen3_5 / qwen3_5_moe)
    around the text model."""
    import transformers

    prefix = "Qwen3_5Moe" if "moe" in text_family else "Qwen3_5"
    torch.manual_seed(0)
    text = tiny_target(text_family, vocab_size=16, init_std=0.2).config.to_dict()
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32)
    config = getattr(transformers, f"{prefix}Config")(text_config=text, vision_config=vision)
    return getattr(transformers, f"{prefix}ForConditionalGeneration")(config).float().eval()


BRUTE_FORCE_TARGETS = {
    **{name: (lambda name=name: hybrid_target(name)) for name in PATTERNS},
    "qwen3_5_moe": lambda: tiny_target("qwen3_5_moe_text", vocab_size=16, init_std=0.2),
    "qwen3_5-vlm": lambda: _vision_language("qwen3_5_text"),
    "qwen3_5_moe-vlm": lambda: _vision_language("qwen3_5_moe_text"),
}

TOL = dict(rtol=1e-3, atol=1e-3)  # a wrong state or window is off by O(1)
# a one-token prompt leaves the conv state zero-padded (fewer inputs than the kernel's width)
BRUTE_FORCE_CASES = [(name, [3, 1, 4, 1, 5, 9]) for name in BRUTE_FORCE_TARGETS] + [("qwen3_5-interval", [7])]


@pytest.mark.parametrize("name,prompt", BRUTE_FORCE_CASES, ids=[f"{n}-{len(p)}" for n, p in BRUTE_FORCE_CASES])
def test_verify_and_commit_equal_brute_force(name, prompt):
    """Over rounds of verify + commit, every node's logits and taps equal the target's own forward
    over committed sequence + the node's path; committing a path leaves nothing of the rest."""
    target = BRUTE_FORCE_TARGETS[name]()
    n_layers = target.config.get_text_config().num_hidden_layers
    taps = [0, n_layers // 2, n_layers - 1]  # the last layer's tap is the normed output
    verifier = make_verifier(target, taps)
    assert isinstance(verifier, HybridVerifier)
    committed = list(prompt)
    gen = torch.Generator().manual_seed(len(prompt))
    with torch.no_grad():
        logits, prompt_taps = verifier.prefill(torch.tensor([prompt]))
        full = target(torch.tensor([prompt]), output_hidden_states=True)
        torch.testing.assert_close(logits, full.logits[0, -1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(prompt_taps, torch.cat([full.hidden_states[i + 1] for i in taps], -1)[0])
        # commit a deep path (conv windows wholly inside the tree), the root alone, a branch
        for n, spine, pick in [(14, 7, 6), (9, 4, 0), (16, 6, 15), (5, 5, 4)]:
            parents, depths = spine_tree(n, spine, seed=n + len(committed))
            tokens = torch.randint(0, 16, (n,), generator=gen)
            mask = ancestor_mask(parents)
            logits, node_taps = verifier.verify(tokens, depths, mask)
            leaves = sorted(set(range(n)) - set(parents.tolist()))
            for leaf in leaves:  # one forward per leaf checks every node on its path
                path = mask[leaf].nonzero().flatten()
                out = target(torch.tensor([committed + tokens[path].tolist()]), output_hidden_states=True)
                at = slice(len(committed), None)
                # fp32 rounding differs (closed-form tree recurrence vs transformers' chunked one)
                torch.testing.assert_close(logits[path], out.logits[0, at], **TOL)
                want_taps = torch.cat([out.hidden_states[j + 1][0, at] for j in taps], dim=-1)
                torch.testing.assert_close(node_taps[path], want_taps, **TOL)
            path = mask[pick].nonzero().flatten()
            verifier.commit(path)
            committed += tokens[path].tolist()
            assert verifier.length == len(committed)


# ---- lossless generation ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def greedy_cases():
    """Per pattern: (target, drafter, greedy continuation), built once."""
    cache = {}

    def get(pattern, vocab_size=16):
        key = (pattern, vocab_size)
        if key not in cache:
            target = hybrid_target(pattern, vocab_size=vocab_size)
            drafter = tiny_drafter(target, num_modes=4, block_size=8)
            ids = torch.tensor([[3, 1, 2, 1, 0, 3]])
            cache[key] = target, drafter, ids, greedy_decode(target, ids, NEW_TOKENS)
        return cache[key]

    return get


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_greedy_is_token_identical(greedy_cases, pattern, method):
    target, drafter, ids, want = greedy_cases(pattern)
    out = drafter.spec_generate(target, ids, max_new_tokens=NEW_TOKENS, method=method, tree_budget=BUDGETS[method])
    assert out.new_tokens == want
    assert sum(out.acceptance_lengths) + 1 == NEW_TOKENS
    partial = sum(1 for a in out.acceptance_lengths if a > 1)  # rounds that accepted drafted tokens
    assert partial >= (3 if method == "chain" else 40), out.acceptance_lengths


def test_deep_acceptance_is_token_identical(greedy_cases):
    """A 4-token vocabulary lets big mixture trees accept 3+ drafted tokens a round: the next
    round's conv windows then come wholly from the committed path, none from older state."""
    target, drafter, ids, want = greedy_cases("qwen3_5-interval", vocab_size=4)
    out = drafter.spec_generate(target, ids, max_new_tokens=NEW_TOKENS, method="mixture", tree_budget=64)
    assert out.new_tokens == want
    assert sum(1 for a in out.acceptance_lengths if a >= 4) >= 10, out.acceptance_lengths


REMOTE_GENERATE = """
import json, torch
from transformers import AutoModel, AutoModelForCausalLM
drafter = AutoModel.from_pretrained("ck", trust_remote_code=True).float().eval()
target = AutoModelForCausalLM.from_pretrained("target").float().eval()
assert not type(drafter).__module__.startswith("mfd_hub")
ids = torch.tensor([[3, 1, 2, 1, 0, 3]])
out = drafter.spec_generate(target, ids, max_new_tokens=40, method="mixture", tree_budget=32)
print(json.dumps(out.new_tokens))
"""


def test_remote_code_generates_on_a_hybrid_target_without_mfd_hub_or_triton(tmp_path, greedy_cases):
    """The checkpoint's bundled code alone (no mfd_hub, no triton) verifies on a saved Qwen3.5 target."""
    target, drafter, ids, want = greedy_cases("qwen3_5-one-attention")
    save_draft(drafter, tmp_path / "ck")
    save_tiny_target(tmp_path / "target", target, with_tokenizer=False)
    proc = run_python(NO_MFD_HUB + NO_TRITON + REMOTE_GENERATE, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == want[:40]


def test_target_family_picks_the_verifier():
    assert isinstance(make_verifier(tiny_target("qwen3", vocab_size=16), [0]), AttentionVerifier)
    for family in ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"):
        assert isinstance(make_verifier(tiny_target(family, vocab_size=16), [0]), HybridVerifier)


def test_unsupported_targets_are_refused():
    """Another recurrent architecture (Mamba) gets one clear error, never a wrong verifier."""
    from transformers import MambaConfig, MambaForCausalLM

    target = MambaForCausalLM(MambaConfig(vocab_size=16, hidden_size=32, num_hidden_layers=4)).eval()
    drafter = tiny_drafter(tiny_target("qwen3", vocab_size=16), num_modes=2)
    with pytest.raises(UnsupportedTargetError, match=r"'mamba'.*qwen3_5_text"):
        drafter.spec_generate(target, torch.tensor([[1, 2]]), max_new_tokens=4)
    # a hybrid family whose config names a layer kind this verifier does not handle
    odd = tiny_target("qwen3_5_text", vocab_size=16, layer_types=[LINEAR, "sliding_attention", LINEAR, FULL])
    with pytest.raises(UnsupportedTargetError, match="sliding_attention"):
        drafter.spec_generate(odd, torch.tensor([[1, 2]]), max_new_tokens=4)
