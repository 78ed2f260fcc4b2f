"""Lossless speculative generation with a block drafter: chain, product tree, mixture tree.

One round: the drafter drafts the block after the anchor (the last committed token) for the
requested modes in one pass; a tree is built from the per-position distributions; the target
verifies root + tree in one pass; the accept walk keeps the longest path whose tokens equal the
target's own next tokens (argmax at T=0, independent samples from plain decoding's distribution
at T>0) and adds the target's token at its end. Every emitted token is the target's, so the
output equals plain decoding: token for token at T=0, in distribution at T>0.

Kernels (``kernels/``, Triton on CUDA, the torch references elsewhere; ``MFD_HUB_KERNELS``
forces either) keep a round on the device: every size is known on the host from the shapes, and
the round reads the device once, a small summary (accepted length, bonus token, the path's
tokens) that decides what to emit and what to commit. Stage times do not synchronise unless
``sync_timing=True``.

This file is part of the remote-code bundle: torch and transformers only.
"""

import time
from dataclasses import dataclass, field

import torch

from ..kernels.accept import accept_walk
from ..kernels.tree_attention import ancestor_mask
from ..kernels.tree_build import build_chain, draft_candidates, draft_tree
from ..kernels.tree_format import SCORE_SCALE
from .budget_mfd import BudgetChooser, calibration, round_costs
from .context_mfd import DraftContextCache
from .sampling_mfd import check_sampling, next_tokens
from .targets_mfd import make_verifier

METHODS = ("chain", "product", "mixture")
STAGES = ("prefill", "draft", "tree", "verify", "commit")


@dataclass
class SpecDecodingOutput:
    """output_ids [1, prompt + new]; acceptance_lengths: tokens each round emitted from the
    verifier's point of view (accepted draft tokens + the bonus); tau: their mean."""

    output_ids: torch.Tensor
    new_tokens: list
    acceptance_lengths: list
    tree_sizes: list
    stage_seconds: dict
    method: str
    tree_budget: int
    temperature: float
    seconds: float = 0.0
    stopped_by: str = "max_new_tokens"
    modes_used: list = field(default_factory=list)
    # per round: modes drafted (0 for a plain target step); with tree_budget="auto" the budgets
    # chosen are the tree sizes, and ``round_costs_key`` names the cached cost measurement
    modes_drafted: list = field(default_factory=list)
    round_costs_key: str = None

    @property
    def rounds(self):
        return len(self.acceptance_lengths)

    @property
    def tau(self):
        return sum(self.acceptance_lengths) / max(1, len(self.acceptance_lengths))

    @property
    def tokens_per_second(self):
        return len(self.new_tokens) / self.seconds if self.seconds > 0 else float("nan")

    def stats(self):
        """Everything but the ids, as plain Python values (for --json and benchmarks)."""
        return {
            "method": self.method,
            "tree_budget": self.tree_budget,
            "temperature": self.temperature,
            "new_tokens": len(self.new_tokens),
            "rounds": self.rounds,
            "tau": self.tau,
            "acceptance_lengths": list(self.acceptance_lengths),
            "tree_sizes": list(self.tree_sizes),
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "stage_seconds": dict(self.stage_seconds),
            "stopped_by": self.stopped_by,
            "modes_drafted": list(self.modes_drafted),
            "plain_rounds": sum(1 for m in self.modes_drafted if m == 0),
        }


class _StageClock:
    """Wall time per stage; on CUDA it synchronises at stage boundaries only when asked to."""

    def __init__(self, device, sync):
        self.sync = sync and device.type == "cuda"
        self.seconds = {name: 0.0 for name in STAGES}
        self._t = None

    def start(self):
        if self.sync:
            torch.cuda.synchronize()
        self._t = time.perf_counter()

    def lap(self, stage):
        if self.sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.seconds[stage] += now - self._t
        self._t = now

    def skip(self, seconds):
        """Leave ``seconds`` just spent out of every stage."""
        self._t += seconds


def _check_pair(draft, target):
    cfg, tcfg = draft.config, target.config
    hidden = getattr(tcfg, "hidden_size", None)
    vocab = getattr(tcfg, "vocab_size", None)
    if hidden is not None and hidden != cfg.hidden_size:
        raise ValueError(f"drafter hidden size {cfg.hidden_size} != target hidden size {hidden}")
    if vocab is not None and vocab != cfg.vocab_size:
        raise ValueError(f"drafter vocabulary {cfg.vocab_size} != target vocabulary {vocab}")
    layers = getattr(tcfg, "num_hidden_layers", None)
    if layers is not None and layers != cfg.num_target_layers:
        raise ValueError(f"drafter expects a {cfg.num_target_layers}-layer target, this one has {layers}")


def _resolve_modes(draft, method, mode, cache):
    """The modes to draft this round: 'all' for the mixture, else one mode (or the default path).
    The gate's choice stays a device tensor (no host synchronisation)."""
    k = draft.config.num_modes
    if k == 0:
        return None
    if method == "mixture":
        return "all"
    if mode is None:
        mode = "default" if draft.config.default_path else "gate"
    if mode == "default":
        return None
    if mode == "gate":
        return draft.mode_gate(cache.last_feature).argmax(-1)[:1]
    return [int(mode)]


@torch.inference_mode()
def spec_generate(
    draft,
    target,
    input_ids,
    max_new_tokens=128,
    temperature=0.0,
    top_p=1.0,
    top_k=0,
    stop_token_ids=None,
    method="mixture",
    tree_budget=32,
    mode=None,
    generator=None,
    sync_timing=False,
    on_round=None,
):
    """Generate with ``draft`` speculating for ``target``; returns a SpecDecodingOutput.

    method: ``chain`` (the argmax path, at most ``tree_budget`` long), ``product`` (the
    ``tree_budget`` most probable prefixes under one mode's product of marginals, DDTree) or
    ``mixture`` (the most probable prefixes, each scored by its best mode: MFD).
    tree_budget: an int, or ``"auto"``: each round takes the budget (and, for the mixture,
    whether to draft all modes; and whether to speculate at all) with the most expected tokens
    per second on this machine, from costs measured once and cached (``budget_mfd``).
    mode: for chain/product on an MFD drafter: a mode index, ``"gate"`` (the gate's top mode,
    the default) or ``"default"`` (the MFD-D default path).
    temperature / top_p / top_k: plain sampling's meaning (temperature 0 = greedy).
    stop_token_ids: generation ends after the first of them, which is kept.
    sync_timing: on CUDA, synchronise at every stage so stage times are exact (slower).
    on_round: called after each verification as ``on_round(tree, tokens, logits, path)``: the
    draft tree, its tokens in the target's vocabulary, the target's logits per node and the
    accepted path from the root. Benchmarks use it to see where the budget went; its own time is
    left out of ``seconds`` and ``stage_seconds`` (statistics must not slow the trees they measure).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    auto = isinstance(tree_budget, str)
    if auto and tree_budget != "auto":
        raise ValueError(f"tree_budget must be an int >= 1 or 'auto', got {tree_budget!r}")
    if not auto and tree_budget < 1:
        raise ValueError("tree_budget must be >= 1")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    check_sampling(temperature, top_p, top_k)
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ValueError("spec_generate decodes one non-empty sequence at a time (input_ids [1, L])")
    _check_pair(draft, target)
    draft.eval()
    device = target.device
    input_ids = input_ids.to(device)
    stops = set(int(t) for t in (stop_token_ids or []))
    block = draft.config.block_size
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    verifier = make_verifier(target, draft.target_layer_ids)
    cache = DraftContextCache()
    clock = _StageClock(device, sync_timing)
    rule = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)

    chooser = None
    if auto:  # measured once per machine and cached; not part of the generation's time
        costs = round_costs(draft, target, input_ids, make_verifier, ancestor_mask)
        chooser = BudgetChooser(costs, method, draft.config.num_modes,
                                max_budget=block - 1 if method == "chain" else None,
                                table=calibration(draft, costs.key, method, (temperature, top_k, top_p)))
        if method == "chain":
            chooser.budgets = list(range(1, block))

    began = time.perf_counter()
    clock.start()
    last_logits, taps = verifier.prefill(input_ids)
    first = int(next_tokens(last_logits, **rule))
    draft.extend_context(cache, taps[None], torch.arange(input_ids.shape[1], device=device))
    clock.lap("prefill")

    out = SpecDecodingOutput(
        output_ids=input_ids,
        new_tokens=[first],
        acceptance_lengths=[],
        tree_sizes=[],
        stage_seconds=clock.seconds,
        method=method,
        tree_budget=tree_budget,
        temperature=temperature,
        round_costs_key=chooser.costs.key if chooser else None,
    )
    done = first in stops or max_new_tokens == 1
    if first in stops:
        out.stopped_by = "stop_token"
    mask_ids = torch.full((1, 1, block - 1), draft.mask_token_id, device=device)
    anchor = first
    while not done:
        start = verifier.length  # the anchor's position
        depth = min(block - 1, max_new_tokens - len(out.new_tokens) - 1)
        round_method, modes, budget = method, None, tree_budget
        if auto:
            budget = chooser.max_budget
            if depth > 0 and not chooser.speculate():
                depth = 0  # a plain target step: speculation has been losing on this machine
            elif method == "mixture" and not chooser.all_modes():
                round_method = "product"  # the gate's one mode: all modes have not been paying
        if depth > 0:
            modes = _resolve_modes(draft, round_method, mode, cache)
        max_depth = min(depth, budget)  # a bound on the tree's depth, known without the device
        if depth > 0:
            block_ids = torch.cat([torch.full((1, 1, 1), anchor, device=device), mask_ids], dim=-1)
            anchor_pos = torch.full((1, 1), start, device=device)  # a device tensor: no host-to-device copy
            drafted = draft(draft.embed_block(block_ids, embed), anchor_pos, cache=cache, modes=modes, lm_head=lm_head)
            logits = drafted.logits[0, 0, :, :depth]  # [M, depth, V]
            clock.lap("draft")
            if round_method == "chain":
                top, ids = draft_candidates(logits[0], 1)
                if auto:
                    budget = _auto_chain_length(chooser, top, depth)
                    max_depth = min(depth, budget)
                tree = build_chain(ids, anchor, length=budget, top_scores=top)
            else:
                scores, ids = draft_candidates(logits, budget)
                tree = draft_tree(scores, ids, budget, anchor, logits.shape[-1])
                if auto:
                    budget = _auto_tree_budget(chooser, tree, scores, ids, anchor, logits.shape[-1], draft, cache,
                                               method, round_method)
                    if budget < tree.num_nodes:
                        tree = draft_tree(scores, ids, budget, anchor, logits.shape[-1])
                    max_depth = min(depth, budget)
            tokens = torch.cat([tree.tokens[:1], draft.draft_to_target_ids(tree.tokens[1:])])
            out.modes_drafted.append(logits.shape[0])
        else:
            tree = build_chain(torch.zeros(0, 1, dtype=torch.long, device=device), anchor)
            tokens = tree.tokens
            out.modes_drafted.append(0)
        tree_mask = ancestor_mask(tree.parents, max_depth)
        clock.lap("tree")

        logits, node_taps = verifier.verify(tokens, tree.depths, tree_mask)
        target_next = next_tokens(logits, **rule)
        path, info = accept_walk(tokens, tree.parents, tree.depths, target_next, max_depth)
        clock.lap("verify")

        # The round's one host synchronisation: accepted length, spine flag, bonus, path tokens.
        summary = torch.cat([info, tokens[path]]).tolist()
        accepted, bonus = summary[0], summary[2]
        emitted = summary[4 : 3 + accepted] + [bonus]  # summary[3] is the root (the anchor)
        out.acceptance_lengths.append(len(emitted))
        if auto and tree.num_nodes > 0:  # calibrate: which of the tree's nodes did the target accept
            accepted_nodes = set(path[1:accepted].tolist())
            chooser.observe((tree.scores[1:].double() / SCORE_SCALE).tolist(),
                            [i in accepted_nodes for i in range(1, tree.num_nodes + 1)])
        if on_round is not None:  # the caller's statistics are not the generation's time
            hook_began = time.perf_counter()
            on_round(tree, tokens, logits, path[:accepted])
            hook_seconds = time.perf_counter() - hook_began
            clock.skip(hook_seconds)
            began += hook_seconds
        out.tree_sizes.append(tree.num_nodes)
        if modes is not None and not isinstance(modes, str):
            out.modes_used.append(modes[0])
        for token in emitted:
            out.new_tokens.append(token)
            if token in stops:
                done, out.stopped_by = True, "stop_token"
                break
            if len(out.new_tokens) >= max_new_tokens:
                done = True
                break
        if not done:
            path = path[:accepted]
            verifier.commit(path)
            positions = start + torch.arange(accepted, device=device)
            draft.extend_context(cache, node_taps[path][None], positions)
            anchor = bonus
        clock.lap("commit")

    out.seconds = time.perf_counter() - began
    if out.modes_used and torch.is_tensor(out.modes_used[0]):  # the gate's choices, read once
        out.modes_used = torch.stack(out.modes_used).tolist()
    new = torch.tensor(out.new_tokens, dtype=input_ids.dtype, device=device)[None]
    out.output_ids = torch.cat([input_ids, new], dim=1)
    return out


def _auto_chain_length(chooser, top_scores, depth):
    """The chain length with the most expected tokens per second (one host read of the scores)."""
    prefix = torch.cumsum(top_scores[:, 0], dim=0).double() / SCORE_SCALE
    length, _, rate = chooser.best(prefix.tolist(), 1)
    chooser.record("one", rate)
    chooser.settle()
    return length


def _auto_tree_budget(chooser, tree, scores, ids, anchor, vocab, draft, cache, method, round_method):
    """The budget with the most expected tokens per second for this round's tree (built at the
    largest candidate budget; smaller budgets keep its best nodes). For the mixture, the gate's
    one-mode product tree is priced too, so the chooser learns whether all modes pay."""
    def best_of(tree_, modes):
        logprobs = sorted((tree_.scores[1:].double() / SCORE_SCALE).tolist(), reverse=True)
        return chooser.best(logprobs, modes)

    m = scores.shape[0]
    budget, _, rate = best_of(tree, m)
    chooser.record("all" if m > 1 else "one", rate)
    if method == "mixture" and round_method == "mixture" and m > 1:
        gate = int(draft.mode_gate(cache.last_feature).argmax(-1)[0])
        single = draft_tree(scores[gate : gate + 1], ids[gate : gate + 1], chooser.max_budget, anchor, vocab)
        chooser.record("one", best_of(single, 1)[2])
    chooser.settle()
    return budget
