"""DFlash block drafter with K learned modes (Multi-Future Drafting).

One forward drafts every requested mode of every block in the same pass: copy k of a block is
the block's input embeddings plus ``mode_embed[k]``; all copies share the context keys/values.
The drafter stores no token embedding and no LM head of its own (unless it drafts over a
reduced vocabulary): it borrows the target's.

This file is part of the remote-code bundle that mfd-hub writes into every checkpoint: it must
import nothing but the standard library, torch, transformers and its bundle siblings.
"""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from ..kernels.mode_attention import mode_attention
from .configuration_mfd import DFlashConfig
from .context_mfd import DraftContextCache


class DFlashRMSNorm(nn.Module):
    """RMSNorm computed in float32, as Qwen3's."""

    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions, head_dim, theta, dtype):
    """cos/sin tables of default RoPE for integer positions of any shape -> [..., head_dim]."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    return x * cos + rotate_half(x) * sin


class DFlashMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashAttention(nn.Module):
    """Block queries; keys/values from the shared context and the query's own block copy."""

    def __init__(self, config, layer_idx):
        super().__init__()
        hidden, d = config.hidden_size, config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = d
        self.scaling = d**-0.5
        self.q_proj = nn.Linear(hidden, self.num_heads * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * d, hidden, bias=config.attention_bias)
        self.q_norm = DFlashRMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = DFlashRMSNorm(d, eps=config.rms_norm_eps)
        self.is_causal = bool(config.block_causal[layer_idx])
        # A sliding layer without a window (Qwen3's use_sliding_window=False) is only causal.
        sliding = config.layer_types[layer_idx] == "sliding_attention" and config.sliding_window
        self.sliding_window = int(config.sliding_window) if sliding else None

    def context_kv(self, ctx_hidden, cos, sin):
        """Keys/values of projected context features [B, C, H] -> two [B, Hkv, C, D]."""
        b, c, _ = ctx_hidden.shape
        k = self.k_norm(self.k_proj(ctx_hidden).view(b, c, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(ctx_hidden).view(b, c, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos[:, None], sin[:, None]), v

    def forward(self, x, ctx_k, ctx_v, cos, sin, ctx_visible, blk_visible):
        """x [B, N, M, S, H]; cos/sin [B, N, S, D] at the block positions."""
        b, n, m, s, _ = x.shape
        d = self.head_dim
        q = self.q_norm(self.q_proj(x).view(b, n, m, s, self.num_heads, d)).permute(0, 4, 1, 2, 3, 5)
        k = self.k_norm(self.k_proj(x).view(b, n, m, s, self.num_kv_heads, d)).permute(0, 4, 1, 2, 3, 5)
        v = self.v_proj(x).view(b, n, m, s, self.num_kv_heads, d).permute(0, 4, 1, 2, 3, 5)
        cos, sin = cos[:, None, :, None], sin[:, None, :, None]  # [B, 1, N, 1, S, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = mode_attention(q, ctx_k, ctx_v, k, v, ctx_visible, blk_visible, self.scaling)
        return self.o_proj(out.permute(0, 2, 3, 4, 1, 5).reshape(b, n, m, s, self.num_heads * d))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = DFlashMLP(config)
        self.input_layernorm = DFlashRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = DFlashRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, ctx_k, ctx_v, cos, sin, ctx_visible, blk_visible):
        x = x + self.self_attn(self.input_layernorm(x), ctx_k, ctx_v, cos, sin, ctx_visible, blk_visible)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class DraftOutput(ModelOutput):
    """hidden_states [B, N, M, S, H] after the final norm; logits [B, N, M, S-1, V] for block
    positions 1..S-1 (when an LM head was given); gate_logits [B, N, K] (MFD drafters)."""

    hidden_states: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    gate_logits: Optional[torch.Tensor] = None


class DFlashDraftModel(PreTrainedModel):
    """DFlash drafter; with ``config.num_modes = K > 0`` an MFD drafter (``mode_embed``, ``mode_gate``)."""

    config_class = DFlashConfig
    base_model_prefix = "dflash"
    main_input_name = "block_embeds"
    _no_split_modules = ["DFlashDecoderLayer"]
    supports_gradient_checkpointing = False

    def __init__(self, config):
        super().__init__(config)
        hidden = config.hidden_size
        n_taps = len(config.target_layer_ids)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = DFlashRMSNorm(hidden, eps=config.rms_norm_eps)
        self.fc = nn.Linear(n_taps * hidden, hidden, bias=False)
        self.hidden_norm = DFlashRMSNorm(hidden, eps=config.rms_norm_eps)
        if config.num_modes > 0:
            self.mode_embed = nn.Parameter(torch.zeros(config.num_modes, hidden))
            self.mode_gate = nn.Linear(hidden, config.num_modes, bias=config.mode_gate_bias)
        if config.default_path:
            self.default_embed = nn.Parameter(torch.zeros(hidden))
        if config.draft_vocab_size:
            self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.post_init()

    # -- weights -------------------------------------------------------------------------
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(0.0, std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, DFlashRMSNorm):
            module.weight.data.fill_(1.0)
        elif isinstance(module, DFlashDraftModel):
            if hasattr(module, "mode_embed"):
                module.mode_embed.data.normal_(0.0, std)
            if hasattr(module, "default_embed"):
                module.default_embed.data.zero_()

    @property
    def num_modes(self):
        return self.config.num_modes

    @property
    def block_size(self):
        return self.config.block_size

    @property
    def mask_token_id(self):
        return self.config.mask_token_id

    @property
    def target_layer_ids(self):
        return list(self.config.target_layer_ids)

    # -- inputs and outputs ----------------------------------------------------------------
    def embed_block(self, block_ids, embed_tokens):
        """Raw target embeddings of the block tokens (times ``input_embedding_scale``)."""
        weight = embed_tokens.weight if hasattr(embed_tokens, "weight") else embed_tokens
        emb = F.embedding(block_ids, weight) * self.config.input_embedding_scale
        return emb.to(self.dtype)

    def compute_logits(self, hidden, lm_head=None):
        """Draft logits: over the draft vocabulary with the drafter's own head, else the target's."""
        if self.config.draft_vocab_size:
            return self.lm_head(hidden)
        if lm_head is None:
            raise ValueError("this drafter has no LM head of its own: pass the target's lm_head")
        return lm_head(hidden.to(lm_head.weight.dtype))

    def draft_to_target_ids(self, ids):
        """Map draft-vocabulary ids to target ids (identity without a draft vocabulary)."""
        if not self.config.draft_vocab_size:
            return ids
        return ids + self.d2t[ids]

    def project_context(self, taps):
        """Concatenated target taps [B, C, n_taps*H] -> context features [B, C, H]."""
        return self.hidden_norm(self.fc(taps.to(self.dtype)))

    def mode_vectors(self, modes):
        """The vectors added to the block for the requested modes -> [M, H].

        ``"all"``: every mode; ``None``: the default path (``default_embed`` or nothing);
        a sequence or tensor of indices: those modes (an int64 tensor already on the drafter's
        device is trusted, unchecked, so that choosing a mode on the GPU never waits for it).
        """
        hidden = self.config.hidden_size
        if modes is None:
            if hasattr(self, "default_embed"):
                return self.default_embed[None]
            return torch.zeros(1, hidden, dtype=self.dtype, device=self.device)
        if self.config.num_modes == 0:
            raise ValueError("this drafter has no modes (num_modes = 0): use modes=None")
        if isinstance(modes, str):
            if modes != "all":
                raise ValueError(f"modes must be 'all', None or indices, not {modes!r}")
            return self.mode_embed
        if torch.is_tensor(modes) and modes.device == self.mode_embed.device and modes.dtype == torch.long:
            return self.mode_embed[modes.reshape(-1)]  # e.g. the gate's argmax: used as is, no host sync
        idx = torch.as_tensor(modes, dtype=torch.long, device=self.mode_embed.device).reshape(-1)
        if idx.numel() == 0 or int(idx.min()) < 0 or int(idx.max()) >= self.config.num_modes:
            raise ValueError(f"mode indices must be in 0..{self.config.num_modes - 1}")
        return self.mode_embed[idx]

    # -- context -----------------------------------------------------------------------------
    def _rope(self, positions):
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, self.dtype)

    def _context_kv(self, ctx_hidden, positions):
        cos, sin = self._rope(positions)
        return [layer.self_attn.context_kv(ctx_hidden, cos, sin) for layer in self.layers]

    def extend_context(self, cache, taps, positions):
        """Append committed positions (their target taps) to a DraftContextCache."""
        taps = taps if taps.dim() == 3 else taps[None]
        positions = torch.as_tensor(positions, device=taps.device).reshape(taps.shape[0], -1)
        ctx_hidden = self.project_context(taps)
        kv = self._context_kv(ctx_hidden, positions)
        if cache.positions is None:
            cache.keys = [k for k, _ in kv]
            cache.values = [v for _, v in kv]
            cache.positions = positions
        else:
            cache.keys = [torch.cat([old, k], dim=2) for old, (k, _) in zip(cache.keys, kv)]
            cache.values = [torch.cat([old, v], dim=2) for old, (_, v) in zip(cache.values, kv)]
            cache.positions = torch.cat([cache.positions, positions], dim=1)
        cache.last_feature = ctx_hidden[:, -1]
        return cache

    # -- forward -----------------------------------------------------------------------------
    def forward(
        self,
        block_embeds,
        block_positions,
        context_taps=None,
        context_positions=None,
        cache=None,
        modes="all",
        lm_head=None,
    ):
        """Draft N blocks x M modes in one pass.

        block_embeds: [B, N, S, H] (or [B, S, H] for one block): the anchor token followed by
            mask tokens, embedded with the target's embedding (see ``embed_block``).
        block_positions: [B, N] (or an int) absolute position of each block's anchor; block
            position s sits at anchor + s.
        Context: either ``cache`` (a DraftContextCache filled by ``extend_context``) or raw
            ``context_taps`` [B, C, n_taps*H] at ``context_positions`` [B, C] (default 0..C-1).
            A block sees exactly the context positions strictly before its anchor.
        modes: ``"all"`` (every mode), ``None`` (default path), or mode indices.
        lm_head: the target's LM head; when given (or when the drafter has its own), logits
            for block positions 1..S-1 are returned.
        """
        if block_embeds.dim() == 3:
            block_embeds = block_embeds[:, None]
        b, n, s, hidden = block_embeds.shape
        device = block_embeds.device
        anchors = torch.as_tensor(block_positions, device=device).reshape(-1)
        anchors = anchors.expand(b * n).reshape(b, n) if anchors.numel() in (1, b * n) else anchors.reshape(b, n)

        if cache is not None:
            ctx_kv = list(zip(cache.keys, cache.values))
            ctx_pos = cache.positions
            last_feature = cache.last_feature[:, None].expand(b, n, hidden) if cache.last_feature is not None else None
        elif context_taps is not None:
            c = context_taps.shape[1]
            if context_positions is None:
                context_positions = torch.arange(c, device=device)[None].expand(b, c)
            ctx_pos = torch.as_tensor(context_positions, device=device).reshape(b, c)
            ctx_hidden = self.project_context(context_taps)
            ctx_kv = self._context_kv(ctx_hidden, ctx_pos)
            # gate input: the projected feature of the last context position before each anchor
            before = (ctx_pos[:, None, :] < anchors[:, :, None]).sum(-1).clamp(min=1) - 1  # [B, N]
            last_feature = torch.gather(ctx_hidden, 1, before[..., None].expand(b, n, hidden))
        else:
            raise ValueError("pass either a context cache or context_taps")

        vectors = self.mode_vectors(modes).to(block_embeds.dtype)  # [M, H]
        x = block_embeds.to(self.dtype)[:, :, None] + vectors[None, None, :, None].to(self.dtype)

        block_pos = anchors[..., None] + torch.arange(s, device=device)  # [B, N, S]
        cos, sin = self._rope(block_pos)
        before_anchor = ctx_pos[:, None, None, :] < anchors[:, :, None, None]  # [B, N, 1, C]
        offsets = torch.arange(s, device=device)
        for layer, (k_ctx, v_ctx) in zip(self.layers, ctx_kv):
            attn = layer.self_attn
            ctx_visible, blk_visible = before_anchor, None
            if attn.sliding_window is not None:
                ctx_visible = before_anchor & (block_pos[..., None] - ctx_pos[:, None, None, :] < attn.sliding_window)
                dist = offsets[:, None] - offsets[None, :]
                blk_visible = dist < attn.sliding_window
                if not attn.is_causal:
                    blk_visible = blk_visible & (-dist < attn.sliding_window)
            if attn.is_causal:
                causal = offsets[:, None] >= offsets[None, :]
                blk_visible = causal if blk_visible is None else blk_visible & causal
            x = layer(x, k_ctx, v_ctx, cos, sin, ctx_visible, blk_visible)
        hidden_states = self.norm(x)

        logits = None
        if lm_head is not None or self.config.draft_vocab_size:
            logits = self.compute_logits(hidden_states[:, :, :, 1:], lm_head)
        gate_logits = None
        if self.config.num_modes > 0 and last_feature is not None:
            gate_logits = self.mode_gate(last_feature.to(self.dtype))
        return DraftOutput(hidden_states=hidden_states, logits=logits, gate_logits=gate_logits)

    # -- generation --------------------------------------------------------------------------
    def spec_generate(self, target, input_ids, **kwargs):
        """Lossless speculative decoding against ``target`` (chain, product or mixture tree).

        See ``generation_mfd.spec_generate`` for the arguments; returns a SpecDecodingOutput
        with ``output_ids`` and statistics (tau, acceptance lengths, time per stage, tokens/s).
        """
        from .generation_mfd import spec_generate

        return spec_generate(self, target, input_ids, **kwargs)
