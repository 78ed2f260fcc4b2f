"""Command-line runs of the suite without paying the import of torch in each.

A census of one suite run (every Python process's CPU time) found some 100 processes, about a
third of the suite's CPU, and ~7 s of each is importing torch and transformers. This module is
a fork server: a process that imports the env-independent heavy modules once (``PRELOAD``:
torch and what transformers pulls in from it, never transformers, huggingface_hub or mfd_hub,
whose import reads the environment or would mask what a run imports) and forks one child per
command. triton is preloaded because torch._dynamo imports it (every run that loads transformers'
models imports both, ~1.5 s); a run whose code blocks triton (``BLOCKS_TRITON``) must find it
unimported, so it gets a plain subprocess. The child is a real process: its own cwd, environment,
argv, file descriptors 0-2 (stdin /dev/null, stdout and stderr to files), exit code, atexit
handlers; it runs the console script's entry point, ``-c`` code or a script as ``__main__``.

A run falls back to a plain subprocess when its environment differs from the server's in a
variable that preloaded modules read at import (``IMPORT_TIME_ENV``) or when ``MFD_HUB_TEST_FORK``
is ``0``. One server per test process, started on first use; requests are sequential.
"""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

PRELOAD = ("numpy", "sympy", "torch", "torch.distributed.tensor", "torch._dynamo", "torch.export", "triton",
           "safetensors.torch", "yaml", "jinja2", "click", "tqdm", "filelock")
BLOCKS_TRITON = 'sys.modules["triton"] = None'  # a run's code that makes triton unimportable
# environment a preloaded module (or the interpreter's start-up) reads once: a run that sets these
# otherwise than the server was started with gets a plain subprocess
IMPORT_TIME_ENV = ("OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH", "PYTORCH", "CUDA", "TRITON", "LD_", "PYTHONPATH",
                   "PYTHONWARNINGS", "PYTHONHASHSEED", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONUTF8",
                   "PYTHONIOENCODING")


# ---- the server (this file run as a script) ------------------------------------------------------
def _child(request):
    """In the forked child: become the requested process, run it, exit with its code."""
    import atexit
    import random
    import runpy
    import types

    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        # fresh streams, as a new interpreter opens them (the server's hold its request pipe's buffer)
        sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace",
                                           closefd=False)
        sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
        random.seed()  # a fresh process draws its own seed
        kind, target, args = request["kind"], request["target"], request["args"]
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        if kind == "code":
            sys.argv = ["-c", *args]
            sys.path[0] = ""
            exec(compile(target, "<string>", "exec"), main.__dict__)
        elif kind == "script":
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
        else:  # the mfd-hub console script
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(target)
            from mfd_hub.cli import main as cli_main

            cli_main()
        code = 0
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # what the interpreter prints for an uncaught exception
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve():
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    print("READY", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


# ---- the client -------------------------------------------------------------------------------
class _Server:
    """The fork server of this test process, and the environment it was started with."""

    def __init__(self):
        self.env = dict(os.environ)
        self.process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        cwd=tempfile.gettempdir())
        self.pending = b""
        if self.reply(None) != "READY":
            raise RuntimeError("the fork server did not start")

    def send(self, request):
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        self.process.stdin.flush()

    def reply(self, deadline):
        """The next line from the server (JSON decoded unless READY), or None at the deadline."""
        fd = self.process.stdout.fileno()
        while b"\n" not in self.pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the fork server died")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return "READY" if line == b"READY" else json.loads(line)


_server = None
_one_at_a_time = threading.Lock()  # the protocol is one request, then its replies


def _import_time_env(env):
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}


def _server_for(env):
    """The fork server, if ``env`` can run in a child of it, else None."""
    global _server
    if os.environ.get("MFD_HUB_TEST_FORK", "1") == "0":
        return None
    if _server is None or _server.process.poll() is not None:
        _server = _Server()
    return _server if _import_time_env(env) == _import_time_env(_server.env) else None


def run(kind, target, args, cwd, env, timeout=None):
    """Run a command -> subprocess.CompletedProcess (text stdout and stderr), as
    ``subprocess.run(..., capture_output=True, text=True, stdin=DEVNULL, timeout=timeout)`` would.
    ``kind``: "console" (``target`` is the mfd-hub script), "code" (``python -c target``) or
    "script" (``python target``)."""
    argv = {"console": [target], "code": [sys.executable, "-c", target],
            "script": [sys.executable, target]}[kind] + list(args)
    with _one_at_a_time:
        server = None if kind == "code" and BLOCKS_TRITON in target else _server_for(env)
        if server is None:
            return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        return _forked(server, kind, target, args, cwd, env, timeout, argv)


def _forked(server, kind, target, args, cwd, env, timeout, argv):
    with tempfile.TemporaryDirectory(prefix="fork-run-") as scratch:
        out, err = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
        server.send({"kind": kind, "target": target, "args": [str(a) for a in args], "cwd": str(cwd),
                     "env": dict(env), "stdout": out, "stderr": err})
        pid = server.reply(None)["pid"]
        done = server.reply(None if timeout is None else time.monotonic() + timeout)
        if done is None:  # as subprocess.run: kill the child, then raise
            os.kill(pid, signal.SIGKILL)
            server.reply(None)
            raise subprocess.TimeoutExpired(argv, timeout)

        def text(path):
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read()

        return subprocess.CompletedProcess(argv, done["returncode"], text(out), text(err))


if __name__ == "__main__":
    serve()
