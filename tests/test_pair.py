"""``mfd_hub.load_pair``: the one set-up sequence (dtype, drafter, target, products, packing)
behind generate, demo, bench and verify, on real checkpoint and model folders."""

import pytest
import torch
import torch.nn as nn

import mfd_hub
from mfd_hub.errors import MfdHubError
from mfd_hub.packed_linear import linears_label
from mfd_hub.targets import greedy_decode
from mfd_hub.testing import save_tiny_target, tiny_drafter, tiny_target

PROMPT = "t3 t1 t4 t1 t5 t9"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny target with its tokenizer and two drafters for it, saved as folders."""
    root = tmp_path_factory.mktemp("pair")
    target = tiny_target("qwen3", vocab_size=16, init_std=0.2)
    save_tiny_target(root / "target", target)
    mfd_hub.save_draft(tiny_drafter(target, num_modes=4, block_size=8), root / "mfd")
    mfd_hub.save_draft(tiny_drafter(target, num_modes=0, block_size=8, seed=2), root / "dflash")
    return root


def _plain_layers(model):
    return all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))


def test_the_pair_generates_what_its_target_decodes_greedily(folders):
    pair = mfd_hub.load_pair(str(folders / "mfd"), str(folders / "target"), dtype="float32", device="cpu")
    assert pair.dtype is torch.float32 and pair.draft.dtype is torch.float32 and pair.tokenizer is not None
    assert pair.draft.config.num_modes == 4 and pair.drafts == [pair.draft]
    ids = pair.encode(PROMPT)
    assert ids.tolist() == [[3, 1, 4, 1, 5, 9]]  # no chat template: the words' own ids
    with pair.packed() as changed:
        # the label reports name the products really used; a nested block changes nothing more
        assert pair.linears == linears_label(changed, pair.linears_choice, [pair.target])
        with pair.packed() as again:
            assert again == 0
        want = greedy_decode(pair.target, ids, 24)  # plain decoding with the same products
        out = pair.generate(PROMPT, method="mixture", tree_budget=6, max_new_tokens=24, stop_token_ids=())
    assert out.new_tokens == want and out.rounds < 24  # lossless, and speculation accepted something
    assert _plain_layers(pair.target) and _plain_layers(pair.draft)  # restored on exit
    assert pair.decode(out.new_tokens) == " ".join(f"t{t}" for t in out.new_tokens if t != 0)
    by_ids = pair.generate(ids, method="product", tree_budget=3, max_new_tokens=24, stop_token_ids=())
    assert by_ids.new_tokens == want


def test_dtype_products_and_more_drafters(folders):
    pair = mfd_hub.load_pair(str(folders / "mfd"), str(folders / "target"), dtype="bfloat16", linears="torch",
                             device="cpu", more_drafters=[str(folders / "dflash")])
    assert pair.dtype is torch.bfloat16 and all(d.dtype is torch.bfloat16 for d in pair.drafts)
    assert [d.config.num_modes for d in pair.drafts] == [4, 0] and pair.linears == "torch"
    with pair.packed() as changed:
        assert changed == 0 and _plain_layers(pair.target)
    assert pair.stop_ids == [0]  # the tokenizer's EOS


def test_baselines_keep_the_target_in_fp32_and_bf16(folders):
    pair = mfd_hub.load_pair(str(folders / "mfd"), str(folders / "target"), dtype="float32", device="cpu",
                             baselines=True)
    assert set(pair.plain_targets) == {torch.float32, torch.bfloat16}
    assert pair.plain_targets[torch.float32] is pair.target
    assert pair.plain_targets[torch.bfloat16].dtype is torch.bfloat16


def test_bad_input_fails_clearly(folders):
    with pytest.raises(ValueError, match="dtype"):  # before anything loads: the drafter does not exist
        mfd_hub.load_pair(str(folders / "nowhere"), str(folders / "target"), dtype="float64")
    with pytest.raises(MfdHubError):
        mfd_hub.load_pair(str(folders / "nowhere"), str(folders / "target"), device="cpu")
    loaded = mfd_hub.load_pair(str(folders / "mfd"), str(folders / "target"), dtype="float32", device="cpu")
    pair = mfd_hub.Pair([loaded.draft], loaded.target, tokenizer=None)  # a target without a tokenizer
    with pytest.raises(MfdHubError, match="no tokenizer"):
        pair.encode(PROMPT)
    with pytest.raises(MfdHubError, match="no tokenizer"):
        pair.decode([3, 1])
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    out = pair.generate(ids, max_new_tokens=8, tree_budget=4, stop_token_ids=())
    assert out.new_tokens == greedy_decode(pair.target, ids, 8)


@pytest.mark.slow
def test_the_quick_start():
    """The README's Python quick start as written there (fewer tokens): the shipped drafter and the
    embedded SmolLM2 target, in the dtype and products the CLI picks on this machine."""
    pair = mfd_hub.load_pair("MFD-SmolLM2-135M", "smollm2")
    out = pair.generate("Write a palindrome check in Python.", method="mixture", tree_budget=16, max_new_tokens=12)
    assert len(out.new_tokens) == 12 and out.tau > 1 and pair.decode(out.new_tokens).strip()
    assert pair.linears in ("onednn", "onednn+bf16", "fp16-weights")  # the CPU's own products, not torch's
