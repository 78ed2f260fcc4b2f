"""Lossless speculative generation with a block drafter: chain, product tree, mixture tree.

One round: the drafter drafts the block after the anchor (the last committed token) for the
requested modes in one pass (for the mixture all K, or only the gate's best m: the drafter then
runs m copies of the block, not K); a tree is built from the per-position distributions; the target
verifies root + tree in one pass; the accept walk keeps the longest path whose tokens equal the
target's own next tokens (argmax at T=0, independent samples from plain decoding's distribution
at T>0) and adds the target's token at its end. Every emitted token is the target's, so the
output equals plain decoding: token for token at T=0, in distribution at T>0. What a round drafts
(its budget; under ``tree_budget="auto"`` also how many modes, and whether to draft at all) is a
planner's decision
(``budget_mfd``); the loop here drafts, builds, verifies and commits.

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
from .budget_mfd import make_planner
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
    # per round: modes drafted (0 for a plain target step) and the modes the verified tree is
    # built over (the gate's best of those drafted); with tree_budget="auto" the budgets chosen
    # are the tree sizes, and ``round_costs_key`` names the cached cost measurement
    modes_drafted: list = field(default_factory=list)
    tree_modes: list = field(default_factory=list)
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
            "tree_modes": list(self.tree_modes),
            "plain_rounds": sum(1 for m in self.modes_drafted if m == 0),
        }


class _StageClock:
    """Wall time per stage; on CUDA it synchronises at stage boundaries only when asked to."""

    def __init__(self, device, sync):
        self.sync = sync and device.type == "cuda"
        self.seconds = {name: 0.0 for name in STAGES}
        self.skipped = 0.0
        self._t = None

    def start(self):
        if self.sync:
            torch.cuda.synchronize()
        self._t = self.began = time.perf_counter()

    def lap(self, stage):
        if self.sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.seconds[stage] += now - self._t
        self._t = now

    def left_out(self, fn, *args):
        """Call ``fn(*args)`` and leave its time out of every stage and of the total."""
        began = time.perf_counter()
        fn(*args)
        seconds = time.perf_counter() - began
        self._t += seconds
        self.skipped += seconds

    def total(self):
        return time.perf_counter() - self.began - self.skipped


def _check_request(method, tree_budget, max_new_tokens, temperature, top_p, top_k, input_ids, num_modes, k):
    """The arguments ``spec_generate`` accepts (ValueError otherwise) -> input_ids as [1, L].
    ``k``: the drafter's number of modes."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if num_modes is not None:
        if method != "mixture" or k == 0:
            raise ValueError("num_modes applies to the mixture of an MFD drafter only "
                             f"(method={method!r}, drafter with {k} modes)")
        if isinstance(num_modes, bool) or not isinstance(num_modes, int) or not 1 <= num_modes <= k:
            raise ValueError(f"num_modes must be an int in 1..{k} (the drafter's modes), got {num_modes!r}")
    if isinstance(tree_budget, str) and tree_budget != "auto":
        raise ValueError(f"tree_budget must be an int >= 1 or 'auto', got {tree_budget!r}")
    if not isinstance(tree_budget, str) and tree_budget < 1:
        raise ValueError("tree_budget must be >= 1")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    check_sampling(temperature, top_p, top_k)
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ValueError("spec_generate decodes one non-empty sequence at a time (input_ids [1, L])")
    return input_ids


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


def _resolve_modes(draft, method, mode, cache, num_modes):
    """The modes to draft this round: for the mixture 'all' (``num_modes`` None) or the gate's
    best ``num_modes`` in the gate's order, else one mode (or the default path). The gate's
    choices stay a device tensor (no host synchronisation)."""
    k = draft.config.num_modes
    if k == 0:
        return None
    if method == "mixture":
        if num_modes is None:
            return "all"
        # stable: among equal gate logits the smaller index first, as argmax picks it
        order = draft.mode_gate(cache.last_feature)[0].argsort(descending=True, stable=True)
        return order[:num_modes]
    if mode is None:
        mode = "default" if draft.config.default_path else "gate"
    if mode == "default":
        return None
    if mode == "gate":
        return draft.mode_gate(cache.last_feature).argmax(-1)[:1]
    return [int(mode)]


@torch.inference_mode()
def spec_generate(draft, target, input_ids, max_new_tokens=128, temperature=0.0, top_p=1.0, top_k=0,
                  stop_token_ids=None, method="mixture", tree_budget=32, mode=None, generator=None, sync_timing=False,
                  on_round=None, num_modes=None):
    """Generate with ``draft`` speculating for ``target``; returns a SpecDecodingOutput.

    method: ``chain`` (the argmax path, at most ``tree_budget`` long), ``product`` (the
    ``tree_budget`` most probable prefixes under one mode's product of marginals, DDTree) or
    ``mixture`` (the most probable prefixes, each scored by its best mode: MFD).
    tree_budget: an int, or ``"auto"``: each round takes the budget (and, for the mixture, how
    many of the gate's best modes to draft; and whether to speculate at all) with the most
    expected tokens per second on this machine, from costs measured once and cached
    (``budget_mfd.AutoBudget``).
    mode: for chain/product on an MFD drafter: a mode index, ``"gate"`` (the gate's top mode,
    the default) or ``"default"`` (the MFD-D default path).
    num_modes: for the mixture of an MFD drafter with K modes, m in 1..K: draft only the gate's
    best m modes each round (the drafter runs m copies of the block) and build the exact best
    tree over them. None: all K, or under ``"auto"`` m in {1, 2, 4, K} chosen per round.
    temperature / top_p / top_k: plain sampling's meaning (temperature 0 = greedy).
    stop_token_ids: generation ends after the first of them, which is kept.
    sync_timing: on CUDA, synchronise at every stage so stage times are exact (slower).
    on_round: called after each verification as ``on_round(tree, tokens, logits, path)``: the
    draft tree, its tokens in the target's vocabulary, the target's logits per node and the
    accepted path from the root. Benchmarks use it to see where the budget went; its own time is
    left out of ``seconds`` and ``stage_seconds`` (statistics must not slow the trees they measure).
    """
    input_ids = _check_request(method, tree_budget, max_new_tokens, temperature, top_p, top_k, input_ids,
                               num_modes, draft.config.num_modes)
    _check_pair(draft, target)
    draft.eval()
    device = target.device
    input_ids = input_ids.to(device)
    stops = set(int(t) for t in (stop_token_ids or []))
    verifier = make_verifier(target, draft.target_layer_ids)
    cache = DraftContextCache()
    clock = _StageClock(device, sync_timing)
    rule = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    planner = make_planner(tree_budget, draft, target, input_ids, method, (temperature, top_k, top_p),
                           make_verifier, ancestor_mask, num_modes)  # "auto" measures here, before the clock starts

    clock.start()
    last_logits, taps = verifier.prefill(input_ids)
    anchor = int(next_tokens(last_logits, **rule))
    draft.extend_context(cache, taps[None], torch.arange(input_ids.shape[1], device=device))
    clock.lap("prefill")
    out = SpecDecodingOutput(output_ids=input_ids, new_tokens=[], acceptance_lengths=[], tree_sizes=[],
                             stage_seconds=clock.seconds, method=method, tree_budget=tree_budget,
                             temperature=temperature, round_costs_key=planner.costs_key)
    done = _emit(out, [anchor], stops, max_new_tokens)
    while not done:
        start = verifier.length  # the anchor's position
        depth = min(draft.config.block_size - 1, max_new_tokens - len(out.new_tokens) - 1)
        round_method, budget, depth, round_modes = planner.plan(method, depth)
        if depth > 0:
            modes = _resolve_modes(draft, round_method, mode, cache, round_modes)
            drafted = _draft_block(draft, target, cache, anchor, start, modes, depth)  # logits [M, depth, V]
            clock.lap("draft")
            tree, budget, tree_modes = _build_tree(planner, round_method, drafted, budget, anchor)
            tokens = torch.cat([tree.tokens[:1], draft.draft_to_target_ids(tree.tokens[1:])])
            out.modes_drafted.append(drafted.shape[0])
            out.tree_modes.append(tree_modes)
        else:  # a plain target step
            modes, tree = None, build_chain(torch.zeros(0, 1, dtype=torch.long, device=device), anchor)
            tokens = tree.tokens
            out.modes_drafted.append(0)
            out.tree_modes.append(0)
        max_depth = min(depth, budget)  # a bound on the tree's depth, known without the device
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
        planner.observe(tree, path, accepted)
        if on_round is not None:  # the caller's statistics are not the generation's time
            clock.left_out(on_round, tree, tokens, logits, path[:accepted])
        out.tree_sizes.append(tree.num_nodes)
        if modes is not None and round_method != "mixture":
            out.modes_used.append(modes[0])
        done = _emit(out, emitted, stops, max_new_tokens)
        if not done:
            path = path[:accepted]
            verifier.commit(path)
            draft.extend_context(cache, node_taps[path][None], start + torch.arange(accepted, device=device))
            anchor = bonus
        clock.lap("commit")

    out.seconds = clock.total()
    return _finish(out, input_ids)


def _draft_block(draft, target, cache, anchor, start, modes, depth):
    """The drafter's logits [M, depth, V] for the block after the anchor (at ``start``) for ``modes``."""
    device = target.device
    block_ids = torch.full((1, 1, draft.config.block_size), draft.mask_token_id, device=device)
    block_ids[..., 0] = anchor
    anchor_pos = torch.full((1, 1), start, device=device)  # a device tensor: no host-to-device copy
    embeds = draft.embed_block(block_ids, target.get_input_embeddings())
    drafted = draft(embeds, anchor_pos, cache=cache, modes=modes, lm_head=target.get_output_embeddings())
    return drafted.logits[0, 0, :, :depth]


def _build_tree(planner, method, logits, budget, anchor):
    """The round's tree from the drafter's logits [M, depth, V] (mixture rows in the gate's order
    where a subset was drafted): the chain of argmaxes, or the best prefixes at ``budget`` over
    the first m modes (``planner`` picks m and may keep fewer nodes) -> (tree, its budget, m)."""
    if method == "chain":
        top, ids = draft_candidates(logits[0], 1)
        budget = planner.chain_length(top, budget)
        return build_chain(ids, anchor, length=budget, top_scores=top), budget, 1
    vocab = logits.shape[-1]
    scores, ids = draft_candidates(logits, budget)  # per row: the rows of any m modes are a slice
    built = {}

    def tree_over(m):  # the exact best-``budget`` tree over the first m drafted modes
        if m not in built:
            built[m] = draft_tree(scores[:m], ids[:m], budget, anchor, vocab)
        return built[m]

    m, smaller = planner.tree_budget(tree_over, scores.shape[0])
    tree = tree_over(m)
    if smaller < tree.num_nodes:
        tree = draft_tree(scores[:m], ids[:m], smaller, anchor, vocab)
    return tree, smaller, m


def _emit(out, tokens, stops, max_new_tokens):
    """Append ``tokens`` to ``out`` up to the first stop token or the length limit -> whether
    generation ends here."""
    for token in tokens:
        out.new_tokens.append(token)
        if token in stops:
            out.stopped_by = "stop_token"
            return True
        if len(out.new_tokens) >= max_new_tokens:
            return True
    return False


def _finish(out, input_ids):
    if out.modes_used and torch.is_tensor(out.modes_used[0]):  # the gate's choices, read once
        out.modes_used = torch.stack(out.modes_used).tolist()
    new = torch.tensor(out.new_tokens, dtype=input_ids.dtype, device=input_ids.device)[None]
    out.output_ids = torch.cat([input_ids, new], dim=1)
    return out
