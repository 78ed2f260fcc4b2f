"""Hardware-aware tree budgets: ``spec_generate(..., tree_budget="auto")``.

A round's worth is (expected tokens it emits) / (seconds it costs). Both halves are estimated:

- Cost, measured once per machine (Sequoia's idea): the target's verify time against the number
  of tree nodes, and the drafting side's time per mode count (1, 2, 4 and K): the drafter's pass,
  each position's candidates and the tree over those modes, all of which grow with the modes (on
  2 cores the mixture's candidates and tree cost twice the product's), on this target, device,
  dtype and thread count, at the prompt's context length. The measurement runs on a verifier of its own (the
  generation's cache is never touched) and is cached as JSON in the user's mfd-hub cache
  (``$MFD_HUB_CACHE``, else ``$XDG_CACHE_HOME/mfd-hub``, else ``~/.cache/mfd-hub``), so it is
  paid once.
- Acceptance, estimated every round from the drafter's own prefix scores (EAGLE-2's idea) and
  calibrated online: under tree verification the expected number of accepted draft tokens is the
  sum, over the tree's nodes, of the probability that the target accepts the node. A node's
  probability is read off a table indexed by the node's draft log-probability (its prefix
  score), which starts at the drafter's own claim (exp(score)) and learns from every verified
  round what fraction of such nodes the target really accepted; the table lives on the drafter
  object (``calibration``), so later generations in the same process start from what earlier
  ones learned.

The budgets are nested (the best B prefixes of the best B' > B), so one tree built at the largest
budget worth pricing (twice the largest chosen lately) prices every smaller one. Each round takes
the budget with the highest expected tokens per second. For the mixture it also takes how many of
the gate's best modes to draft (1, 2, 4 or K): a probe round drafts all K in the gate's order and
prices the trees over the best 1, 2, 4 and K of them (the best m modes' tree needs only the first
m rows), verifying the best one; the rounds in between draft only the mode count with the best
running rate, so a round pays for drafting no more modes than have been paying. Probes come every
8 drafted rounds, spaced out to 32 while they keep confirming the same count. Whether speculating
beats a plain target step is tracked too; when it loses, a few rounds are plain steps and
speculation is probed again afterwards.

None of this changes what is emitted: every budget, mode set or plain step is verified by the
target as usual, so output stays the target's own (lossless).

``spec_generate`` asks a planner what each round drafts and learns nothing itself:
``FixedBudget`` for a whole-number budget, ``AutoBudget`` for ``"auto"`` (``make_planner``).

This file is part of the remote-code bundle: torch only.
"""

import collections
import hashlib
import json
import math
import os
import time
from pathlib import Path

import torch

from ..kernels.tree_build import draft_candidates, draft_tree
from ..kernels.tree_format import SCORE_SCALE

# Tree budgets the chooser prices (nodes below the root); the largest one fixes the tree it builds.
CANDIDATE_BUDGETS = (1, 2, 4, 8, 16, 32, 64)
# Node counts (root included) at which verify time is measured; others are interpolated.
MEASURED_NODES = (1, 2, 3, 5, 9, 17, 33, 65)
# 4: the drafting side per mode count takes in the candidates and the tree (3 timed the drafter's
# pass only, which underprices wide mixtures); 3: drafting at 1, 2, 4 and K modes (2 had 1 and K)
COSTS_FORMAT = 4
# the budget at which the drafting side's candidates and tree are timed: the budgets rounds take
# most on CPU lie between 8 and 16, and the tree's cost grows slowly with the budget
PRICED_BUDGET = 16
ENV_CACHE = "MFD_HUB_CACHE"


def cache_root():
    """The user's mfd-hub cache folder (not created)."""
    root = os.environ.get(ENV_CACHE)
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "mfd-hub")


def mode_options(num_modes):
    """The mode counts a mixture round may draft (the gate's best m of K): 1, 2, 4 and K."""
    return sorted({m for m in (1, 2, 4, num_modes) if 1 <= m <= num_modes}) or [1]


# -- cost ----------------------------------------------------------------------------------------
class RoundCosts:
    """Measured seconds: ``verify[n]`` for a target pass over n nodes (root included) and
    ``draft[m]`` for the drafting side of a round over m modes: the drafter's pass (the LM head
    included), each position's candidates and the tree."""

    def __init__(self, verify, draft, key=None):
        # a pass over more nodes never costs less: noise in a measurement is not allowed to say so
        self.verify_s, most = {}, 0.0
        for n, s in sorted((int(n), float(s)) for n, s in verify.items()):
            most = max(most, s)
            self.verify_s[n] = most
        self.draft_s = {int(m): float(s) for m, s in draft.items()}
        self.key = key

    def verify(self, nodes):
        """Piecewise-linear in the node count; linear beyond the last measured point."""
        points = sorted(self.verify_s.items())
        if nodes <= points[0][0]:
            return points[0][1]
        for (n0, s0), (n1, s1) in zip(points, points[1:]):
            if nodes <= n1:
                return s0 + (s1 - s0) * (nodes - n0) / (n1 - n0)
        (n0, s0), (n1, s1) = points[-2], points[-1]
        return s1 + (s1 - s0) * (nodes - n1) / (n1 - n0)

    def draft(self, modes):
        """Piecewise-linear between the measured mode counts; the nearest one outside them."""
        if modes in self.draft_s:
            return self.draft_s[modes]
        known = sorted(self.draft_s.items())
        if modes <= known[0][0]:
            return known[0][1]
        for (m0, s0), (m1, s1) in zip(known, known[1:]):
            if modes <= m1:
                return s0 + (s1 - s0) * (modes - m0) / (m1 - m0)
        return known[-1][1]

    def to_dict(self):
        return {"format": COSTS_FORMAT, "key": self.key, "verify_seconds": self.verify_s, "draft_seconds": self.draft_s}


def device_name(device):
    """What the device is: the GPU's name, else the CPU's model name (not only its architecture,
    which two very different CPUs share)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = os.uname().machine if hasattr(os, "uname") else ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), name)
    except OSError:
        pass
    return name


def target_shape(target):
    """The target's identity as a cost depends on it: family, name, width, depth, vocabulary, dtype."""
    cfg = target.config
    return [getattr(cfg, "model_type", None), getattr(cfg, "name_or_path", None) or getattr(cfg, "_name_or_path", None),
            getattr(cfg, "hidden_size", None), getattr(cfg, "num_hidden_layers", None), getattr(cfg, "vocab_size", None),
            str(target.dtype)]


def drafter_shape(draft):
    """The drafter's identity as a cost depends on it: width, depth, modes, draft vocabulary."""
    cfg = draft.config
    return [cfg.hidden_size, cfg.num_hidden_layers, cfg.num_modes, cfg.draft_vocab_size or cfg.vocab_size]


def linear_kinds(model):
    """The classes of a model's linear layers: a layer swapped for a faster product (oneDNN with
    packed weights, a quantised one) changes the costs."""
    return sorted({type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear)})


def machine_key(draft, target):
    """What the costs depend on: the target's shape, the drafter's, device, dtype, threads and the
    kind of linear layers each multiplies with."""
    device = target.device
    parts = {
        "target": target_shape(target),
        "drafter": drafter_shape(draft) + [str(draft.dtype)],
        "linears": [linear_kinds(target), linear_kinds(draft)],
        "device": [device.type, device_name(device)],
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20], parts


def round_robin_seconds(fns, repeats, device, warmup=3):
    """Median seconds of each of ``fns``, measured round-robin: one call of each per round, after
    ``warmup`` rounds, so that load drifting while they are measured hits all of them alike
    (their ratios, which decide the budget, stay right on a busy machine)."""
    samples = [[] for _ in fns]
    for round_ in range(repeats + warmup):
        for fn, mine in zip(fns, samples):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            began = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if round_ >= warmup:
                mine.append(time.perf_counter() - began)
    return [sorted(mine)[len(mine) // 2] for mine in samples]


def probe_tree(nodes, depth_limit, device):
    """Parents and depths of a tree of ``nodes`` nodes (root first) whose paths hang from the root
    in chains no deeper than ``depth_limit``: the shape of a real tree, for timing only."""
    parents, depths = [-1], [0]
    for i in range(1, nodes):
        parent = i - 1 if depths[i - 1] < depth_limit and i > 1 else 0
        parents.append(parent)
        depths.append(depths[parent] + 1)
    return torch.tensor(parents, device=device), torch.tensor(depths, device=device)


@torch.inference_mode()
def measure_costs(draft, target, input_ids, make_verifier, ancestor_mask, repeats=7):
    """Time verify over MEASURED_NODES and the drafting side over ``mode_options`` -> RoundCosts.

    Runs on a verifier and a drafter context of its own, at ``input_ids``' context length. The
    first passes of a process over new shapes pay for setting them up (oneDNN's primitives: on 2
    cores a first measurement read 1 node's verify at 39 ms, the next ones 30), hence three
    warm-up rounds and the median of seven."""
    from .context_mfd import DraftContextCache

    device = target.device
    verifier = make_verifier(target, draft.target_layer_ids)
    _, taps = verifier.prefill(input_ids)
    anchor = int(input_ids[0, -1])
    block = draft.config.block_size
    empty = torch.zeros(0, dtype=torch.long, device=device)

    def verify_pass(nodes):
        parents, depths = probe_tree(nodes, block - 1, device)
        tokens = torch.full((nodes,), anchor, dtype=torch.long, device=device)
        mask = ancestor_mask(parents, int(depths.max()))

        def one_pass():
            verifier.verify(tokens, depths, mask)
            verifier.commit(empty)  # roll back: keep only the committed prefix

        return one_pass

    cache = DraftContextCache()
    draft.extend_context(cache, taps[None], torch.arange(input_ids.shape[1], device=device))
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    ids = torch.full((1, 1, block), draft.mask_token_id, device=device)
    ids[..., 0] = anchor
    embeds = draft.embed_block(ids, embed)
    position = torch.full((1, 1), input_ids.shape[1], device=device)
    k = draft.config.num_modes
    # the first m modes, as a device tensor: the way a round asks for the gate's best m
    mode_sets = {m: torch.arange(m, device=device) if k else None for m in mode_options(k)}

    def drafting_side(modes):
        logits = draft(embeds, position, cache=cache, modes=modes, lm_head=lm_head).logits[0, 0, :, : block - 1]
        scores, ids = draft_candidates(logits, PRICED_BUDGET)
        draft_tree(scores, ids, PRICED_BUDGET, anchor, logits.shape[-1])

    fns = [verify_pass(n) for n in MEASURED_NODES]
    fns += [lambda modes=modes: drafting_side(modes) for modes in mode_sets.values()]
    seconds = round_robin_seconds(fns, repeats, device)
    verify = dict(zip(MEASURED_NODES, seconds))
    draft_s = dict(zip(mode_sets, seconds[len(MEASURED_NODES):]))
    return RoundCosts(verify, draft_s)


def round_costs(draft, target, input_ids, make_verifier, ancestor_mask, refresh=False):
    """The cached RoundCosts for this machine, measured (and cached) when absent."""
    key, parts = machine_key(draft, target)
    path = cache_root() / "costs" / f"{key}.json"
    if not refresh and path.is_file():
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw.get("format") == COSTS_FORMAT:
                return RoundCosts(raw["verify_seconds"], raw["draft_seconds"], key=key)
        except (OSError, ValueError, KeyError):
            pass  # a damaged entry is measured again
    costs = measure_costs(draft, target, input_ids, make_verifier, ancestor_mask)
    costs.key = key
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({**costs.to_dict(), "machine": parts, "context": int(input_ids.shape[1])},
                                  indent=1), encoding="utf-8")
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:
        pass  # an unwritable cache only costs a measurement next time
    return costs


# -- acceptance ----------------------------------------------------------------------------------
class AcceptanceTable:
    """P(the target accepts a node) as a function of the node's draft log-probability (nats).

    Bins of ``width`` nats from 0 down to ``floor``; each starts at exp(bin centre) with the weight
    of ``prior`` observations (the drafter's own claim) and is updated by verified rounds."""

    def __init__(self, width=0.25, floor=-12.0, prior=2.0):
        self.width, self.floor = width, floor
        self.bins = int(math.ceil(-floor / width)) + 1
        centres = [-(i + 0.5) * width for i in range(self.bins)]
        self.accepted = [prior * math.exp(c) for c in centres]
        self.seen = [prior] * self.bins

    def _bin(self, logprob):
        return min(self.bins - 1, max(0, int(-logprob / self.width)))

    def probability(self, logprob):
        i = self._bin(logprob)
        return self.accepted[i] / self.seen[i]

    def expected_accepted(self, logprobs):
        """Running sum over nodes sorted best first: entry b = expected accepted nodes of a tree
        holding the b best (entry 0 = 0)."""
        out, total = [0.0], 0.0
        for lp in logprobs:
            total += self.probability(lp)
            out.append(total)
        return out

    def observe(self, logprobs, accepted_flags):
        for lp, hit in zip(logprobs, accepted_flags):
            i = self._bin(lp)
            self.seen[i] += 1.0
            self.accepted[i] += 1.0 if hit else 0.0


def calibration(draft, costs_key, method, sampling, modes=1):
    """The acceptance table that ``draft``'s generations with ``method`` and ``sampling`` (a tuple:
    temperature, top-k, top-p) on the machine of ``costs_key`` learn and reuse for trees over
    ``modes`` modes, kept on the drafter object for the process's life. How often the target
    accepts what the drafter claims is a property of the drafter, the target and the sampling, not
    of one prompt: a table that starts afresh at every prompt spends the first rounds of each on
    the drafter's own claims (HumanEval, bf16 on 2 cores: the mixture at budget ``auto`` took 47
    tok/s with a table per prompt, 55 with one carried over, against 53 at a fixed 16). Nor is it
    the same for every mode count: a mixture node's score is the best of m modes' claims, which
    overstates it more the more modes compete, so each count learns its own table."""
    tables = draft.__dict__.setdefault("_auto_calibration", {})  # not a parameter or buffer
    return tables.setdefault((costs_key, method, tuple(sampling), modes), AcceptanceTable())


class BudgetChooser:
    """Per-round decisions for ``tree_budget="auto"``; see the module docstring.

    ``mode_counts``: the mode counts a round may draft (for the mixture ``mode_options(K)``,
    else one). Options are keyed by mode count; the rates are running expected tokens/s."""

    PROBE_EVERY = 8  # drafted rounds to the next probe after one that changed the best count
    PROBE_EVERY_MAX = 32  # ... doubling after each probe that confirms it, up to this
    SMOOTHING = 0.3  # weight of the newest round in the running rates
    RECENT = 16  # rounds whose chosen budgets bound the next tree's (``max_budget``)

    def __init__(self, costs, method, num_modes, max_budget=None, tables=None, mode_counts=(1,)):
        """``tables``: {mode count: its AcceptanceTable} (fresh ones where None)."""
        self.costs, self.method, self.num_modes = costs, method, num_modes
        top = max(CANDIDATE_BUDGETS) if max_budget is None else max_budget
        self.budgets = [b for b in CANDIDATE_BUDGETS if b <= top] or [1]
        self.mode_counts = sorted(mode_counts)
        self.tables = tables or {m: AcceptanceTable() for m in self.mode_counts}
        self.rate = {}  # mode count -> running expected tokens per second
        self.benched = {}  # option -> rounds left out
        self.plain_rate = 1.0 / costs.verify(1)
        self.drafted_rounds = 0
        self.priced = [self.mode_counts[0]]  # the mode counts the current round prices
        self.probe_interval, self.next_probe, self.incumbent = self.PROBE_EVERY, 0, None
        self.recent_budgets = collections.deque(maxlen=self.RECENT)
        self.expanding = method != "chain"  # a chain's length costs no candidates: always priced in full

    @property
    def max_budget(self):
        """The budget this round's candidates and tree are built at, which prices every smaller
        one: twice the largest budget chosen in the last RECENT rounds (the whole range before
        any), so that a round does not pay for selecting and building 64 nodes where 8 win; a
        round choosing the bound doubles it for the next."""
        if not self.expanding or not self.recent_budgets:
            return self.budgets[-1]
        wanted = 2 * max(self.recent_budgets)
        return next((b for b in self.budgets if b >= wanted), self.budgets[-1])

    def _sits_out(self, option):
        left = self.benched.get(option, 0)
        if left > 0:
            self.benched[option] = left - 1
            return True
        return False

    def speculate(self):
        """False: this round is a plain target step (speculation has been losing)."""
        return not self._sits_out("speculate")

    def _best_count(self):
        return max(self.mode_counts, key=lambda m: (self.rate[m], -m))

    def modes_to_draft(self):
        """How many of the gate's best modes this round drafts. A probe drafts the most and
        prices every mode count on it; the rounds between draft the count with the best running
        rate (ties: fewer modes) and price only it. Probes come PROBE_EVERY drafted rounds apart,
        twice as far after each probe that leaves the best count as it was (up to
        PROBE_EVERY_MAX: a probe drafts all K modes, the dearest round there is), and at once
        while some count has no rate yet."""
        unrated = any(m not in self.rate for m in self.mode_counts)
        probe = len(self.mode_counts) > 1 and (self.drafted_rounds >= self.next_probe or unrated)
        self.drafted_rounds += 1
        if len(self.mode_counts) == 1 or probe:
            self.priced = list(self.mode_counts)
            self.incumbent = None if unrated else self._best_count()
            return self.mode_counts[-1]
        best = self._best_count()
        self.priced = [best]
        return best

    def best(self, logprobs, modes):
        """The budget with the highest expected tokens/s for a tree whose node log-probabilities,
        best first, are ``logprobs``, drafted with ``modes`` modes -> (budget, expected tokens
        per round, tokens per second)."""
        expected = self.tables[modes].expected_accepted(logprobs)
        draft_s = self.costs.draft(modes)
        best = None
        for budget in self.budgets:
            nodes = min(budget, len(logprobs))
            tokens = 1.0 + expected[nodes]  # accepted nodes + the target's bonus token
            rate = tokens / (draft_s + self.costs.verify(nodes + 1))
            if best is None or rate > best[2] * (1 + 1e-9):
                best = (budget, tokens, rate)
            if nodes == len(logprobs):  # a larger budget holds no more nodes
                break
        return best

    def choose(self, priced):
        """``priced``: {mode count: its tree's node log-probabilities, best first}, the trees of
        one round -> (the mode count and budget with the most expected tokens per second this
        round). Every priced count's running rate learns this round's."""
        chosen = None
        for modes in sorted(priced):
            budget, _, rate = self.best(priced[modes], modes)
            self.record(modes, rate)
            if chosen is None or rate > chosen[2] * (1 + 1e-9):
                chosen = (modes, budget, rate)
        if len(priced) > 1 and all(m in self.rate for m in self.mode_counts):  # a probe: when is the next
            confirmed = self.incumbent is not None and self._best_count() == self.incumbent
            self.probe_interval = min(2 * self.probe_interval, self.PROBE_EVERY_MAX) if confirmed else self.PROBE_EVERY
            self.next_probe = self.drafted_rounds - 1 + self.probe_interval
        self.recent_budgets.append(chosen[1])
        self.settle()
        return chosen[0], chosen[1]

    def record(self, option, rate):
        old = self.rate.get(option)
        self.rate[option] = rate if old is None else (1 - self.SMOOTHING) * old + self.SMOOTHING * rate

    def settle(self):
        """After a round's estimates: bench speculation when even its best option loses to a
        plain target step."""
        spec = max(self.rate.values(), default=None)
        if spec is not None and spec < self.plain_rate and self.benched.get("speculate", 0) == 0:
            self.benched["speculate"] = self.PROBE_EVERY

    def observe(self, logprobs, accepted_flags, modes):
        """A verified tree over ``modes`` modes: its nodes' log-probabilities and which were accepted."""
        self.tables[modes].observe(logprobs, accepted_flags)


# -- planners: what spec_generate asks before and after each round ---------------------------------
class FixedBudget:
    """A whole-number ``tree_budget``: every round drafts as asked, at that budget."""

    costs_key = None

    def __init__(self, budget, num_modes=None):
        self.budget, self.num_modes = budget, num_modes

    def plan(self, method, depth):
        """-> (this round's method, the largest budget its tree may take, positions to draft (0
        for a plain target step), and for the mixture how many of the gate's best modes to draft
        (None: all K, in index order))."""
        return method, self.budget, depth, self.num_modes if method == "mixture" else None

    def chain_length(self, top_scores, budget):
        """The chain's length, given each position's best draft score."""
        return budget

    def tree_budget(self, tree_over, drafted):
        """The tree verified this round -> (how many of the ``drafted`` modes it is built over,
        its budget). ``tree_over(m)`` builds the tree over the first m drafted modes at the
        largest budget (nested: a smaller budget keeps its best nodes)."""
        return drafted, self.budget

    def observe(self, tree, path, accepted):
        """Learn from a verified round: ``path`` from the root, its first ``accepted`` entries kept."""


class AutoBudget:
    """``tree_budget="auto"``: each round takes the budget (and, for the mixture, how many of the
    gate's best modes to draft; and whether to speculate at all) with the most expected tokens
    per second, from this machine's costs (measured once, cached) and the acceptance table it
    calibrates. ``num_modes``: a mixture's mode count fixed by the caller (None: chosen)."""

    def __init__(self, draft, target, input_ids, method, sampling, make_verifier, ancestor_mask, num_modes=None):
        """``sampling``: (temperature, top-k, top-p). The cost measurement runs here, outside the
        generation's time."""
        block = draft.config.block_size
        k = draft.config.num_modes
        costs = round_costs(draft, target, input_ids, make_verifier, ancestor_mask)
        if method != "mixture":
            counts = (1,)
        else:
            counts = (num_modes,) if num_modes is not None else mode_options(k)
        self.drafts_by_gate = method == "mixture" and k > 0  # else the mode count means nothing
        self.chooser = BudgetChooser(costs, method, k, max_budget=block - 1 if method == "chain" else None,
                                     tables={m: calibration(draft, costs.key, method, sampling, m) for m in counts},
                                     mode_counts=counts)
        self.verified_modes = counts[0]  # the mode count of the tree the current round verifies
        if method == "chain":  # every length up to the block, not only the powers of two
            self.chooser.budgets = list(range(1, block))

    @property
    def costs_key(self):
        """The cached cost measurement's name (``SpecDecodingOutput.round_costs_key``)."""
        return self.chooser.costs.key

    def plan(self, method, depth):
        chooser = self.chooser
        if depth > 0 and not chooser.speculate():
            return method, chooser.max_budget, 0, None  # speculation has been losing on this machine
        modes = chooser.modes_to_draft() if depth > 0 else None
        return method, chooser.max_budget, depth, modes if self.drafts_by_gate else None

    def chain_length(self, top_scores, budget):
        """The chain length with the most expected tokens per second (one host read of the scores)."""
        prefix = torch.cumsum(top_scores[:, 0], dim=0).double() / SCORE_SCALE
        length, _, rate = self.chooser.best(prefix.tolist(), 1)
        self.chooser.record(1, rate)
        self.chooser.settle()
        return length

    def tree_budget(self, tree_over, drafted):
        """The mode count and budget with the most expected tokens per second among the trees
        this round prices (a probe: the best 1, 2, 4 and K of the drafted modes; else the one
        count drafted), each built by ``tree_over`` at the largest budget."""
        counts = [m for m in self.chooser.priced if m <= drafted] or [drafted]
        self.verified_modes, budget = self.chooser.choose({m: _logprobs(tree_over(m), best_first=True) for m in counts})
        return self.verified_modes, budget

    def observe(self, tree, path, accepted):
        """Calibrate: which of the tree's nodes did the target accept."""
        if tree.num_nodes > 0:
            kept = set(path[1:accepted].tolist())
            self.chooser.observe(_logprobs(tree), [i in kept for i in range(1, tree.num_nodes + 1)], self.verified_modes)


def _logprobs(tree, best_first=False):
    """The draft log-probabilities (nats) of the tree's nodes below the root."""
    values = (tree.scores[1:].double() / SCORE_SCALE).tolist()
    return sorted(values, reverse=True) if best_first else values


def make_planner(tree_budget, draft, target, input_ids, method, sampling, make_verifier, ancestor_mask,
                 num_modes=None):
    """The planner for a ``tree_budget`` that ``spec_generate`` has checked: an int or ``"auto"``;
    ``num_modes``: the mixture's mode count the caller fixed (None: all K, or chosen by auto)."""
    if tree_budget == "auto":
        return AutoBudget(draft, target, input_ids, method, sampling, make_verifier, ancestor_mask, num_modes)
    return FixedBudget(tree_budget, num_modes)
