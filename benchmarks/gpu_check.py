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

    python benchmarks/gpu_check.py                                  # on a machine with a CUDA GPU
    python benchmarks/gpu_check.py --device cpu --quick --out x.json  # same code paths, small shapes

It runs from a checkout without ``pip install``: it maps ``mfd_hub`` (and ``kernels/`` as
``mfd_hub.kernels``, as pyproject.toml's package-dir says) onto this repository itself. This file
is the command line; each section lives in a module of ``benchmarks/gpucheck/`` (bootstrap,
shapes, kernels, lossless, speed, warm, environment, report). See the README's "GPU check" section.
"""

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # the sections' package beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpucheck.bootstrap import prepare_process  # noqa: E402  (stdlib only, like every module below)
from gpucheck.environment import environment, transformers_compat  # noqa: E402
from gpucheck.kernels import run_kernel_checks  # noqa: E402
from gpucheck.lossless import check_lossless_and_sync  # noqa: E402
from gpucheck.report import Report, clean, exit_code, print_table, summarise  # noqa: E402
from gpucheck.shapes import plan  # noqa: E402
from gpucheck.speed import check_speed  # noqa: E402
from gpucheck.warm import WarmPool, warm_configs  # noqa: E402


SECTIONS = ("kernels", "lossless", "sync", "speed")


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
