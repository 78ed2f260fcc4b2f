"""The repository's own mfd_hub, with or without ``pip install``: the package mapping that
pyproject.toml's package-dir states, applied to this checkout, and the process settings Triton
needs before it is first imported."""

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


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


# the packages living outside mfd_hub/ that the check imports (the others it never needs)
MAPPED_PACKAGES = ("mfd_hub.kernels",)


def package_dirs():
    """{package: its folder in this checkout}, from pyproject.toml's package-dir (the mapping's one
    statement)."""
    import tomllib

    with open(REPO / "pyproject.toml", "rb") as handle:
        table = tomllib.load(handle)["tool"]["setuptools"]["package-dir"]
    return {package: REPO / folder for package, folder in table.items()}


def map_repository_packages():
    """``mfd_hub`` and ``MAPPED_PACKAGES`` onto this checkout's folders, as pyproject's package-dir
    maps them at install time (``mfd_hub.kernels`` -> kernels/). The check always tests this
    checkout (an installed copy elsewhere is ignored) and never runs mfd_hub/__init__.py, which
    imports the checkpoint and Hub code this check does not need."""
    import types

    if "mfd_hub" in sys.modules:
        return
    folders = package_dirs()
    package = types.ModuleType("mfd_hub")
    package.__path__ = [str(folders["mfd_hub"])]
    package.__file__ = str(folders["mfd_hub"] / "__init__.py")
    package.__spec__ = importlib.util.spec_from_file_location(
        "mfd_hub", package.__file__, submodule_search_locations=package.__path__
    )
    sys.modules["mfd_hub"] = package
    for name in MAPPED_PACKAGES:
        folder = folders[name]
        spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        setattr(package, name.rpartition(".")[2], module)
