"""Configuration of an MFD / DFlash block drafter.

This file is part of the remote-code bundle that mfd-hub writes into every checkpoint: it must
import nothing but the standard library, torch and transformers.
"""

from transformers import PretrainedConfig

MODEL_TYPE = "mfd_dflash"

# Fields every checkpoint must carry (the schema `mfd-hub verify` checks).
REQUIRED_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "block_size",
    "num_target_layers",
    "target_layer_ids",
    "mask_token_id",
    "num_modes",
)


class DFlashConfig(PretrainedConfig):
    """A DFlash block drafter, optionally with K learned modes (Multi-Future Drafting).

    The layer fields are Qwen3's. The drafter fields:

    - ``block_size``: anchor + drafted positions (16 in the published drafters).
    - ``num_target_layers`` / ``target_layer_ids``: the target's depth and the decoder layers whose
      outputs form the context (tap ``i`` is ``output_hidden_states[i + 1]`` of the target).
    - ``mask_token_id``: the token that fills the drafted positions of the input block.
    - ``num_modes``: K mode embeddings (0 = plain DFlash, no ``mode_embed``/``mode_gate``).
    - ``default_path``: True for MFD-D drafters: a trained single-mode path (``default_embed``)
      that runs without modes.
    - ``mode_gate_bias``: whether ``mode_gate`` carries a bias (some released drafters' gates do;
      ours do not). Written to config.json only when True, so configs without it keep their bytes.
    - ``block_causal``: per layer, whether the block attends causally inside itself.
    - ``target``: the target's identity (``name_or_path``, ``model_type``, ``hidden_size``,
      ``vocab_size``, ``num_hidden_layers``) so mismatches are caught before decoding.
    - ``draft_vocab_size``: when set, the drafter owns an ``lm_head`` over a reduced vocabulary and
      ``d2t`` maps draft ids to target ids (``target_id = i + d2t[i]``).
    - ``mfd_metadata``: free-form provenance (conversion source, mode init, training run).
    """

    model_type = MODEL_TYPE
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=5,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        hidden_act="silu",
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        attention_bias=False,
        attention_dropout=0.0,
        layer_types=None,
        sliding_window=None,
        block_causal=None,
        block_size=16,
        num_target_layers=36,
        target_layer_ids=None,
        mask_token_id=151669,
        input_embedding_scale=1.0,
        num_modes=0,
        default_path=False,
        mode_gate_bias=False,
        target=None,
        draft_vocab_size=None,
        mfd_metadata=None,
        initializer_range=0.02,
        **kwargs,
    ):
        # transformers 5 stores RoPE settings as `rope_parameters`; accept either spelling.
        rope = kwargs.pop("rope_parameters", None) or kwargs.pop("rope_scaling", None)
        if isinstance(rope, dict):
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type != "default":
                raise ValueError(f"unsupported RoPE type {rope_type!r}: mfd-hub drafters use default RoPE")
            rope_theta = float(rope.get("rope_theta", rope_theta))
        kwargs.pop("tie_word_embeddings", None)
        self.vocab_size = int(vocab_size)
        self.hidden_size = int(hidden_size)
        self.intermediate_size = int(intermediate_size)
        self.num_hidden_layers = int(num_hidden_layers)
        self.num_attention_heads = int(num_attention_heads)
        self.num_key_value_heads = int(num_key_value_heads)
        self.head_dim = int(head_dim)
        self.hidden_act = hidden_act
        self.max_position_embeddings = int(max_position_embeddings)
        self.rms_norm_eps = float(rms_norm_eps)
        self.rope_theta = float(rope_theta)
        self.attention_bias = bool(attention_bias)
        self.attention_dropout = float(attention_dropout)
        self.layer_types = list(layer_types) if layer_types is not None else ["full_attention"] * self.num_hidden_layers
        self.sliding_window = sliding_window
        if block_causal is None:
            # The public DFlash code attends causally inside the block on sliding layers only.
            block_causal = [t == "sliding_attention" for t in self.layer_types]
        self.block_causal = [bool(c) for c in block_causal]
        self.block_size = int(block_size)
        self.num_target_layers = int(num_target_layers)
        self.target_layer_ids = list(target_layer_ids) if target_layer_ids is not None else [1]
        self.mask_token_id = int(mask_token_id)
        self.input_embedding_scale = float(input_embedding_scale)
        self.num_modes = int(num_modes)
        self.default_path = bool(default_path)
        self.mode_gate_bias = bool(mode_gate_bias)
        self.target = dict(target) if target else {}
        self.draft_vocab_size = int(draft_vocab_size) if draft_vocab_size is not None else None
        self.mfd_metadata = dict(mfd_metadata) if mfd_metadata else {}
        self.initializer_range = float(initializer_range)
        super().__init__(tie_word_embeddings=False, **kwargs)

    def to_dict(self):
        out = super().to_dict()
        if not out.get("mode_gate_bias"):
            out.pop("mode_gate_bias", None)
        return out

    def validate_drafter(self):
        """Raise ValueError with one readable line for the first inconsistency found."""
        problems = drafter_config_problems(self)
        if problems:
            raise ValueError(problems[0])


def drafter_config_problems(config):
    """Every inconsistency in a drafter config, as readable lines (empty when sound)."""
    problems = []
    for name in REQUIRED_FIELDS:
        if getattr(config, name, None) is None:
            problems.append(f"config field {name!r} is missing")
    if problems:
        return problems
    n_layers = config.num_hidden_layers
    if config.num_attention_heads % config.num_key_value_heads:
        problems.append("num_attention_heads must be a multiple of num_key_value_heads")
    if len(config.layer_types) != n_layers:
        problems.append(f"layer_types has {len(config.layer_types)} entries for {n_layers} layers")
    if len(config.block_causal) != n_layers:
        problems.append(f"block_causal has {len(config.block_causal)} entries for {n_layers} layers")
    unknown = sorted(set(config.layer_types) - {"full_attention", "sliding_attention"})
    if unknown:
        problems.append(f"unknown layer types {unknown}")
    if config.block_size < 2:
        problems.append("block_size must be at least 2 (an anchor and one drafted position)")
    if not config.target_layer_ids:
        problems.append("target_layer_ids is empty")
    bad = [i for i in config.target_layer_ids if not 0 <= int(i) < config.num_target_layers]
    if bad:
        problems.append(f"target_layer_ids {bad} are outside the target's {config.num_target_layers} layers")
    if not 0 <= config.mask_token_id < config.vocab_size:
        problems.append(f"mask_token_id {config.mask_token_id} is outside the vocabulary of {config.vocab_size}")
    if config.num_modes < 0:
        problems.append("num_modes must be >= 0")
    if config.draft_vocab_size is not None and not 0 < config.draft_vocab_size <= config.vocab_size:
        problems.append(f"draft_vocab_size {config.draft_vocab_size} must be in 1..{config.vocab_size}")
    target = config.target or {}
    if target.get("hidden_size") not in (None, config.hidden_size):
        problems.append(f"target hidden size {target['hidden_size']} != drafter hidden size {config.hidden_size}")
    if target.get("vocab_size") not in (None, config.vocab_size):
        problems.append(f"target vocabulary {target['vocab_size']} != drafter vocabulary {config.vocab_size}")
    if target.get("num_hidden_layers") not in (None, config.num_target_layers):
        problems.append(
            f"target has {target['num_hidden_layers']} layers but num_target_layers is {config.num_target_layers}"
        )
    return problems
