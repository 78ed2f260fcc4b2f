# mfd-hub remote code 0.1.0, generated from mfd_hub/remote/hybrid_mfd.py; edit the source, not this copy.
"""Tree verification on hybrid Gated-DeltaNet targets (Qwen3.5 / Qwen3.6, Qwen3-Next).

An attention mask cannot verify a tree on these targets: their linear-attention layers carry a
conv window and a recurrent state from token to token. The verify pass therefore runs the
target's decoder layers itself, with the target's own modules and weights:
  - attention layers are the target's decoder layers, called with the tree attention mask and a
    small key/value store of ours (the ``update`` the attention module calls);
  - linear-attention layers use the module's projections, conv weight, gate parameters, gated
    norm and output projection, while the conv window and the recurrence follow each node's
    ancestor path (``kernels/tree_deltanet.py``).
Prefill is the target's own forward; its conv/recurrent states and keys/values are read once
from the transformers cache and kept here. ``commit`` keeps the accepted path only: the
attention keys/values are compacted, the conv state becomes the last inputs of the accepted
path and the recurrent state that of its deepest node, so nothing of a rejected branch leaks.

This file is part of the remote-code bundle: torch and transformers only.
"""

import torch
import torch.nn.functional as F

from .kv_compact import compact_kv
from .tree_attention import verify_attention_bias
from .tree_deltanet import (
    conv_state_after,
    delta_rule_inputs,
    node_state,
    tree_causal_conv,
    tree_delta_rule,
    tree_layout,
)

# Families whose decoder layers are Gated-DeltaNet ("linear_attention") or full attention.
HYBRID_FAMILIES = {"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"}
LAYER_KINDS = {"linear_attention", "full_attention"}


def hybrid_layer_problem(target):
    """None when the target's layers are all ones this verifier handles, else why not."""
    cfg = target.config.get_text_config()
    types = getattr(cfg, "layer_types", None)
    if not types:
        return "its config has no layer_types"
    unknown = sorted(set(types) - LAYER_KINDS)
    if unknown:
        return f"it has layers of kind {', '.join(unknown)}"
    return None


class _TreeKeyValues:
    """Per-layer keys/values of the attention layers; ``update`` is what an attention module calls
    on its cache: it appends the new positions and returns everything visible."""

    def __init__(self):
        self.keys, self.values = {}, {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx in self.keys:
            key_states = torch.cat([self.keys[layer_idx], key_states], dim=-2)
            value_states = torch.cat([self.values[layer_idx], value_states], dim=-2)
        self.keys[layer_idx], self.values[layer_idx] = key_states, value_states
        return key_states, value_states

    def compact(self, prefix_len, path):
        layers = list(self.keys)  # one compaction call for every attention layer's keys and values
        kept = compact_kv([t for i in layers for t in (self.keys[i], self.values[i])], prefix_len, path)
        for n, i in enumerate(layers):
            self.keys[i], self.values[i] = kept[2 * n], kept[2 * n + 1]


def _linear_projections(mod, x):
    """x [N, H] -> (conv inputs [N, C], z [N, Hv, Dv], b [N, Hv], a [N, Hv]) by the module's own
    projections (Qwen3.5: separate; Qwen3-Next: fused and reordered by the module)."""
    n = x.shape[0]
    if hasattr(mod, "in_proj_qkvz"):
        q, k, v, z, b, a = mod.fix_query_key_value_ordering(mod.in_proj_qkvz(x[None]), mod.in_proj_ba(x[None]))
        mixed = torch.cat([t.reshape(n, -1) for t in (q, k, v)], dim=-1)
        return mixed, z[0], b[0], a[0]
    z = mod.in_proj_z(x).reshape(n, -1, mod.head_v_dim)
    return mod.in_proj_qkv(x), z, mod.in_proj_b(x), mod.in_proj_a(x)


class HybridVerifier:
    """Tree verification for targets mixing full attention with Gated-DeltaNet layers."""

    def __init__(self, target, tap_ids, backend=None):
        from transformers.activations import ACT2FN

        self.target = target
        self.tap_ids = list(tap_ids)
        self.backend = backend
        self.model = target.get_decoder()  # embed_tokens, layers, norm, rotary_emb
        self.layer_types = list(target.config.get_text_config().layer_types)
        layers = zip(self.model.layers, self.layer_types)
        linear = [layer.linear_attn for layer, kind in layers if kind == "linear_attention"]
        self.act = ACT2FN[linear[0].activation] if linear else None
        self.width = linear[0].conv_kernel_size if linear else 1  # one conv width per config
        self.kv = _TreeKeyValues()
        self.conv = {}  # layer -> [width - 1, C]: the last conv inputs of the committed sequence
        self.recurrent = {}  # layer -> [Hv, Dk, Dv] float32
        self.length = 0
        self._layout = None  # the last verify's tree, and per linear layer what commit needs of it
        self._pending = {}

    def prefill(self, input_ids):
        """The target's own forward over the prompt -> (last logits [V], taps [L, n_taps*H])."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.target.config)
        n = input_ids.shape[1]
        out = self.target(
            input_ids=input_ids,
            position_ids=torch.arange(n, device=input_ids.device)[None],
            cache=cache,
            use_cache=True,
            output_hidden_states=True,
            logits_to_keep=1,
        )
        for i, layer in enumerate(self.model.layers):
            if self.layer_types[i] == "linear_attention":
                conv = cache.get_conv_state(i)[0]  # [C, >= width], zero-padded on the left
                self.conv[i] = conv[:, conv.shape[1] - (self.width - 1) :].t().contiguous()
                self.recurrent[i] = cache.get_recurrent_state(i)[0].float()
            else:
                self.kv.keys[i], self.kv.values[i] = cache.layers[i].keys, cache.layers[i].values
        self.length = n
        taps = torch.cat([out.hidden_states[i + 1] for i in self.tap_ids], dim=-1)
        return out.logits[0, -1], taps[0]

    def _tree_linear_attention(self, i, mod, x, layout):
        mixed, z, b, a = _linear_projections(mod, x)
        weight, bias = mod.conv1d.weight.squeeze(1), mod.conv1d.bias
        conv = self.act(tree_causal_conv(mixed, self.conv[i], weight, layout, bias, self.backend)).to(x.dtype)
        n = x.shape[0]
        q, k, v = torch.split(conv, [mod.key_dim, mod.key_dim, mod.value_dim], dim=-1)
        q, k = q.reshape(n, -1, mod.head_k_dim), k.reshape(n, -1, mod.head_k_dim)
        v = v.reshape(n, -1, mod.head_v_dim)
        g = -mod.A_log.float().exp() * F.softplus(a.float() + mod.dt_bias)
        q, k, v, g, beta = delta_rule_inputs(q, k, v, g, b.sigmoid())
        out = tree_delta_rule(q, k, v, g, beta, self.recurrent[i], layout, self.backend).to(x.dtype)
        self._pending[i] = (mixed, k, v, g, beta)
        out = mod.norm(out.reshape(-1, mod.head_v_dim), z.reshape(-1, mod.head_v_dim))
        return mod.out_proj(out.reshape(n, -1))

    def verify(self, tokens, depths, tree_mask):
        """One pass over the tree -> (logits [N, V], taps [N, n_taps*H]) per node."""
        layout = tree_layout(depths, tree_mask, self.width)
        positions = (self.length + depths)[None]
        hidden = self.model.embed_tokens(tokens[None])
        rotary = self.model.rotary_emb(hidden, positions)
        bias = verify_attention_bias(tree_mask, self.length, hidden.dtype)
        self._layout, self._pending = layout, {}
        last = len(self.model.layers) - 1
        taps = {}
        for i, layer in enumerate(self.model.layers):
            if self.layer_types[i] == "linear_attention":
                # the decoder layer's own structure, with the tree-aware token mixer
                mixer = self._tree_linear_attention(i, layer.linear_attn, layer.input_layernorm(hidden)[0], layout)
                hidden = hidden + mixer[None]
                mlp = layer.mlp(layer.post_attention_layernorm(hidden))
                hidden = hidden + (mlp[0] if isinstance(mlp, tuple) else mlp)  # MoE blocks may return a tuple
            else:
                hidden = layer(
                    hidden, position_embeddings=rotary, attention_mask=bias, position_ids=positions, cache=self.kv
                )
            if i in self.tap_ids and i != last:
                taps[i] = hidden
        hidden = self.model.norm(hidden)
        taps[last] = hidden  # hidden_states[-1] is the normed output in transformers
        logits = self.target.get_output_embeddings()(hidden)
        return logits[0], torch.cat([taps[i] for i in self.tap_ids], dim=-1)[0]

    def commit(self, path):
        """Keep the committed prefix plus the accepted nodes (indices into the last verify)."""
        deepest = path[-1]
        for i, (mixed, k, v, g, beta) in self._pending.items():
            self.conv[i] = conv_state_after(mixed, self.conv[i], self._layout, deepest)
            state = self.recurrent[i]
            self.recurrent[i] = node_state(k, v, g, beta, state, self._layout, deepest, self.backend)
        self._layout, self._pending = None, {}
        self.kv.compact(self.length, path)
        self.length += path.shape[0]
