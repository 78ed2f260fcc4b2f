"""Tiny real models for tests, examples and benchmarks: random-weight transformers targets and
matching drafters, and writers of z-lab-format and released-MFD-format checkpoints.

Everything here builds real transformers / mfd-hub modules from configs; nothing is mocked.
"""

import json
from pathlib import Path

import torch

from .remote.configuration_mfd import DFlashConfig
from .remote.modeling_mfd import DFlashDraftModel
from .targets import greedy_decode  # noqa: F401  (tests import it from here too)

TARGET_FAMILIES = ("qwen3", "llama")
# Gated-DeltaNet + attention targets; layer_types=... picks the pattern (default: 3 linear : 1 full)
HYBRID_CLASSES = {
    "qwen3_5_text": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
}
HYBRID_FAMILIES = tuple(HYBRID_CLASSES)


def tiny_target(family="qwen3", vocab_size=64, hidden_size=32, num_layers=4, seed=0, init_std=0.02, **overrides):
    """A random-weight causal LM of a transformers family, fp32, in eval mode."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        initializer_range=init_std,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    common.update(overrides)
    if family == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(**common))
    elif family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**common))
    elif family in HYBRID_FAMILIES:
        model = _tiny_hybrid(family, common)
    else:
        raise ValueError(f"unknown tiny target family {family!r}; choose from {TARGET_FAMILIES + HYBRID_FAMILIES}")
    return model.float().eval()


def _tiny_hybrid(family, common):
    import transformers

    width = common["hidden_size"] // 4
    fields = dict(
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=width,
        linear_value_head_dim=width,
        linear_conv_kernel_dim=4,
    )
    if family != "qwen3_5_text":  # the mixture-of-experts members
        h = common["hidden_size"]
        fields.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=h, shared_expert_intermediate_size=h)
    fields.update(common)
    config_cls, model_cls = HYBRID_CLASSES[family]
    return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**fields))


def drafter_config_for(target, num_modes=0, num_layers=2, block_size=8, target_layer_ids=None, **overrides):
    """A DFlashConfig matching ``target`` (hidden size, vocabulary, depth)."""
    tcfg = target.config
    n_target = tcfg.num_hidden_layers
    if target_layer_ids is None:
        target_layer_ids = sorted({0, n_target // 2, n_target - 2}) if n_target > 2 else [0]
    fields = dict(
        vocab_size=tcfg.vocab_size,
        hidden_size=tcfg.hidden_size,
        intermediate_size=2 * tcfg.hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=tcfg.hidden_size // 4,
        rope_theta=10000.0,
        block_size=block_size,
        num_target_layers=n_target,
        target_layer_ids=list(target_layer_ids),
        mask_token_id=tcfg.vocab_size - 1,
        num_modes=num_modes,
        target={
            "name_or_path": getattr(tcfg, "_name_or_path", "") or f"tiny-{tcfg.model_type}",
            "model_type": tcfg.model_type,
            "hidden_size": tcfg.hidden_size,
            "vocab_size": tcfg.vocab_size,
            "num_hidden_layers": n_target,
        },
    )
    fields.update(overrides)
    return DFlashConfig(**fields)


def tiny_drafter(target, num_modes=0, seed=1, mode_std=0.5, **config_overrides):
    """A random-weight drafter for ``target`` (fp32, eval). Mode embeddings get ``mode_std`` so
    that modes visibly differ."""
    torch.manual_seed(seed)
    model = DFlashDraftModel(drafter_config_for(target, num_modes=num_modes, **config_overrides)).float().eval()
    if num_modes:
        with torch.no_grad():
            model.mode_embed.normal_(0.0, mode_std)
    return model


def zlab_config_dict(config):
    """The z-lab DFlash config.json layout (DESIGN §3) for a K = 0 DFlashConfig."""
    sliding = "sliding_attention" in config.layer_types
    raw = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "block_size": config.block_size,
        "num_target_layers": config.num_target_layers,
        "dflash_config": {"mask_token_id": config.mask_token_id, "target_layer_ids": list(config.target_layer_ids)},
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "layer_types": list(config.layer_types),
        "use_sliding_window": sliding,
        "sliding_window": config.sliding_window,
        "max_window_layers": config.num_hidden_layers,
        "torch_dtype": "bfloat16",
    }
    return raw


def write_zlab_checkpoint(folder, config, state_dict, dtype=torch.bfloat16, is_causal=None):
    """Write a z-lab-format drafter checkpoint (config.json + bf16 model.safetensors)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    raw = zlab_config_dict(config)
    if is_causal is not None:
        raw["is_causal"] = is_causal
    (folder / "config.json").write_text(json.dumps(raw, indent=2), encoding="utf-8")
    weights = {k: v.detach().to(dtype).contiguous() for k, v in state_dict.items() if k not in ("mode_embed",)}
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def save_released_layout(drafter, folder, default_name="default_mode_embed", mode_embed_name="mode_embed",
                         k_field=None, extra_tensors=None, dtype=None):
    """Write ``drafter`` (an MFD or MFD-D DFlashDraftModel) in the layout the MFD authors release
    drafters in: z-lab's config.json and one model.safetensors holding z-lab's tensors plus
    ``mode_embed`` [K, H], ``mode_gate.weight`` (and ``.bias`` when the drafter's gate has one)
    and, for MFD-D, the default path under ``default_name``.

    mode_embed_name: ``mode_embed`` or ``mode_embed.weight``. k_field: ``{"name": K}`` or
    ``{"dflash_config": {"name": K}}``, merged into the config (where a release states K).
    extra_tensors: more tensors to store as they are. dtype: the floating-point weights' dtype
    (default: the drafter's own), e.g. bf16 as the authors publish them. A draft vocabulary
    (``lm_head``, ``d2t``, ``t2d``) is stored as it is.
    """
    from safetensors.torch import save_file

    config = drafter.config
    if not config.num_modes:
        raise ValueError("a released MFD drafter has modes: num_modes must be > 0")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    raw = zlab_config_dict(config)
    for key, value in (k_field or {}).items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and isinstance(raw.get(key), dict) else value
    raw["torch_dtype"] = str(dtype or drafter.dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(raw, indent=2), encoding="utf-8")
    names = {"mode_embed": mode_embed_name, "default_embed": default_name}
    cast = (lambda t: t.to(dtype) if dtype is not None and t.is_floating_point() else t)
    weights = {names.get(k, k): cast(v.detach()).contiguous() for k, v in drafter.state_dict().items()}
    weights.update(extra_tensors or {})
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def target_taps(target, input_ids, layer_ids):
    """The drafter's context for ``input_ids``: target taps concatenated -> [1, T, n_taps*H]."""
    with torch.no_grad():
        out = target(input_ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


def tiny_tokenizer(vocab_size):
    """A real fast tokenizer over words ``t0 .. t{V-1}`` (whitespace-separated), EOS ``t0``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="t0", unk_token="t0")


def save_tiny_target(folder, target, with_tokenizer=True):
    """Save a tiny target (and a word-level tokenizer) as a loadable model folder."""
    folder = Path(folder)
    target.save_pretrained(folder)
    if with_tokenizer:
        tiny_tokenizer(target.config.vocab_size).save_pretrained(folder)
    return folder


def tiny_registry_drafter(drafter, seed=1, **overrides):
    """A tiny random drafter with the identity the registry gives ``drafter`` (a
    ``mfd_hub.cards.registry.Drafter``): its K, block size, taps, target depth, mask id, vocabulary,
    default path and target name, at a tiny width. ``overrides`` change identity fields."""
    identity = {**drafter.identity(), **overrides}
    target = tiny_target("qwen3", vocab_size=identity["vocab_size"], num_layers=identity["num_target_layers"])
    model = tiny_drafter(target, num_modes=identity["num_modes"], block_size=identity["block_size"],
                         target_layer_ids=identity["target_layer_ids"], mask_token_id=identity["mask_token_id"],
                         default_path=identity["default_path"], seed=seed)
    model.config.target["name_or_path"] = drafter.target.repo
    return model


def random_tree(rng, n, max_depth=None):
    """(tokens, parents, depths) of an n-node tree drawn with ``rng`` (a ``random.Random``):
    parents before children, siblings with distinct tokens (as every draft tree), depth at most
    ``max_depth``. For the kernel tests and the GPU check."""
    parents, depths, tokens, used = [-1], [0], [rng.randrange(50)], {}
    for i in range(1, n):
        p = rng.choice([j for j in range(i) if max_depth is None or depths[j] < max_depth])
        taken = used.setdefault(p, set())
        token = rng.choice([t for t in range(len(taken) + 2) if t not in taken])
        taken.add(token)
        parents.append(p)
        depths.append(depths[p] + 1)
        tokens.append(token)
    return torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths)


def spine_tree(n, spine, seed):
    """(parents, depths) of an n-node tree whose first ``spine`` nodes form a chain (the root -1,
    parents before children), with random branches off it: deep trees for the verifiers' brute
    force checks."""
    gen = torch.Generator().manual_seed(seed)
    parents = [-1] + list(range(spine - 1))
    for i in range(spine, n):
        parents.append(int(torch.randint(0, i, (1,), generator=gen)))
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    return torch.tensor(parents), torch.tensor(depths)


def chain_tree(n):
    """(tokens, parents, depths) of an n-node chain."""
    steps = torch.arange(n)
    return steps % 3, steps - 1, steps
