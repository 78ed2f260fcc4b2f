"""The remote-code bundle: the flat set of .py files every checkpoint carries.

Its one home in the repository is two folders: ``mfd_hub/remote/`` (configuration, model,
generation) and ``kernels/`` (installed as ``mfd_hub.kernels``: the kernels and their torch
references). transformers' remote-code loader only follows flat relative imports, so the bundle
is generated: ``from ..kernels.NAME import`` becomes ``from .NAME import`` and every file gets a
provenance header. The result must import nothing but the standard library, torch,
transformers and (inside ``try``) triton, which ``bundle_sources`` checks.
"""

import ast
import re
import sys
from importlib import resources

from .version import __version__
from .errors import MfdHubError

AUTO_MAP = {
    "AutoConfig": "configuration_mfd.DFlashConfig",
    "AutoModel": "modeling_mfd.DFlashDraftModel",
}
_SOURCE_PACKAGES = ("mfd_hub.remote", "mfd_hub.kernels")
_ALLOWED_TOP_LEVEL = {"torch", "transformers"}
_OPTIONAL_TOP_LEVEL = {"triton"}  # allowed only inside try/except ImportError
_KERNEL_IMPORT = re.compile(r"^(\s*)from \.\.kernels\.(\w+) import ", re.MULTILINE)
HEADER_PREFIX = "# mfd-hub remote code"


def _source_files():
    files = {}
    for package in _SOURCE_PACKAGES:
        for entry in sorted(resources.files(package).iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".py") and entry.name != "__init__.py":
                if entry.name in files:
                    raise MfdHubError(f"bundle file name {entry.name} appears in two source folders")
                files[entry.name] = (package, entry.read_text(encoding="utf-8"))
    return files


def _flatten(text):
    return _KERNEL_IMPORT.sub(r"\1from .\2 import ", text)


def _check_imports(name, text, bundle_names):
    """Refuse a bundle file that would not load without mfd_hub (or without triton)."""
    tree = ast.parse(text, filename=name)
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for inner in node.body:
                for sub in ast.walk(inner):
                    guarded.add(id(sub))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            module = (node.module or "").split(".")[0]
            if node.level != 1 or module + ".py" not in bundle_names:
                raise MfdHubError(f"bundle file {name}: relative import outside the bundle ({node.module!r})")
            continue
        if isinstance(node, ast.Import):
            tops = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            tops = [(node.module or "").split(".")[0]]
        else:
            continue
        for top in tops:
            if top in _ALLOWED_TOP_LEVEL or top in sys.stdlib_module_names:
                continue
            if top in _OPTIONAL_TOP_LEVEL and id(node) in guarded:
                continue
            raise MfdHubError(f"bundle file {name}: imports {top!r}, which a checkpoint's user may not have")


def bundle_sources():
    """The generated bundle: {file name: file text}, deterministic for an mfd-hub version."""
    files = _source_files()
    out = {}
    for name, (package, text) in files.items():
        flat = _flatten(text)
        _check_imports(name, flat, files)
        origin = package.replace("mfd_hub.kernels", "kernels").replace(".", "/") + "/" + name
        header = f"{HEADER_PREFIX} {__version__}, generated from {origin}; edit the source, not this copy.\n"
        out[name] = header + flat
    return out


def bundle_version_of(text):
    """The mfd-hub version named in a bundled file's provenance header (None when absent)."""
    first = text.split("\n", 1)[0]
    if not first.startswith(HEADER_PREFIX):
        return None
    return first[len(HEADER_PREFIX) :].split(",")[0].strip() or None


def write_bundle(directory):
    """Write the bundle's files into a checkpoint folder; returns their names."""
    from pathlib import Path

    sources = bundle_sources()
    for name, text in sources.items():
        (Path(directory) / name).write_text(text, encoding="utf-8")
    return sorted(sources)
