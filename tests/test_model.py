"""DFlashDraftModel: modes in one pass, the plain DFlash path, z-lab checkpoints, remote code."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import NO_MFD_HUB, NO_TRITON, run_python
from mfd_hub import DFlashDraftModel, DraftContextCache, load_draft, save_draft
from mfd_hub.errors import MfdHubError
from mfd_hub.testing import drafter_config_for, target_taps, tiny_drafter, write_zlab_checkpoint


def _inputs(drafter, target, ctx_len=9, anchor_token=5, n_blocks=1):
    ids = torch.randint(0, target.config.vocab_size - 1, (1, ctx_len))
    taps = target_taps(target, ids, drafter.target_layer_ids)
    s = drafter.block_size
    block_ids = torch.full((1, n_blocks, s), drafter.mask_token_id)
    block_ids[:, :, 0] = anchor_token
    embeds = drafter.embed_block(block_ids, target.get_input_embeddings())
    anchors = torch.tensor([[ctx_len - 2 * (n_blocks - 1 - i) for i in range(n_blocks)]])
    return embeds, anchors, taps


def test_modes_in_one_pass_equal_separate_passes(target):
    drafter = tiny_drafter(target, num_modes=4)
    embeds, anchors, taps = _inputs(drafter, target, n_blocks=3)
    head = target.get_output_embeddings()
    joint = drafter(embeds, anchors, context_taps=taps, modes="all", lm_head=head)
    assert joint.logits.shape == (1, 3, 4, drafter.block_size - 1, target.config.vocab_size)
    for k in range(4):
        alone = drafter(embeds, anchors, context_taps=taps, modes=[k], lm_head=head)
        assert (joint.logits[:, :, k] - alone.logits[:, :, 0]).abs().max() < 1e-5
        assert (joint.hidden_states[:, :, k] - alone.hidden_states[:, :, 0]).abs().max() < 1e-5
    # the modes really differ (otherwise the test above proves nothing)
    assert (joint.logits[:, :, 0] - joint.logits[:, :, 1]).abs().max() > 1e-3


def test_a_mode_ignores_the_other_modes_embeddings(target):
    drafter = tiny_drafter(target, num_modes=3)
    embeds, anchors, taps = _inputs(drafter, target)
    before = drafter(embeds, anchors, context_taps=taps, lm_head=target.lm_head).logits
    with torch.no_grad():
        drafter.mode_embed[1] += 3.0
    after = drafter(embeds, anchors, context_taps=taps, lm_head=target.lm_head).logits
    assert torch.equal(before[:, :, 0], after[:, :, 0]) and torch.equal(before[:, :, 2], after[:, :, 2])
    assert (before[:, :, 1] - after[:, :, 1]).abs().max() > 1e-3


def test_one_zero_mode_equals_plain_dflash(target):
    plain = tiny_drafter(target, num_modes=0, seed=3)
    one = DFlashDraftModel(drafter_config_for(target, num_modes=1)).float().eval()
    missing, unexpected = one.load_state_dict(plain.state_dict(), strict=False)
    assert set(missing) == {"mode_embed", "mode_gate.weight"} and not unexpected
    with torch.no_grad():
        one.mode_embed.zero_()
    embeds, anchors, taps = _inputs(plain, target)
    a = plain(embeds, anchors, context_taps=taps, modes=None, lm_head=target.lm_head).logits
    b = one(embeds, anchors, context_taps=taps, modes="all", lm_head=target.lm_head).logits
    assert (a - b).abs().max() < 1e-6


def test_cached_context_equals_full_context(target):
    """The draft cache (context K/V kept across rounds) gives the same drafts as recomputing."""
    drafter = tiny_drafter(target, num_modes=2)
    embeds, anchors, taps = _inputs(drafter, target, ctx_len=11)
    full = drafter(embeds, anchors, context_taps=taps, lm_head=target.lm_head)
    cache = DraftContextCache()
    drafter.extend_context(cache, taps[:, :6], torch.arange(6))
    drafter.extend_context(cache, taps[:, 6:], torch.arange(6, 11))
    cached = drafter(embeds, anchors, cache=cache, lm_head=target.lm_head)
    assert (full.logits - cached.logits).abs().max() < 1e-5
    assert (full.gate_logits - cached.gate_logits).abs().max() < 1e-5


# ---- a from-scratch reference of DESIGN §1, independent of mfd_hub's model code ----------------
def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos[:, None] + torch.cat([-x2, x1], -1) * sin[:, None]


def reference_block_logits(w, cfg, block_emb, anchor, taps, lm_head_w, causal_flags, windows):
    """Plain DFlash for one block: block_emb [S, H], context taps [C, T*H] at positions 0..C-1."""
    eps, hd, theta = cfg["rms_norm_eps"], cfg["head_dim"], cfg["rope_theta"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    s, c = block_emb.shape[0], taps.shape[0]
    ctx = _rms(taps @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    qpos = anchor + torch.arange(s)
    kpos = torch.cat([torch.arange(c), qpos])
    x = block_emb
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = _rms((h @ w[p + "self_attn.q_proj.weight"].T).view(s, nh, hd), w[p + "self_attn.q_norm.weight"], eps)
        src = torch.cat([ctx, h])
        k = _rms((src @ w[p + "self_attn.k_proj.weight"].T).view(c + s, nkv, hd), w[p + "self_attn.k_norm.weight"], eps)
        v = (src @ w[p + "self_attn.v_proj.weight"].T).view(c + s, nkv, hd)
        q, k = _rope(q, qpos, theta), _rope(k, kpos, theta)
        visible = kpos[None, :] < anchor  # context strictly before the anchor
        in_block = torch.arange(c + s)[None, :] >= c
        if causal_flags[i]:
            visible = visible | (in_block & (kpos[None, :] <= qpos[:, None]))
        else:
            visible = visible | in_block
        if windows[i]:
            visible = visible & (qpos[:, None] - kpos[None, :] < windows[i])
            if not causal_flags[i]:
                visible = visible & (kpos[None, :] - qpos[:, None] < windows[i])
        out = torch.zeros(s, nh, hd)
        for head in range(nh):
            kv = head // (nh // nkv)
            scores = (q[:, head] @ k[:, kv].T) / hd**0.5
            scores = scores.masked_fill(~visible, float("-inf"))
            out[:, head] = scores.softmax(-1) @ v[:, kv]
        x = x + out.reshape(s, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        mlp = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + mlp @ w[p + "mlp.down_proj.weight"].T
    return _rms(x, w["norm.weight"], eps)[1:] @ lm_head_w.T


@pytest.mark.parametrize(
    "layer_types,window,is_causal",
    [
        (["full_attention", "full_attention"], None, None),
        (["sliding_attention", "full_attention"], 5, None),
        (["sliding_attention", "sliding_attention"], 4, False),
        (["full_attention", "full_attention"], None, True),
    ],
)
def test_zlab_checkpoint_matches_reference(target, tmp_path, layer_types, window, is_causal):
    cfg = drafter_config_for(target, num_modes=0, layer_types=layer_types, sliding_window=window)
    torch.manual_seed(7)
    source = DFlashDraftModel(cfg).float()
    folder = write_zlab_checkpoint(tmp_path / "zlab", cfg, source.state_dict(), is_causal=is_causal)
    raw = json.loads((folder / "config.json").read_text())
    assert raw["model_type"] == "qwen3" and raw["auto_map"]["AutoModel"] == "dflash.DFlashDraftModel"

    drafter = load_draft(folder)
    assert isinstance(drafter, DFlashDraftModel) and drafter.num_modes == 0
    weights = {k: v.float() for k, v in load_file(folder / "model.safetensors").items()}
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, weights[name]), name

    ctx_len, anchor_token = 9, 3
    ids = torch.randint(0, 60, (1, ctx_len))
    taps = target_taps(target, ids, drafter.target_layer_ids)
    block = torch.tensor([[anchor_token] + [drafter.mask_token_id] * (drafter.block_size - 1)])
    emb = target.get_input_embeddings().weight[block[0]].detach()
    causal = [bool(is_causal)] * 2 if is_causal is not None else [t == "sliding_attention" for t in layer_types]
    windows = [window if t == "sliding_attention" else None for t in layer_types]
    expected = reference_block_logits(
        weights, cfg.to_dict(), emb, ctx_len, taps[0], target.lm_head.weight.detach(), causal, windows
    )
    got = drafter(emb[None], ctx_len, context_taps=taps, modes=None, lm_head=target.lm_head).logits[0, 0, 0]
    assert (got - expected).abs().max() < 1e-4


def test_load_refuses_mismatched_weights(target, tmp_path):
    drafter = tiny_drafter(target, num_modes=2)
    save_draft(drafter, tmp_path / "ck")
    weights = load_file(tmp_path / "ck" / "model.safetensors")
    del weights["mode_gate.weight"]
    save_file(weights, tmp_path / "ck" / "model.safetensors")
    with pytest.raises(MfdHubError, match="missing"):
        load_draft(tmp_path / "ck")


# ---- remote code ----------------------------------------------------------------------------------
REMOTE_SCRIPT = """
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel
model = AutoModel.from_pretrained("ck", trust_remote_code=True, dtype=torch.float32).eval()
assert type(model).__name__ == "DFlashDraftModel", type(model)
assert not type(model).__module__.startswith("mfd_hub"), type(model).__module__
x = {k: v.clone() for k, v in load_file("inputs.safetensors").items()}  # fresh, aligned memory
head = torch.nn.Linear(x["lm_head"].shape[1], x["lm_head"].shape[0], bias=False)
head.weight.data.copy_(x["lm_head"])
with torch.no_grad():
    out = model(x["embeds"], x["anchors"], context_taps=x["taps"], modes="all", lm_head=head)
save_file({"logits": out.logits.contiguous()}, "remote_logits.safetensors")
print("remote ok", type(model).__module__)
"""


@pytest.mark.parametrize("block_triton", [False, True])
def test_remote_code_without_mfd_hub_gives_identical_logits(target, tmp_path, block_triton):
    drafter = tiny_drafter(target, num_modes=3)
    save_draft(drafter, tmp_path / "ck")
    raw = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert raw["auto_map"] == {
        "AutoConfig": "configuration_mfd.DFlashConfig",
        "AutoModel": "modeling_mfd.DFlashDraftModel",
    }
    assert raw["model_type"] == "mfd_dflash"
    embeds, anchors, taps = _inputs(drafter, target, n_blocks=2)
    save_file(
        {"embeds": embeds, "anchors": anchors, "taps": taps, "lm_head": target.lm_head.weight.detach().clone()},
        tmp_path / "inputs.safetensors",
    )
    prelude = NO_MFD_HUB + (NO_TRITON if block_triton else "")
    result = run_python(prelude + REMOTE_SCRIPT, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    remote = load_file(tmp_path / "remote_logits.safetensors")["logits"]
    x = {k: v.clone() for k, v in load_file(tmp_path / "inputs.safetensors").items()}
    with torch.no_grad():
        local = drafter(x["embeds"], x["anchors"], context_taps=x["taps"], modes="all", lm_head=target.lm_head).logits
    assert torch.equal(remote, local)


def test_loading_without_trust_remote_code_fails_loudly(target, tmp_path):
    save_draft(tiny_drafter(target, num_modes=2), tmp_path / "ck")
    code = NO_MFD_HUB + (
        "from transformers import AutoModel\n"
        "AutoModel.from_pretrained('ck')\n"
        "print('LOADED SILENTLY')\n"
    )
    result = run_python(code, tmp_path)
    assert result.returncode != 0
    assert "LOADED SILENTLY" not in result.stdout
    assert "trust_remote_code" in result.stderr
