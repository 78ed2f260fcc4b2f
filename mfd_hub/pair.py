"""A drafter and its target, ready to speculate: ``load_pair``, the one set-up sequence behind
``mfd-hub generate``, ``demo``, ``bench`` and ``verify``: choose the dtype, load the drafter, load
the target, pick the linear products, pack them while generating.

    import mfd_hub
    pair = mfd_hub.load_pair("MFD-SmolLM2-135M", "smollm2")
    out = pair.generate("Write a palindrome check in Python.", method="mixture", tree_budget=16, max_new_tokens=64)
    print(pair.decode(out.new_tokens), out.tau)
"""

import contextlib

import torch

from .errors import MfdHubError

# what ``baselines=True`` times each dtype on (``dtype_choice``) when no prompt is given
TIMING_PROMPT = "Write a palindrome check in Python."


def load_pair(drafter, target, dtype="auto", linears="auto", *, device=None, baselines=False, timing_prompt=None,
              more_drafters=(), remote_code=False, log=None):
    """A ``Pair``: ``drafter`` (a checkpoint folder, a Hub repo id or a shipped drafter's name)
    speculating for ``target`` (a model folder, a Hub id or ``smollm2``).

    dtype: ``auto`` (bf16 on CUDA and on CPUs with native bf16, else fp32) or ``float32`` /
    ``bfloat16`` / ``float16``; drafter and target both load in it.
    linears: the products on CPU (``packed_linear.speculation_linears``): ``auto`` multiplies by
    fp16-rounded weights on a CPU without native bf16, else through oneDNN with packed weights;
    ``torch`` leaves torch's own layers. They apply inside ``Pair.packed()`` and ``Pair.generate``.
    device: ``cuda`` where there is one, else ``cpu``.
    baselines: what ``demo`` and ``bench`` need: the target also in fp32 and bf16 for plain
    decoding (``Pair.plain_targets``), and ``dtype="auto"`` on a CPU taken as the dtype whose
    speculative decoding of ``timing_prompt`` is fastest on this machine (timed once, then cached;
    the drafter in fp32 unless bf16 is native: ``dtype_choice.speculation_dtypes``).
    more_drafters: further drafters for the same target, in the same dtype (``Pair.drafts``).
    remote_code: load the drafter as its users do, through AutoModel with trust_remote_code.
    log: called with one line before each load or measurement.
    """
    from .packed_linear import speculation_linears
    from .precision import dtype_name, resolve_dtype
    from .targets import load_target

    say = log or (lambda line: None)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    run_dtype = resolve_dtype(dtype, device)  # a bad name fails before anything loads
    linears = speculation_linears(linears, device)
    load_dtype = torch.float32 if baselines else run_dtype  # the baselines start from fp32
    drafts = []
    for spec in (drafter, *more_drafters):
        say(f"loading drafter {spec} ...")
        drafts.append(_load_drafter(spec, load_dtype, device, remote_code))
    say(f"loading target {target} ({dtype_name(load_dtype)}) ...")
    model, tokenizer = load_target(target, dtype=load_dtype, device=device)
    pair = Pair(drafts, model, tokenizer, linears, name=str(target))
    if baselines:
        from .dtype_choice import speculation_dtypes

        if dtype == "auto" and device == "cpu":
            say("--dtype auto: float32 rows with fp16 weights (this CPU has no native bf16)" if linears == "fp16" else
                "--dtype auto: the dtype whose speculative decoding is fastest here (measured once, then cached)")
        prompt = TIMING_PROMPT if timing_prompt is None else timing_prompt
        ids = pair.encode(prompt) if isinstance(prompt, str) else prompt
        plain, run_dtype, draft_dtype = speculation_dtypes(dtype, model, drafts[0], ids, linears)
        pair = Pair([draft.to(draft_dtype) for draft in drafts], plain[run_dtype], tokenizer, linears,
                    name=str(target), plain_targets=plain)
    return pair


def _load_drafter(spec, dtype, device, remote_code):
    if not remote_code:
        from .checkpoint import load_draft

        return load_draft(spec, dtype=dtype, device=device)
    from .locate import resolve_drafter
    from .zoo.shipped import load_with_auto_model

    return load_with_auto_model(resolve_drafter(spec)).to(device=device, dtype=dtype)


class Pair:
    """A drafter (``draft``; ``drafts`` when several share the target) and the ``target`` it
    speculates for, with the target's ``tokenizer``, the dtype both run in, and the CPU products
    chosen for them (``linears``, the label reports use). ``plain_targets``: {dtype: the target in
    it} for plain decoding (just the target itself unless loaded with ``baselines``)."""

    def __init__(self, drafts, target, tokenizer, linears="torch", name=None, plain_targets=None):
        self.drafts = list(drafts)
        self.draft = self.drafts[0]
        self.target, self.tokenizer = target, tokenizer
        self.linears_choice = linears  # onednn / fp16 / torch, as speculation_linears resolved it
        self.plain_targets = dict(plain_targets or {target.dtype: target})
        self.name = name or getattr(target.config, "name_or_path", "the target")
        self._packed = False

    @property
    def dtype(self):
        """The target's dtype: the dtype speculation verifies in."""
        return self.target.dtype

    @property
    def draft_dtype(self):
        return self.draft.dtype

    @property
    def linears(self):
        """What reports call the products: ``torch``, ``onednn``, ``onednn+bf16`` or ``fp16-weights``."""
        from .packed_linear import changes_layers, linears_label

        changed = changes_layers(*self._models(), linears=self.linears_choice)
        return linears_label(changed, self.linears_choice, self.plain_targets.values())

    @property
    def stop_ids(self):
        """The end-of-sequence ids plain generation would stop at."""
        from .targets import stop_ids_of

        return stop_ids_of(self.tokenizer, self.target)

    def _models(self):
        return [*self.plain_targets.values(), self.target, *self.drafts]

    @contextlib.contextmanager
    def packed(self):
        """Within the block, every model of the pair multiplies as ``linears`` says (the layers are
        changed on entry and restored on exit); yields how many layers were changed. Inside an
        open block a second one changes nothing."""
        from .packed_linear import packed_for_speculation

        if self._packed:
            yield 0
            return
        with packed_for_speculation(*self._models(), linears=self.linears_choice) as count:
            self._packed = True
            try:
                yield count
            finally:
                self._packed = False

    def encode(self, prompt, chat=True):
        """Token ids [1, L] of ``prompt``, through the chat template where the tokenizer has one."""
        from .targets import encode_prompt

        if self.tokenizer is None:
            raise MfdHubError(f"target {self.name} has no tokenizer to encode the prompt")
        return encode_prompt(self.tokenizer, prompt, chat=chat)

    def generate(self, prompt_or_ids, chat=True, **kwargs):
        """``draft.spec_generate`` on the target (a SpecDecodingOutput), inside ``packed()``.
        A string is encoded first (``encode``); ``stop_token_ids`` defaults to ``stop_ids``; every
        other keyword is ``spec_generate``'s (method, tree_budget, max_new_tokens, temperature...)."""
        ids = self.encode(prompt_or_ids, chat=chat) if isinstance(prompt_or_ids, str) else prompt_or_ids
        kwargs.setdefault("stop_token_ids", self.stop_ids)
        with self.packed():
            return self.draft.spec_generate(self.target, ids, **kwargs)

    def decode(self, ids):
        """The text of token ids, special tokens left out."""
        if self.tokenizer is None:
            raise MfdHubError(f"target {self.name} has no tokenizer to decode with")
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)
