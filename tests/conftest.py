import os
import sys
from pathlib import Path

# Two cores, two xdist workers: one thread each (also for subprocesses), or tiny models crawl.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Without a GPU the Triton kernels run in triton's CPU interpreter, which triton chooses when the
# kernels are decorated: this must precede every mfd_hub import. Only tests that force the Triton
# backend use it; "auto" keeps the torch references on CPU tensors.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mfd_hub.testing import TARGET_FAMILIES, tiny_drafter, tiny_target

import fork_server  # noqa: E402
from cli_batch import run_cli_many, tree_state  # noqa: E402,F401 - shared with the test files

REPO = Path(__file__).resolve().parents[1]

# Python prelude for subprocesses that must run WITHOUT mfd_hub: any import of it fails.
NO_MFD_HUB = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "mfd_hub" or name.startswith("mfd_hub."):
            raise ImportError("mfd_hub is blocked in this process")
        return None
sys.meta_path.insert(0, _Block())
try:
    import mfd_hub
    raise SystemExit("mfd_hub must not be importable here")
except ImportError:
    pass
"""

NO_TRITON = f"""
{fork_server.BLOCKS_TRITON}
"""


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture
def forced_triton():
    """Run the kernels in Triton (on the GPU, else in triton's interpreter) -> the device to use."""
    from mfd_hub.kernels import backend

    if backend.triton is None:
        pytest.skip("triton is not installed")
    if not (torch.cuda.is_available() or backend.INTERPRETED):
        pytest.skip("no GPU and triton's interpreter is off")
    previous = backend.set_kernel_backend("triton")
    yield "cuda" if torch.cuda.is_available() else "cpu"
    backend.set_kernel_backend(previous)


@pytest.fixture(params=TARGET_FAMILIES)
def family(request):
    return request.param


@pytest.fixture
def target(family):
    return tiny_target(family)


def load_script(relative_path):
    """A script of the repository (``scripts/``, ``benchmarks/``: not a package) as a module."""
    import importlib.util

    path = REPO / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_python(code, tmp_path, timeout=300, extra_env=None):
    """Run Python code in a fresh process (cwd = tmp_path, isolated HF caches; a child of the fork
    server, tests/fork_server.py, with torch already imported)."""
    env = dict(os.environ)
    env.update(
        HF_HOME=str(tmp_path / "hf_home"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.pop("PYTHONPATH", None)
    env.update(extra_env or {})
    return fork_server.run("code", code, [], tmp_path, env, timeout)


def run_cli(args, tmp_path, timeout=600, extra_env=None):
    """Run the installed `mfd-hub` console script in a fresh process (a child of the fork server)."""
    env = dict(os.environ)
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env.update(extra_env or {})
    return fork_server.run("console", str(Path(sys.executable).with_name("mfd-hub")), args, tmp_path, env, timeout)


def one_error_line(result):
    """A failed CLI run printed exactly one 'error:' line, last, and no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return result.returncode != 0 and len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in result.stderr


def pytest_collection_modifyitems(config, items):
    """Tests that use a module-scoped fixture of their own module run on one xdist worker (one
    group per module, ``--dist loadgroup`` in pyproject.toml), so the fixture is built once, not
    once per worker: several cost 8-26 s."""
    for item in items:
        own_file = item.nodeid.split("::")[0]
        if any(d.scope == "module" and d.baseid == own_file
               for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs):
            item.add_marker(pytest.mark.xdist_group(f"{own_file}-module-fixtures"))
