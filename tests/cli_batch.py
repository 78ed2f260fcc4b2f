"""Several ``mfd-hub`` command lines in ONE fresh process, each exactly as the console script runs it.

The console script is ``mfd_hub.cli:main``; a process of its own per command line pays the ~7 s
import of torch and transformers' modeling code each time, which is most of what a bad-input
case costs. ``run_cli_many`` starts one process (the environment and isolated caches of
``conftest.run_cli``) that calls ``main(argv)`` for each case in turn, with file descriptors 1 and
2 pointed at files of the case's own, so everything the command prints (click, logging handlers
made earlier, warnings from C++) lands in that case's stdout or stderr, and the exit code is the
one the console script would have exited with: ``sys.exit``'s code, 0 when main returns, and 1
with the traceback on stderr for an exception that escapes (as Python itself does).

With ``watch=ROOT`` the process also records ``tree_state(ROOT)`` after every case, so a test can
check that each failing command, not only the last, left the folder untouched.

This file is also the process's program (``python cli_batch.py PLAN RESULTS``); it imports
nothing from the suite, so the process sees only what a user's process sees.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import fork_server


def tree_state(root):
    """Every path under ``root`` (links not followed) with its bytes, mode and mtime: equal
    states mean nothing was written, removed, touched or re-permissioned."""
    state = {}
    for path in sorted(Path(root).rglob("*")):
        info = path.lstat()
        digest = None
        if path.is_file() and not path.is_symlink():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        link = os.readlink(path) if path.is_symlink() else None
        state[str(path.relative_to(root))] = (digest, link, info.st_mode, info.st_mtime_ns)
    return state


def run_cli_many(cases, tmp_path, timeout=600, extra_env=None, watch=None):
    """Run each argument list of ``cases`` through the console script's entry point, in order, in
    one fresh process (cwd ``tmp_path``) -> a CompletedProcess per case; with ``watch``, each also
    carries ``.state``, ``tree_state(watch)`` right after it ran (JSON form: lists for tuples)."""
    tmp_path = Path(tmp_path)
    with tempfile.TemporaryDirectory(prefix="cli-batch-") as scratch:  # outside any watched folder
        return _run(cases, tmp_path, Path(scratch), timeout, extra_env, watch)


def _run(cases, tmp_path, work, timeout, extra_env, watch):
    plan = [{"argv": [str(a) for a in args], "stdout": str(work / f"{n}.out"), "stderr": str(work / f"{n}.err")}
            for n, args in enumerate(cases)]
    (work / "plan.json").write_text(json.dumps({"cases": plan, "watch": str(watch) if watch else None}))
    env = dict(os.environ)
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env.update(extra_env or {})
    env.pop("PYTHONPATH", None)
    done = fork_server.run("script", __file__, [str(work / "plan.json"), str(work / "results.json")], tmp_path, env,
                           timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((work / "results.json").read_text())
    completed = []
    for args, case, result in zip(cases, plan, results):
        run = subprocess.CompletedProcess(["mfd-hub", *case["argv"]], result["code"],
                                          Path(case["stdout"]).read_text(errors="replace"),
                                          Path(case["stderr"]).read_text(errors="replace"))
        run.state = {path: tuple(entry) for path, entry in result["state"].items()} if watch else None
        completed.append(run)
    return completed


def _serve(plan_path, results_path):
    import traceback

    from mfd_hub.cli import main

    plan = json.loads(Path(plan_path).read_text())
    home, results = os.getcwd(), []
    for case in plan["cases"]:
        os.chdir(home)
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        with open(case["stdout"], "wb") as out, open(case["stderr"], "wb") as err:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            try:
                main(case["argv"])
                code = 0
            except SystemExit as done:
                code = done.code
                if isinstance(code, str):  # as the interpreter does with sys.exit("text")
                    print(code, file=sys.stderr)
                    code = 1
                code = 0 if code is None else code
            except BaseException:  # noqa: BLE001 - what an uncaught exception does to a process
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
        result = {"code": code}
        if plan["watch"]:
            result["state"] = tree_state(plan["watch"])
        results.append(result)
    Path(results_path).write_text(json.dumps(results))


if __name__ == "__main__":
    sys.path.pop(0)  # this folder: the commands see the import path a user's process has
    _serve(sys.argv[1], sys.argv[2])
