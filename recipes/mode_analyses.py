"""The paper's mode analyses: do an MFD drafter's modes carry futures, or only perturbations?

Every held-out prompt is answered greedily by the target (plain decoding, ``max_new_tokens``, as
the bench). At every position of that answer the block after it is drafted as decoding drafts
it (the anchor and masks, the target's tap features of everything before the anchor as context)
by the MFD drafter and by a single-mode control (the D-PACE drafter), and trees are built with
decoding's own builder (``kernels.tree_build``: ``draft_candidates`` then ``build_mixture_tree``)
at each budget B from these draft distributions (CONSTRUCTIONS):

- ``mixture`` (i): the MFD drafter's mixture tree, each prefix scored by its best mode;
- ``mean_marginals`` (ii): the product tree of the modes' mean marginals, mean_k p_k(y_d);
- ``shuffled`` (iii): the mixture over modes relabelled by an independent random permutation at
  every position: each "mode" splices positions of different modes, so whatever a mode couples
  across positions is broken while every marginal is kept;
- ``dpace`` (iv): the control's product tree (DDTree);
- ``gate``: the product tree of the gate's top-1 mode (what ``--method product`` decodes with);
- ``random_norms``: the mixture of the same drafter with its mode embeddings replaced by random
  directions of the trained norms (drawn once per run);
- ``without_mode_k``: the mixture of all modes but k.

Measures, per construction and budget:

- offline accepted length: at every anchor, the nodes of the tree's longest path that matches the
  greedy answer, the root included (at T = 0 exactly what a verification round there accepts);
- ``tau_rounds``: decoding's rounds replayed over the greedy answer (the first anchor after the
  prefill, the next anchor after each round's accepted tokens and bonus, decoding's depth cap near
  ``max_new_tokens``, a stop token ends it): at T = 0 in fp32 these are ``spec_generate``'s
  acceptance lengths, so the offline measure can be held against the bench's tau;
- with ``mass``: the target probability mass the tree covers per depth (the expected accepted
  tokens at T = 1), for the main constructions (MASS_CONSTRUCTIONS), from one target verification
  of the union of the anchor's trees, at every ``mass_every``-th anchor (a target pass over a few
  hundred nodes costs seconds on a CPU: every 8th anchor is an unbiased sample at an eighth).

The fork analysis: an anchor is a fork when the target's runner-up token after it has at least
``FORK_RUNNER_UP`` probability; reported are the share of anchors that are forks and the share of
the mixture's offline gain over (iv) that they carry (the paper: 60-71% of anchors, 75-88% of the
gain). The modes themselves: their norms against the mask token embedding's norm (they are added
to it), their cosine to their random start when the checkpoint records its seed, their pairwise
angles, and the gate: how often its top-1 is the mode that covers the greedy answer best, and its
mean entropy against ln K.

The target's greedy answers are kept in the user's mfd-hub cache (``greedy-answers``), keyed by
the target's weights, dtype and device, the prompt and the length: the analyses of several drafters
with one target (the shipped pair's, each fine-tune's) decode each prompt once.

Long runs are resumable: each finished prompt's sums are appended to ``<out>/progress.jsonl``
(the first line holds the settings; a run with other settings is refused), and a later run with
``resume`` computes only the prompts not there.
"""

import hashlib
import json
import math
from pathlib import Path

import torch

from mfd_hub.errors import MfdHubError
from mfd_hub.journal import append_line, read_entries
from mfd_hub.kernels.accept import accept_walk
from mfd_hub.kernels.tree_attention import ancestor_mask
from mfd_hub.kernels.tree_build import build_mixture_tree, draft_candidates

FORK_RUNNER_UP = 0.10  # the paper's threshold on the target's second most probable token
BUDGETS = (16, 32, 64)
BASE_CONSTRUCTIONS = ("mixture", "mean_marginals", "shuffled", "dpace", "gate", "random_norms")
MASS_CONSTRUCTIONS = ("mixture", "mean_marginals", "shuffled", "dpace", "gate")
PROGRESS_NAME = "progress.jsonl"
REPORT_NAME = "analyses.json"
FORMAT = "mfd-hub-mode-analyses-1"


def constructions(num_modes):
    """The names of every construction for a drafter of ``num_modes`` modes, in report order."""
    return [*BASE_CONSTRUCTIONS, *(f"without_mode_{k}" for k in range(num_modes))]


# -- the draft distributions of each construction ---------------------------------------------------
def mean_marginal_logits(logits):
    """[..., K, P, V] per-mode logits -> [..., 1, P, V] log of the modes' mean probabilities."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return (torch.logsumexp(logp, dim=-3) - math.log(logits.shape[-3])).unsqueeze(-3)


def position_permutations(num_blocks, num_modes, positions, generator):
    """An independent random permutation of the modes for every (block, position): [N, P, K]."""
    keys = torch.rand(num_blocks, positions, num_modes, generator=generator)
    return keys.argsort(dim=-1)


def shuffle_modes(per_mode, permutations):
    """per_mode [N, K, P, ...] -> the same with mode k at (block n, position d) taken from mode
    permutations[n, d, k]: each new "mode" mixes the modes across positions, marginals kept."""
    n, k, p = per_mode.shape[:3]
    index = permutations.transpose(1, 2).to(per_mode.device)  # [N, K, P]
    index = index.reshape(n, k, p, *([1] * (per_mode.dim() - 3))).expand(per_mode.shape)
    return per_mode.gather(1, index)


def random_directions(mode_embed, generator):
    """Random vectors with the rows' norms of ``mode_embed`` [K, H] (isotropic directions)."""
    noise = torch.randn(mode_embed.shape, generator=generator, dtype=torch.float32)
    norms = mode_embed.detach().float().norm(dim=-1, keepdim=True)
    return (noise / noise.norm(dim=-1, keepdim=True) * norms).to(mode_embed.dtype)


def candidate_sets(mfd_logits, control_logits, random_logits, gate_logits, permutations, budget):
    """Every construction's tree candidates from the drafted logits of N blocks.

    mfd_logits / random_logits [N, K, P, V]; control_logits [N, 1, P', V']; gate_logits [N, K];
    permutations [N, P, K] (``position_permutations``). -> {name: (scores, ids [N, M, P, C], which
    drafter's vocabulary: "mfd" or "control")}. A tree of budget b <= ``budget`` is built from the
    first b candidates (each position's list is exactly ordered, best first)."""
    scores, ids = draft_candidates(mfd_logits, budget)
    out = {"mixture": (scores, ids, "mfd")}
    out["mean_marginals"] = (*draft_candidates(mean_marginal_logits(mfd_logits), budget), "mfd")
    out["shuffled"] = (shuffle_modes(scores, permutations), shuffle_modes(ids, permutations), "mfd")
    out["dpace"] = (*draft_candidates(control_logits, budget), "control")
    top = gate_logits.argmax(-1)[:, None, None, None].expand(-1, 1, *scores.shape[2:])
    out["gate"] = (scores.gather(1, top), ids.gather(1, top), "mfd")
    out["random_norms"] = (*draft_candidates(random_logits, budget), "mfd")
    k = scores.shape[1]
    for left_out in range(k):
        keep = [m for m in range(k) if m != left_out]
        out[f"without_mode_{left_out}"] = (scores[:, keep], ids[:, keep], "mfd")
    return out


# -- one tree ---------------------------------------------------------------------------------------
def accepted_length(tree_tokens, parents, depths, continuation):
    """Nodes (the root included) of the tree's longest path matching ``continuation`` (the tokens
    after the anchor, target ids; -1 past what is known): the accept walk of a T = 0 round whose
    target tokens are the answer's, ``kernels.accept.accept_walk``."""
    known = torch.as_tensor(continuation, dtype=torch.long)
    max_depth = int(depths.max()) if depths.numel() else 0
    padded = torch.full((max_depth + 1,), -1, dtype=torch.long)
    padded[: min(max_depth + 1, known.numel())] = known[: max_depth + 1]
    next_tokens = padded[depths]  # on the answer's path the target's next token is the answer's
    _, info = accept_walk(tree_tokens, parents, depths, next_tokens, max_depth)
    return int(info[0])


def tree_prefixes(tokens, parents):
    """Every node's prefix (a tuple of tokens after the root), root first."""
    prefixes = [()]
    for node in range(1, tokens.shape[0]):
        prefixes.append(prefixes[int(parents[node])] + (int(tokens[node]),))
    return prefixes


# -- one prompt -------------------------------------------------------------------------------------
class ModeAnalyses:
    """The analyses of ``mfd`` (an MFD drafter) against ``control`` (a single-mode drafter) with
    ``target``, all fp32, on the same device. ``analyse(prompt_ids)`` -> one prompt's sums."""

    def __init__(self, target, mfd, control, budgets=BUDGETS, max_new_tokens=128, stop_ids=(), mass=False,
                 seed=0, anchors_per_pass=16, mass_every=1, answers_key=None):
        from mfd_hub.remote.generation_mfd import _check_pair

        if not mfd.config.num_modes or mfd.config.num_modes < 2:
            raise MfdHubError("the analysed drafter has no modes: give an MFD drafter (K >= 2)")
        if control.config.num_modes:
            raise MfdHubError("the drafter to compare against (--against) must be a single-mode drafter "
                              "(D-PACE, DFlash)")
        for draft in (mfd, control):
            try:
                _check_pair(draft, target)
            except ValueError as err:
                raise MfdHubError(str(err)) from None
        self.target, self.mfd, self.control = target, mfd.eval(), control.eval()
        self.budgets = sorted(int(b) for b in budgets)
        self.max_new_tokens, self.stop_ids = int(max_new_tokens), set(int(t) for t in stop_ids)
        self.mass, self.seed, self.anchors_per_pass, self.mass_every = mass, seed, anchors_per_pass, int(mass_every)
        # with a key naming the target (its weights, dtype, device), greedy answers are kept in the user's
        # cache: every analysis with this target (the shipped pair's, each variant's) answers a prompt once
        self.answers_key = answers_key
        self.names = constructions(mfd.config.num_modes)
        self.embed, self.lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        # drawn once per run: the ablation asks whether any vectors of these norms would do
        self.random_embed = random_directions(mfd.mode_embed, torch.Generator().manual_seed(seed))

    @property
    def drafted_positions(self):
        return max(self.mfd.config.block_size, self.control.config.block_size) - 1

    def greedy_answer(self, prompt_ids):
        """(answer ids, its length in decoding): plain greedy decoding ``max_new_tokens`` long, or to
        its first stop token; the answer goes on a block past that, so every tree can be matched."""
        from mfd_hub.targets import greedy_decode

        from mfd_hub.cache import read_record, write_record

        tokens = self.max_new_tokens + self.drafted_positions
        key = None
        if self.answers_key is not None:
            text = json.dumps([self.answers_key, [int(t) for t in prompt_ids], tokens])
            key = hashlib.sha256(text.encode()).hexdigest()[:32]
        known = read_record("greedy-answers", key) if key else None
        if known is not None:
            answer = known["answer"]
        else:
            ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=self.target.device)[None]
            answer = greedy_decode(self.target, ids, tokens, stop_ids=None)
            if key:
                write_record("greedy-answers", key, {"answer": answer})
        length = min(self.max_new_tokens, len(answer))
        for i, token in enumerate(answer[:length]):
            if token in self.stop_ids:
                length = i + 1
                break
        return answer, length

    def _draft(self, draft, block_ids, anchors, taps, modes, embed=None):
        """Logits [N, M, P, V] and gate logits of blocks at ``anchors`` [N], as decoding drafts them."""
        if embed is not None:
            saved = draft.mode_embed.data
            draft.mode_embed.data = embed
        try:
            out = draft(draft.embed_block(block_ids[None], self.embed), anchors[None], context_taps=taps,
                        modes=modes, lm_head=self.lm_head)
        finally:
            if embed is not None:
                draft.mode_embed.data = saved
        return out.logits[0].float(), (None if out.gate_logits is None else out.gate_logits[0].float())

    @torch.no_grad()
    def analyse(self, prompt_ids, index=0, detail=False):
        """One prompt -> a dict of sums over its anchors (``merge`` adds them, ``report`` turns them
        into rates); with ``detail`` also every anchor's trees and measures (for tests)."""
        prompt = [int(t) for t in prompt_ids]
        answer, length = self.greedy_answer(prompt)
        full = torch.tensor(prompt + answer, dtype=torch.long, device=self.target.device)
        start = len(prompt)
        out = self.target(full[None], output_hidden_states=True)
        taps = {id(d): torch.cat([out.hidden_states[i + 1] for i in d.target_layer_ids], dim=-1)
                for d in (self.mfd, self.control)}
        # the target's distribution after anchor i (answer position i) is row start + i
        probs = torch.softmax(out.logits[0, start : start + length].float(), dim=-1)
        runner_up = probs.topk(2, dim=-1).values[:, 1]
        del out

        anchors = list(range(length - 1))  # an anchor needs one answer token after it
        state = {"answer": answer, "length": length, "start": start, "full": full, "taps": taps,
                 "generator": torch.Generator().manual_seed(self.seed * 1_000_003 + index)}
        trees = {}  # (name, budget, anchor, depth cap) -> (target tokens, parents, depths)
        sums = self._empty_sums()
        sums["anchors"] = len(anchors)
        sums["forks"] = int((runner_up[: len(anchors)] >= FORK_RUNNER_UP).sum())
        details = []
        cands = {}
        for first in range(0, len(anchors), self.anchors_per_pass):
            chunk = anchors[first : first + self.anchors_per_pass]
            cands.update(self._candidates(state, chunk, sums))
        # the replay needs the few anchors near max_new_tokens whose depth decoding caps
        capped = [i for i in range(length) if self._depth_cap(i) < self.drafted_positions]
        extra = [i for i in capped if i not in cands and i < len(full) - start - 1]
        for first in range(0, len(extra), self.anchors_per_pass):
            cands.update(self._candidates(state, extra[first : first + self.anchors_per_pass], None))

        def tree(name, budget, i, cap=None):
            key = (name, budget, i, cap)
            if key not in trees:
                scores, ids, vocab = cands[i][name]
                block = (self.mfd if vocab == "mfd" else self.control).config.block_size
                depth = block - 1 if cap is None else min(block - 1, cap)
                built = build_mixture_tree(scores, ids, budget, answer[i], max_depth=depth)
                drafter = self.mfd if vocab == "mfd" else self.control
                tokens = torch.cat([built.tokens[:1], drafter.draft_to_target_ids(built.tokens[1:])])
                trees[key] = (tokens, built.parents, built.depths)
            return trees[key]

        verifier = self._mass_verifier(prompt) if self.mass else None
        committed = 0  # answer tokens in the verifier's cache
        for i in anchors:
            continuation = answer[i + 1 : i + 1 + self.drafted_positions]
            fork = bool(runner_up[i] >= FORK_RUNNER_UP)
            weigh = verifier is not None and i % self.mass_every == 0
            union = {} if weigh else None
            row = {}
            for name in self.names:
                for b in self.budgets:
                    tokens, parents, depths = tree(name, b, i)
                    accepted = accepted_length(tokens, parents, depths, continuation)
                    cell = sums["cells"][f"{name}@{b}"]
                    cell["accepted"] += accepted
                    if fork:
                        cell["accepted_forks"] += accepted
                    row[(name, b)] = {"accepted": accepted, "tree": (tokens, parents, depths)}
                    if union is not None and name in MASS_CONSTRUCTIONS:
                        for prefix in tree_prefixes(tokens, parents)[1:]:
                            union.setdefault(prefix, len(union) + 1)
            if weigh:
                self._advance(verifier, answer[committed:i])
                path_prob = self._verify_union(verifier, answer[i], union)
                committed = i + 1
                sums["mass_anchors"] += 1
                for (name, b), entry in row.items():
                    if name not in MASS_CONSTRUCTIONS:
                        continue
                    tokens, parents, _ = entry["tree"]
                    per_depth = [0.0] * (self.drafted_positions + 1)
                    for prefix in tree_prefixes(tokens, parents)[1:]:
                        per_depth[len(prefix)] += path_prob[prefix]
                    entry["mass_per_depth"] = per_depth[1:]
                    cell = sums["cells"][f"{name}@{b}"]
                    cell["mass_per_depth"] = [a + m for a, m in zip(cell["mass_per_depth"], per_depth[1:])]
            if detail:
                details.append({"anchor": i, "fork": fork, "continuation": continuation, "cells": row})

        for name in self.names:  # decoding's rounds over the greedy answer
            for b in self.budgets:
                rounds = self.replay(answer, length, lambda i, cap: accepted_length(
                    *tree(name, b, i, None if cap >= self.drafted_positions else cap),
                    answer[i + 1 : i + 1 + self.drafted_positions]))
                cell = sums["cells"][f"{name}@{b}"]
                cell["round_tokens"] += sum(rounds)
                cell["rounds"] += len(rounds)
                if detail:
                    sums.setdefault("rounds", {})[f"{name}@{b}"] = rounds
        for cell in sums["cells"].values():  # 6 digits: a prompt's journal line stays a few kB, exact on resume
            cell["mass_per_depth"] = [float(f"{m:.6g}") for m in cell["mass_per_depth"]]
        if detail:
            sums["details"] = details
            sums["greedy_answer"] = answer[:length]
        return sums

    def _depth_cap(self, i):
        """Decoding's depth cap at answer position i (i + 1 tokens are out)."""
        return max(0, min(self.drafted_positions, self.max_new_tokens - (i + 1) - 1))

    def replay(self, answer, length, accepted_at):
        """``spec_generate``'s acceptance lengths over the greedy answer: ``accepted_at(i, cap)``
        gives the accepted nodes of the tree at anchor i with depth cap ``cap``."""
        rounds, i = [], 0
        done = answer[0] in self.stop_ids or self.max_new_tokens == 1
        emitted_count = 1
        while not done:
            cap = self._depth_cap(i)
            accepted = 1 if cap == 0 else accepted_at(i, cap)
            rounds.append(accepted)
            for token in answer[i + 1 : i + 1 + accepted]:
                emitted_count += 1
                if token in self.stop_ids or emitted_count >= self.max_new_tokens:
                    done = True
                    break
            i += accepted
            done = done or i >= length - 1
        return rounds

    def _candidates(self, state, chunk, sums):
        """The candidates of every construction for the blocks at answer positions ``chunk``;
        with ``sums``, the gate's statistics of these blocks are added to it."""
        answer, start, full, taps = state["answer"], state["start"], state["full"], state["taps"]
        device = full.device
        anchors = torch.tensor([start + i for i in chunk], device=device)
        budget = self.budgets[-1]
        logits, blocks = {}, {}
        for name, draft in (("mfd", self.mfd), ("control", self.control)):
            size = draft.config.block_size
            block_ids = torch.full((len(chunk), size), draft.mask_token_id, dtype=torch.long, device=device)
            block_ids[:, 0] = full[anchors]
            blocks[name] = block_ids
            ctx = taps[id(draft)]
            modes = "all" if name == "mfd" else None
            logits[name], gate = self._draft(draft, block_ids, anchors, ctx, modes)
            if name == "mfd":
                gate_logits = gate
        random_logits, _ = self._draft(self.mfd, blocks["mfd"], anchors, taps[id(self.mfd)], "all",
                                       embed=self.random_embed)
        perms = position_permutations(len(chunk), self.mfd.config.num_modes, logits["mfd"].shape[2],
                                      state["generator"])
        sets = candidate_sets(logits["mfd"], logits["control"], random_logits, gate_logits, perms, budget)
        if sums is not None:
            self._gate_statistics(sums, logits["mfd"], gate_logits, chunk, answer)
        return {i: {name: (s[n], d[n], v) for name, (s, d, v) in sets.items()} for n, i in enumerate(chunk)}

    def _gate_statistics(self, sums, logits, gate_logits, chunk, answer):
        """The winner of each block (the mode whose soft coverage of the greedy answer is highest,
        as in training) against the gate's top-1; the gate's entropy."""
        from mfd_hub.recipes.losses import soft_coverage

        draft = self.mfd
        positions = logits.shape[2]
        logp = torch.log_softmax(logits, dim=-1)  # [N, K, P, V']
        row_of = None
        if draft.config.draft_vocab_size:
            row_of = torch.full((draft.config.vocab_size,), -1, dtype=torch.long)
            rows = torch.arange(draft.config.draft_vocab_size)
            row_of[rows + draft.d2t.cpu()] = rows
        q = torch.zeros(logp.shape[:3])
        for n, i in enumerate(chunk):
            for d in range(positions):
                at = i + 1 + d
                if at >= len(answer):
                    break
                token = answer[at] if row_of is None else int(row_of[answer[at]])
                if token >= 0:
                    q[n, :, d] = logp[n, :, d, token].exp()
        winner = soft_coverage(q).argmax(-1)
        top1 = gate_logits.argmax(-1).cpu()
        gate_logp = torch.log_softmax(gate_logits, dim=-1)
        entropy = -(gate_logp.exp() * gate_logp).sum(-1)
        sums["gate"]["hits"] += int((top1 == winner).sum())
        sums["gate"]["entropy"] += float(entropy.sum())
        for k in top1.tolist():
            sums["gate"]["top1_counts"][k] += 1
        for k in winner.tolist():
            sums["gate"]["winner_counts"][k] += 1

    def _mass_verifier(self, prompt):
        from mfd_hub.remote.targets_mfd import make_verifier

        verifier = make_verifier(self.target, self.mfd.target_layer_ids)
        verifier.prefill(torch.tensor([prompt], device=self.target.device))
        return verifier

    def _advance(self, verifier, tokens):
        """Commit answer ``tokens`` to the verifier's cache as one accepted chain."""
        if not tokens:
            return
        chain = torch.tensor(tokens, device=self.target.device)
        steps = torch.arange(len(tokens), device=chain.device)
        verifier.verify(chain, steps, ancestor_mask(steps - 1, len(tokens) - 1))
        verifier.commit(steps)

    def _verify_union(self, verifier, anchor, union):
        """One verification of the root and every node of ``union`` (prefix -> node index), then the
        anchor is committed as decoding commits it -> {prefix: target probability of the prefix}."""
        prefixes = [()] + sorted(union, key=union.get)
        index = {p: n for n, p in enumerate(prefixes)}
        tokens = torch.tensor([anchor] + [p[-1] for p in prefixes[1:]], device=self.target.device)
        parents = torch.tensor([-1] + [index[p[:-1]] for p in prefixes[1:]], device=tokens.device)
        depths = torch.tensor([len(p) for p in prefixes], device=tokens.device)
        logits, _ = verifier.verify(tokens, depths, ancestor_mask(parents, int(depths.max())))
        probs = torch.softmax(logits.float(), dim=-1)
        path = {(): 1.0}
        for p in prefixes[1:]:  # parents precede children (shorter prefixes first)
            path[p] = path[p[:-1]] * float(probs[index[p[:-1]], p[-1]])
        verifier.commit(torch.zeros(1, dtype=torch.long, device=tokens.device))
        return path

    def _empty_sums(self):
        k = self.mfd.config.num_modes
        cell = lambda: {"accepted": 0, "accepted_forks": 0, "round_tokens": 0, "rounds": 0,  # noqa: E731
                        "mass_per_depth": [0.0] * self.drafted_positions}
        cells = {f"{n}@{b}": cell() for n in self.names for b in self.budgets}
        return {"anchors": 0, "forks": 0, "mass_anchors": 0, "cells": cells,
                "gate": {"hits": 0, "entropy": 0.0, "top1_counts": [0] * k, "winner_counts": [0] * k}}


# -- sums over prompts, and the report -------------------------------------------------------------
def merge(total, sums):
    """Add one prompt's sums into ``total`` (in place; returns it)."""
    if total is None:
        kept = {k: v for k, v in sums.items() if k not in ("details", "greedy_answer", "rounds")}
        return json.loads(json.dumps(kept))  # a deep copy
    for key in ("anchors", "forks", "mass_anchors"):
        total[key] += sums[key]
    for name, cell in sums["cells"].items():
        mine = total["cells"][name]
        for key in ("accepted", "accepted_forks", "round_tokens", "rounds"):
            mine[key] += cell[key]
        mine["mass_per_depth"] = [a + b for a, b in zip(mine["mass_per_depth"], cell["mass_per_depth"])]
    gate = total["gate"]
    gate["hits"] += sums["gate"]["hits"]
    gate["entropy"] += sums["gate"]["entropy"]
    for key in ("top1_counts", "winner_counts"):
        gate[key] = [a + b for a, b in zip(gate[key], sums["gate"][key])]
    return total


def mode_geometry(mfd, embed_weight):
    """The modes themselves: norms against the mask token embedding's (they are added to it), the
    cosine to their random start when the checkpoint records its seed and scale, pairwise angles."""
    modes = mfd.mode_embed.detach().float().cpu()
    mask = embed_weight[mfd.config.mask_token_id].detach().float().cpu() * mfd.config.input_embedding_scale
    unit = modes / modes.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    cosines = (unit @ unit.t()).clamp(-1, 1)
    k = modes.shape[0]
    upper = cosines[torch.triu(torch.ones(k, k, dtype=torch.bool), diagonal=1)]
    angles = torch.rad2deg(torch.acos(upper))
    out = {"num_modes": k, "norms": modes.norm(dim=-1).tolist(), "mask_token_norm": float(mask.norm()),
           "pairwise_angle_degrees": {"min": float(angles.min()), "mean": float(angles.mean()),
                                      "max": float(angles.max())},
           "pairwise_cosines": cosines.tolist()}
    start = initial_modes(mfd)
    if start is not None:
        cos = torch.nn.functional.cosine_similarity(modes, start, dim=-1)
        out["cosine_to_start"] = cos.tolist()
    return out


def initial_modes(mfd):
    """The mode embeddings a drafter started training from, rebuilt from its recorded mode_init
    (seed, std and, for a token-scale start, the norm), or None when it is not recorded."""
    from mfd_hub.converters.zlab import init_modes

    init = (mfd.config.mfd_metadata or {}).get("mode_init") or {}
    seed, std = init.get("seed"), init.get("mode_std")
    if std is None and isinstance(init.get("mode_embed"), str) and init["mode_embed"].startswith("normal(0, "):
        try:  # older checkpoints: "normal(0, 0.02^2)"
            std = float(init["mode_embed"][len("normal(0, "):].split("^")[0])
        except ValueError:
            std = None
    if seed is None or std is None:
        return None
    gate_std = init.get("gate_std", mfd.config.initializer_range)
    modes, _ = init_modes(mfd.config.num_modes, mfd.config.hidden_size, int(seed), float(std), float(gate_std))
    if init.get("mode_norm") is not None:
        modes = modes / modes.norm(dim=-1, keepdim=True) * float(init["mode_norm"])
    return modes


def report(total, budgets, names, geometry, settings):
    """The summed measures -> the analyses' report (a JSON-ready dict)."""
    anchors = max(1, total["anchors"])
    weighed = max(1, total["mass_anchors"])
    cells = {}
    for name in names:
        for b in budgets:
            c = total["cells"][f"{name}@{b}"]
            cells.setdefault(name, {})[str(b)] = {
                "tau_offline": c["accepted"] / anchors,
                "tau_rounds": c["round_tokens"] / max(1, c["rounds"]),
                "rounds": c["rounds"],
                **({"mass": sum(c["mass_per_depth"]) / weighed,
                    "mass_per_depth": [m / weighed for m in c["mass_per_depth"]]}
                   if settings.get("mass") and name in MASS_CONSTRUCTIONS else {}),
            }
    ratios = {}
    for name in names:
        if name == "dpace":
            continue
        ratios[name] = {}
        for b in budgets:
            mine, control = cells[name][str(b)], cells["dpace"][str(b)]
            entry = {"tau_offline": mine["tau_offline"] / control["tau_offline"],
                     "tau_rounds": mine["tau_rounds"] / control["tau_rounds"]}
            if "mass" in mine and control["mass"] > 0:
                entry["mass"] = mine["mass"] / control["mass"]
            ratios[name][str(b)] = entry
    forks = {"runner_up_threshold": FORK_RUNNER_UP, "anchor_share": total["forks"] / anchors, "gain_share": {}}
    random_keeps = {}
    for b in budgets:
        mix, ctrl = total["cells"][f"mixture@{b}"], total["cells"][f"dpace@{b}"]
        gain = mix["accepted"] - ctrl["accepted"]
        fork_gain = mix["accepted_forks"] - ctrl["accepted_forks"]
        forks["gain_share"][str(b)] = fork_gain / gain if gain else None
        # the share of the mixture's gain over its shuffled modes that random vectors keep
        rnd, shuf = total["cells"][f"random_norms@{b}"], total["cells"][f"shuffled@{b}"]
        over_shuffled = mix["accepted"] - shuf["accepted"]
        random_keeps[str(b)] = {
            "of_gain_over_dpace": (rnd["accepted"] - ctrl["accepted"]) / gain if gain else None,
            "of_gain_over_shuffled": (rnd["accepted"] - shuf["accepted"]) / over_shuffled if over_shuffled else None,
        }
    gate = total["gate"]
    k = len(gate["top1_counts"])
    blocks = max(1, sum(gate["top1_counts"]))
    return {
        "format": FORMAT, "settings": settings, "prompts": total.get("prompts", 0), "anchors": total["anchors"],
        "mass_anchors": total["mass_anchors"],
        "constructions": cells, "against_dpace": ratios, "forks": forks, "random_norms_keep": random_keeps,
        "gate": {"top1_accuracy": gate["hits"] / blocks, "chance": 1.0 / k, "mean_entropy": gate["entropy"] / blocks,
                 "max_entropy": math.log(k), "top1_share": [c / blocks for c in gate["top1_counts"]],
                 "winner_share": [c / blocks for c in gate["winner_counts"]]},
        "modes": geometry,
    }


def ratio_interval(progress_path, construction, against="dpace", budget=16, resamples=2000, seed=0, level=0.95):
    """A paired bootstrap over prompts of the offline tau ratio of ``construction`` to ``against``
    (accepted nodes summed over the resampled prompts' anchors), from a finished run's journal
    -> (low, high) at ``level``. Prompts, not anchors, are resampled: the anchors of one answer are
    not independent."""
    import random

    lines = Path(progress_path).read_text(encoding="utf-8").splitlines()[1:]
    accepted = AnalysesJournal.CELL.index("accepted")
    pairs = [(cells[f"{construction}@{budget}"][accepted], cells[f"{against}@{budget}"][accepted])
             for cells in (json.loads(line)["sums"]["cells"] for line in lines if line)]
    if not pairs:
        raise MfdHubError(f"{progress_path}: no finished prompt")
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        drawn = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ratios.append(sum(a for a, _ in drawn) / max(1, sum(b for _, b in drawn)))
    ratios.sort()
    tail = (1 - level) / 2
    return ratios[int(tail * resamples)], ratios[min(resamples - 1, int((1 - tail) * resamples))]


# -- the journal and the command's work ------------------------------------------------------------
class AnalysesJournal:
    """``<out>/progress.jsonl``: the settings, then one line of sums per finished prompt, appended
    and synced as each ends (a run of hours survives being stopped; a line cut by a crash is
    dropped). With ``resume`` the prompts found there are read, not recomputed; other settings
    are refused. Without it an old journal is replaced."""

    def __init__(self, out_dir, settings, resume=False):
        self.path = Path(out_dir) / PROGRESS_NAME
        self.settings = json.loads(json.dumps(settings))
        self.done = {}
        if not resume and self.path.exists():
            self.path.unlink()
        if self.path.exists():
            for entry in read_entries(self.path, self.settings, "mode-analyses", FORMAT):
                self.done[entry["record"]] = self._unpack(entry["sums"])
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            append_line(self.path, {"format": FORMAT, "settings": self.settings})

    CELL = ("accepted", "accepted_forks", "round_tokens", "rounds")

    def add(self, record, sums):
        packed = {**sums, "cells": {name: [*(c[k] for k in self.CELL), *c["mass_per_depth"]]
                                    for name, c in sums["cells"].items()}}
        append_line(self.path, {"record": record, "sums": packed})
        self.done[record] = sums

    def _unpack(self, sums):
        n = len(self.CELL)
        return {**sums, "cells": {name: {**dict(zip(self.CELL, row[:n])), "mass_per_depth": row[n:]}
                                  for name, row in sums["cells"].items()}}



def analyse_modes(drafter_spec, against_spec, target_spec, data, limit=None, budgets=BUDGETS, max_new_tokens=128,
                  mass=False, seed=0, out_dir=None, resume=False, progress=None, mass_every=1):
    """What ``mfd-hub evaluate --trees`` does -> the report (written to ``<out>/analyses.json`` too).
    ``progress(prompts done now, prompts in all)`` is called as prompts finish."""
    from mfd_hub.checkpoint import load_draft
    from mfd_hub.targets import load_target, stop_ids_of

    from mfd_hub.zoo.bench import weights_digest

    from .data import load_sequences

    if not Path(data).exists():
        raise MfdHubError(f"held-out data {data} not found (make it with 'mfd-hub regen')")
    sequences, _ = load_sequences(data, 1 << 30)
    sequences = sequences[:limit] if limit else sequences
    if not sequences:
        raise MfdHubError(f"{data} holds no usable record")
    mfd = load_draft(drafter_spec).float().eval()
    control = load_draft(against_spec).float().eval()
    target, tokenizer = load_target(target_spec)
    stops = stop_ids_of(tokenizer, target) if tokenizer is not None else []
    target_key = [weights_digest(target), str(next(target.parameters()).dtype), target.device.type]
    analyses = ModeAnalyses(target, mfd, control, budgets, max_new_tokens, stops, mass, seed, mass_every=mass_every,
                            answers_key=target_key)
    settings = {"drafter": str(drafter_spec), "against": str(against_spec), "target": str(target_spec),
                "data": str(data), "budgets": analyses.budgets, "max_new_tokens": max_new_tokens, "mass": mass,
                "mass_every": mass_every if mass else None,
                "seed": seed, "stop_ids": sorted(analyses.stop_ids),
                "weights": {"drafter": weights_digest(mfd), "against": weights_digest(control)}}
    journal = AnalysesJournal(out_dir, settings, resume) if out_dir else None
    total = None
    for n, seq in enumerate(sequences):
        sums = journal.done.get(seq.id) if journal else None
        if sums is None:
            sums = analyses.analyse(seq.ids[: seq.prompt_len], index=n)
            if journal:
                journal.add(seq.id, sums)
        total = merge(total, sums)
        if progress:
            progress(1, len(sequences))
    total["prompts"] = len(sequences)
    result = report(total, analyses.budgets, analyses.names, mode_geometry(mfd, analyses.embed.weight), settings)
    if out_dir:
        path = Path(out_dir) / REPORT_NAME
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        temporary.replace(path)
    return result
