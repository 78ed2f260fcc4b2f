"""One command that answers the GPU questions: kernels, losslessness, host syncs, speed.

On one CUDA GPU, offline, in a few minutes; every model is built from a config with random
weights. Writes one JSON file (``--out``) and prints a table; exits 1 when an exactness or losslessness
check fails or any check could not run (speed and sync goals are only reported), 2 on bad
arguments (one ``error:`` line).

  kernels    every Triton kernel (``kernels/*_triton.py`` and the Triton half of
             ``tree_deltanet.py``) against its torch reference at the Qwen drafters' shapes
             (K = 8 modes, B up to 256, 15 positions, vocabularies 151,936 and 248,320) and at the
             edge cases of tests/test_kernels.py: bit for bit where the reference says so (top-k,
             trees, masks, accept walk, KV compaction), to rounding otherwise (mode attention,
             tree Gated-DeltaNet)
  lossless   ``spec_generate`` token-identical to greedy decoding (fp32, tiny random attention and
             hybrid Gated-DeltaNet targets, Triton and torch backends, chain/product/mixture), with
             a drafter trained here on the target's own greedy outputs so that rounds accept long
             runs and some reject (tau and rejecting rounds are checked)
  sync       host synchronisations per round on the Triton path (python-level reads everywhere; on
             CUDA also the CUDA runtime's synchronising calls, seen by the torch profiler)
  speed      tree build K = 8, B = 128 over the Qwen3 vocabulary (Triton vs the one-mode heap of
             benchmarks/tree_build.py); on a Qwen3-8B-shaped bf16 target with a 1K context: a
             decode step, verify at 16/64/128 nodes, and a speculative round split into stages
             (benchmarks/round_breakdown.py) with the share spent outside the target's forward

    python benchmarks/gpu_check.py                                  # on the GPU host
    python benchmarks/gpu_check.py --device cpu --quick --out x.json  # same code paths, small shapes

It runs from a checkout without ``pip install``: it maps ``mfd_hub`` (and ``kernels/`` as
``mfd_hub.kernels``) onto this repository itself. See the README's "GPU check" section.
"""

import argparse
import contextlib
import importlib.util
import json
import math
import os
import platform
import random
import re
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = Path(__file__).resolve().parent
SECTIONS = ("kernels", "lossless", "sync", "speed")
QWEN_VOCABS = (151_936, 248_320)  # Qwen3, Qwen3.5 / 3.6
METHODS = ("chain", "product", "mixture")


# ---- command line ---------------------------------------------------------------------------------
class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parse_args(argv):
    parser = _Parser(
        description=__doc__.splitlines()[0],
        epilog="examples:\n  python benchmarks/gpu_check.py --out gpu_check.json\n"
        "  python benchmarks/gpu_check.py --device cpu --quick --out /tmp/check.json\n"
        "  python benchmarks/gpu_check.py --sections kernels lossless",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (Triton runs in its interpreter)")
    parser.add_argument("--quick", action="store_true", help="small shapes (the CPU test's mode)")
    parser.add_argument("--out", default="gpu_check.json", help="the JSON report (default gpu_check.json)")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), metavar="NAME",
                        help=f"run only these of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--max-tree-entries", type=int, default=1024, metavar="N",
                        help="check Triton trees of modes x budget <= N only (default 1024, K = 8 at B = 128; "
                             "2048 adds K = 8 at B = 256, whose kernel takes many minutes to compile)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes that compile the large Triton tree kernels ahead, in parallel (CUDA, full "
                             "shapes; default: CPUs - 2, at most 12; 0: compile as the checks go)")
    args = parser.parse_args(argv)
    if args.device not in ("cuda", "cpu"):
        raise UsageError(f"--device must be cuda or cpu, not {args.device!r}")
    if args.device == "cpu" and not args.quick:
        raise UsageError("--device cpu needs --quick (the full shapes in triton's interpreter would take hours)")
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        raise UsageError(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads must be >= 1")
    if args.jobs is not None and args.jobs < 0:
        raise UsageError("--jobs must be >= 0")
    if args.max_tree_entries < 1:
        raise UsageError("--max-tree-entries must be >= 1")
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; give a file name")
    if not out.resolve().parent.is_dir():
        raise UsageError(f"--out {out}: folder {out.resolve().parent} does not exist")
    return args


# ---- bootstrap: the repository's own mfd_hub, with or without pip install -------------------------
def prepare_process(device):
    """Triton decides at decoration time whether kernels run in its interpreter: on CPU it must,
    on CUDA it must not. Then map the packages onto this checkout."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    map_repository_packages()
    if str(BENCHMARKS) not in sys.path:  # tree_build.py and round_breakdown.py, imported below
        sys.path.insert(0, str(BENCHMARKS))


def map_repository_packages():
    """``mfd_hub`` -> REPO/mfd_hub and ``mfd_hub.kernels`` -> REPO/kernels, the mapping that
    pyproject's package-dir makes at install time. The check always tests this checkout (an
    installed copy elsewhere is ignored) and never runs mfd_hub/__init__.py, which imports the
    checkpoint and Hub code this check does not need."""
    import types

    if "mfd_hub" in sys.modules:
        return
    package = types.ModuleType("mfd_hub")
    package.__path__ = [str(REPO / "mfd_hub")]
    package.__file__ = str(REPO / "mfd_hub" / "__init__.py")
    package.__spec__ = importlib.util.spec_from_file_location(
        "mfd_hub", package.__file__, submodule_search_locations=package.__path__
    )
    sys.modules["mfd_hub"] = package
    spec = importlib.util.spec_from_file_location(
        "mfd_hub.kernels", REPO / "kernels" / "__init__.py", submodule_search_locations=[str(REPO / "kernels")]
    )
    kernels = importlib.util.module_from_spec(spec)
    sys.modules["mfd_hub.kernels"] = kernels
    spec.loader.exec_module(kernels)
    package.kernels = kernels


# ---- the report -----------------------------------------------------------------------------------
EXACT, GOAL, INFO = "exact", "goal", "info"  # exactness (decides the exit code), goals, plain figures


class Report:
    def __init__(self, device, quick, compat):
        self.device, self.quick, self.compat = device, quick, compat
        self.checks = []
        self.section_seconds = {}

    def run(self, section, name, kind, goal, fn, unsupported_if=None):
        """Run one check: ``fn() -> (measured text, ok, value, details)``. An exception becomes an
        ``error`` (or ``unsupported`` when ``unsupported_if`` names why this environment cannot
        run it); goals off the full GPU shapes are ``n/a``."""
        started = time.perf_counter()
        try:
            measured, ok, value, details = fn()
            if kind == INFO:
                status = "info"
            elif kind == GOAL and (self.quick or self.device != "cuda") and ok is not None and section == "speed":
                status = "n/a"
            else:
                status = "pass" if ok else "fail"
        except Exception as error:  # report it and carry on with the other checks
            first = (str(error).strip().splitlines() or [""])[0][:300]
            measured, value = f"{type(error).__name__}: {first}", None
            details = {"traceback": traceback.format_exc().splitlines()[-12:]}
            status = "error"
            if unsupported_if:
                status = "unsupported"
                measured = f"{unsupported_if}; raised {measured}"
        if unsupported_if and status != "unsupported":
            details = {**(details or {}), "note": f"the compatibility probe expected problems: {unsupported_if}"}
        self.checks.append({
            "name": name, "section": section, "kind": kind, "goal": goal, "measured": measured,
            "value": value, "status": status,
            "passed": {"pass": True, "fail": False, "error": False, "unsupported": False}.get(status),
            "seconds": round(time.perf_counter() - started, 3), "details": details or {},
        })
        return self.checks[-1]


def exit_code(checks):
    """1 when an exactness check did not pass or any check could not run, else 0."""
    for check in checks:
        if check["status"] in ("error", "unsupported"):
            return 1
        if check["kind"] == EXACT and check["status"] != "pass":
            return 1
    return 0


# ---- environment -----------------------------------------------------------------------------------
def _version(module_name):
    try:
        module = __import__(module_name)
        return getattr(module, "__version__", "?")
    except Exception as error:  # absent or broken: say which
        return f"not importable ({type(error).__name__})"


def pinned_transformers():
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'"transformers\s*([^"]*)"', text)
    return match.group(1).strip() if match else None


def transformers_compat():
    """What mfd_hub.remote's verifiers rely on in transformers, probed without running a model.
    attention: targets_mfd.AttentionVerifier picks `cache=` or `past_key_values=` itself and needs
    DynamicCache.layers; hybrid: hybrid_mfd.HybridVerifier passes `cache=` to the model and its
    decoder layers and reads DynamicCache.get_conv_state / get_recurrent_state."""
    import inspect

    import transformers
    from transformers import DynamicCache, Qwen3ForCausalLM

    probes, problems = {}, {"attention": [], "hybrid": []}
    params = inspect.signature(Qwen3ForCausalLM.forward).parameters
    probes["cache_keyword"] = "cache" if "cache" in params else "past_key_values" if "past_key_values" in params else None
    probes["logits_to_keep"] = "logits_to_keep" in params
    if probes["cache_keyword"] is None:
        problems["attention"].append("Qwen3ForCausalLM.forward takes neither cache= nor past_key_values=")
    probes["dynamic_cache_layers"] = hasattr(DynamicCache(), "layers")
    if not probes["dynamic_cache_layers"]:
        problems["attention"].append("DynamicCache has no .layers")
    hybrid = getattr(transformers, "Qwen3_5ForCausalLM", None)
    probes["qwen3_5"] = hybrid is not None
    probes["qwen3_next"] = getattr(transformers, "Qwen3NextForCausalLM", None) is not None
    if hybrid is None:
        problems["hybrid"].append("transformers has no Qwen3_5ForCausalLM")
    else:
        from transformers.models.qwen3_5 import modeling_qwen3_5

        layer = getattr(modeling_qwen3_5, "Qwen3_5DecoderLayer", None)
        probes["hybrid_forward_cache_keyword"] = "cache" in inspect.signature(hybrid.forward).parameters
        layer_params = inspect.signature(layer.forward).parameters if layer is not None else {}
        probes["hybrid_layer_cache_keyword"] = "cache" in layer_params
        if not probes["hybrid_forward_cache_keyword"]:
            problems["hybrid"].append("Qwen3_5ForCausalLM.forward has no cache= (hybrid_mfd passes cache=)")
        if not probes["hybrid_layer_cache_keyword"]:
            problems["hybrid"].append("Qwen3_5DecoderLayer.forward has no cache= (hybrid_mfd passes cache=)")
    for name in ("get_conv_state", "get_recurrent_state"):
        probes[f"dynamic_cache_{name}"] = hasattr(DynamicCache, name)
        if not probes[f"dynamic_cache_{name}"]:
            problems["hybrid"].append(f"DynamicCache has no {name}")
    return {"probes": probes, "problems": problems}


def environment(device):
    import torch

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "huggingface_hub": _version("huggingface_hub"),
        "safetensors": _version("safetensors"),
        "tokenizers": _version("tokenizers"),
        "numpy": _version("numpy"),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
        "torch_threads": torch.get_num_threads(),
        "mfd_hub": {"loaded_from": str(Path(sys.modules["mfd_hub"].__path__[0]).resolve()),
                    "kernels_from": str(Path(sys.modules["mfd_hub.kernels"].__path__[0]).resolve()),
                    "git_commit": _git_commit()},
    }
    pinned = pinned_transformers()
    env["transformers_pinned"] = pinned
    try:
        from packaging.specifiers import SpecifierSet

        env["transformers_in_pinned_range"] = pinned is not None and SpecifierSet(pinned).contains(
            env["transformers"], prereleases=True)
    except Exception:  # packaging missing or an unparsable version
        env["transformers_in_pinned_range"] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                      "memory_gib": round(props.total_memory / 2**30, 1), "count": torch.cuda.device_count()}
    return env


def _git_commit():
    head = REPO / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            path = REPO / ".git" / ref[5:]
            if path.exists():
                return path.read_text().strip()
            packed = (REPO / ".git" / "packed-refs").read_text()
            match = re.search(rf"^([0-9a-f]{{40}}) {re.escape(ref[5:])}$", packed, re.M)
            return match.group(1) if match else None
        return ref
    except OSError:
        return None


# ---- shapes ----------------------------------------------------------------------------------------
def plan(quick, max_tree_entries=None):
    """Every size the check uses, full (the GPU) or quick (the CPU test: Triton's interpreter
    pays per operation, so the vocabularies there are tiny). Tree cases whose mode merge would
    sort more than ``max_tree_entries`` (modes x budget) entries are set aside in
    ``skipped_trees``: that one kernel's compile grows steeply (K = 8, B = 256: many minutes)."""
    shapes = _quick_plan() if quick else _full_plan()
    if max_tree_entries is not None:
        big = [t for t in shapes["trees"] if t[0] * t[1] > max_tree_entries and t[4] != "fallback"]
        shapes["trees"] = [t for t in shapes["trees"] if t not in big]
        shapes["skipped_trees"] = big
    return shapes


def _quick_plan():
    return dict(
        candidates=[(1, 1, 2, 1, "normal", "float32"), (3, 4, 7, 5, "ties", "float32"),
                    (2, 3, 16, 16, "ties", "float32"), (2, 2, 9, 40, "normal", "float32"),
                    (1, 1, 130, 4, "inf", "float32"), (2, 3, 16, 8, "drafter", "bfloat16")],
        trees=[(5, 1, 6, 1, "normal"), (1, 3, 4, 5, "normal"), (16, 2, 3, 16, "drafter"),
               (8, 2, 3, 16, "shared"), (300, 2, 3, 5, "fallback")],
        random_tree_sizes=(1, 2, 9, 33), chains=(1, 7), bias_prefixes=(5,),
        kv=[dict(layers=3, heads=3, prefix=5, rows=9, head_dim=6, dtype="float32")],
        mode_attention=[(2, 2, 2, 2, 1, 8, 16, 0, "float32", False), (1, 2, 1, 3, 2, 5, 12, 70, "float32", True),
                        (1, 4, 2, 1, 2, 4, 16, 9, "bfloat16", True)],
        deltanet=[dict(tree="random", nodes=9, hk=1, hv=2, dk=8, dv=12, width=4, decay=2.0, tol=1e-5)],
        # the interpreter runs a round in about a second: Triton decodes fewer methods here
        lossless=dict(families=("qwen3", "qwen3_5_text"), vocab=32, hidden=32, layers=4, init_std=0.2,
                      hybrid_target=dict(num_layers=2, layer_types=["linear_attention", "full_attention"],
                                         linear_num_key_heads=1, linear_num_value_heads=2),
                      triton_methods=dict(attention=("chain", "mixture"), hybrid=("mixture",)),
                      sync_families=("qwen3", "qwen3_5_text"), profile_tokens=12,
                      modes=2, draft_layers=1, block=8, budgets=dict(chain=8, product=8, mixture=8),
                      new_tokens=12, prompts=1, prompt_len=6, train_seqs=16, train_steps=100,
                      anchors=8, lr=3e-3, min_tau=1.5),
        tree_speed=dict(vocab=16, positions=3, modes=2, budget=8, repeats=1),
        qwen=dict(vocab=256, hidden=64, intermediate=128, layers=4, heads=4, kv_heads=2, head_dim=16,
                  draft_layers=1, taps=[0, 1, 2], mask_id=255, context=32, decode_steps=4,
                  verify_budgets=(4, 8, 16), repeats=2, round_tokens=12, anchors={},
                  rounds=(("chain", 15), ("product", 16), ("mixture", 16))),
    )


def _full_plan():
    candidates = [(1, 1, 2, 1, "normal", "float32"), (3, 4, 7, 5, "ties", "float32"),
                  (2, 3, 16, 16, "ties", "float32"), (2, 2, 9, 40, "normal", "float32"),
                  (1, 5, 300, 33, "inf", "float32"), (2, 1, 4100, 3, "ties", "float32")]
    for vocab in QWEN_VOCABS:
        candidates += [(8, 15, vocab, b, "drafter", "bfloat16") for b in (64, 128, 256)]
        candidates += [(1, 15, vocab, 128, "drafter", "bfloat16"), (1, 15, vocab, 1, "drafter", "bfloat16")]
    candidates += [(8, 15, QWEN_VOCABS[0], 128, "drafter", "float32"), (8, 15, QWEN_VOCABS[0], 128, "ties", "bfloat16"),
                   (8, 15, QWEN_VOCABS[1], 64, "inf", "bfloat16"), (8, 3, QWEN_VOCABS[0], 128, "drafter", "bfloat16")]
    trees = [(128, 2, 3, 6, "normal"), (32, 8, 2, 40, "shared"), (1, 3, 4, 5, "normal"), (5, 1, 6, 1, "normal"),
             (300, 2, 3, 5, "fallback")]
    for vocab in QWEN_VOCABS:
        trees += [(b, m, 15, vocab, "drafter") for m, b in ((8, 64), (8, 128), (1, 128), (1, 256))]
    trees += [(128, 8, 3, QWEN_VOCABS[0], "drafter"), (128, 8, 15, QWEN_VOCABS[0], "shared"),
              (128, 8, 15, QWEN_VOCABS[0], "ties")]
    trees += [(256, 8, 15, vocab, "drafter") for vocab in QWEN_VOCABS]  # last: the longest compile
    return dict(
        candidates=candidates, trees=trees,
        random_tree_sizes=(1, 2, 9, 33, 129, 257), chains=(1, 7, 16), bias_prefixes=(1, 1024),
        kv=[dict(layers=3, heads=3, prefix=5, rows=9, head_dim=6, dtype="float32"),
            dict(layers=36, heads=8, prefix=1024, rows=129, head_dim=128, dtype="bfloat16"),
            dict(layers=8, heads=4, prefix=100, rows=33, head_dim=128, dtype="float16")],
        mode_attention=[(1, 4, 2, 1, 3, 4, 8, 5, "float32", False), (2, 2, 2, 2, 1, 8, 16, 0, "float32", False),
                        (1, 2, 1, 3, 2, 5, 12, 70, "float32", False),
                        (1, 32, 8, 1, 8, 16, 128, 1024, "bfloat16", True), (1, 32, 8, 1, 8, 16, 128, 1024, "float32", True),
                        (1, 32, 8, 1, 1, 16, 128, 1024, "bfloat16", True), (1, 32, 8, 1, 8, 16, 128, 1, "bfloat16", False),
                        (1, 40, 8, 1, 8, 16, 128, 3000, "bfloat16", True)],
        deltanet=[dict(tree="built", hk=16, hv=32, dk=128, dv=128, width=4, decay=2.0, tol=1e-4),
                  dict(tree="chain", hk=16, hv=32, dk=128, dv=128, width=4, decay=40.0, tol=1e-4),
                  dict(tree="random", nodes=20, hk=2, hv=6, dk=5, dv=7, width=4, decay=2.0, tol=1e-5)],
        lossless=dict(families=("qwen3", "llama", "qwen3_5_text", "qwen3_next"), vocab=256, hidden=64, layers=4,
                      init_std=0.2, triton_methods=dict(attention=METHODS, hybrid=METHODS), modes=4,
                      # MoE targets (qwen3_next) read the device in their own routing, in plain decoding too
                      sync_families=("qwen3", "llama", "qwen3_5_text"), profile_tokens=32,
                      draft_layers=2, block=16, budgets=dict(chain=16, product=32, mixture=32),
                      new_tokens=64, prompts=2, prompt_len=8, train_seqs=16, train_steps=150, anchors=16,
                      lr=2e-3, min_tau=2.0),
        tree_speed=dict(vocab=QWEN_VOCABS[0], positions=15, modes=8, budget=128, repeats=50),
        qwen=dict(vocab=151_936, hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, head_dim=128,
                  draft_layers=5, taps=[1, 9, 17, 25, 33], mask_id=151_669, context=1024, decode_steps=32,
                  verify_budgets=(16, 64, 128), repeats=20, round_tokens=64,
                  anchors={"decode": 28.9, 64: 28.7, 128: 33.1},  # DESIGN §4: H200, eager, ms
                  rounds=(("chain", 15), ("product", 128), ("mixture", 128))),
    )


# ---- small helpers -------------------------------------------------------------------------------
def dtype_of(name):
    import torch

    return getattr(torch, name)


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def kernel_backend(name):
    from mfd_hub.kernels.backend import set_kernel_backend

    previous = set_kernel_backend(name)
    try:
        yield
    finally:
        set_kernel_backend(previous)


@contextlib.contextmanager
def default_dtype(dtype):
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def median_ms(fn, repeats, device, warmup=2, after=None):
    """Median wall time of ``fn`` in ms (synchronised on CUDA); ``after`` runs untimed."""
    import statistics

    samples = []
    for i in range(repeats + warmup):
        sync(device)
        started = time.perf_counter()
        fn()
        sync(device)
        if i >= warmup:
            samples.append((time.perf_counter() - started) * 1e3)
        if after is not None:
            after()
    return statistics.median(samples)


def max_error(got, want):
    diff = (got.double() - want.double()).abs()
    return float(diff.max()) if diff.numel() else 0.0


# ---- compiling ahead ------------------------------------------------------------------------------
def warm_configs(shapes):
    """Every (modes, positions, vocab, k, dtype, with a tree) that this run sends through the Triton
    top-k and tree kernels at a large tile: the Qwen-shaped kernel cases, and generation's
    configurations at every depth 1..15 (a round near max_new_tokens drafts fewer positions, and
    each depth class is another compile; the largest take minutes on one core)."""
    configs = set()
    for m, length, vocab, k, kind, dt in shapes["candidates"]:
        if vocab > 4100:
            configs.add((m, length, vocab, k, dt, False))
    for budget, m, length, vocab, kind in shapes["trees"]:
        if vocab > 4100:
            configs.add((m, length, vocab, budget, "bfloat16", True))
    loss, qwen = shapes["lossless"], shapes["qwen"]
    for depth in range(1, 16):
        for vocab, dt, budgets, modes in ((loss["vocab"], "float32", loss["budgets"], loss["modes"]),
                                          (qwen["vocab"], "bfloat16", dict(qwen["rounds"]), 8)):
            configs.add((0, depth, vocab, 1, dt, False))  # chain: one mode's top-1, [depth, V]
            configs.add((1, depth, vocab, budgets["product"], dt, True))
            configs.add((modes, depth, vocab, budgets["mixture"], dt, True))
    configs.add((8, 15, shapes["tree_speed"]["vocab"], shapes["tree_speed"]["budget"], "bfloat16", True))
    # Both Qwen vocabularies give the same kernels (the tree kernels never see V; the top-k sees
    # only multiples of 16): one of them is enough. The biggest first: they decide the wall time.
    # Depths compile alike when their padded sizes agree (positions and path words rounded up to
    # powers of two; row counts of 1 or multiples of 16 are specialised), so one depth per class.
    unique = {}
    for m, length, vocab, k, dt, tree in sorted(configs, key=lambda c: (-c[5], c)):
        vocab = vocab if vocab < QWEN_VOCABS[0] else QWEN_VOCABS[0]
        rows = max(m, 1) * length
        key = (m, vocab, k, dt, 1 << (length - 1).bit_length(), 1 << ((length + 2) // 3 - 1).bit_length(),
               length == 1, rows == 1, rows % 16 == 0)
        if key not in unique:
            unique[key] = (m, length, vocab, k, dt, tree)
    return sorted(unique.values(), key=lambda c: (-(max(c[0], 1) * c[3] * c[5]), -c[3], c))


def warm_one(config, device="cuda"):
    """In a worker process: run the top-k (and tree) kernels once at ``config`` so that Triton's
    on-disk cache holds them -> seconds taken."""
    started = time.perf_counter()
    prepare_process(device)
    import torch

    from mfd_hub.kernels.backend import set_kernel_backend
    from mfd_hub.kernels.tree_build import draft_candidates, draft_tree

    set_kernel_backend("triton")
    m, length, vocab, k, dt, tree = config
    shape = (length, vocab) if m == 0 else (m, length, vocab)
    with torch.inference_mode():
        logits = torch.randn(*shape, device=device).to(dtype_of(dt))
        scores, ids = draft_candidates(logits, k)
        if tree:
            draft_tree(scores, ids, k, 0, vocab)
        sync(torch.device(device))
    return time.perf_counter() - started


class WarmPool:
    """Compiles the large Triton kernels in ``jobs`` processes, in the background (a fresh GPU host
    has no cache: one by one they would take most of the run). The run meanwhile checks what
    needs only small kernels, then ``wait``s. Failures only cost time: a check compiles whatever
    is missing itself."""

    def __init__(self, configs, jobs, device="cuda"):
        import concurrent.futures as futures
        import multiprocessing

        self.started = time.perf_counter()
        self.configs, self.jobs = configs, jobs
        self.pool = futures.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
        self.pending = {self.pool.submit(warm_one, c, device): c for c in configs}

    def wait(self, limit_s, only=None):
        """Wait until the configs that ``only(config)`` selects (default: all) are compiled, or
        until ``limit_s`` after the start -> what has happened so far."""
        import concurrent.futures as futures

        chosen = [f for f, c in self.pending.items() if only is None or only(c)]
        left = max(0.0, limit_s - (time.perf_counter() - self.started))
        _, late = futures.wait(chosen, timeout=left)
        seconds, problems = {}, []
        for future, config in self.pending.items():
            if future.done() and not future.cancelled():
                error = future.exception()
                if error is None:
                    seconds[str(config)] = round(future.result(), 1)
                else:
                    problems.append(f"{config}: {type(error).__name__}: {str(error)[:200]}")
        if late:
            problems.append(f"{len(late)} still compiling {limit_s} s after the start: the checks compile them")
        slowest = dict(sorted(seconds.items(), key=lambda kv: -kv[1])[:10])
        return {"configs": len(self.configs), "compiled": len(seconds), "jobs": self.jobs,
                "seconds": time.perf_counter() - self.started, "slowest_seconds": slowest, "problems": problems[:20]}

    def close(self):
        processes = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # a compile still running would hold the exit
            if process.is_alive():
                process.terminate()


# ---- kernels ---------------------------------------------------------------------------------------
def kernel_logits(m, length, vocab, kind, seed, device, dtype):
    """Logits [m, length, vocab] of one kind: drafter-like (benchmarks/tree_build.py), normal,
    ties (small integers: quantised ties across every cut), inf (every 7th token impossible),
    shared (every mode the same drafter-like distribution)."""
    import torch
    import tree_build as tree_bench

    g = torch.Generator().manual_seed(seed)
    if kind in ("drafter", "shared"):
        logits = tree_bench.synthetic_logits(m, seed=seed, vocab=vocab, positions=length)
        if kind == "shared":
            logits[:] = logits[0]
    elif kind == "ties":
        logits = torch.randint(-2, 2, (m, length, vocab), generator=g).float()
    else:
        logits = torch.randn(m, length, vocab, generator=g) * (4 if kind in ("normal", "inf") else 2)
        if kind == "inf":
            logits[..., ::7] = float("-inf")
    return logits.to(device=device, dtype=dtype_of(dtype))


def run_kernel_checks(report, device, shapes):
    import torch

    with torch.inference_mode(), kernel_backend("triton"):
        try:
            check_kernels(report, device, shapes, [])
        except Exception as error:  # e.g. no triton: one record says so
            def failed(error=error):
                raise error

            report.run("kernels", "kernels", EXACT, "every Triton kernel == its reference", failed)


def check_kernels(report, device, shapes, pool):
    from mfd_hub.testing import chain_tree, random_tree
    import torch

    from mfd_hub.kernels import backend
    from mfd_hub.kernels.accept import accept_walk, accept_walk_reference
    from mfd_hub.kernels.kv_compact import compact_kv, compact_kv_reference
    from mfd_hub.kernels.mode_attention import mode_attention, mode_attention_reference
    from mfd_hub.kernels.tree_attention import (
        ancestor_mask,
        ancestor_mask_reference,
        verify_attention_bias,
        verify_attention_bias_reference,
    )
    from mfd_hub.kernels.tree_build import (
        build_mixture_tree,
        draft_candidates,
        draft_tree,
        log_normaliser,
        top_candidates,
    )
    from mfd_hub.kernels.tree_build_triton import candidates_kernel_supports, tree_kernel_supports

    if backend.triton is None:
        raise RuntimeError("triton is not installed: the Triton kernels cannot be checked")
    if not backend.use_triton(torch.zeros(1, device=device)):
        raise RuntimeError("the Triton backend is not active: the kernels would be compared with themselves")
    section = "kernels"

    def candidates():
        rows, first_call = [], {}
        for i, (m, length, vocab, k, kind, dt) in enumerate(shapes["candidates"]):
            logits = kernel_logits(m, length, vocab, kind, 100 + i, device, dt)
            want = top_candidates(logits, k, log_normaliser(logits))
            started = time.perf_counter()
            got = draft_candidates(logits, k)
            sync(device)
            first_call[f"{m}x{length}x{vocab} k={k} {dt}"] = round(time.perf_counter() - started, 3)
            equal = torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            rows.append({"modes": m, "positions": length, "vocab": vocab, "k": k, "logits": kind, "dtype": dt,
                         "triton": candidates_kernel_supports(vocab), "equal": equal})
        good = sum(r["equal"] and r["triton"] for r in rows)
        return (f"{good}/{len(rows)} cases equal (scores and ids)", good == len(rows), good,
                {"cases": rows, "first_call_seconds": first_call})

    report.run(section, "kernels.vocab_topk", EXACT, "tree_build_triton top-k == top_candidates, bit for bit", candidates)

    def trees():
        rows = []
        for i, (budget, m, length, vocab, kind) in enumerate(shapes["trees"]):
            logits = kernel_logits(m, length, vocab, "normal" if kind == "fallback" else kind, 200 + i, device, "float32")
            scores, ids = top_candidates(logits, budget, log_normaliser(logits))
            want = build_mixture_tree(scores.cpu(), ids.cpu(), budget, anchor=3)
            got = draft_tree(scores, ids, budget, 3, vocab)
            fields = ("tokens", "parents", "depths", "scores", "modes")
            equal = all(torch.equal(getattr(got, f).cpu(), getattr(want, f)) for f in fields)
            uses_kernel = tree_kernel_supports(m, length, budget, vocab)
            rows.append({"budget": budget, "modes": m, "positions": length, "vocab": vocab, "logits": kind,
                         "nodes": got.num_nodes, "triton": uses_kernel, "equal": equal})
            if uses_kernel and got.num_nodes >= 8:
                pool.append((got.tokens, got.parents, got.depths))
        good = sum(r["equal"] and (r["triton"] or r["logits"] == "fallback") for r in rows)
        measured = f"{good}/{len(rows)} trees equal (tokens, parents, depths, scores, modes)"
        skipped = [{"budget": t[0], "modes": t[1], "positions": t[2], "vocab": t[3]}
                   for t in shapes.get("skipped_trees", [])]
        if skipped:
            shown = sorted({f"K = {t['modes']}, B = {t['budget']}" for t in skipped})
            needed = max(t["modes"] * t["budget"] for t in skipped)
            measured += f"; not run: {', '.join(shown)} (--max-tree-entries {needed})"
        return measured, good == len(rows), good, {"cases": rows, "skipped": skipped}

    report.run(section, "kernels.tree_build", EXACT, "draft_tree (Triton) == build_mixture_tree, bit for bit", trees)

    rng = random.Random(0)
    shaped = [random_tree(rng, n) for n in shapes["random_tree_sizes"]] + [chain_tree(n) for n in shapes["chains"]]
    # drafted-shaped trees: depth <= 15, from the tree build above (or random when it did not run)
    drafted = list(pool) or [random_tree(rng, 17, max_depth=15)]
    deepest = max(drafted, key=lambda t: (int(t[2].max()), t[0].shape[0]))  # the Qwen-shaped tree
    all_trees = shaped + drafted

    def masks():
        rows = []
        for tokens, parents, depths in all_trees:
            parents_d = parents.to(device)
            mask = ancestor_mask(parents_d, int(depths.max()))
            mask_ok = torch.equal(mask, ancestor_mask_reference(parents_d))
            bias_ok = True
            for dt in ("float32", "bfloat16", "float16"):
                for prefix in shapes["bias_prefixes"]:
                    bias = verify_attention_bias(mask, prefix, dtype_of(dt))
                    want = verify_attention_bias_reference(mask, prefix, dtype_of(dt))
                    bias_ok &= bias.dtype == want.dtype and torch.equal(bias, want)
            rows.append({"nodes": parents.shape[0], "depth": int(depths.max()), "mask": mask_ok, "bias": bias_ok})
        good = sum(r["mask"] and r["bias"] for r in rows)
        return (f"{good}/{len(rows)} trees: mask and bias equal (fp32/bf16/fp16)", good == len(rows), good,
                {"cases": rows})

    report.run(section, "kernels.tree_attention", EXACT, "ancestor mask and verify bias == reference, bit for bit", masks)

    def accept():
        rows = []
        for tokens, parents, depths in all_trees:
            n = tokens.shape[0]
            t_list, p_list = tokens.tolist(), parents.tolist()
            # along a random root-to-leaf path the target agrees: deep accepts with branches
            leaf = rng.randrange(n)
            along = torch.tensor([rng.randrange(3) for _ in range(n)])
            node = leaf
            while p_list[node] >= 0:
                along[p_list[node]] = t_list[node]
                node = p_list[node]
            targets = (torch.tensor([rng.randrange(3) for _ in range(n)]), torch.roll(tokens, -1), along)
            for target in targets:
                for extra in (0, 2):
                    max_depth = int(depths.max()) + extra
                    args = [x.to(device) for x in (tokens, parents, depths, target)]
                    path, info = accept_walk(*args, max_depth)
                    want_path, want_info = accept_walk_reference(*args, max_depth)
                    y, brute = target.tolist(), [0]
                    for i in range(1, n):
                        if p_list[i] == brute[-1] and t_list[i] == y[p_list[i]]:
                            brute.append(i)
                    ok = torch.equal(path, want_path) and torch.equal(info, want_info)
                    ok &= path[: len(brute)].tolist() == brute and info.tolist() == [
                        len(brute), int(brute == list(range(len(brute)))), y[brute[-1]]]
                    rows.append({"nodes": n, "max_depth": max_depth, "accepted": len(brute), "equal": ok})
        good = sum(r["equal"] for r in rows)
        return (f"{good}/{len(rows)} walks equal (path, info; brute force too)", good == len(rows), good,
                {"cases": rows, "deepest_accept": max(r["accepted"] for r in rows)})

    report.run(section, "kernels.accept_walk", EXACT, "accept walk (Triton) == reference == brute force", accept)

    def kv():
        rows = []
        for spec in shapes["kv"]:
            dt = dtype_of(spec["dtype"])
            rows_n = spec["rows"]
            tree = next((t for t in drafted if t[0].shape[0] <= rows_n), None) or random_tree(rng, rows_n, max_depth=15)
            # accepted paths: the root alone, the spine, a root-to-node path of a drafted tree
            p_list = tree[1].tolist()
            node, branchy = len(p_list) - 1, []
            while node >= 0:
                branchy.append(node)
                node = p_list[node]
            paths = [[0], list(range(min(16, rows_n))), branchy[::-1], [0, 2, 5][: max(1, min(3, rows_n - 4))]]
            for path in paths:
                if max(path) >= rows_n:
                    continue
                path_d = torch.tensor(path, device=device)
                g = torch.Generator().manual_seed(len(path))
                tensors = [torch.randn(1, spec["heads"], spec["prefix"] + rows_n, spec["head_dim"], generator=g)
                           .to(device=device, dtype=dt) for _ in range(2 * spec["layers"])]
                before = [t.clone() for t in tensors]
                want = [t.clone() for t in compact_kv_reference(before, spec["prefix"], path_d)]
                got = compact_kv(tensors, spec["prefix"], path_d)
                ok = all(torch.equal(a, b) for a, b in zip(got, want))
                spine = path == list(range(len(path)))
                if spine:  # nothing moves
                    ok &= all(torch.equal(a, b) for a, b in zip(tensors, before))
                rows.append({**spec, "path_length": len(path), "spine": spine, "equal": ok})
        good = sum(r["equal"] for r in rows)
        return (f"{good}/{len(rows)} compactions equal", good == len(rows), good, {"cases": rows})

    report.run(section, "kernels.kv_compact", EXACT, "KV compaction (Triton, in place) == reference, bit for bit", kv)

    def modes():
        rows = []
        for i, (b, hq, hkv, n, m, s, d, c, dt, permuted) in enumerate(shapes["mode_attention"]):
            g = torch.Generator().manual_seed(300 + i)
            dtype = dtype_of(dt)

            def block():
                if permuted:  # the drafter's layout: [B, N, M, S, H, D] permuted to [B, H, N, M, S, D]
                    return torch.randn(b, n, m, s, hq, d, generator=g).to(device, dtype).permute(0, 4, 1, 2, 3, 5)
                return torch.randn(b, hq, n, m, s, d, generator=g).to(device, dtype)

            def block_kv():
                if permuted:
                    return torch.randn(b, n, m, s, hkv, d, generator=g).to(device, dtype).permute(0, 4, 1, 2, 3, 5)
                return torch.randn(b, hkv, n, m, s, d, generator=g).to(device, dtype)

            q, k_blk, v_blk = block(), block_kv(), block_kv()
            k_ctx, v_ctx = (torch.randn(b, hkv, c, d, generator=g).to(device, dtype) for _ in range(2))
            ctx_visible = (torch.rand(b, n, 1, c, generator=g) < 0.6).to(device)
            steps = torch.arange(s, device=device)
            causal = steps[:, None] >= steps[None, :]
            band = (steps[:, None] - steps[None, :]).abs() < 4  # a sliding window inside the block
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            for label, cv, bv in (("all", None, None), ("ctx", ctx_visible, None), ("ctx+causal", ctx_visible, causal),
                                  ("ctx+band", ctx_visible, band & causal)):
                want = mode_attention_reference(q, k_ctx, v_ctx, k_blk, v_blk, cv, bv, 0.3)
                got = mode_attention(q, k_ctx, v_ctx, k_blk, v_blk, cv, bv, 0.3)
                err = max_error(got, want)
                close = got.dtype == dtype and bool(torch.isclose(got.float(), want.float(), rtol=tol, atol=tol).all())
                rows.append({"shape": [b, hq, hkv, n, m, s, d, c], "dtype": dt, "masks": label,
                             "permuted": permuted, "max_abs_error": err, "tolerance": tol, "close": close})
        good = sum(r["close"] for r in rows)
        worst = {dt: max((r["max_abs_error"] for r in rows if r["dtype"] == dt), default=0.0)
                 for dt in ("float32", "bfloat16")}
        measured = (f"{good}/{len(rows)} within tolerance; max |err| fp32 {worst['float32']:.1e}, "
                    f"bf16 {worst['bfloat16']:.1e}")
        return measured, good == len(rows), good, {"cases": rows}

    report.run(section, "kernels.mode_attention", EXACT,
               "mode attention (Triton) == reference: fp32 to 1e-5, bf16 to rounding (2e-2)", modes)

    def deltanet():
        from mfd_hub.kernels import tree_deltanet as td

        rows = []
        for i, spec in enumerate(shapes["deltanet"]):
            if spec["tree"] == "random":
                tokens, parents, depths = random_tree(random.Random(i), spec["nodes"], max_depth=15)
            else:  # the deepest drafted tree, or a 16-node chain
                tokens, parents, depths = deepest if spec["tree"] == "built" else chain_tree(16)
            n = parents.shape[0]
            g = torch.Generator().manual_seed(400 + i)

            def rand(*shape):
                return torch.randn(*shape, generator=g).to(device)

            hk, hv, dk, dv, width = spec["hk"], spec["hv"], spec["dk"], spec["dv"], spec["width"]
            channels = 2 * hk * dk + hv * dv
            layout = td.tree_layout(depths.to(device), ancestor_mask(parents.to(device)), width)
            q, k, v, gates, beta = td.delta_rule_inputs(
                rand(n, hk, dk), rand(n, hk, dk), rand(n, hv, dv),
                (-torch.rand(n, hv, generator=g) * spec["decay"]).to(device), torch.rand(n, hv, generator=g).to(device))
            state = rand(hv, dk, dv)
            tol = spec["tol"]
            errors = {}
            ref = td.tree_delta_rule(q, k, v, gates, beta, state, layout, backend="torch")
            tri = td.tree_delta_rule(q, k, v, gates, beta, state, layout, backend="triton")
            errors["delta_rule"] = (max_error(tri, ref), bool(torch.isclose(tri, ref, rtol=tol, atol=tol).all()))
            worst_state, states_ok = 0.0, True
            for node in sorted({0, n // 2, n - 1, int(depths.argmax())}):
                a = td.node_state(k, v, gates, beta, state, layout, node, backend="triton")
                b = td.node_state(k, v, gates, beta, state, layout, node, backend="torch")
                worst_state = max(worst_state, max_error(a, b))
                states_ok &= bool(torch.isclose(a, b, rtol=tol, atol=tol).all())
            errors["node_state"] = (worst_state, states_ok)
            for dt in ("float32", "bfloat16"):
                x = rand(n, channels).to(dtype_of(dt))
                conv_state, weight = rand(width - 1, channels).to(dtype_of(dt)), rand(channels, width)
                a = td.tree_causal_conv(x, conv_state, weight, layout, backend="triton")
                b = td.tree_causal_conv(x, conv_state, weight, layout, backend="torch")
                errors[f"conv_{dt}"] = (max_error(a, b), bool(torch.isclose(a, b, rtol=1e-5, atol=1e-5).all()))
            ok = all(flag for _, flag in errors.values())
            rows.append({**spec, "nodes": n, "channels": channels, "ok": ok,
                         "max_abs_error": {key: err for key, (err, _) in errors.items()}})
        good = sum(r["ok"] for r in rows)
        worst = max(max(r["max_abs_error"].values()) for r in rows)
        return (f"{good}/{len(rows)} within tolerance; max |err| {worst:.1e}", good == len(rows), good, {"cases": rows})

    report.run(section, "kernels.tree_deltanet", EXACT,
               "tree conv, delta rule and node state (Triton) == torch, fp32 to 1e-5 (1e-4 at Qwen3.5 shapes)", deltanet)


# ---- lossless generation, and host syncs per round -----------------------------------------------
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
        why = f"transformers {_version('transformers')}: " + "; ".join(problems) if problems else None
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


# ---- speed ----------------------------------------------------------------------------------------
def check_speed(report, device, shapes):
    import torch

    with torch.inference_mode():
        speed_checks(report, device, shapes)


def speed_checks(report, device, shapes):
    import torch

    import tree_build as tree_bench
    from mfd_hub.timing import round_robin_ms
    from mfd_hub.kernels.tree_build import draft_candidates, draft_tree

    spec = shapes["tree_speed"]
    vocab, budget, modes = spec["vocab"], spec["budget"], spec["modes"]

    def tree():
        logits = tree_bench.synthetic_logits(modes, device=device, vocab=vocab, positions=spec["positions"])
        heap_logits = logits[0]
        values, heap_ids = tree_bench.heap_vocab(heap_logits, budget)
        low = logits.to(torch.bfloat16)
        with kernel_backend("triton"):
            scores, ids = draft_candidates(low, budget)
            t_heap_vocab, t_heap, t_vocab, t_tree = round_robin_ms([
                lambda: tree_bench.heap_vocab(heap_logits, budget),
                lambda: tree_bench.heap_build(values, heap_ids, budget),
                lambda: draft_candidates(low, budget),
                lambda: draft_tree(scores, ids, budget, 0, vocab),
            ], spec["repeats"], device)
        total, heap_total = t_vocab + t_tree, t_heap_vocab + t_heap
        details = {"triton_vocab_topk_ms": t_vocab, "triton_tree_ms": t_tree, "triton_total_ms": total,
                   "heap1_vocab_ms": t_heap_vocab, "heap1_build_ms": t_heap, "heap1_total_ms": heap_total,
                   "speedup_vs_heap1": heap_total / total, "modes": modes, "budget": budget, "vocab": vocab,
                   "positions": spec["positions"], "paper_ms": 0.35}
        measured = (f"{total:.3f} ms (top-k {t_vocab:.3f} + tree {t_tree:.3f}); heap, 1 mode: {heap_total:.3f} ms "
                    f"({heap_total / total:.1f}x)")
        return measured, total <= 0.1, total, details

    report.run("speed", f"speed.tree_build.k{modes}_b{budget}", GOAL,
               "Triton top-k + tree <= 0.1 ms a round (paper: 0.35 ms)", tree)

    qwen = shapes["qwen"]
    state = {}

    def build():
        target, drafter = qwen3_8b_shaped(device, qwen)
        g = torch.Generator().manual_seed(0)
        state.update(target=target, drafter=drafter,
                     ids=torch.randint(0, qwen["vocab"] - 1, (1, qwen["context"]), generator=g).to(device))
        params = sum(p.numel() for p in target.parameters())
        draft_params = sum(p.numel() for p in drafter.parameters())
        return (f"target {params / 1e6:,.1f}M parameters ({str(next(target.parameters()).dtype)[6:]}), drafter "
                f"{draft_params / 1e6:,.1f}M, context {qwen['context']} tokens", True, params / 1e9,
                {"config": {k: v for k, v in qwen.items() if k != "rounds"}, "target_parameters": params,
                 "drafter_parameters": draft_params})

    made = report.run("speed", "speed.qwen3_8b_shape.build", INFO, "Qwen3-8B-shaped target (random weights)", build)
    if made["status"] != "info":
        return
    target, drafter, ids = state["target"], state["drafter"], state["ids"]
    decode_ms = {}

    anchors = qwen["anchors"]

    def decode():
        decode_ms["ms"] = plain_decode_step_ms(target, ids, qwen["decode_steps"], device)
        note = f" (H200 anchor: {anchors['decode']} ms)" if "decode" in anchors else ""
        return f"{decode_ms['ms']:.2f} ms a token{note}", True, decode_ms["ms"], {"anchor_ms": anchors.get("decode")}

    report.run("speed", "speed.decode_step", INFO,
               f"plain greedy step after {qwen['context']} tokens (for the ratios below)", decode)

    for budget in qwen["verify_budgets"]:
        def verify(budget=budget):
            ms = verify_ms(target, drafter, ids, budget, qwen["repeats"], device)
            ratio = ms / decode_ms["ms"] if decode_ms.get("ms") else float("nan")
            anchor = anchors.get(budget)
            note = f" (H200 anchor {anchor} ms)" if anchor else ""
            return (f"{ms:.2f} ms for {budget + 1} tokens = {ratio:.2f}x a decode step{note}", True, ms,
                    {"tokens": budget + 1, "ratio_to_decode_step": ratio, "anchor_ms": anchor})

        report.run("speed", f"speed.verify_{budget}", INFO, "one verify pass over root + B tree nodes", verify)

    import round_breakdown

    for method, budget in qwen["rounds"]:
        def one_round(method=method, budget=budget):
            m = round_breakdown.measure_rounds(drafter, target, ids, method, budget, qwen["round_tokens"], device)
            out = drafter.spec_generate(target, ids, max_new_tokens=qwen["round_tokens"], method=method,
                                        tree_budget=budget, mode=0)
            plain = 1e3 * (out.seconds - out.stage_seconds["prefill"]) / out.rounds
            parts = ", ".join(f"{p} {v:.2f}" for p, v in m["parts"].items() if v >= 0.005)
            measured = (f"{m['outside']:.1%} outside the target ({m['round_ms']:.2f} ms a round instrumented, "
                        f"{plain:.2f} ms plain; {parts})")
            return measured, m["outside"] <= 0.10, m["outside"], {**m, "plain_round_ms": plain, "budget": budget,
                                                                   "tokens": qwen["round_tokens"]}

        report.run("speed", f"speed.round.{method}_b{budget}", GOAL,
                   f"share of a round outside the target's forward <= 10% (untrained drafter, {qwen['context']}-token "
                   "context)", one_round)
    state.clear()
    del target, drafter
    if device.type == "cuda":
        torch.cuda.empty_cache()


def qwen3_8b_shaped(device, cfg):
    """A transformers Qwen3 target and an 8-mode, 5-layer drafter of the published shapes
    (DESIGN §3), random weights, built directly on ``device`` (bf16 on CUDA, fp32 on CPU)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from mfd_hub.remote.modeling_mfd import DFlashDraftModel
    from mfd_hub.testing import drafter_config_for

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = Qwen3Config(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["intermediate"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
        head_dim=cfg["head_dim"], max_position_embeddings=4096, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    with default_dtype(dtype), torch.device(device):
        target = Qwen3ForCausalLM(config).eval()
        draft_config = drafter_config_for(
            target, num_modes=8, num_layers=cfg["draft_layers"], block_size=16, target_layer_ids=cfg["taps"],
            intermediate_size=cfg["intermediate"], num_attention_heads=cfg["heads"],
            num_key_value_heads=cfg["kv_heads"], head_dim=cfg["head_dim"], mask_token_id=cfg["mask_id"],
        )
        drafter = DFlashDraftModel(draft_config).eval()
    with torch.no_grad():
        drafter.mode_embed.normal_(0.0, 0.5)
    target.requires_grad_(False)
    drafter.requires_grad_(False)
    return target, drafter


def plain_decode_step_ms(target, ids, steps, device):
    """Median time of one greedy step of plain decoding after ``ids`` (a transformers cache)."""
    import statistics

    import torch
    from transformers import DynamicCache

    from mfd_hub.remote.targets_mfd import _forward_kwargs

    cache_kw, _ = _forward_kwargs(target)
    cache = DynamicCache()
    with torch.inference_mode():
        out = target(input_ids=ids, use_cache=True, **{cache_kw: cache})
        token = out.logits[:, -1:].argmax(-1)
        samples = []
        for step in range(steps + 2):
            position = torch.full((1, 1), ids.shape[1] + step, device=device)
            sync(device)
            started = time.perf_counter()
            out = target(input_ids=token, position_ids=position, use_cache=True, **{cache_kw: cache})
            token = out.logits[:, -1:].argmax(-1)
            sync(device)
            if step >= 2:
                samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def verify_ms(target, drafter, ids, budget, repeats, device):
    """Median time of the verifier's forward over root + a ``budget``-node mixture tree (of
    drafter-like logits) after ``ids``; each pass is then committed as the root alone, so the
    context grows by one token a repeat."""
    import torch

    import tree_build as tree_bench
    from mfd_hub.kernels.tree_attention import ancestor_mask
    from mfd_hub.kernels.tree_build import draft_candidates, draft_tree
    from mfd_hub.remote.targets_mfd import make_verifier

    vocab = target.config.vocab_size
    with torch.inference_mode():
        logits = tree_bench.synthetic_logits(8, seed=budget, device=device, vocab=vocab, positions=15)
        with kernel_backend("torch"):  # the tree's shape is all that matters here: no compile for it
            scores, cand = draft_candidates(logits, budget)
            tree = draft_tree(scores, cand, budget, 0, vocab)
            mask = ancestor_mask(tree.parents, 15)
        verifier = make_verifier(target, drafter.target_layer_ids)
        verifier.prefill(ids)
        root = torch.zeros(1, dtype=torch.long, device=device)
        return median_ms(lambda: verifier.verify(tree.tokens, tree.depths, mask), repeats, device,
                         after=lambda: verifier.commit(root))


# ---- output ---------------------------------------------------------------------------------------
def print_table(checks, stream=sys.stdout):
    rows = [(c["name"], c["goal"], c["measured"], c["status"]) for c in checks]
    widths = [max(len("check"), *(len(r[0]) for r in rows)), 44, 78, 11]

    def wrap(text, width):
        words, lines, line = str(text).split(" "), [], ""
        for word in words:
            if line and len(line) + 1 + len(word) > width:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        return lines + [line]

    header = f"{'check':<{widths[0]}}  {'goal':<{widths[1]}}  {'measured':<{widths[2]}}  status"
    print(header, file=stream)
    print("-" * len(header), file=stream)
    for name, goal, measured, status in rows:
        goal_lines, measured_lines = wrap(goal, widths[1]), wrap(measured, widths[2])
        for i in range(max(len(goal_lines), len(measured_lines))):
            first = i == 0
            print(f"{name if first else '':<{widths[0]}}  {goal_lines[i] if i < len(goal_lines) else '':<{widths[1]}}  "
                  f"{measured_lines[i] if i < len(measured_lines) else '':<{widths[2]}}  {status if first else ''}",
                  file=stream)


def summarise(checks):
    counts = {}
    for c in checks:
        key = f"{c['kind']}:{c['status']}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def clean(value):
    """JSON-safe: NaN/inf become null, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def main(argv=None):
    started = time.perf_counter()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    prepare_process(args.device)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device cuda, but torch {torch.__version__} sees no CUDA GPU (use --device cpu --quick)")
    device = torch.device(args.device)
    shapes = plan(args.quick, args.max_tree_entries)
    env = environment(args.device)
    # fp32 references mean fp32: no TF32 in this process's matmuls (recorded: a site may force it)
    env["tf32_before"] = {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        compat = transformers_compat()
    except Exception as error:
        failed = [f"the probe failed: {type(error).__name__}: {error}"]
        compat = {"probes": {}, "problems": {"attention": failed, "hybrid": failed}}
    env["transformers_compat"] = compat
    report = Report(args.device, args.quick, compat)
    print(f"gpu_check: {args.device}{' (quick)' if args.quick else ''}, torch {env['torch']}, triton {env['triton']}, "
          f"transformers {env['transformers']} (pinned {env['transformers_pinned']}), "
          f"huggingface_hub {env['huggingface_hub']}" + (f", {env['gpu']['name']}" if "gpu" in env else ""), flush=True)
    for problem_kind, problems in compat["problems"].items():
        for problem in problems:
            print(f"  note: {problem_kind} targets: {problem}", flush=True)

    jobs = args.jobs if args.jobs is not None else max(1, min(12, (os.cpu_count() or 4) - 2))
    warm = None
    if args.device == "cuda" and not args.quick and jobs > 0 and {"kernels", "speed"} & set(args.sections):
        print(f"  compiling the large Triton kernels in {jobs} background processes", flush=True)
        try:
            warm = WarmPool(warm_configs(shapes), jobs)
        except Exception as error:  # noqa: BLE001  (no pool here: the checks compile as they go)
            env["warm_compile"] = {"problems": [f"{type(error).__name__}: {error}"]}

    def write_report(complete):
        """The JSON, rewritten after every section: a run killed at its time limit leaves what it
        had answered (``complete`` false)."""
        code, wall = exit_code(report.checks), time.perf_counter() - started
        order = {name: i for i, name in enumerate(SECTIONS)}
        checks = sorted(report.checks, key=lambda c: order.get(c["section"], len(order)))  # stable
        result = {
            "schema": 1, "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
            "device": args.device, "quick": args.quick, "sections": args.sections, "complete": complete,
            "environment": env, "checks": checks, "summary": summarise(checks), "exit_code": code,
            "section_seconds": report.section_seconds, "wall_seconds": wall,
        }
        Path(args.out).write_text(json.dumps(clean(result), indent=2) + "\n", encoding="utf-8")
        report.checks[:] = checks
        return code, wall

    def section(name, fn):
        t = time.perf_counter()
        fn()
        report.section_seconds[name] = time.perf_counter() - t
        print(f"  {name} done ({report.section_seconds[name]:.1f} s)", flush=True)
        write_report(complete=False)

    def warm_wait(limit_s, only=None):
        if warm is not None:
            env["warm_compile"] = warm.wait(limit_s, only)
            report.section_seconds["warm_compile"] = env["warm_compile"]["seconds"]
            print(f"  compiled ahead: {env['warm_compile']['compiled']}/{env['warm_compile']['configs']} shapes "
                  f"after {env['warm_compile']['seconds']:.0f} s", flush=True)

    try:
        # First what needs only small kernels, while the pool compiles the large ones; the
        # kernel checks last (K = 8, B = 256 is the longest compile of all).
        if "lossless" in args.sections or "sync" in args.sections:
            section("lossless+sync", lambda: check_lossless_and_sync(report, device, shapes["lossless"], compat,
                                                                     args.sections))
        if "speed" in args.sections:
            warm_wait(300, only=lambda c: c[3] <= 128)
            section("speed", lambda: check_speed(report, device, shapes))
        if "kernels" in args.sections:
            warm_wait(480)
            section("kernels", lambda: run_kernel_checks(report, device, shapes))
        warm_wait(0)
    finally:
        if warm is not None:
            warm.close()
    code, wall = write_report(complete=True)
    print()
    print_table(report.checks)
    failed = [c["name"] for c in report.checks if c["status"] in ("fail", "error", "unsupported")]
    print(f"\n{len(report.checks)} checks, wall {wall:.1f} s; not passed: {', '.join(failed) or 'none'}; "
          f"exit {code}; wrote {args.out}")
    return code


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as error:  # one line unless MFD_HUB_DEBUG=1
        if os.environ.get("MFD_HUB_DEBUG"):
            traceback.print_exc()
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
