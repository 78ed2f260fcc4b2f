"""The layout itself: no import circle between modules, the remote code in one place."""

import ast
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# where each installed package's sources live: pyproject's package-dir, the mapping's one statement
PACKAGE_DIRS = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]


def _modules():
    """{module name: source path} for every module of the installed packages."""
    modules = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted((REPO / folder).glob("*.py")):
            modules[package if path.name == "__init__.py" else f"{package}.{path.stem}"] = path
        for sub in sorted((REPO / folder).iterdir()):
            if sub.is_dir() and (sub / "__init__.py").is_file() and f"{package}.{sub.name}" not in PACKAGE_DIRS:
                for path in sorted(sub.glob("*.py")):
                    name = f"{package}.{sub.name}"
                    modules[name if path.name == "__init__.py" else f"{name}.{path.stem}"] = path
    return modules


def import_graph(modules):
    """{module: set of modules it imports}, from every import statement (lazy ones inside
    functions included: a circle through a function-level import is still a circle)."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    anchor = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{anchor}.{base}" if base else anchor
                # `from package import submodule` imports the submodule
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def find_circle(graph):
    """One import circle as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_there_is_no_import_circle():
    modules = _modules()
    assert "mfd_hub.remote.generation_mfd" in modules and "mfd_hub.zoo.bench" in modules
    circle = find_circle(import_graph(modules))
    assert circle is None, " -> ".join(circle)


def test_the_circle_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_circle(graph) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None


def test_the_remote_code_has_one_home():
    """Only mfd_hub/remote and kernels hold the remote code; no folder in the repository carries
    a generated copy of it (a file with the bundle's provenance header). Ignored folders may: a
    retrained drafter's bundle is written back there (scripts/retrain_miniature.py)."""
    from mfd_hub.bundle import HEADER_PREFIX

    if (REPO / ".git").exists():  # what git tracks, or would add
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout.split()
        files = [REPO / name for name in listed if (REPO / name).exists()]
    else:
        files = [p for p in REPO.rglob("*.py") if ".venv" not in p.parts]
    copies = [p for p in files if p.read_text(encoding="utf-8", errors="replace").startswith(HEADER_PREFIX)]
    assert not copies, copies
    assert not list((REPO / "zoo").rglob("*/*.py")), "a shipped drafter folder holds code"


def test_the_benchmark_scripts_import_names_that_exist():
    """benchmarks/*.py (and the gpu check's modules, benchmarks/gpucheck/) are scripts no test runs
    in full (they time things); every name they import from mfd_hub must still exist, so a move or
    a rename cannot leave one broken."""
    import importlib

    missing = []
    for script in sorted((REPO / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mfd_hub" and not node.level:
                module = importlib.import_module(node.module)
                missing += [f"{script.name}: {node.module}.{alias.name}" for alias in node.names
                            if not hasattr(module, alias.name)
                            and not (hasattr(module, "__path__")  # a submodule of a package
                                     and importlib.util.find_spec(f"{node.module}.{alias.name}"))]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "mfd_hub" and importlib.util.find_spec(alias.name) is None:
                        missing.append(f"{script.name}: {alias.name}")
    assert not missing, missing


def test_the_bundle_is_the_remote_code_of_the_folders_pyproject_maps():
    """The bundle every checkpoint carries is, byte for byte, the .py files of the folders that
    pyproject's package-dir gives mfd_hub.remote and mfd_hub.kernels, each behind its provenance
    header with its kernel imports made flat. The bundler finds them through importlib (an
    installed mfd-hub has no pyproject.toml), so both must name the same files."""
    import re

    from mfd_hub import __version__
    from mfd_hub.bundle import HEADER_PREFIX, bundle_sources

    def folder(package):
        if package in PACKAGE_DIRS:
            return REPO / PACKAGE_DIRS[package]
        parent, _, leaf = package.rpartition(".")
        return folder(parent) / leaf

    expected = {}
    for package in ("mfd_hub.remote", "mfd_hub.kernels"):
        for path in sorted(folder(package).glob("*.py")):
            if path.name != "__init__.py":
                text = re.sub(r"^(\s*)from \.\.kernels\.(\w+) import ", r"\1from .\2 import ",
                              path.read_text(encoding="utf-8"), flags=re.MULTILINE)
                header = (f"{HEADER_PREFIX} {__version__}, generated from {path.relative_to(REPO).as_posix()}; "
                          "edit the source, not this copy.\n")
                expected[path.name] = header + text
    assert "generation_mfd.py" in expected and "tree_build.py" in expected
    assert bundle_sources() == expected
