"""tests/fork_server.py: a command run as a child of the fork server behaves as a process of its
own would (the suite's command-line tests rely on it)."""

import os
import subprocess
import sys

import pytest

import fork_server

PROBE = """
import atexit, json, os, sys
atexit.register(lambda: print("atexit ran", file=sys.stderr))
print(json.dumps({
    "cwd": os.getcwd(), "argv": sys.argv, "stdin": sys.stdin.read(), "env_set": os.environ.get("PROBE_SET"),
    "env_dropped": os.environ.get("PROBE_DROPPED"), "parent": os.getppid(), "main": __name__,
    "preloaded": sorted(m for m in ("torch", "transformers", "huggingface_hub", "triton", "mfd_hub")
                       if sys.modules.get(m) is not None),
}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_run_is_a_process_of_its_own(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("PROBE_DROPPED", "from the test process")
    env = {k: v for k, v in os.environ.items() if k != "PROBE_DROPPED"}
    env["PROBE_SET"] = "yes"
    done = fork_server.run("code", PROBE, ["7", "extra"], tmp_path, env, timeout=60)
    seen = json.loads(done.stdout)
    assert done.returncode == 7 and done.stderr == "to stderr\natexit ran\n"
    assert seen["cwd"] == str(tmp_path) and seen["argv"] == ["-c", "7", "extra"] and seen["stdin"] == ""
    assert seen["env_set"] == "yes" and seen["env_dropped"] is None and seen["main"] == "__main__"
    assert seen["parent"] != os.getpid()  # a child of the server
    assert seen["preloaded"] == ["torch", "triton"]  # never transformers, huggingface_hub or mfd_hub

    crash = fork_server.run("code", "raise KeyError('boom')", [], tmp_path, env, timeout=60)
    assert crash.returncode == 1 and crash.stderr.rstrip().endswith("KeyError: 'boom'") and "Traceback" in crash.stderr
    message = fork_server.run("code", "import sys; sys.exit('bad input')", [], tmp_path, env, timeout=60)
    assert message.returncode == 1 and message.stderr == "bad input\n"
    script = tmp_path / "s.py"
    script.write_text("import sys; print(__name__, sys.argv[1:]); sys.stdout.flush(); raise SystemExit(None)\n")
    ran = fork_server.run("script", str(script), ["a"], tmp_path, env, timeout=60)
    assert (ran.returncode, ran.stdout) == (0, "__main__ ['a']\n")

    with pytest.raises(subprocess.TimeoutExpired):
        fork_server.run("code", "import time; time.sleep(30)", [], tmp_path, env, timeout=1)
    assert fork_server.run("code", "print('still serving')", [], tmp_path, env, timeout=60).stdout == "still serving\n"


def test_a_run_with_other_import_time_settings_gets_a_plain_process(tmp_path):
    import json

    env = dict(os.environ, OMP_NUM_THREADS="3")
    done = fork_server.run("code", PROBE, ["0"], tmp_path, env, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["parent"] == os.getpid()
    assert json.loads(done.stdout)["preloaded"] == []
    assert sys.executable in done.args


def test_a_run_that_blocks_triton_gets_a_plain_process(tmp_path):
    """triton is preloaded in the server: a run that must not see it cannot be its child."""
    import json

    code = "import sys\n" + fork_server.BLOCKS_TRITON + "\n" + PROBE
    done = fork_server.run("code", code, ["0"], tmp_path, dict(os.environ), timeout=120)
    seen = json.loads(done.stdout)
    assert done.returncode == 0 and seen["parent"] == os.getpid() and seen["preloaded"] == []
