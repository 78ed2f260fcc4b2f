"""Training losses of block drafters (DESIGN §2): DFlash decay CE, D-PACE and MFD.

Every loss is a function of two tensors over the drafted positions k = 1..P of each block:

- ``logp`` [..., P]: the drafter's log-probability of the true token at position k (-inf when the
  true token lies outside a draft vocabulary: the drafter cannot propose it);
- ``valid`` [..., P]: whether position k has a true token at all (False past the end of the
  sequence, and for padding blocks).

The true-token log-probabilities come from ``true_token_logprobs``, which never materialises more
than one chunk of logits at a time. Losses are returned per block; the trainer sums them and
divides by the number of blocks in the global batch.
"""

import math

import torch
import torch.nn.functional as F

LOSS_TYPES = ("dflash", "dpace", "mfd")


# -- per-position weights ----------------------------------------------------------------------
def decay_weights(num_positions, gamma, device=None):
    """DFlash's position weights exp(-(k-1)/gamma) for k = 1..P."""
    k = torch.arange(num_positions, dtype=torch.float32, device=device)
    return torch.exp(-k / gamma)


def true_token_probs(logp, valid):
    """q_k: the (detached) probability of the true token; 0 where it cannot be accepted."""
    logp = logp.detach().float()
    return torch.where(valid, logp.exp(), torch.zeros_like(logp))


def position_ce(logp, valid):
    """-log q_k where there is a true token the drafter can propose; 0 elsewhere (no gradient)."""
    usable = valid & torch.isfinite(logp)
    return torch.where(usable, -logp.float(), torch.zeros_like(logp, dtype=torch.float32))


def dpace_weights(q, valid, alpha):
    """D-PACE weights: s_k = (1-alpha) q_k + alpha, prefix_k = prod_{j<=k} s_j,
    weight_k = sum_{j>=k} prefix_j, summing over positions that exist (s = 0 past the end)."""
    s = torch.where(valid, (1.0 - alpha) * q + alpha, torch.zeros_like(q))
    prefix = torch.cumprod(s, dim=-1)
    return prefix.flip(-1).cumsum(-1).flip(-1)


def soft_coverage(q):
    """Expected accepted length of a block on its true continuation: sum_d prod_{j<=d} q_j."""
    return torch.cumprod(q, dim=-1).sum(-1)


def winner_take_all_weights(coverage, winner_weight):
    """Relaxed winner-take-all over modes: the mode with the largest coverage (ties: the smaller
    index) gets ``winner_weight``, every other mode (1 - winner_weight) / (K - 1).
    coverage [..., K] -> (weights [..., K], winner [...])."""
    k = coverage.shape[-1]
    winner = coverage.argmax(dim=-1)
    weights = torch.full_like(coverage, (1.0 - winner_weight) / (k - 1))
    weights.scatter_(-1, winner[..., None], winner_weight)
    return weights, winner


# -- per-block losses --------------------------------------------------------------------------
def dflash_loss(logp, valid, gamma):
    """sum_k exp(-(k-1)/gamma) CE_k per block."""
    weights = decay_weights(logp.shape[-1], gamma, device=logp.device)
    return (position_ce(logp, valid) * weights).sum(-1)


def dpace_loss(logp, valid, alpha):
    """sum_k CE_k weight_k per block, weights from the detached q (D-PACE)."""
    weights = dpace_weights(true_token_probs(logp, valid), valid, alpha)
    return (position_ce(logp, valid) * weights).sum(-1)


def mfd_loss(logp, valid, gate_logits, alpha, winner_weight, gate_weight):
    """MFD: per-mode D-PACE weighted by relaxed winner-take-all on soft coverage, plus the gate's
    cross-entropy towards the winner.

    logp [..., K, P]; valid [..., P] (shared by the modes); gate_logits [..., K].
    Returns (loss [...], parts) with parts = {"dpace", "gate", "coverage" [..., K], "winner"}.
    """
    valid_m = valid.unsqueeze(-2).expand_as(logp)
    q = true_token_probs(logp, valid_m)
    coverage = soft_coverage(q)
    mode_weights, winner = winner_take_all_weights(coverage, winner_weight)
    per_mode = (position_ce(logp, valid_m) * dpace_weights(q, valid_m, alpha)).sum(-1)
    dpace = (mode_weights * per_mode).sum(-1)
    gate = F.cross_entropy(gate_logits.float().reshape(-1, gate_logits.shape[-1]), winner.reshape(-1), reduction="none")
    gate = gate.reshape(winner.shape)
    return dpace + gate_weight * gate, {"dpace": dpace, "gate": gate, "coverage": coverage, "winner": winner}


# -- true-token log-probabilities through an LM head -------------------------------------------
class _TrueTokenLogProb(torch.autograd.Function):
    """log softmax(h W^T)[index] per row, in chunks of rows; -inf where index < 0.

    The backward pass uses d logp / d logits = onehot(index) - softmax, so no [rows, V] tensor
    but one chunk's softmax is ever alive when ``keep`` is False (it is recomputed); with
    ``keep`` the forward keeps the chunks' probabilities, which saves one matmul per chunk.
    """

    @staticmethod
    def forward(ctx, hidden, weight, index, chunk, keep):
        rows = hidden.shape[0]
        out = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        lses, kept = [], []
        for start in range(0, rows, chunk):
            h, idx = hidden[start : start + chunk], index[start : start + chunk]
            logits = (h.to(weight.dtype) @ weight.t()).float()
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, idx.clamp(min=0)[:, None])[:, 0]
            out[start : start + chunk] = torch.where(idx >= 0, picked - lse, torch.full_like(lse, -math.inf))
            lses.append(lse)
            if keep:
                kept.append(logits.sub_(lse[:, None]).exp_())
        ctx.chunk, ctx.keep, ctx.kept = chunk, keep, kept
        ctx.save_for_backward(hidden, weight, index, torch.cat(lses) if lses else out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, index, lse = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        grad_out = torch.where(index >= 0, grad_out, torch.zeros_like(grad_out))
        for n, start in enumerate(range(0, hidden.shape[0], ctx.chunk)):
            stop = start + ctx.chunk
            h, idx, g = hidden[start:stop], index[start:stop], grad_out[start:stop]
            if ctx.keep:
                probs = ctx.kept[n]
            else:
                probs = ((h.to(weight.dtype) @ weight.t()).float() - lse[start:stop, None]).exp_()
            # d logp / d logits = onehot(index) - softmax, scaled by the incoming gradient
            g_logits = probs.mul_(-g[:, None])
            g_logits.scatter_add_(1, idx.clamp(min=0)[:, None], g[:, None])
            g_logits = g_logits.to(weight.dtype)
            if want_h:
                grad_h[start:stop] = (g_logits @ weight).to(hidden.dtype)
            if want_w:
                grad_w += (g_logits.t() @ h.to(weight.dtype)).float()
        ctx.kept = None
        return grad_h, (grad_w.to(weight.dtype) if want_w else None), None, None, None


def true_token_logprobs(hidden, weight, index, chunk=0):
    """log-probability of ``index`` under softmax(hidden @ weight^T), row by row.

    hidden [R, H]; weight [V, H] (an LM head); index [R] ids into the head's rows, -1 for a token
    the head cannot produce (the result is -inf there). ``chunk`` = 0 computes all rows at once
    and keeps their probabilities for the backward pass (fastest); ``chunk`` = n works n rows at a
    time and recomputes the logits in the backward pass (memory-lean for large vocabularies).
    """
    rows = hidden.shape[0]
    if rows == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    keep = chunk <= 0
    return _TrueTokenLogProb.apply(hidden, weight, index, rows if keep else int(chunk), keep)


# -- diagnostics -------------------------------------------------------------------------------
class ModeStats:
    """Counters that show whether modes specialise: per-mode wins and coverage, gate top-1 hits.

    Summed over blocks; ``summary()`` turns them into rates. ``state()`` / ``load()`` carry them
    through checkpoints; ``all_reduce()`` sums them over ranks.
    """

    def __init__(self, num_paths):
        self.num_paths = max(1, num_paths)
        self.blocks = torch.zeros((), dtype=torch.float64)
        self.wins = torch.zeros(self.num_paths, dtype=torch.float64)
        self.coverage = torch.zeros(self.num_paths, dtype=torch.float64)
        self.best_coverage = torch.zeros((), dtype=torch.float64)
        self.gate_hits = torch.zeros((), dtype=torch.float64)

    def update(self, coverage, block_valid, winner=None, gate_logits=None):
        """coverage [..., M] of each block; block_valid [...]; winner [...] and gate_logits [..., M]
        for MFD."""
        mask = block_valid.reshape(-1).cpu()
        cov = coverage.detach().reshape(-1, coverage.shape[-1]).double().cpu()[mask]
        self.blocks += mask.sum()
        self.coverage += cov.sum(0)
        self.best_coverage += cov.max(-1).values.sum()
        if winner is not None:
            win = winner.reshape(-1).cpu()[mask]
            self.wins += torch.bincount(win, minlength=self.num_paths).double()
            if gate_logits is not None:
                top1 = gate_logits.detach().reshape(-1, gate_logits.shape[-1]).argmax(-1).cpu()[mask]
                self.gate_hits += (top1 == win).sum()

    NAMES = ("blocks", "wins", "coverage", "best_coverage", "gate_hits")

    def tensors(self):
        return [self.blocks, self.wins, self.coverage, self.best_coverage, self.gate_hits]

    def all_reduce(self, device):
        import torch.distributed as dist

        for t in self.tensors():
            moved = t.to(device)
            dist.all_reduce(moved)
            t.copy_(moved.cpu())

    def state(self):
        return {name: t.tolist() for name, t in zip(self.NAMES, self.tensors())}

    def load(self, state):
        for name, t in zip(self.NAMES, self.tensors()):
            t.copy_(torch.tensor(state[name], dtype=torch.float64))

    def summary(self):
        n = float(self.blocks)
        if n == 0:
            return {"blocks": 0}
        out = {"blocks": int(n), "coverage_per_mode": (self.coverage / n).tolist(),
               "best_mode_coverage": float(self.best_coverage / n)}
        if self.num_paths > 1 and float(self.wins.sum()) > 0:
            rates = self.wins / self.wins.sum()
            entropy = -(rates[rates > 0] * rates[rates > 0].log()).sum()
            out.update(win_rate_per_mode=rates.tolist(), effective_modes=float(entropy.exp()),
                       gate_top1_accuracy=float(self.gate_hits / n))
        return out
