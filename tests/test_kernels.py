"""Every Triton kernel equals its torch reference (run by triton's interpreter without a GPU),
the backend switch, and generation through the kernels: lossless, one host sync per round."""

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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
    quantize_logprobs,
    top_candidates,
)
from mfd_hub.testing import chain_tree, random_tree, tiny_drafter, tiny_target
from test_generation import greedy_reference

TREE_FIELDS = ("tokens", "parents", "depths", "scores", "modes")


# ---- the backend switch ----------------------------------------------------------------------
def test_backend_switch(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    assert backend.kernel_backend() == "auto" and not backend.use_triton(cpu)  # auto: CUDA only
    monkeypatch.setenv(backend.ENV_VAR, "triton")
    assert backend.kernel_backend() == "triton"
    assert backend.set_kernel_backend("torch") is None  # the setter wins over the variable
    try:
        assert not backend.use_triton(cpu)
    finally:
        backend.set_kernel_backend(None)
    monkeypatch.setenv(backend.ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="MFD_HUB_KERNELS"):
        backend.kernel_backend()
    with pytest.raises(ValueError):
        backend.set_kernel_backend("fast")
    # forcing triton where it cannot run is an error, never a silent fallback
    monkeypatch.setenv(backend.ENV_VAR, "triton")
    monkeypatch.setattr(backend, "triton", None)
    with pytest.raises(RuntimeError, match="not installed"):
        backend.use_triton(cpu)
    monkeypatch.setenv(backend.ENV_VAR, "auto")
    assert not backend.use_triton(cpu)


def test_kernels_import_and_fall_back_without_triton(tmp_path):
    from conftest import NO_TRITON, run_python

    code = "import sys\n" + NO_TRITON + """
import os, torch
os.environ["MFD_HUB_KERNELS"] = "auto"
from mfd_hub.kernels import tree_build_triton, accept_triton, kv_compact_triton, mode_attention_triton
from mfd_hub.kernels.tree_build import draft_candidates, draft_tree
scores, ids = draft_candidates(torch.randn(2, 3, 9), 4)
print(draft_tree(scores, ids, 4, 0, 9).num_nodes)
os.environ["MFD_HUB_KERNELS"] = "triton"
try:
    draft_candidates(torch.randn(2, 3, 9), 4)
except RuntimeError as e:
    print("refused:", e)
"""
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "4" and "not installed" in result.stdout


# ---- vocabulary top-k and the tree build ------------------------------------------------------
CANDIDATE_CASES = [  # (modes, positions, vocab, k, logits kind)
    (1, 1, 2, 1, "normal"),
    (3, 4, 7, 5, "ties"),
    (2, 3, 16, 16, "ties"),  # k = V
    (2, 2, 9, 40, "normal"),  # k > V
    (1, 5, 300, 33, "inf"),  # a chunk above 128: the bitonic network
    (2, 1, 4100, 3, "ties"),  # several vocabulary chunks merged
]


@pytest.mark.parametrize("m,length,vocab,k,kind", CANDIDATE_CASES)
def test_candidates_equal_reference(forced_triton, m, length, vocab, k, kind):
    g = torch.Generator().manual_seed(vocab + k)
    if kind == "ties":  # small integer logits: quantised ties across the cut
        logits = torch.randint(-2, 2, (m, length, vocab), generator=g).float()
    else:
        logits = torch.randn(m, length, vocab, generator=g) * 4
    if kind == "inf":
        logits[..., ::7] = float("-inf")
    logits = logits.to(forced_triton)
    lse = log_normaliser(logits)
    want = top_candidates(logits, k, lse)
    got = draft_candidates(logits, k)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def assert_same_tree(got, want):
    for name in TREE_FIELDS:
        assert torch.equal(getattr(got, name).cpu(), getattr(want, name).cpu()), name


@pytest.mark.parametrize(
    "budget,m,length,vocab,shared",
    [
        (128, 2, 3, 6, False),  # 312 beam cells: the bitonic network
        (32, 8, 2, 40, True),  # eight modes proposing the same distributions
        (1, 3, 4, 5, False),
        (5, 1, 6, 1, False),  # a one-token vocabulary: the tree is one chain
    ],
)
def test_tree_build_equals_reference_on_larger_shapes(forced_triton, budget, m, length, vocab, shared):
    g = torch.Generator().manual_seed(budget)
    logits = torch.randn(m, length, vocab, generator=g) * 2
    if shared:
        logits[:] = logits[0]
    scores, ids = top_candidates(logits, budget, log_normaliser(logits))
    want = build_mixture_tree(scores, ids, budget, anchor=3)
    got = draft_tree(scores.to(forced_triton), ids.to(forced_triton), budget, 3, vocab)
    assert_same_tree(got, want)
    if vocab == 1:
        assert got.parents.tolist() == list(range(-1, min(budget, length)))


def test_shapes_beyond_the_kernels_equal_brute_force(forced_triton):
    """B > 256 leaves the Triton kernel for the reference: its tree is still the exact top-B
    (584 prefixes of 3 tokens over 8, enumerated)."""
    from test_trees import assert_tree_is_brute_force_top

    logprobs = torch.log_softmax(torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(5)), dim=-1)
    scores, ids = top_candidates(logprobs.to(forced_triton), 300)
    tree = draft_tree(scores, ids, 300, 7, 8)
    assert tree.num_nodes == 300
    assert_tree_is_brute_force_top(tree, quantize_logprobs(logprobs), 300, 3, 7)


# ---- tree attention, accept walk, KV compaction -----------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 9, 33])
def test_tree_attention_equals_reference(forced_triton, n):
    for tokens, parents, depths in (random_tree(random.Random(n), n), chain_tree(n)):
        parents = parents.to(forced_triton)
        mask = ancestor_mask(parents, int(depths.max()))
        assert torch.equal(mask, ancestor_mask_reference(parents))
        for dtype in (torch.float32, torch.bfloat16):
            bias = verify_attention_bias(mask, 5, dtype)
            assert bias.dtype == dtype and torch.equal(bias, verify_attention_bias_reference(mask, 5, dtype))


def brute_force_accept(tokens, parents, target):
    accepted = [0]
    for i in range(1, len(tokens)):
        if parents[i] == accepted[-1] and tokens[i] == target[parents[i]]:
            accepted.append(i)
    return accepted


def test_accept_walk_equals_reference_and_brute_force(forced_triton):
    rng = random.Random(0)
    cases = [random_tree(rng, rng.randint(1, 30)) for _ in range(6)] + [chain_tree(1), chain_tree(7)]
    for tokens, parents, depths in cases:
        n = tokens.shape[0]
        for target in (torch.tensor([rng.randrange(3) for _ in range(n)]), torch.roll(tokens, -1)):
            max_depth = int(depths.max()) + rng.randint(0, 2)
            args = [x.to(forced_triton) for x in (tokens, parents, depths, target)]
            path, info = accept_walk(*args, max_depth)
            want_path, want_info = accept_walk_reference(*args, max_depth)
            assert torch.equal(path, want_path) and torch.equal(info, want_info)
            accepted = brute_force_accept(tokens.tolist(), parents.tolist(), target.tolist())
            assert path[: len(accepted)].tolist() == accepted
            assert info.tolist() == [len(accepted), int(accepted == list(range(len(accepted)))), int(target[accepted[-1]])]


@pytest.mark.parametrize("path", [[0], [0, 1, 2], [0, 2, 5], [0, 1, 4, 6, 7]])
def test_kv_compaction_equals_reference(forced_triton, path):
    path = torch.tensor(path, device=forced_triton)
    tensors = [torch.randn(1, 3, 5 + 9, 6, device=forced_triton) for _ in range(6)]  # 3 layers x (K, V)
    want = [t.clone() for t in compact_kv_reference(tensors, 5, path)]
    before = [t.clone() for t in tensors]
    got = compact_kv(tensors, 5, path)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    if path.tolist() == list(range(path.shape[0])):  # the spine is already in place: nothing moves
        assert all(torch.equal(a, b) for a, b in zip(tensors, before))


# ---- fused mode attention ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "b,hq,hkv,n,m,s,d,c", [(1, 4, 2, 1, 3, 4, 8, 5), (2, 2, 2, 2, 1, 8, 16, 0), (1, 2, 1, 3, 2, 5, 12, 70)]
)
def test_mode_attention_equals_reference(forced_triton, b, hq, hkv, n, m, s, d, c):
    g = torch.Generator().manual_seed(c)
    dev = forced_triton
    q = torch.randn(b, hq, n, m, s, d, generator=g).to(dev)
    k_ctx, v_ctx = (torch.randn(b, hkv, c, d, generator=g).to(dev) for _ in range(2))
    k_blk, v_blk = (torch.randn(b, hkv, n, m, s, d, generator=g).to(dev) for _ in range(2))
    ctx_visible = (torch.rand(b, n, 1, c, generator=g) < 0.6).to(dev)
    causal = torch.ones(s, s, dtype=torch.bool, device=dev).tril()
    for cv, bv in [(None, None), (ctx_visible, None), (ctx_visible, causal)]:
        want = mode_attention_reference(q, k_ctx, v_ctx, k_blk, v_blk, cv, bv, 0.3)
        got = mode_attention(q, k_ctx, v_ctx, k_blk, v_blk, cv, bv, 0.3)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_mode_attention_in_bfloat16(forced_triton):
    g = torch.Generator().manual_seed(0)
    q, k_blk, v_blk = (torch.randn(1, 4, 2, 3, 4, 16, generator=g).bfloat16().to(forced_triton) for _ in range(3))
    k_ctx, v_ctx = (torch.randn(1, 2, 9, 16, generator=g).bfloat16().to(forced_triton) for _ in range(2))
    want = mode_attention_reference(q, k_ctx, v_ctx, k_blk[:, :2], v_blk[:, :2])
    got = mode_attention(q, k_ctx, v_ctx, k_blk[:, :2], v_blk[:, :2])
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


# ---- generation through the kernels -------------------------------------------------------------
@pytest.fixture(scope="module")
def pair():
    target = tiny_target("qwen3", vocab_size=16, init_std=0.2)
    return target, tiny_drafter(target, num_modes=4, block_size=8)


@pytest.mark.parametrize("method,budget,mode", [("mixture", 16, None), ("product", 7, "gate"), ("chain", 4, 2)])
def test_generation_through_kernels_is_lossless(forced_triton, pair, method, budget, mode):
    target, drafter = pair
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    want = greedy_reference(target, ids, 12)
    out = drafter.spec_generate(target, ids, max_new_tokens=12, method=method, tree_budget=budget, mode=mode)
    assert out.new_tokens == want
    assert sum(out.acceptance_lengths) + 1 == len(want)
    if method == "mixture":
        assert out.tau > 1.3  # rounds accepted several tokens: the walk and the compaction ran
    if mode == "gate":
        assert len(out.modes_used) == out.rounds and all(0 <= k < 4 for k in out.modes_used)


@pytest.mark.slow
def test_kernels_compile_for_a_cuda_gpu(tmp_path):
    """The interpreter accepts programs the compiler refuses: compile every kernel for sm_90
    (front end, LLVM, ptxas; no GPU needed) at small generation shapes."""
    from conftest import REPO, run_python

    script = REPO / "benchmarks" / "compile_kernels.py"
    code = f"import runpy, sys; sys.argv = ['x', '--budget', '16', '--modes', '4']; runpy.run_path({str(script)!r}, run_name='__main__')"
    result = run_python(code, tmp_path, timeout=1800, extra_env={"TRITON_INTERPRET": "0"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ok ") == 9 and "FAIL" not in result.stdout


class HostSyncCounter(TorchDispatchMode):
    """Records what makes the host wait for the device: value reads (item, tolist, numpy, cpu,
    bool/int/float/index of a tensor), data-dependent shapes (nonzero, masked_select, unique,
    seen at the dispatcher, also when torch calls them internally) and tensors built from host
    data on a device (``torch.tensor(..., device=...)``: a blocking host-to-device copy)."""

    SHAPE_OPS = ("nonzero", "masked_select", "equal")

    def __init__(self):
        super().__init__()
        self.events = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.SHAPE_OPS or name.startswith(("_unique", "unique")):
            self.events.append(name)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def count_host_syncs(monkeypatch):
    counter = HostSyncCounter()

    def record(owner, name, when=lambda *a, **k: True):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            if when(*args, **kwargs):
                counter.events.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    for name in ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"):
        record(torch.Tensor, name)
    for name in ("tensor", "as_tensor"):
        record(torch, name, when=lambda data, *a, **k: k.get("device") is not None and not torch.is_tensor(data))
    return counter


def test_generation_through_kernels_syncs_once_per_round(forced_triton, pair, count_host_syncs, monkeypatch):
    """The forced-Triton path reads the device once per round: the round's summary (accepted
    length, bonus, path tokens). Markers split the record into rounds."""
    from mfd_hub.remote import generation_mfd

    def marked(fn, marker):
        def call(*args, **kwargs):
            count_host_syncs.events.append(marker)
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(generation_mfd, "draft_candidates", marked(generation_mfd.draft_candidates, "<tree>"))
    monkeypatch.setattr(generation_mfd, "accept_walk", marked(generation_mfd.accept_walk, "<accept>"))
    target, drafter = pair
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    for num_modes in (None, 2):  # all modes; the gate's best two (ranked on the device)
        count_host_syncs.events.clear()
        with count_host_syncs:
            out = drafter.spec_generate(target, ids, max_new_tokens=10, method="mixture", tree_budget=8,
                                        num_modes=num_modes)
        events = " ".join(count_host_syncs.events)
        prefill, _, rounds = events.partition("<tree>")
        assert "tolist" not in prefill and prefill.count("__int__") == 1  # the first token
        per_round = ("<tree>" + rounds).split("<tree>")[1:]
        assert len(per_round) == out.rounds >= 2
        # drafting the next block, building the tree, verifying: nothing; reading the summary: once
        assert all(r.split() == ["<accept>", "tolist"] for r in per_round[:-1]), (num_modes, per_round)
        assert per_round[-1].split() == ["<accept>", "tolist", "tensor"]  # + the output ids at the end

    # the counter does see synchronisations: the torch references read values every round
    count_host_syncs.events.clear()
    backend.set_kernel_backend("torch")
    with count_host_syncs:
        drafter.spec_generate(target, ids, max_new_tokens=10, method="mixture", tree_budget=8)
    per_round = " ".join(count_host_syncs.events).split("<tree>")[1:]
    assert all(len(r.split()) > 2 for r in per_round[:-1])
