"""benchmarks/gpu_check.py, the one command for a machine with a CUDA GPU: its CPU quick mode runs
every section's code path (Triton in its interpreter) in a real subprocess and writes the report
the GPU run writes; the exit code follows the exactness checks; bad input is one error line."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, load_script, one_error_line

SCRIPT = REPO / "benchmarks" / "gpu_check.py"
STATUSES = {"pass", "fail", "n/a", "info", "error", "unsupported"}
# every kernels/*_triton.py file (by stem) and the checks that compare it with its reference
KERNEL_CHECKS = {
    "tree_build": ["kernels.vocab_topk", "kernels.tree_build"],
    "tree_attention": ["kernels.tree_attention"],
    "accept": ["kernels.accept_walk"],
    "kv_compact": ["kernels.kv_compact"],
    "mode_attention": ["kernels.mode_attention"],
}


def run_check(args, cwd, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_HOME=str(cwd / "hf_home"),
               TRANSFORMERS_VERBOSITY="error", PYTHONDONTWRITEBYTECODE="1")
    env.pop("TRITON_INTERPRET", None)  # --device cpu sets it itself, before triton is imported
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def checks_of(report, prefix):
    return {c["name"]: c for c in report["checks"] if c["name"].startswith(prefix)}


def test_quick_cpu_run(tmp_path):
    """One subprocess run (about 30 s on one core), then each section's report. One test, so that
    xdist never runs it twice."""
    out = tmp_path / "report.json"
    result = run_check(["--device", "cpu", "--quick", "--out", str(out)], tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads(out.read_text())
    assert_fields(report, result.stdout)
    assert_kernels(report)
    assert_lossless(report)
    assert_syncs(report)
    assert_speed(report)


def assert_fields(report, stdout):
    assert report["device"] == "cpu" and report["quick"] and report["exit_code"] == 0
    env = report["environment"]
    for field in ("python", "torch", "triton", "transformers", "huggingface_hub", "transformers_pinned"):
        assert env[field], field
    assert env["TRITON_INTERPRET"] == "1"
    assert env["mfd_hub"]["loaded_from"] == str((REPO / "mfd_hub").resolve())  # this checkout, not an install
    assert env["mfd_hub"]["kernels_from"] == str((REPO / "kernels").resolve())
    assert env["transformers_compat"]["problems"] == {"attention": [], "hybrid": []}  # the pinned transformers
    for check in report["checks"]:
        assert {"name", "section", "kind", "goal", "measured", "value", "status", "passed"} <= set(check), check
        assert check["status"] in STATUSES and check["goal"] and check["measured"], check
        assert check["name"] in stdout  # the printed table
    assert "exit 0" in stdout


def assert_kernels(report):
    """Every kernels/*_triton.py file is compared with its reference, and equals it."""
    stems = {p.name[: -len("_triton.py")] for p in (REPO / "kernels").glob("*_triton.py")}
    assert stems == set(KERNEL_CHECKS), "a Triton kernel file without a check in gpu_check.py"
    kernels = checks_of(report, "kernels.")
    for names in [*KERNEL_CHECKS.values(), ["kernels.tree_deltanet"]]:  # tree_deltanet.py holds its own
        for name in names:
            check = kernels[name]
            assert check["kind"] == "exact" and check["status"] == "pass", check
            assert check["value"] >= 1  # cases compared
    cases = kernels["kernels.tree_build"]["details"]["cases"]
    assert all(c["equal"] for c in cases) and any(c["triton"] for c in cases)


def assert_lossless(report):
    """Token-identical on an attention and a hybrid Gated-DeltaNet target, both backends, with a
    drafter that accepts runs (tau above the floor) and is sometimes rejected."""
    lossless = checks_of(report, "lossless.")
    for family in ("qwen3", "qwen3_5_text"):
        for backend in ("triton", "torch"):
            check = lossless[f"lossless.{family}.{backend}"]
            assert check["kind"] == "exact" and check["status"] == "pass", check
            details = check["details"]
            assert all(run["identical"] for run in details["runs"])
            assert details["rejecting_rounds"] > 0 and check["value"] >= details["min_tau"] > 1
        methods = {run["method"] for run in lossless[f"lossless.{family}.torch"]["details"]["runs"]}
        assert methods == {"chain", "product", "mixture"}


def assert_syncs(report):
    syncs = checks_of(report, "sync.")
    mixture = syncs["sync.qwen3.mixture"]
    assert mixture["status"] == "pass" and mixture["value"] == 1, mixture
    assert mixture["details"]["counter_sees_torch_reads"]
    rounds = mixture["details"]["python_triton"]["drafting_rounds"]
    assert rounds and all(r == ["tolist"] for r in rounds)  # the round's one summary read
    assert "sync.qwen3.chain" in syncs and "sync.qwen3_5_text.mixture" in syncs


def assert_speed(report):
    """Every speed measurement ran at the small shapes; goals are not judged on a CPU."""
    speed = checks_of(report, "speed.")
    assert any(name.startswith("speed.tree_build.") for name in speed)
    assert {"speed.decode_step", "speed.verify_4", "speed.verify_8", "speed.verify_16"} <= set(speed)
    assert {n.split("_b")[0] for n in speed if n.startswith("speed.round.")} == {
        "speed.round.chain", "speed.round.product", "speed.round.mixture"}
    for check in speed.values():
        assert check["status"] == ("n/a" if check["kind"] == "goal" else "info"), check
        assert isinstance(check["value"], (int, float)) and math.isfinite(check["value"]) and check["value"] > 0
    shares = [c["details"]["outside"] for n, c in speed.items() if n.startswith("speed.round.")]
    assert all(0 < s < 1 for s in shares)


def test_exit_code_follows_exactness_checks():
    module = load_script(SCRIPT.relative_to(REPO))  # stdlib imports only at module level

    def check(kind, status):
        return {"kind": kind, "status": status}

    passing = [check("exact", "pass"), check("goal", "n/a"), check("goal", "fail"), check("info", "info")]
    assert module.exit_code(passing) == 0  # a missed speed or sync goal is reported, not fatal
    assert module.exit_code(passing + [check("exact", "fail")]) == 1
    assert module.exit_code(passing + [check("goal", "error")]) == 1  # a question left unanswered
    assert module.exit_code(passing + [check("exact", "unsupported")]) == 1


@pytest.mark.parametrize("args", [["--device", "tpu"], ["--sections", "kernels", "bogus"], ["--threads", "0"],
                                  ["--out", "missing-folder/report.json"], ["--device", "cpu"], ["--jobs", "-1"],
                                  ["--max-tree-entries", "0"]])
def test_bad_input_is_one_error_line(tmp_path, args):
    result = run_check(args, tmp_path, timeout=60)
    assert one_error_line(result), result.stderr
    assert not (tmp_path / "gpu_check.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_one_error_line(tmp_path):
    result = run_check(["--device", "cuda", "--out", str(tmp_path / "r.json")], tmp_path, timeout=120)
    assert one_error_line(result) and "no CUDA GPU" in result.stderr, result.stderr
    assert not (tmp_path / "r.json").exists()
