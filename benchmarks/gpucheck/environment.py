"""What ran the check: versions, the mfd_hub it loaded, the GPU, and the transformers features
mfd_hub's verifiers rely on (probed without running a model)."""

import os
import platform
import re
import sys
from pathlib import Path

from .bootstrap import REPO


def version_of(module_name):
    try:
        module = __import__(module_name)
        return getattr(module, "__version__", "?")
    except Exception as error:  # absent or broken: say which
        return f"not importable ({type(error).__name__})"


def pinned_transformers():
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'"transformers\s*([^"]*)"', text)
    return match.group(1).strip() if match else None


def transformers_compat():
    """What mfd_hub.remote's verifiers rely on in transformers, probed without running a model.
    attention: targets_mfd.AttentionVerifier picks `cache=` or `past_key_values=` itself and needs
    DynamicCache.layers; hybrid: hybrid_mfd.HybridVerifier passes `cache=` to the model and its
    decoder layers and reads DynamicCache.get_conv_state / get_recurrent_state."""
    import inspect

    import transformers
    from transformers import DynamicCache, Qwen3ForCausalLM

    probes, problems = {}, {"attention": [], "hybrid": []}
    params = inspect.signature(Qwen3ForCausalLM.forward).parameters
    probes["cache_keyword"] = "cache" if "cache" in params else "past_key_values" if "past_key_values" in params else None
    probes["logits_to_keep"] = "logits_to_keep" in params
    if probes["cache_keyword"] is None:
        problems["attention"].append("Qwen3ForCausalLM.forward takes neither cache= nor past_key_values=")
    probes["dynamic_cache_layers"] = hasattr(DynamicCache(), "layers")
    if not probes["dynamic_cache_layers"]:
        problems["attention"].append("DynamicCache has no .layers")
    hybrid = getattr(transformers, "Qwen3_5ForCausalLM", None)
    probes["qwen3_5"] = hybrid is not None
    probes["qwen3_next"] = getattr(transformers, "Qwen3NextForCausalLM", None) is not None
    if hybrid is None:
        problems["hybrid"].append("transformers has no Qwen3_5ForCausalLM")
    else:
        from transformers.models.qwen3_5 import modeling_qwen3_5

        layer = getattr(modeling_qwen3_5, "Qwen3_5DecoderLayer", None)
        probes["hybrid_forward_cache_keyword"] = "cache" in inspect.signature(hybrid.forward).parameters
        layer_params = inspect.signature(layer.forward).parameters if layer is not None else {}
        probes["hybrid_layer_cache_keyword"] = "cache" in layer_params
        if not probes["hybrid_forward_cache_keyword"]:
            problems["hybrid"].append("Qwen3_5ForCausalLM.forward has no cache= (hybrid_mfd passes cache=)")
        if not probes["hybrid_layer_cache_keyword"]:
            problems["hybrid"].append("Qwen3_5DecoderLayer.forward has no cache= (hybrid_mfd passes cache=)")
    for name in ("get_conv_state", "get_recurrent_state"):
        probes[f"dynamic_cache_{name}"] = hasattr(DynamicCache, name)
        if not probes[f"dynamic_cache_{name}"]:
            problems["hybrid"].append(f"DynamicCache has no {name}")
    return {"probes": probes, "problems": problems}


def environment(device):
    import torch

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": version_of("triton"),
        "transformers": version_of("transformers"),
        "huggingface_hub": version_of("huggingface_hub"),
        "safetensors": version_of("safetensors"),
        "tokenizers": version_of("tokenizers"),
        "numpy": version_of("numpy"),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
        "torch_threads": torch.get_num_threads(),
        "mfd_hub": {"loaded_from": str(Path(sys.modules["mfd_hub"].__path__[0]).resolve()),
                    "kernels_from": str(Path(sys.modules["mfd_hub.kernels"].__path__[0]).resolve()),
                    "git_commit": _git_commit()},
    }
    pinned = pinned_transformers()
    env["transformers_pinned"] = pinned
    try:
        from packaging.specifiers import SpecifierSet

        env["transformers_in_pinned_range"] = pinned is not None and SpecifierSet(pinned).contains(
            env["transformers"], prereleases=True)
    except Exception:  # packaging missing or an unparsable version
        env["transformers_in_pinned_range"] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                      "memory_gib": round(props.total_memory / 2**30, 1), "count": torch.cuda.device_count()}
    return env


def _git_commit():
    head = REPO / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            path = REPO / ".git" / ref[5:]
            if path.exists():
                return path.read_text().strip()
            packed = (REPO / ".git" / "packed-refs").read_text()
            match = re.search(rf"^([0-9a-f]{{40}}) {re.escape(ref[5:])}$", packed, re.M)
            return match.group(1) if match else None
        return ref
    except OSError:
        return None
