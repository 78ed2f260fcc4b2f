"""A trained drafter on held-out regenerated answers: the mode diagnostics the training logs, on
data it never saw.

Per block (an anchor in a held-out answer, the block_size - 1 tokens after it), the drafter runs
as in training with every mode and the target's tap features; each mode's soft coverage is its
expected accepted length under the true continuation (``losses.soft_coverage``), the winner is
the mode that covers most. Reported: how often each mode wins and the effective number of modes
(exp of the win-rate entropy: K when every mode wins as often), how often the gate's top-1 mode is
the winner (chance is 1/K), and the mean coverage of the gate's choice, of the best mode (an
oracle) and of every mode. The paper's held-out figures: 7.9-8.0 effective modes of 8, the gate
right 28% of the time against 12.5% chance. Also the best mode's coverage per block depth (the
chance that its draft reaches depth d, prod_{j<=d} q_j): where it is ~0, a longer block only costs.
"""

import torch

from mfd_hub.errors import MfdHubError

from .config import LossSection
from .data import TapExtractor, head_weights, load_sequences, make_batch, sample_anchors
from .losses import ModeStats
from .trainer import DrafterObjective


@torch.no_grad()
def evaluate_drafter(drafter_spec, target_spec, data, anchors_per_sequence=16, limit=None, seed=0, max_length=1024,
                     batch_sequences=8, progress=None):
    """-> dict of the held-out diagnostics (see the module docstring) of drafter ``drafter_spec``
    on the regen records ``data`` (a file or a regen folder), with target ``target_spec``.
    ``progress(records done now, records in all)`` is called after each batch of records."""
    from mfd_hub.checkpoint import load_draft
    from mfd_hub.targets import load_target

    from pathlib import Path

    if not Path(data).exists():
        raise MfdHubError(f"held-out data {data} not found (make it with 'mfd-hub regen')")
    sequences, _ = load_sequences(data, max_length)  # bad records fail before any model loads
    sequences = sequences[:limit] if limit else sequences
    draft = load_draft(drafter_spec).float().eval()
    cfg = draft.config
    target, _ = load_target(target_spec)
    tcfg = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    if (tcfg.vocab_size, tcfg.hidden_size) != (cfg.vocab_size, cfg.hidden_size):
        raise MfdHubError(f"the drafter is for a target of vocabulary {cfg.vocab_size} and width {cfg.hidden_size}; "
                          f"{target_spec} has {tcfg.vocab_size} and {tcfg.hidden_size}")
    modes = cfg.num_modes or 1
    # the loss only weighs blocks; coverage, winner and gate (what is reported) do not depend on it
    loss = LossSection(type="mfd" if cfg.num_modes > 1 else "dpace")
    embed, lm_head = head_weights(target)
    objective = DrafterObjective(draft, embed, lm_head, loss)
    extractor = TapExtractor(target, cfg.target_layer_ids, torch.float32)
    stats = ModeStats(modes)
    gate_coverage, loss_sum = 0.0, 0.0
    depth_coverage = torch.zeros(cfg.block_size - 1, dtype=torch.float64)  # summed over blocks
    for start in range(0, len(sequences), batch_sequences):
        chunk = list(range(start, min(start + batch_sequences, len(sequences))))
        taps = extractor([sequences[i].ids for i in chunk])
        anchors = [sample_anchors(sequences[i], anchors_per_sequence, seed, 0, i) for i in chunk]
        batch = make_batch(sequences, chunk, anchors, taps)
        total, info = objective(batch.ids, batch.lengths, batch.anchors, batch.block_valid, batch.taps)
        stats.update(info["coverage"], batch.block_valid, info["winner"], info["gate_logits"])
        loss_sum += float(total)
        # the best mode's chance of reaching each depth: prod_{j<=d} q_j (summed over d: its coverage)
        best = info["coverage"].argmax(-1)  # [B, N]
        reach = torch.cumprod(info["true_probs"], dim=-1)  # [B, N, M, P]
        reach = reach.gather(2, best[:, :, None, None].expand(*best.shape, 1, reach.shape[-1]))[:, :, 0]
        depth_coverage += reach[batch.block_valid].double().sum(0)
        if info["gate_logits"] is not None:
            picked = info["coverage"].gather(-1, info["gate_logits"].argmax(-1, keepdim=True))[..., 0]
            gate_coverage += float(picked[batch.block_valid].sum())
        if progress:
            progress(len(chunk), len(sequences))
    summary = stats.summary()
    blocks = summary["blocks"]
    if blocks == 0:
        raise MfdHubError(f"{data} gave no block to evaluate (answers need at least 2 tokens)")
    out = {
        "drafter": str(drafter_spec), "target": str(target_spec), "data": str(data), "sequences": len(sequences),
        "blocks": blocks, "anchors_per_sequence": anchors_per_sequence, "seed": seed, "num_modes": cfg.num_modes,
        "loss_per_block": loss_sum / blocks, "loss": loss.type,
        "coverage_per_mode": summary["coverage_per_mode"], "best_mode_coverage": summary["best_mode_coverage"],
        "best_mode_coverage_per_depth": (depth_coverage / blocks).tolist(),
    }
    if cfg.num_modes > 1:
        out.update(win_rate_per_mode=summary["win_rate_per_mode"], effective_modes=summary["effective_modes"],
                   gate_top1_accuracy=summary["gate_top1_accuracy"], chance=1.0 / cfg.num_modes,
                   gate_choice_coverage=gate_coverage / blocks)
    return out
