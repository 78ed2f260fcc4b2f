"""Sections ``lossless`` and ``sync``: ``spec_generate`` token-identical to greedy decoding with a
drafter trained here on the target's own outputs, and the host synchronisations per round."""

import re
import time

from .common import kernel_backend
from .environment import version_of
from .report import EXACT, GOAL, INFO
from .shapes import METHODS


def greedy_sequences(target, prompts, new_tokens):
    """The target's own greedy continuations, batched, without a cache (training data)."""
    import torch

    seq = prompts
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = target(input_ids=seq, use_cache=False).logits[:, -1]
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq


def train_drafter(target, drafter, seqs, prompt_len, steps, anchors, lr, seed=0):
    """A few hundred steps of the DFlash loss (CE at block position k weighted exp(-(k-1)/7),
    every mode on the same labels) on the target's greedy outputs: the drafter then proposes the
    true continuation often, not always. Returns the last loss."""
    import torch
    import torch.nn.functional as F

    from mfd_hub.testing import target_taps

    device = seqs.device
    block = drafter.config.block_size
    batch, total = seqs.shape
    taps = target_taps(target, seqs, drafter.target_layer_ids).detach()
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    weights = torch.exp(-torch.arange(block - 1, device=device, dtype=torch.float32) / 7.0)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    offsets = torch.arange(block, device=device)
    loss = torch.tensor(float("nan"))
    drafter.train()
    with kernel_backend("torch"), torch.enable_grad():  # the references carry gradients
        for _ in range(steps):
            starts = torch.randint(prompt_len, total - block + 1, (batch, anchors), generator=g).to(device)
            positions = starts[..., None] + offsets  # [B, N, S]
            tokens = seqs.gather(1, positions.reshape(batch, -1)).reshape(batch, anchors, block)
            block_ids = tokens.clone()
            block_ids[..., 1:] = drafter.mask_token_id
            out = drafter(drafter.embed_block(block_ids, embed), starts, context_taps=taps, modes="all", lm_head=head)
            logits = out.logits  # [B, N, M, S-1, V]
            labels = tokens[:, :, None, 1:].expand(*logits.shape[:-1])
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
            loss = (ce.view(labels.shape) * weights).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            optimizer.step()
    drafter.eval()
    return float(loss.detach())


def trained_pair(family, device, cfg, overrides, seed=0):
    """A tiny fp32 target of ``family`` and a drafter trained for a few hundred steps on its
    greedy outputs. The lossless check decodes the first ``prompts`` training prompts: the
    drafter has learned their continuations well, not perfectly, so rounds accept long runs and
    some reject (on unseen prompts a drafter this small accepts little)."""
    import torch

    from mfd_hub.testing import tiny_drafter, tiny_target

    fields = dict(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], num_layers=cfg["layers"], init_std=cfg["init_std"])
    fields.update(overrides)
    target = tiny_target(family, seed=seed, **fields).to(device)
    target.requires_grad_(False)
    drafter = tiny_drafter(target, num_modes=cfg["modes"], num_layers=cfg["draft_layers"],
                           block_size=cfg["block"]).to(device)
    g = torch.Generator().manual_seed(seed + 7)
    prompts = torch.randint(0, cfg["vocab"] - 1, (cfg["train_seqs"], cfg["prompt_len"]), generator=g).to(device)
    seqs = greedy_sequences(target, prompts, cfg["new_tokens"])
    started = time.perf_counter()
    loss = train_drafter(target, drafter, seqs, cfg["prompt_len"], cfg["train_steps"], cfg["anchors"], cfg["lr"], seed)
    info = {"train_loss": loss, "train_seconds": time.perf_counter() - started}
    return target, drafter, prompts[: cfg["prompts"]], info


def rejecting_rounds(acceptance_lengths, block, new_tokens):
    """Rounds that emitted fewer tokens than they could have (the walk stopped at a rejection,
    not at the block's end or at max_new_tokens)."""
    have, count = 1, 0
    for emitted in acceptance_lengths:
        if emitted < min(block, new_tokens - have):
            count += 1
        have += emitted
    return count


def divergence(target, ids, want, got):
    """Where two continuations part, and the target's top-2 logit gap there (a near-tie hints at
    rounding rather than a wrong verifier)."""
    import torch

    at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    gap = None
    if at < len(want):
        prefix = torch.cat([ids[0], torch.tensor(want[:at], dtype=ids.dtype, device=ids.device)])[None]
        with torch.no_grad():
            logits = target(input_ids=prefix, use_cache=False).logits[0, -1].float()
        top = logits.topk(2).values
        gap = float(top[0] - top[1])
    return {"first_difference": at, "top2_gap_there": gap, "want": want[at: at + 5], "got": got[at: at + 5]}


class HostReads:
    """Counts what makes the host wait for the device during generation: value reads (item,
    tolist, numpy, cpu, bool/int/float/index of a tensor), blocking copies between devices
    (``.to`` across devices, tensors built from host data on a device), torch.cuda.synchronize,
    and data-dependent shapes seen at the dispatcher (nonzero, masked_select, unique, equal).
    On CPU nothing waits, but the same calls are counted: they are where a GPU would wait."""

    READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")
    SHAPE_OPS = ("nonzero", "masked_select", "equal")

    def __init__(self):
        self.events = []  # names in call order; "<accept>" / "<draft>" are round markers
        self._saved = []
        self._mode = None

    def _patch(self, owner, name, when=None):
        original = getattr(owner, name)
        events = self.events

        def counted(*args, **kwargs):
            if when is None or when(*args, **kwargs):
                events.append(name)
            return original(*args, **kwargs)

        self._saved.append((owner, name, original))
        setattr(owner, name, counted)

    def __enter__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        events, shape_ops = self.events, self.SHAPE_OPS

        class Shapes(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if name in shape_ops or name.startswith(("_unique", "unique")):
                    events.append(name)
                return func(*args, **(kwargs or {}))

        for name in self.READS:
            self._patch(torch.Tensor, name)
        to_original = torch.Tensor.to

        def to(self_, *args, **kwargs):
            out = to_original(self_, *args, **kwargs)
            if torch.is_tensor(out) and out.device != self_.device and not kwargs.get("non_blocking", False):
                events.append(f"to({out.device.type})")
            return out

        self._saved.append((torch.Tensor, "to", to_original))
        torch.Tensor.to = to
        for name in ("tensor", "as_tensor"):
            self._patch(torch, name, when=lambda data, *a, **k: k.get("device") is not None and not torch.is_tensor(data))
        self._patch(torch.cuda, "synchronize")
        self._mode = Shapes()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        return False


def split_rounds(events):
    """A generation's events (names in order, with "<accept>" at every accept walk and
    "<draft>" at every vocabulary top-k) -> per-round counts. Interval i between accept walks i
    and i+1 holds round i's summary read and round i+1's work before its walk; it is a drafting
    round when round i+1 drafted (the last rounds of a generation may verify the anchor alone)."""
    intervals, current = [], []
    for name in events:
        if name == "<accept>":
            intervals.append(current)
            current = []
        else:
            current.append(name)
    intervals.append(current)
    first, middle, last = intervals[0], intervals[1:-1], intervals[-1] if len(intervals) > 1 else []

    def reads(interval):
        return [n for n in interval if n != "<draft>"]

    return {
        "prefill_and_first_round": reads(first),
        "drafting_rounds": [reads(i) for i in middle if "<draft>" in i],
        "other_rounds": [reads(i) for i in middle if "<draft>" not in i],
        "last_round_and_output": reads(last),
    }


CUDA_SYNC = re.compile(r"^(cuda|cu)(Stream|Device|Ctx|Event)Synchronize|^cu(da)?Memcpy(DtoH|HtoD)?(_v2)?$")


MARKERS = {"gpu_check::accept_walk": "<accept>", "gpu_check::draft": "<draft>"}


def profiled_rounds(run):
    """Run ``run()`` under the torch profiler (CPU + CUDA) and split the CUDA runtime's
    synchronising calls (stream/device/event synchronize, synchronous memcpy) into rounds by the
    marker ranges -> (split_rounds of them, None) or (None, why not)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
    events = list(prof.events())
    if not any(e.name.startswith("cu") for e in events):
        return None, "the profiler recorded no CUDA runtime calls"
    timeline = sorted((e.time_range.start, MARKERS.get(e.name, e.name)) for e in events
                      if e.name in MARKERS or CUDA_SYNC.search(e.name))
    return split_rounds([name for _, name in timeline]), None


class RoundMarkers:
    """Marks every accept walk and vocabulary top-k of the generation loop, for the active
    HostReads and (as record_function ranges) for the profiler."""

    def __init__(self):
        from mfd_hub.remote import generation_mfd

        self.module = generation_mfd
        self.active = None
        self.saved = {name: getattr(generation_mfd, name) for name in ("accept_walk", "draft_candidates")}

    def __enter__(self):
        import torch

        def marked(name, label, marker):
            original = self.saved[name]

            def call(*args, **kwargs):
                if self.active is not None:
                    self.active.events.append(marker)
                with torch.profiler.record_function(label):
                    return original(*args, **kwargs)

            return call

        self.module.accept_walk = marked("accept_walk", "gpu_check::accept_walk", "<accept>")
        self.module.draft_candidates = marked("draft_candidates", "gpu_check::draft", "<draft>")
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(self.module, name, fn)
        return False


def check_lossless_and_sync(report, device, cfg, compat, sections):
    import torch

    from mfd_hub.kernels import backend
    from mfd_hub.testing import greedy_decode

    backends = ["triton", "torch"] if backend.triton is not None else ["torch"]
    hybrid = {"qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"}
    for family in cfg["families"]:
        kind = "hybrid" if family in hybrid else "attention"
        problems = compat["problems"][kind] if compat else []
        why = f"transformers {version_of('transformers')}: " + "; ".join(problems) if problems else None
        state = {}

        def build(family=family, kind=kind):
            target, drafter, prompts, info = trained_pair(family, device, cfg, cfg.get(f"{kind}_target", {}))
            wants = [greedy_decode(target, prompts[i: i + 1], cfg["new_tokens"]) for i in range(prompts.shape[0])]
            state.update(target=target, drafter=drafter, prompts=prompts, wants=wants)
            return (f"loss {info['train_loss']:.2f} after {cfg['train_steps']} steps ({info['train_seconds']:.1f} s)",
                    True, info["train_loss"], info)

        setup = report.run("lossless", f"lossless.{family}.setup", INFO,
                           "tiny target + drafter trained on its greedy outputs", build, unsupported_if=why)
        if setup["status"] in ("error", "unsupported"):
            continue
        runs = {}  # (backend, method) -> [(output, HostReads)] one per prompt
        markers = RoundMarkers()
        for name in backends:
            methods = cfg["triton_methods"][kind] if name == "triton" else METHODS

            def lossless(name=name, methods=methods):
                rows = []
                with kernel_backend(name), markers:
                    for method in methods:
                        for i in range(state["prompts"].shape[0]):
                            reads = markers.active = HostReads()
                            try:
                                with reads:
                                    out = state["drafter"].spec_generate(
                                        state["target"], state["prompts"][i: i + 1], max_new_tokens=cfg["new_tokens"],
                                        method=method, tree_budget=cfg["budgets"][method])
                            finally:
                                markers.active = None
                            runs.setdefault((name, method), []).append((out, reads))
                            same = out.new_tokens == state["wants"][i]
                            rejected = rejecting_rounds(out.acceptance_lengths, cfg["block"], cfg["new_tokens"])
                            row = {"method": method, "prompt": i, "identical": same, "tau": out.tau, "rounds": out.rounds,
                                   "acceptance_lengths": out.acceptance_lengths, "rejecting_rounds": rejected}
                            if not same:
                                row["divergence"] = divergence(state["target"], state["prompts"][i: i + 1],
                                                               state["wants"][i], out.new_tokens)
                            rows.append(row)
                identical = sum(r["identical"] for r in rows)
                rounds = sum(r["rounds"] for r in rows)
                rejecting = sum(r["rejecting_rounds"] for r in rows)
                tau = sum(sum(r["acceptance_lengths"]) for r in rows) / max(1, rounds)
                by_method = {m: [r for r in rows if r["method"] == m] for m in methods}
                taus = {m: sum(sum(r["acceptance_lengths"]) for r in rs) / max(1, sum(r["rounds"] for r in rs))
                        for m, rs in by_method.items()}
                ok = identical == len(rows) and tau >= cfg["min_tau"] and rejecting > 0
                per_method = ", ".join(f"{m} {t:.2f}" for m, t in taus.items())
                measured = f"{identical}/{len(rows)} identical; tau {per_method}; {rejecting}/{rounds} rounds rejected"
                return measured, ok, tau, {"runs": rows, "tau_by_method": taus, "rounds": rounds,
                                           "rejecting_rounds": rejecting, "min_tau": cfg["min_tau"]}

            report.run("lossless", f"lossless.{family}.{name}", EXACT,
                       f"token-identical to greedy (fp32); tau >= {cfg['min_tau']}; some rounds reject",
                       lossless, unsupported_if=why)
        if "sync" not in sections or "triton" not in backends or family not in cfg["sync_families"]:
            state.clear()
            continue
        for method in cfg["triton_methods"][kind]:
            def syncs(method=method):
                return sync_check(device, runs, method, state, cfg, markers)

            report.run("sync", f"sync.{family}.{method}", GOAL,
                       "<= 1 host sync in every drafting round on the Triton path (the summary read)", syncs,
                       unsupported_if=why)
        state.clear()


def sync_check(device, runs, method, state, cfg, markers):
    """Host syncs per round of the Triton path, from the counted lossless runs (and, on CUDA, one
    profiled generation); the torch path, which reads the device every round, checks the counter."""
    if ("triton", method) not in runs:
        raise RuntimeError("the Triton generation did not run (see the lossless check)")
    tri = split_rounds(runs[("triton", method)][0][1].events)
    ref = split_rounds(runs[("torch", method)][0][1].events) if ("torch", method) in runs else None
    details = {"python_triton": tri, "python_torch": ref}
    counts = [len(r) for r in tri["drafting_rounds"]]
    source = "python-level reads"
    sane = ref is not None and max((len(r) for r in ref["drafting_rounds"]), default=0) > 1
    if device.type == "cuda":
        def generate(name):
            with kernel_backend(name), markers:
                state["drafter"].spec_generate(state["target"], state["prompts"][:1],
                                               max_new_tokens=cfg["profile_tokens"], method=method,
                                               tree_budget=cfg["budgets"][method])

        try:
            cuda_tri, why = profiled_rounds(lambda: generate("triton"))
            cuda_ref, _ = profiled_rounds(lambda: generate("torch"))
        except Exception as error:  # noqa: BLE001  (the python-level count still stands)
            cuda_tri = cuda_ref = None
            why = f"the profiler failed: {type(error).__name__}: {str(error)[:200]}"
        details.update(cuda_triton=cuda_tri, cuda_torch=cuda_ref, cuda_note=why)
        if cuda_tri is not None:
            counts = [len(r) for r in cuda_tri["drafting_rounds"]]
            names = sorted({n for r in cuda_tri["drafting_rounds"] for n in r})
            source = f"CUDA runtime syncs ({', '.join(names) or 'none'}; profiler)"
            sane = sane and cuda_ref is not None and max((len(r) for r in cuda_ref["drafting_rounds"]), default=0) > 1
        else:
            source = f"python-level reads ({why})"
    worst = max(counts, default=0)
    ok = bool(counts) and worst <= 1 and sane
    kinds = sorted({" ".join(r) for r in tri["drafting_rounds"]}) or ["none"]
    others = [len(r) for r in tri["other_rounds"]]
    measured = f"max {worst} in {len(counts)} drafting rounds by {source} (python: {' | '.join(kinds)})"
    if others:
        seen = " | ".join(sorted({" ".join(r) for r in tri["other_rounds"]}))
        measured += f"; {len(others)} end round(s) verifying the anchor alone: {max(others)} ({seen})"
    if ref is not None:
        measured += f"; torch path up to {max((len(r) for r in ref['drafting_rounds']), default=0)}"
    if not sane:
        measured += "; the counter saw no reads on the torch path, so it proves nothing"
    details["counter_sees_torch_reads"] = sane
    return measured, ok, worst, details
