"""The training recipe's mode knobs (drafter.mode_init / mode_init_scale, train.mode_lr_scale,
loss.winner_weight, loss.gate_weight, loss.gate_input): each changes exactly what it says, the
defaults give today's loss, and a trained checkpoint records them. Tiny real models."""

import json
import math

import pytest
import torch

from mfd_hub.errors import MfdHubError
from mfd_hub.recipes.config import LossSection, TrainSection, load_recipe
from mfd_hub.recipes.losses import dpace_loss, true_token_logprobs
from mfd_hub.recipes.mode_analyses import initial_modes
from mfd_hub.recipes.trainer import DrafterObjective, build_drafter, make_optimizer, train
from mfd_hub.testing import save_tiny_target, tiny_drafter, tiny_target, write_zlab_checkpoint

K = 3


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """What the packaged tiny-mfd recipe reads: ./tiny-target, ./tiny-zlab and ./tiny-data.jsonl
    (random answers: the knobs' effects do not need meaningful ones)."""
    root = tmp_path_factory.mktemp("knobs")
    target = tiny_target("qwen3", vocab_size=64, init_std=0.2)
    save_tiny_target(root / "tiny-target", target)
    base = tiny_drafter(target, num_layers=2, block_size=8)
    write_zlab_checkpoint(root / "tiny-zlab", base.config, base.state_dict(), dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    lines = [json.dumps({"id": f"r{i}", "prompt_ids": torch.randint(1, 64, (4,), generator=gen).tolist(),
                         "response_ids": torch.randint(1, 64, (20,), generator=gen).tolist()}) for i in range(8)]
    (root / "tiny-data.jsonl").write_text("\n".join(lines) + "\n")
    return root, target


def _recipe(root, *overrides):
    return load_recipe("tiny-mfd", [f"target={root / 'tiny-target'}", f"drafter.base={root / 'tiny-zlab'}",
                                    f"data.train={root / 'tiny-data.jsonl'}", f"drafter.num_modes={K}", *overrides])


def _batch(target, drafter, seed=0):
    """Two sequences' ids, lengths, anchors, validity and target taps."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (2, 24), generator=gen)
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    taps = torch.cat([out.hidden_states[i + 1] for i in drafter.target_layer_ids], dim=-1)
    anchors = torch.tensor([[2, 7, 11], [3, 9, 15]])
    return ids, torch.tensor([24, 20]), anchors, torch.ones(2, 3, dtype=torch.bool), taps


def _objective(target, drafter, **loss):
    return DrafterObjective(drafter, target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach(),
                            LossSection(**loss))


def test_knobs_default_to_todays_recipe_and_refuse_bad_values(workspace):
    root, _ = workspace
    recipe = _recipe(root)
    drafter, train = recipe.drafter, recipe.train
    assert (drafter.mode_init, drafter.mode_init_scale, train.mode_lr_scale) == ("normal", 1.0, 1.0)
    assert (recipe.loss.winner_weight, recipe.loss.gate_weight, recipe.loss.gate_input) == (0.9, 0.1, "shared")
    for bad, key in (("loss.gate_input=frozen", "loss.gate_input"), ("drafter.mode_init=zeros", "drafter.mode_init"),
                     ("train.mode_lr_scale=0", "train.mode_lr_scale"),
                     ("loss.winner_weight=1.5", "loss.winner_weight")):
        with pytest.raises(MfdHubError, match=key):
            _recipe(root, bad)


def test_the_loss_weighs_winner_others_and_gate_as_the_knobs_say(workspace):
    """On one batch, the objective's loss is sum over blocks of sum_k w_k D-PACE_k + gate_weight x the
    gate's cross-entropy towards the best-covering mode, w = winner_weight for it and
    (1 - winner_weight)/(K - 1) for the others, computed here by hand from the drafter's own outputs;
    the defaults (0.9, 0.1) give exactly that loss, winner_weight 1 drops the other modes."""
    _, target = workspace
    drafter = tiny_drafter(target, num_modes=K, block_size=6)
    ids, lengths, anchors, valid_blocks, taps = _batch(target, drafter)
    block = torch.full((2, 3, 6), drafter.mask_token_id)
    block[:, :, 0] = ids.gather(1, anchors)
    with torch.no_grad():
        out = drafter(drafter.embed_block(block, target.model.embed_tokens), anchors, context_taps=taps, modes="all")
    positions = anchors[..., None] + torch.arange(1, 6)
    valid = positions < lengths[:, None, None]
    true = ids.gather(1, positions.clamp(max=23).reshape(2, -1)).reshape(positions.shape)
    hidden = out.hidden_states[:, :, :, 1:]
    logp = true_token_logprobs(hidden.reshape(-1, hidden.shape[-1]), target.lm_head.weight.detach(),
                               true[:, :, None].expand(2, 3, K, 5).reshape(-1)).reshape(2, 3, K, 5)
    logp = torch.where(valid[:, :, None], logp, torch.zeros_like(logp))
    per_mode = torch.stack([dpace_loss(logp[:, :, k], valid, 0.5) for k in range(K)], dim=-1)  # [2, 3, K]
    coverage = torch.cumprod(torch.where(valid[:, :, None], logp.exp(), torch.zeros_like(logp)), -1).sum(-1)
    winner = coverage.argmax(-1)
    gate_ce = -torch.log_softmax(out.gate_logits, -1).gather(-1, winner[..., None])[..., 0]
    for winner_weight, gate_weight in ((0.9, 0.1), (1.0, 0.1), (0.9, 0.3), (0.5, 0.0)):
        weights = torch.full((2, 3, K), (1 - winner_weight) / (K - 1)).scatter(-1, winner[..., None], winner_weight)
        want = ((weights * per_mode).sum(-1) + gate_weight * gate_ce).sum()
        if (winner_weight, gate_weight) == (0.9, 0.1):
            objective = _objective(target, drafter)  # the defaults
        else:
            objective = _objective(target, drafter, winner_weight=winner_weight, gate_weight=gate_weight)
        with torch.no_grad():
            got, _ = objective(ids, lengths, anchors, valid_blocks, taps)
        assert float(got) == pytest.approx(float(want), rel=1e-5), (winner_weight, gate_weight)
    with torch.no_grad():
        hard = _objective(target, drafter, winner_weight=1.0)(ids, lengths, anchors, valid_blocks, taps)[0]
    assert float(hard) == pytest.approx(float((per_mode.gather(-1, winner[..., None])[..., 0] + 0.1 * gate_ce).sum()),
                                        rel=1e-5)


def _grads(target, drafter, **loss):
    drafter.zero_grad(set_to_none=True)
    objective = _objective(target, drafter, **loss)
    total, _ = objective(*_batch(target, drafter))
    total.backward()
    return total.detach(), {name: p.grad.clone() for name, p in drafter.named_parameters() if p.grad is not None}


def test_a_detached_gate_input_keeps_the_gates_loss_off_the_context(workspace):
    """With loss.gate_input detached the gate's cross-entropy gives the context projection (fc,
    hidden_norm) no gradient, and the gate the same gradient as when shared; the loss is unchanged."""
    _, target = workspace
    shared = tiny_drafter(target, num_modes=K, block_size=6)
    detached = tiny_drafter(target, num_modes=K, block_size=6)
    loss_s, with_gate = _grads(target, shared, gate_weight=0.5)
    _, no_gate = _grads(target, shared, gate_weight=0.0)
    loss_d, detached_gate = _grads(target, detached, gate_weight=0.5, gate_input="detached")
    _, detached_no_gate = _grads(target, detached, gate_weight=0.0, gate_input="detached")
    assert torch.equal(loss_s, loss_d)
    for name in ("fc.weight", "hidden_norm.weight"):
        assert not torch.allclose(with_gate[name], no_gate[name], atol=1e-9, rtol=0), name  # shared: the gate pulls
        assert torch.allclose(detached_gate[name], detached_no_gate[name], atol=1e-9, rtol=0), name
    assert torch.allclose(detached_gate["mode_gate.weight"], with_gate["mode_gate.weight"], atol=1e-7)
    assert detached_gate["mode_gate.weight"].abs().sum() > 0


def test_mode_lr_scale_gives_the_modes_and_the_gate_their_own_learning_rate(workspace):
    _, target = workspace
    drafter = tiny_drafter(target, num_modes=K)
    objective = _objective(target, drafter)
    everything = {id(p) for p in objective.parameters()}
    default = make_optimizer(objective, TrainSection(lr=2e-4))
    assert len(default.param_groups) == 1 and {id(p) for p in default.param_groups[0]["params"]} == everything
    scaled = make_optimizer(objective, TrainSection(lr=2e-4, mode_lr_scale=10.0))
    main, modes = scaled.param_groups
    assert {id(p) for p in modes["params"]} == {id(drafter.mode_embed), id(drafter.mode_gate.weight)}
    assert {id(p) for p in main["params"]} == everything - {id(p) for p in modes["params"]}
    assert (main["lr"], modes["lr"]) == (2e-4, pytest.approx(2e-3))
    schedule = torch.optim.lr_scheduler.LambdaLR(scaled, lambda step: 0.5)
    assert schedule.get_last_lr() == [pytest.approx(1e-4), pytest.approx(1e-3)]


def test_token_scale_init_starts_the_modes_at_the_mask_tokens_norm(workspace):
    """drafter.mode_init token_scale: every new mode has norm mode_init_scale x |embed[mask]|, random
    directions; the default keeps N(0, 0.02^2). Both record what rebuilds their start."""
    root, target = workspace
    embed = target.model.embed_tokens.weight.detach()
    sequences = []
    default = build_drafter(_recipe(root), _info(target), target.lm_head.weight, sequences, embed=embed)
    scaled = build_drafter(_recipe(root, "drafter.mode_init=token_scale", "drafter.mode_init_scale=0.5"),
                           _info(target), target.lm_head.weight, sequences, embed=embed)
    mask_norm = float(embed[scaled.config.mask_token_id].norm())
    assert torch.allclose(scaled.mode_embed.norm(dim=-1), torch.full((K,), 0.5 * mask_norm), rtol=1e-5)
    assert default.mode_embed.norm(dim=-1).max() < 0.25 * mask_norm  # 0.02 sqrt(H) against 0.2 sqrt(H)
    assert torch.nn.functional.cosine_similarity(scaled.mode_embed, default.mode_embed, dim=-1).min() > 0.999
    for model in (default, scaled):
        assert torch.allclose(initial_modes(model), model.mode_embed.detach(), rtol=1e-6)
    assert scaled.config.mfd_metadata["mode_init"]["mode_norm"] == pytest.approx(0.5 * mask_norm)
    with pytest.raises(MfdHubError, match="embedding"):
        build_drafter(_recipe(root, "drafter.mode_init=token_scale"), _info(target), target.lm_head.weight, sequences)


def _info(target):
    c = target.config
    return {"hidden_size": c.hidden_size, "vocab_size": c.vocab_size, "num_hidden_layers": c.num_hidden_layers,
            "model_type": c.model_type, "name_or_path": "tiny"}


def test_a_trained_checkpoint_records_its_knobs(workspace, tmp_path):
    from mfd_hub.checkpoint import load_draft

    root, _ = workspace
    recipe = _recipe(root, "train.max_steps=1", "drafter.mode_init=token_scale", "train.mode_lr_scale=10",
                     "loss.winner_weight=1.0", "loss.gate_weight=0.3", "loss.gate_input=detached",
                     "data.features=online", f"output.dir={tmp_path / 'run'}", "output.save_every=0")
    summary = train(recipe, verbose=False)
    settings = load_draft(summary["exported"]).config.mfd_metadata["training"]["settings"]
    assert {k: settings[k] for k in ("mode_init", "mode_lr_scale", "winner_weight", "gate_weight", "gate_input")} == {
        "mode_init": "token_scale", "mode_lr_scale": 10.0, "winner_weight": 1.0, "gate_weight": 0.3,
        "gate_input": "detached"}
    assert math.isfinite(summary["final_loss"])


def test_resize_block_lets_a_fine_tune_draft_longer_blocks_than_its_base(workspace):
    """drafter.resize_block: the base's weights, unchanged, drafting blocks of the recipe's size
    (recorded); without it a block size other than the base's is refused, as before."""
    root, target = workspace
    embed = target.model.embed_tokens.weight.detach()
    longer = build_drafter(_recipe(root, "drafter.block_size=16", "drafter.resize_block=true"), _info(target),
                           target.lm_head.weight, [], embed=embed)
    same = build_drafter(_recipe(root), _info(target), target.lm_head.weight, [], embed=embed)
    assert (longer.config.block_size, same.config.block_size) == (16, 8)
    assert longer.config.mfd_metadata["block_resized"] == {"base": 8, "now": 16}
    for name, tensor in same.state_dict().items():
        assert torch.equal(tensor, longer.state_dict()[name]), name
    with pytest.raises(MfdHubError, match="block_size"):
        build_drafter(_recipe(root, "drafter.block_size=16"), _info(target), target.lm_head.weight, [], embed=embed)


def test_a_checkpoint_made_before_the_knobs_resumes_as_their_defaults(workspace):
    from mfd_hub.recipes.trainer import recipe_changes

    root, _ = workspace
    saved = _recipe(root).to_dict()
    for section, key in (("drafter", "mode_init"), ("drafter", "mode_init_scale"), ("drafter", "resize_block"),
                         ("train", "mode_lr_scale"), ("loss", "gate_input")):
        del saved[section][key]
    assert recipe_changes(saved, _recipe(root).to_dict()) == []
    assert recipe_changes(saved, _recipe(root, "loss.gate_input=detached").to_dict()) == ["loss.gate_input"]
