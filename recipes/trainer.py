"""The training recipe: fine-tune (or train from scratch) a block drafter as a recipe says.

Read top to bottom, ``train`` does:

1. set up the process group when launched by torchrun (gloo on CPU, NCCL on GPU);
2. read the regenerated sequences and make sure the target's tap features exist (computed once
   into the feature store, shared by every rank), or prepare to compute them per step (online);
3. build the drafter: from a z-lab or MFD checkpoint (adding modes and a draft vocabulary when
   the recipe asks), from scratch, or from the last checkpoint of this run when resuming;
4. wrap it in ``DrafterObjective`` (the drafter plus the frozen target embedding and LM head, whose
   forward returns the summed per-block loss), then FSDP2 or DDP across ranks;
5. AdamW, warmup + cosine, gradient clipping; each global step takes ``batch_size`` sequences,
   split over ranks and micro-batches, and normalises the loss by the number of blocks in the
   whole step, so any split gives the same gradient;
6. log metrics (JSON Lines) and mode diagnostics, save resumable checkpoints (the
   ``train_checkpoint`` contract plus optimiser, scheduler, RNG and data position), and export the
   trained drafter as an mfd-hub checkpoint at the end.
"""

import json
import math
import os
import resource
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import yaml
from torch import nn

from mfd_hub.errors import MfdHubError
from mfd_hub.precision import auto_dtype
from mfd_hub.remote.configuration_mfd import DFlashConfig
from mfd_hub.remote.modeling_mfd import DFlashDraftModel
from mfd_hub.recipes.train_checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from mfd_hub.recipes.config import SCRATCH, Recipe
from mfd_hub.recipes.data import (
    DTYPES,
    FeatureStore,
    TapExtractor,
    data_checksum,
    draft_vocabulary,
    head_weights,
    load_sequences,
    make_batch,
    sample_anchors,
    step_sequences,
    target_identity,
)
from mfd_hub.recipes.losses import (
    ModeStats,
    dflash_loss,
    dpace_loss,
    mfd_loss,
    soft_coverage,
    true_token_logprobs,
    true_token_probs,
)

# Keys a resumed run may change: they do not change what is computed.
RESUME_MAY_CHANGE = ("output", "train.parallel", "train.micro_batch_size", "train.head_chunk", "data.features",
                     "data.features_dir", "data.extract_batch_tokens", "data.regen", "description")
# Feature extraction can take hours before the first collective of training.
PROCESS_GROUP_TIMEOUT = timedelta(hours=6)


# -- processes -----------------------------------------------------------------------------------
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self):
        return self.world > 1

    @property
    def main(self):
        return self.rank == 0

    def barrier(self):
        if self.enabled:
            torch.distributed.barrier()

    def sum(self, value):
        """Sum a float (or a float tensor) over ranks."""
        tensor = torch.as_tensor(value, dtype=torch.float64, device=self.device).clone()
        if self.enabled:
            torch.distributed.all_reduce(tensor)
        return tensor.cpu()


def setup_distributed():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world == 1:
        return Dist(0, 1, device)
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=PROCESS_GROUP_TIMEOUT)
    return Dist(dist.get_rank(), world, device)


# -- the objective -------------------------------------------------------------------------------
class DrafterObjective(nn.Module):
    """The drafter and its loss. The target's embedding and LM head are frozen tensors kept out
    of the module's parameters and state dict (FSDP and checkpoints see only the drafter)."""

    def __init__(self, drafter, embed, lm_head, loss, head_chunk=0, autocast_dtype=None):
        super().__init__()
        self.drafter = drafter
        self.__dict__["frozen"] = {"embed": embed, "lm_head": lm_head}
        self.loss, self.head_chunk, self.autocast_dtype = loss, head_chunk, autocast_dtype
        if getattr(loss, "gate_input", "shared") == "detached" and hasattr(drafter, "mode_gate"):
            drafter.mode_gate.register_forward_hook(_gate_on_detached_input)

    def _head(self):
        """(head weight [V', H], target id -> head row map [V] with -1 for ids it cannot draft)."""
        d = self.drafter
        if d.config.draft_vocab_size:
            rows = torch.arange(d.config.draft_vocab_size, device=d.d2t.device)
            row_of = torch.full((d.config.vocab_size,), -1, dtype=torch.long, device=rows.device)
            row_of[rows + d.d2t] = rows
            weight = d.lm_head.weight
            return (weight.to(self.autocast_dtype) if self.autocast_dtype else weight), row_of
        return self.frozen["lm_head"], None

    def _logprobs(self, hidden, true_ids, valid):
        """hidden [B, N, M, P, H] -> log q of the true tokens [B, N, M, P] (0 where not valid)."""
        mask = valid[:, :, None].expand(hidden.shape[:-1])
        weight, row_of = self._head()
        index = true_ids[:, :, None].expand(mask.shape)[mask]
        if row_of is not None:
            index = row_of[index]
        with torch.autocast(hidden.device.type, enabled=False):
            rows = true_token_logprobs(hidden[mask], weight, index, self.head_chunk)
        return torch.zeros(mask.shape, dtype=rows.dtype, device=rows.device).masked_scatter(mask, rows)

    def _draft(self, embeds, anchors, taps, modes):
        with torch.autocast(embeds.device.type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None):
            return self.drafter(embeds, anchors, context_taps=taps, modes=modes)

    def forward(self, ids, lengths, anchors, block_valid, taps):
        """Summed loss of the valid blocks, and detached parts for logging and diagnostics."""
        d, loss = self.drafter, self.loss
        cfg = d.config
        b, n = anchors.shape
        size = cfg.block_size
        block_ids = torch.full((b, n, size), cfg.mask_token_id, dtype=torch.long, device=ids.device)
        block_ids[:, :, 0] = ids.gather(1, anchors)
        embeds = d.embed_block(block_ids, self.frozen["embed"])
        positions = anchors[..., None] + torch.arange(1, size, device=ids.device)  # [B, N, P]
        valid = block_valid[..., None] & (positions < lengths[:, None, None])
        true_ids = ids.gather(1, positions.clamp(max=ids.shape[1] - 1).reshape(b, -1)).reshape(positions.shape)

        out = self._draft(embeds, anchors, taps, "all" if cfg.num_modes else None)
        logp = self._logprobs(out.hidden_states[:, :, :, 1:], true_ids, valid)
        true_probs = true_token_probs(logp, valid[:, :, None].expand(logp.shape))  # [B, N, M, P], detached
        parts = {}
        if loss.type == "mfd":
            block_loss, extra = mfd_loss(logp, valid, out.gate_logits, loss.alpha, loss.winner_weight, loss.gate_weight)
            parts.update(dpace=extra["dpace"], gate=extra["gate"])
            coverage, winner, gate_logits = extra["coverage"], extra["winner"], out.gate_logits
        else:
            logp = logp[:, :, 0]
            if loss.type == "dflash":
                block_loss = dflash_loss(logp, valid, loss.gamma)
            else:
                block_loss = dpace_loss(logp, valid, loss.alpha)
            coverage, winner, gate_logits = soft_coverage(true_token_probs(logp, valid))[..., None], None, None
        default_coverage = None
        if cfg.default_path:
            out_d = self._draft(embeds, anchors, taps, None)
            logp_d = self._logprobs(out_d.hidden_states[:, :, :, 1:], true_ids, valid)[:, :, 0]
            default = dpace_loss(logp_d, valid, loss.alpha)
            parts["default"] = default
            block_loss = block_loss + loss.default_weight * default
            default_coverage = soft_coverage(true_token_probs(logp_d, valid))
        parts = {k: (v.detach() * block_valid).sum() for k, v in parts.items()}
        block_loss = torch.where(block_valid, block_loss, torch.zeros_like(block_loss))
        info = {"parts": parts, "coverage": coverage.detach(), "winner": winner, "gate_logits": gate_logits,
                "default_coverage": default_coverage, "true_probs": true_probs}
        return block_loss.sum(), info


def _gate_on_detached_input(gate, args, output):
    """loss.gate_input = detached: the gate's logits from its input without gradient, so the gate's
    cross-entropy trains the gate alone and never pulls the context projection it reads."""
    return torch.nn.functional.linear(args[0].detach(), gate.weight, gate.bias)


# -- the drafter -----------------------------------------------------------------------------------
def _rebuilt(model, **changes):
    """A copy of ``model`` whose config has ``changes``; new tensors keep their fresh init."""
    config = DFlashConfig.from_dict({**model.config.to_dict(), **changes})
    new = DFlashDraftModel(config).float()
    missing, unexpected = new.load_state_dict(model.state_dict(), strict=False)
    if unexpected:
        raise MfdHubError(f"cannot carry weights {unexpected[:3]} into the new drafter config")
    return new, set(missing)


def add_modes(model, num_modes, default_path, std, seed, mode_norm=None):
    """Give a drafter K mode embeddings and a gate (converters.zlab.init_modes: seeded N(0, std^2),
    the gate N(0, initializer_range^2)) unless it has them, and MFD-D's default path (zero, i.e. the
    base drafter's behaviour) if asked; existing modes are kept. With ``mode_norm`` each mode is
    rescaled to that norm (its direction kept: drafter.mode_init token_scale). The choice is
    recorded in the config's metadata, with what rebuilds the start (seed, stds, norm)."""
    from mfd_hub.converters.zlab import init_modes

    new, missing = _rebuilt(model, num_modes=num_modes, default_path=default_path)
    init = {}
    if "mode_embed" in missing:
        gate_std = new.config.initializer_range
        mode_embed, gate = init_modes(num_modes, new.config.hidden_size, seed, std, gate_std)
        described = f"normal(0, {std}^2)"
        if mode_norm is not None:
            mode_embed = mode_embed / mode_embed.norm(dim=-1, keepdim=True) * mode_norm
            described = f"random directions of norm {mode_norm:.6g}"
            init["mode_norm"] = float(mode_norm)
        with torch.no_grad():
            new.mode_embed.copy_(mode_embed)
            new.mode_gate.weight.copy_(gate)
        init.update(mode_embed=described, mode_gate=f"normal(0, {gate_std}^2)", seed=seed, mode_std=std,
                    gate_std=gate_std)
    if default_path and "default_embed" in missing:
        with torch.no_grad():
            new.default_embed.zero_()
        init["default_embed"] = "zeros"
    if init:
        new.config.mfd_metadata = {**new.config.mfd_metadata, "mode_init": init}
    return new


def _expect(recipe_value, actual, name, base):
    if recipe_value is not None and recipe_value != actual:
        raise MfdHubError(f"drafter.{name} is {recipe_value!r} but the base {base} has {actual!r}")


def mode_init_norm(recipe, model, embed):
    """The norm new modes start at: None for drafter.mode_init normal; for token_scale,
    mode_init_scale x the norm of the mask token's input embedding (what every mode is added to)."""
    r = recipe.drafter
    if r.mode_init != "token_scale":
        return None
    if embed is None:
        raise MfdHubError("drafter.mode_init token_scale needs the target's embedding")
    mask = embed[model.config.mask_token_id].float() * model.config.input_embedding_scale
    return r.mode_init_scale * float(mask.norm())


def build_drafter(recipe, target_info, lm_head, sequences, embed=None):
    """The drafter a fresh run starts from (fp32, on the CPU, identical on every rank). ``embed``:
    the target's input embedding, needed by drafter.mode_init token_scale."""
    r = recipe.drafter
    torch.manual_seed(recipe.train.seed)
    if r.base == SCRATCH:
        fields = {**r.config}
        fields.update(
            vocab_size=target_info["vocab_size"], hidden_size=target_info["hidden_size"],
            num_target_layers=target_info["num_hidden_layers"], target_layer_ids=r.target_layer_ids,
            mask_token_id=r.mask_token_id, block_size=r.block_size or 16, target=target_info,
            num_modes=0, default_path=False,
        )
        try:
            config = DFlashConfig(**fields)
            config.validate_drafter()
        except (TypeError, ValueError) as err:
            raise MfdHubError(f"drafter.config: {err}") from None
        model = DFlashDraftModel(config).float()
        model.config.mfd_metadata = {"init": "scratch", "initializer_range": config.initializer_range}
    else:
        from mfd_hub.checkpoint import load_draft

        model = load_draft(r.base, dtype=torch.float32)
        cfg = model.config
        _expect(r.target_layer_ids, list(cfg.target_layer_ids), "target_layer_ids", r.base)
        _expect(r.mask_token_id, cfg.mask_token_id, "mask_token_id", r.base)
        if not r.resize_block:
            _expect(r.block_size, cfg.block_size, "block_size", r.base)
        for key, ours in (("hidden_size", cfg.hidden_size), ("vocab_size", cfg.vocab_size),
                          ("num_hidden_layers", cfg.num_target_layers)):
            if target_info[key] != ours:
                raise MfdHubError(f"the base {r.base} was made for a target with {key} {ours}, "
                                  f"the target {recipe.target} has {target_info[key]}")
        model.config.target = dict(target_info)
        model.config.mfd_metadata = {**cfg.mfd_metadata, "base": r.base}
        if cfg.num_modes and cfg.num_modes != r.num_modes:
            raise MfdHubError(f"the base {r.base} has {cfg.num_modes} modes, the recipe asks for {r.num_modes}")
        if cfg.default_path and not r.default_path:
            raise MfdHubError(f"the base {r.base} is an MFD-D drafter; set drafter.default_path: true")
    cfg = model.config
    if r.base != SCRATCH and r.resize_block and r.block_size and r.block_size != cfg.block_size:
        resized = {"base": cfg.block_size, "now": r.block_size}
        model, _ = _rebuilt(model, block_size=r.block_size)
        model.config.mfd_metadata = {**model.config.mfd_metadata, "block_resized": resized}
        cfg = model.config
    if r.num_modes and (cfg.num_modes == 0 or (r.default_path and not cfg.default_path)):
        model = add_modes(model, r.num_modes, r.default_path, r.mode_init_std, recipe.train.seed,
                          mode_norm=mode_init_norm(recipe, model, embed))
    if r.draft_vocab_size and not model.config.draft_vocab_size:
        from mfd_hub.converters.draft_vocab import reduce_vocabulary

        ids = draft_vocabulary(sequences, r.draft_vocab_size, model.config.vocab_size)
        model = reduce_vocabulary(model, lm_head, ids).float()
    elif r.draft_vocab_size and model.config.draft_vocab_size > r.draft_vocab_size:
        # the size is an upper bound (only tokens that occur are kept), so a base with fewer keeps its own
        raise MfdHubError(f"the base has a draft vocabulary of {model.config.draft_vocab_size}, "
                          f"more than the recipe's {r.draft_vocab_size}")
    return model


def tap_layers_of(recipe):
    """The target layers the drafter reads, known before any weights are loaded."""
    r = recipe.drafter
    if r.base == SCRATCH:
        return list(r.target_layer_ids)
    from mfd_hub.checkpoint_config import checkpoint_format, config_from_zlab, read_config_dict
    from mfd_hub.locate import resolve_drafter

    raw = read_config_dict(resolve_drafter(r.base))  # a folder, a Hub repo id or a shipped name
    config = config_from_zlab(raw) if checkpoint_format(raw) == "zlab" else DFlashConfig.from_dict(raw)
    return list(config.target_layer_ids)


# -- features ----------------------------------------------------------------------------------
def bf16_is_fast(device):
    """Whether bf16 beats fp32 on ``device``: CUDA, or a CPU with native bf16 (AMX-BF16 or
    AVX512-BF16; there a training step costs 0.4-0.7x an fp32 one, a target forward less)."""
    return device.type == "cuda" or auto_dtype(device) == torch.bfloat16


def features_dir(recipe, tap_layers):
    if recipe.data.features_dir:
        return Path(recipe.data.features_dir)
    name = Path(recipe.target).name or "target"
    key = f"{name}-taps{'_'.join(map(str, tap_layers))}-{recipe.data.features_dtype}-len{recipe.data.max_length}"
    return Path(f"{recipe.data.train}.features") / key


def prepare_features(recipe, sequences, tap_layers, dist, log):
    """-> (target identity, embedding, LM head, taps_of(indices) -> list of [L, F] tensors)."""
    from mfd_hub.targets import load_target

    dtype = DTYPES[recipe.data.features_dtype]
    # bf16 features are rounded anyway, so the target may run in bf16 where that is fast; fp32 ones need an fp32 target
    target_dtype = torch.bfloat16 if dtype == torch.bfloat16 and bf16_is_fast(dist.device) else torch.float32

    def load():
        log(f"loading target {recipe.target}")
        target, _ = load_target(recipe.target, dtype=target_dtype, device=dist.device)
        target.requires_grad_(False)
        return target

    if recipe.data.features == "online":
        target = load()
        extractor = TapExtractor(target, tap_layers, target_dtype, recipe.data.extract_batch_tokens)
        embed, lm_head = head_weights(target)

        def taps_of(indices):
            return extractor([sequences[i].ids for i in indices])

        return target_identity(target, recipe.target), embed, lm_head, taps_of

    spec = {"target": recipe.target, "tap_layers": tap_layers, "dtype": recipe.data.features_dtype,
            "max_length": recipe.data.max_length}
    store = FeatureStore(features_dir(recipe, tap_layers), spec)
    store.check_meta()
    todo = store.missing(sequences)
    if todo or not store.has_head():
        target = load()
        if dist.main:
            if not (store.root / "meta.json").exists():
                store.write_meta(target_identity(target, recipe.target))
            store.save_head(*head_weights(target))
        dist.barrier()  # the store folder and its meta exist before any rank adds shards
        mine = todo[dist.rank :: dist.world]
        log(f"computing tap features of {len(todo)} sequences into {store.root}")
        from tqdm import tqdm

        with tqdm(total=len(mine), desc=f"tap features (rank {dist.rank})", unit="seq",
                  disable=not (dist.main and log.verbose)) as bar:
            store.build(TapExtractor(target, tap_layers, dtype, recipe.data.extract_batch_tokens), sequences, mine,
                        progress=bar.update)
        del target
        dist.barrier()
        if store.missing(sequences):
            raise MfdHubError(f"feature store {store.root} is still incomplete after extraction")
    embed, lm_head = store.load_head()
    return store.target_info(), embed, lm_head, lambda idx: [store.get(sequences[i]) for i in idx]


# -- optimiser, schedule, checkpoints ------------------------------------------------------------
MODE_PARAMETERS = ("mode_embed", "mode_gate.weight")


def make_optimizer(top, t):
    """AdamW over the trainable parameters; with train.mode_lr_scale != 1 the modes and the gate are
    a second group at lr x mode_lr_scale (the schedule scales both alike)."""
    named = [(name, p) for name, p in top.named_parameters() if p.requires_grad]
    is_mode = [any(name == m or name.endswith("." + m) for m in MODE_PARAMETERS) for name, _ in named]
    groups = [{"params": [p for (_, p), mode in zip(named, is_mode) if not mode or t.mode_lr_scale == 1.0]}]
    if t.mode_lr_scale != 1.0 and any(is_mode):
        groups.append({"params": [p for (_, p), mode in zip(named, is_mode) if mode], "lr": t.lr * t.mode_lr_scale})
    return torch.optim.AdamW(groups, lr=t.lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay)


def training_settings(recipe):
    """The knobs a trained drafter records in its metadata (``training.settings``)."""
    r, loss, t = recipe.drafter, recipe.loss, recipe.train
    return {"block_size": r.block_size, "resize_block": r.resize_block, "mode_init": r.mode_init,
            "mode_init_scale": r.mode_init_scale, "mode_init_std": r.mode_init_std, "mode_lr_scale": t.mode_lr_scale,
            "alpha": loss.alpha,
            "winner_weight": loss.winner_weight, "gate_weight": loss.gate_weight, "gate_input": loss.gate_input,
            "lr": t.lr, "anchors_per_sequence": t.anchors_per_sequence, "batch_size": t.batch_size}


def lr_lambda(step, total, warmup, schedule, min_ratio):
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


class _Schedule:
    """A picklable LambdaLR rule (warmup then cosine)."""

    def __init__(self, total, warmup, schedule, min_ratio):
        self.total, self.warmup, self.schedule, self.min_ratio = total, warmup, schedule, min_ratio

    def __call__(self, step):
        return lr_lambda(step, self.total, self.warmup, self.schedule, self.min_ratio)


def _flat(d, prefix=""):
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and key != "config":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def recipe_changes(saved, current):
    """Keys whose values differ between the recipe a checkpoint was made with and this one."""
    # a key added to recipes after the checkpoint was made reads as its default there
    a, b = {**_flat(Recipe().to_dict()), **_flat(saved)}, _flat(current)
    return [k for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not any(k == p or k.startswith(p + ".") for p in RESUME_MAY_CHANGE)]


def export_drafter(run_dir, top, config, dtype_name, dist):
    """The trained drafter as an mfd-hub checkpoint (``run_dir/final``), gathered on rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from mfd_hub.checkpoint import save_draft

    state = get_model_state_dict(top, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not dist.main:
        return None
    model = DFlashDraftModel(config).float()
    model.load_state_dict({k.split("drafter.", 1)[1]: v for k, v in state.items()})
    return save_draft(model, run_dir / "final", dtype=DTYPES[dtype_name], overwrite=True)


def _truncate_metrics(path, last_step):
    if not path.exists():
        return
    keep = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= last_step]
    path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")


def _peak_memory_mb(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class _Log:
    def __init__(self, verbose):
        self.verbose = verbose

    def __call__(self, text):
        if self.verbose:
            from tqdm import tqdm

            tqdm.write(text, file=sys.stderr)


# -- the recipe ------------------------------------------------------------------------------------
def train(recipe, resume=False, stop_after=None, verbose=True):
    """Run a recipe; returns a summary dict (also written as ``train_summary.json``) on rank 0,
    None on the other ranks."""
    dist = setup_distributed()
    try:
        return _run(recipe, dist, resume, stop_after, verbose)
    finally:
        # a process group left alive aborts the process at exit (gloo's threads are still joinable)
        if dist.world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _run(recipe, dist, resume, stop_after, verbose):
    log = _Log(verbose and dist.main)
    t = recipe.train
    run_dir = recipe.run_dir
    if t.batch_size % (dist.world * t.micro_batch_size):
        raise MfdHubError(f"train.batch_size {t.batch_size} must be a multiple of {dist.world} ranks x "
                          f"train.micro_batch_size {t.micro_batch_size}")
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None and not resume:
        raise MfdHubError(f"{run_dir} already holds checkpoints: pass --resume to continue, or use another output.dir")
    if resume and checkpoint is None:
        log(f"no checkpoint in {run_dir}: starting fresh")
    if dist.main:
        run_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()

    # data and features
    sequences, dropped = load_sequences(recipe.data.train, recipe.data.max_length)
    if recipe.data.limit is not None:
        if len(sequences) < recipe.data.limit:
            raise MfdHubError(f"data.limit is {recipe.data.limit}, but {recipe.data.train} holds only "
                              f"{len(sequences)} usable sequences")
        sequences = sequences[:recipe.data.limit]
    data_fingerprint = {"sequences": len(sequences), "crc": data_checksum(sequences)}
    if len(sequences) < t.batch_size:
        raise MfdHubError(f"{len(sequences)} usable sequences are fewer than train.batch_size {t.batch_size}")
    if checkpoint is not None:
        drafter_config = DFlashConfig.from_dict(json.loads((checkpoint / "config.json").read_text(encoding="utf-8")))
        tap_layers = list(drafter_config.target_layer_ids)
    else:
        tap_layers = tap_layers_of(recipe)
    target_info, embed, lm_head, taps_of = prepare_features(recipe, sequences, tap_layers, dist, log)

    # the drafter
    if checkpoint is not None:
        drafter = DFlashDraftModel(drafter_config).float()  # weights come from the checkpoint below
    else:
        drafter = build_drafter(recipe, target_info, lm_head, sequences, embed=embed)
    if drafter.config.draft_vocab_size and not recipe.drafter.train_lm_head:
        drafter.lm_head.weight.requires_grad_(False)
    cuda = dist.device.type == "cuda"
    autocast = torch.bfloat16 if t.precision == "bf16" or (t.precision == "auto" and bf16_is_fast(dist.device)) else None
    head_dtype = autocast or torch.float32  # the frozen head runs in the compute precision
    objective = DrafterObjective(drafter.to(dist.device), embed.to(dist.device, head_dtype),
                                 lm_head.to(dist.device, head_dtype), recipe.loss, t.head_chunk, autocast)
    top = objective
    if dist.enabled and t.parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # one FSDP unit: the drafter reads every layer's context projections before running the
        # layers, so per-layer units would be used outside their own forward
        fully_shard(objective, mesh=init_device_mesh(dist.device.type, (dist.world,)))
    elif dist.enabled:
        top = nn.parallel.DistributedDataParallel(objective, device_ids=[dist.device.index] if cuda else None)

    # optimiser and schedule
    per_epoch = len(sequences) // t.batch_size
    total = t.max_steps or t.epochs * per_epoch
    warmup = math.ceil(t.warmup_ratio * total)
    params = [p for p in top.parameters() if p.requires_grad]
    optimizer = make_optimizer(top, t)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _Schedule(total, warmup, t.schedule, t.min_lr_ratio))
    num_paths = drafter.config.num_modes or 1
    stats, window = ModeStats(num_paths), ModeStats(num_paths)
    default_stats = ModeStats(1) if drafter.config.default_path else None
    start = 0
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, top, optimizer, scheduler, dist)
        changed = recipe_changes(state["recipe"], recipe.to_dict())
        if changed:
            key = changed[0]
            was, now = _flat(state["recipe"]).get(key), _flat(recipe.to_dict()).get(key)
            raise MfdHubError(f"the recipe changed since {checkpoint.name}: {key} ({was!r} -> {now!r})")
        if state.get("data") != data_fingerprint:
            raise MfdHubError(f"the training data changed since {checkpoint.name} ({state.get('data')} -> "
                              f"{data_fingerprint}): resuming would train on other sequences")
        start = state["step"]
        if dist.main:  # the saved counters are global: the other ranks count from zero again
            stats.load(state["stats"])
            if default_stats is not None:
                default_stats.load(state["default_stats"])
        log(f"resumed from {checkpoint} at step {start}")
    metrics_path = run_dir / "metrics.jsonl"
    if dist.main:
        _truncate_metrics(metrics_path, start)
        (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False), encoding="utf-8")
    if dist.main and dropped:
        log(f"{dropped} records had fewer than 2 response tokens within {recipe.data.max_length} tokens: skipped")

    def reduced(counters):
        """The counters summed over ranks (a copy)."""
        copy = ModeStats(counters.num_paths)
        copy.load(counters.state())
        if dist.enabled:
            copy.all_reduce(dist.device)
        return copy

    def diagnostics():
        out = {"step": step_done, "mode_count": num_paths, "run": reduced(stats).summary()}
        if default_stats is not None:
            out["default_path"] = reduced(default_stats).summary()
        return out

    def trainer_state():
        state = {"step": step_done, "epoch": step_done // per_epoch, "steps_per_epoch": per_epoch,
                 "total_steps": total, "world_size": dist.world, "recipe": recipe.to_dict(), "data": data_fingerprint,
                 "stats": reduced(stats).state()}
        if default_stats is not None:
            state["default_stats"] = reduced(default_stats).state()
        return state

    from tqdm import tqdm

    per_rank = t.batch_size // dist.world
    stop = min(total, stop_after) if stop_after else total
    step_done, first_loss, last_loss, began = start, None, None, time.perf_counter()
    bar = tqdm(total=total, initial=start, desc=recipe.name, unit="step", disable=not (verbose and dist.main))
    top.train()
    for step in range(start, stop):
        tick = time.perf_counter()
        epoch, indices = step_sequences(step, len(sequences), t.batch_size, t.seed)
        mine = indices[dist.rank * per_rank : (dist.rank + 1) * per_rank]
        anchors = {i: sample_anchors(sequences[i], t.anchors_per_sequence, t.seed, epoch, i) for i in mine}
        blocks = float(dist.sum(sum(int(v.sum()) for _, v in anchors.values())))
        sums = {}
        for first in range(0, per_rank, t.micro_batch_size):
            chunk = mine[first : first + t.micro_batch_size]
            batch = make_batch(sequences, chunk, [anchors[i] for i in chunk], taps_of(chunk)).to(dist.device)
            loss_sum, info = top(batch.ids, batch.lengths, batch.anchors, batch.block_valid, batch.taps)
            # mean over the step's blocks; FSDP/DDP average gradients over ranks, hence x world
            (loss_sum * (dist.world / blocks)).backward()
            for key, value in {"loss": loss_sum.detach(), **info["parts"]}.items():
                sums[key] = sums.get(key, 0.0) + float(value)
            for s in (stats, window):
                s.update(info["coverage"], batch.block_valid, info["winner"], info["gate_logits"])
            if default_stats is not None:
                default_stats.update(info["default_coverage"][..., None], batch.block_valid)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, t.grad_clip if t.grad_clip > 0 else float("inf"))
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step_done = step + 1
        totals = {k: float(dist.sum(v)) / blocks for k, v in sorted(sums.items())}
        last_loss = totals["loss"]
        first_loss = last_loss if first_loss is None else first_loss
        bar.update(1)
        bar.set_postfix(loss=f"{last_loss:.4f}", lr=f"{lr:.2e}")
        log_now = step_done % recipe.output.log_every == 0 or step_done == stop
        if log_now:
            if dist.enabled:
                window.all_reduce(dist.device)
            line = {"step": step_done, "epoch": epoch, "lr": lr, "grad_norm": float(grad_norm), "blocks": int(blocks),
                    "seconds": time.perf_counter() - tick, **totals, "modes": window.summary()}
            window = ModeStats(num_paths)
            if dist.main:
                with metrics_path.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(line) + "\n")
        save_now = (recipe.output.save_every and step_done % recipe.output.save_every == 0) or step_done == stop
        if save_now:
            diag = diagnostics()
            folder = save_checkpoint(run_dir, step_done, top, drafter.config, optimizer, scheduler, trainer_state(),
                                     dist, recipe.output.keep_last)
            if dist.main:
                (run_dir / "diagnostics.json").write_text(json.dumps(diag, indent=1) + "\n", encoding="utf-8")
            log(f"checkpoint {folder}")
    bar.close()
    seconds = time.perf_counter() - began
    steps_run = step_done - start
    exported = None
    if step_done == total and recipe.output.export:
        meta = dict(drafter.config.mfd_metadata)
        if "training" in meta:  # a fine-tune of a trained drafter keeps the earlier runs
            meta["earlier_training"] = [*meta.get("earlier_training", []), meta["training"]]
        meta["training"] = {"recipe": recipe.name, "loss": recipe.loss.type, "steps": total,
                            "sequences": len(sequences), "data": str(recipe.data.train), "final_loss": last_loss,
                            "settings": training_settings(recipe)}
        config = DFlashConfig.from_dict({**drafter.config.to_dict(), "mfd_metadata": meta})
        exported = export_drafter(run_dir, top, config, recipe.output.export_dtype, dist)
    summary = {
        "run_dir": str(run_dir), "steps": step_done, "total_steps": total, "steps_this_run": steps_run,
        "seconds": seconds, "steps_per_second": steps_run / seconds if seconds > 0 else None,
        "peak_memory_mb": _peak_memory_mb(dist.device), "world_size": dist.world, "final_loss": last_loss,
        "first_loss": first_loss, "data": data_fingerprint,
        "exported": str(exported) if exported else None, "diagnostics": diagnostics(),
    }
    if dist.main:
        (run_dir / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    dist.barrier()
    return summary if dist.main else None
