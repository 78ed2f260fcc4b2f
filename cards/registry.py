"""The registry of published drafters: ``cards/registry.yaml`` (installed as ``mfd_hub.cards``),
loaded, checked and resolved into plain objects.

Every fact a model card states about a drafter (its target, z-lab base, data, recipe, licenses
and the paper's figures) lives in that one YAML file. ``load_registry`` refuses a file with a
dangling reference, a missing field or an implausible figure, naming the entry and field.
"""

import difflib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from mfd_hub.errors import MfdHubError

REGISTRY_FILE = "registry.yaml"
# Engines a drafter's results come from, and the paper table that holds each.
ENGINES = {"hf": "table1", "sglang": "table2"}
TEMPERATURES = ("t0", "t1")
KINDS = ("MFD", "MFD-D")
LAYER_TYPES = ("full_attention", "sliding_attention")
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")


@dataclass(frozen=True)
class Cell:
    """One figure of the paper: speedup over autoregressive decoding and acceptance length tau."""

    speedup: float
    tau: float


@dataclass(frozen=True)
class ResultRow:
    table: str  # registry key: table1 / table2
    title: str  # the paper's name: "Table 1"
    id: str
    section: str
    section_title: str
    method: str
    training: str | None
    label: str
    cells: dict  # column (target key) -> {"t0": Cell, "t1": Cell}

    def source(self, column):
        """Where a figure comes from, in the paper's words."""
        training = f", {self.training}" if self.training else ""
        return f'{self.title}, "{self.section_title}", row "{self.method}{training}", column {column}'


@dataclass(frozen=True)
class Table:
    key: str
    title: str
    engine: str
    setting: str
    columns: list
    sections: dict
    rows: dict  # id -> ResultRow


@dataclass(frozen=True)
class Target:
    key: str
    repo: str
    paper_column: str
    mode: str
    license: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    tags: list


@dataclass(frozen=True)
class Base:
    repo: str
    target: Target
    license: str
    hidden_size: int
    intermediate_size: int
    layer_counts: dict  # layer type -> how many
    sliding_window: int | None
    target_layer_ids: list
    mask_token_id: int
    shape: dict  # heads, kv heads, head_dim, dtype (shared by every base)


@dataclass(frozen=True)
class DataSource:
    key: str
    label: str
    description: str
    datasets: list
    license: str | None


@dataclass(frozen=True)
class Drafter:
    name: str
    kind: str
    repo_id: str
    base: Base
    data: DataSource
    epochs: int
    num_modes: int
    block_size: int
    license: str
    release: str
    in_paper: str
    budget: dict  # engine -> int or None (not stated by the sources)
    sglang_launch: dict | None
    results: dict  # engine -> ResultRow (this drafter's row)
    compare: dict  # engine -> [ResultRow] (rows shown beside it on its card)

    @property
    def target(self):
        return self.base.target

    @property
    def default_path(self):
        return self.kind == "MFD-D"

    def figures(self, engine):
        """This drafter's own figures on ``engine``: {"t0": Cell, "t1": Cell}."""
        return self.results[engine].cells[self.target.key]

    def identity(self):
        """The config fields a checkpoint published under this name must carry."""
        return {
            "num_modes": self.num_modes,
            "block_size": self.block_size,
            "default_path": self.default_path,
            "target_layer_ids": list(self.base.target_layer_ids),
            "num_target_layers": self.target.num_hidden_layers,
            "mask_token_id": self.base.mask_token_id,
            "vocab_size": self.target.vocab_size,
        }

    def mismatches(self, config):
        """How a checkpoint's DFlashConfig differs from this entry (empty when it fits)."""
        found = []
        for name, want in self.identity().items():
            have = getattr(config, name, None)
            have = list(have) if isinstance(have, (list, tuple)) else have
            if have != want:
                found.append(f"{name} is {have!r}, the registry says {want!r}")
        named = (getattr(config, "target", None) or {}).get("name_or_path")
        if named and named != self.target.repo:
            found.append(f"target is {named!r}, the registry says {self.target.repo!r}")
        return found

    def config(self):
        """The DFlashConfig the registry describes (for shapes and parameter counts)."""
        from mfd_hub.remote.configuration_mfd import DFlashConfig

        base, target = self.base, self.target
        # The order of layer types is the checkpoint's; counts are all the registry keeps.
        layer_types = [t for t in LAYER_TYPES[::-1] for _ in range(base.layer_counts.get(t, 0))]
        return DFlashConfig(
            vocab_size=target.vocab_size,
            hidden_size=base.hidden_size,
            intermediate_size=base.intermediate_size,
            num_hidden_layers=len(layer_types),
            num_attention_heads=base.shape["num_attention_heads"],
            num_key_value_heads=base.shape["num_key_value_heads"],
            head_dim=base.shape["head_dim"],
            layer_types=layer_types,
            sliding_window=base.sliding_window,
            block_size=self.block_size,
            num_target_layers=target.num_hidden_layers,
            target_layer_ids=list(base.target_layer_ids),
            mask_token_id=base.mask_token_id,
            num_modes=self.num_modes,
            default_path=self.default_path,
            target={
                "name_or_path": target.repo,
                "hidden_size": target.hidden_size,
                "vocab_size": target.vocab_size,
                "num_hidden_layers": target.num_hidden_layers,
            },
        )

    def to_dict(self):
        """A JSON-ready description (what ``mfd-hub list --json`` prints)."""
        results = {}
        for engine, row in self.results.items():
            cells = self.figures(engine)
            results[engine] = {
                "source": row.source(self.target.paper_column),
                "budget": self.budget.get(engine),
                **{t: {"speedup": cells[t].speedup, "tau": cells[t].tau} for t in TEMPERATURES},
            }
        return {
            "name": self.name,
            "kind": self.kind,
            "repo_id": self.repo_id,
            "target": self.target.repo,
            "target_mode": self.target.mode,
            "base": self.base.repo,
            "data": self.data.label,
            "datasets": list(self.data.datasets),
            "epochs": self.epochs,
            "num_modes": self.num_modes,
            "block_size": self.block_size,
            "default_path": self.default_path,
            "target_layer_ids": list(self.base.target_layer_ids),
            "budget": dict(self.budget),
            "license": self.license,
            "base_license": self.base.license,
            "target_license": self.target.license,
            "data_license": self.data.license,
            "release": self.release,
            "in_paper": self.in_paper,
            "results": results,
        }


@dataclass(frozen=True)
class Registry:
    path: str
    paper: dict
    recipe: dict
    tables: dict  # key -> Table
    targets: dict
    bases: dict
    data: dict
    drafters: dict = field(default_factory=dict)  # name -> Drafter, in file order

    def get(self, name):
        try:
            return self.drafters[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self.drafters), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise MfdHubError(f"unknown drafter {name!r}{hint} ('mfd-hub list' shows the ten)") from None

    def siblings(self, drafter):
        """Other drafters for the same target (the cards point to them)."""
        return [d for d in self.drafters.values() if d.target is drafter.target and d is not drafter]


class _Check:
    """Reads one YAML mapping and names the place of the first problem it finds."""

    def __init__(self, where, value):
        if not isinstance(value, dict):
            raise MfdHubError(f"registry: {where} must be a mapping")
        self.where, self.value = where, value

    def fail(self, key, message):
        raise MfdHubError(f"registry: {self.where}: {key} {message}")

    def get(self, key, kind, optional=False, default=None):
        if key not in self.value or self.value[key] is None:
            if optional:
                return default
            self.fail(key, "is missing")
        value = self.value[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.fail(key, f"must be {getattr(kind, '__name__', kind)}, not {value!r}")
        return value

    def positive_int(self, key, optional=False, default=None):
        value = self.get(key, int, optional=optional, default=default)
        if value is not None and value <= 0:
            self.fail(key, f"must be positive, not {value}")
        return value

    def repo_id(self, key):
        value = self.get(key, str)
        if not _REPO_ID.match(value):
            self.fail(key, f"{value!r} is not a Hub repo id (owner/name)")
        return value

    def key_of(self, key, choices, optional=False):
        value = self.get(key, str, optional=optional)
        if value is not None and value not in choices:
            self.fail(key, f"{value!r} is not one of {sorted(choices)}")
        return value

    def entries(self, key):
        """(name, _Check) for each entry of the mapping under ``key``."""
        for name, raw in self.sub(key).value.items():
            yield name, _Check(f"{key}.{name}", raw)

    def sub(self, key, optional=False):
        value = self.get(key, dict, optional=optional, default={})
        return _Check(f"{self.where}.{key}", value)


def _cell(check, column, temp):
    pair = check.value.get(temp)
    if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, (int, float)) for v in pair)):
        check.fail(f"{column}.{temp}", f"must be [speedup, tau], not {pair!r}")
    speedup, tau = float(pair[0]), float(pair[1])
    # Plausibility, not truth (the tests compare every cell with the paper): a speedup above 1
    # and an acceptance length of at least 1 (the bonus token), both under the block size.
    if not (1.0 < speedup < 16.0 and 1.0 <= tau <= 16.0):
        check.fail(f"{column}.{temp}", f"[{speedup}, {tau}] is not a plausible [speedup, tau]")
    return Cell(speedup, tau)


def _tables(top, targets):
    tables = {}
    for key, check in top.entries("tables"):
        columns = check.get("columns", list)
        for column in columns:
            if column not in targets:
                check.fail("columns", f"name unknown target {column!r}")
        sections = check.get("sections", dict)
        title = check.get("title", str)
        rows = {}
        for i, raw_row in enumerate(check.get("rows", list)):
            row = _Check(f"tables.{key}.rows[{i}]", raw_row)
            row_id = row.get("id", str)
            if row_id in rows:
                row.fail("id", f"{row_id!r} appears twice")
            section = row.key_of("section", sections)
            cells = {}
            for column, raw_cell in row.get("cells", dict).items():
                if column not in columns:
                    row.fail("cells", f"name column {column!r}, not among {columns}")
                cell_check = _Check(f"tables.{key}.rows[{i}].cells.{column}", raw_cell)
                cells[column] = {t: _cell(cell_check, column, t) for t in TEMPERATURES}
            method = row.get("method", str)
            rows[row_id] = ResultRow(
                table=key, title=title, id=row_id, section=section, section_title=sections[section],
                method=method, training=row.get("training", str, optional=True),
                label=row.get("label", str, optional=True, default=method), cells=cells,
            )
        tables[key] = Table(key, title, check.get("engine", str), check.get("setting", str), columns, sections, rows)
    for engine, key in ENGINES.items():
        if key not in tables:
            top.fail("tables", f"lack {key} (the {engine} results)")
    return tables


def _targets(top):
    targets = {}
    for key, check in top.entries("targets"):
        targets[key] = Target(
            key=key, repo=check.repo_id("repo"), paper_column=check.get("paper_column", str), mode=check.get("mode", str),
            license=check.get("license", str), num_hidden_layers=check.positive_int("num_hidden_layers"),
            hidden_size=check.positive_int("hidden_size"), vocab_size=check.positive_int("vocab_size"),
            tags=check.get("tags", list, optional=True, default=[]),
        )
    return targets


def _bases(top, targets):
    shape_check = top.sub("base_shape")
    shape = {k: shape_check.positive_int(k) for k in ("num_attention_heads", "num_key_value_heads", "head_dim")}
    shape["dtype"] = shape_check.get("dtype", str)
    bases = {}
    for repo, check in top.entries("bases"):
        if not _REPO_ID.match(repo):
            top.fail("bases", f"key {repo!r} is not a Hub repo id (owner/name)")
        target = targets[check.key_of("target", targets)]
        counts = check.get("layers", dict)
        if not counts or any(t not in LAYER_TYPES or not isinstance(n, int) or n <= 0 for t, n in counts.items()):
            check.fail("layers", f"must map layer types {LAYER_TYPES} to positive counts, not {counts!r}")
        taps = check.get("target_layer_ids", list)
        if not taps or any(not isinstance(i, int) or not 0 <= i < target.num_hidden_layers for i in taps):
            check.fail("target_layer_ids", f"{taps!r} must be layers of {target.repo} (0..{target.num_hidden_layers - 1})")
        mask = check.get("mask_token_id", int)
        if not 0 <= mask < target.vocab_size:
            check.fail("mask_token_id", f"{mask} is outside {target.repo}'s vocabulary of {target.vocab_size}")
        window = check.positive_int("sliding_window", optional=True)
        if counts.get("sliding_attention") and window is None:
            check.fail("sliding_window", "is needed by sliding-attention layers")
        bases[repo] = Base(
            repo=repo, target=target, license=check.get("license", str),
            hidden_size=check.positive_int("hidden_size"), intermediate_size=check.positive_int("intermediate_size"),
            layer_counts=dict(counts), sliding_window=window, target_layer_ids=list(taps), mask_token_id=mask,
            shape=shape,
        )
        if bases[repo].hidden_size != target.hidden_size:
            check.fail("hidden_size", f"{bases[repo].hidden_size} differs from {target.repo}'s {target.hidden_size}")
    return bases


def _data(top):
    data = {}
    for key, check in top.entries("data"):
        datasets = check.get("datasets", list)
        for name in datasets:
            if not isinstance(name, str) or not _REPO_ID.match(name):
                check.fail("datasets", f"entry {name!r} is not a Hub dataset id")
        data[key] = DataSource(
            key=str(key), label=check.get("label", str), description=" ".join(check.get("description", str).split()),
            datasets=list(datasets), license=check.get("license", str, optional=True),
        )
    return data


def _drafter(i, raw, defaults, tables, bases, data):
    merged = {**defaults.value, **raw}
    check = _Check(f"drafters[{i}] ({raw.get('name', '?') if isinstance(raw, dict) else '?'})", merged)
    name = check.get("name", str)
    if not _NAME.match(name):
        check.fail("name", f"{name!r} is not a plain model name")
    repo_id = check.repo_id("repo_id")
    if repo_id.split("/")[1] != name:
        check.fail("repo_id", f"{repo_id!r} must be owner/{name}")
    base = bases[check.key_of("base", bases)]
    budget_check = check.sub("budget")
    budget = {e: budget_check.positive_int(e, optional=True) for e in ENGINES}
    results, compare = {}, {}
    for engine, row_id in check.get("results", dict).items():
        if engine not in ENGINES:
            check.fail("results", f"name engine {engine!r}, not one of {sorted(ENGINES)}")
        table = tables[ENGINES[engine]]
        row_ids = [row_id] + list(check.sub("compare").value.get(engine) or [])
        rows = []
        for rid in row_ids:
            if rid not in table.rows:
                check.fail("results", f"refer to row {rid!r}, which {table.title} lacks")
            if base.target.key not in table.rows[rid].cells:
                check.fail("results", f"refer to row {rid!r}, which has no {base.target.key} figures in {table.title}")
            rows.append(table.rows[rid])
        results[engine], compare[engine] = rows[0], rows[1:]
    if not results:
        check.fail("results", "is empty: every published drafter has figures in the paper")
    for engine in check.sub("compare").value:
        if engine not in results:
            check.fail("compare", f"has {engine!r} rows but no {engine!r} result")
    launch = check.get("sglang_launch", dict, optional=True)
    return Drafter(
        name=name, kind=check.key_of("kind", KINDS), repo_id=repo_id, base=base,
        data=data[check.key_of("data", data)], epochs=check.positive_int("epochs"),
        num_modes=check.positive_int("num_modes"), block_size=check.positive_int("block_size"),
        license=check.get("license", str), release=check.get("release", str), in_paper=check.get("in_paper", str),
        budget=budget, sglang_launch=launch, results=results, compare=compare,
    )


def load_registry(path=None):
    """Load and check the registry (default: the packaged ``cards/registry.yaml``)."""
    if path is None:
        source = resources.files("mfd_hub.cards").joinpath(REGISTRY_FILE)
        where = str(source)
    else:
        source, where = Path(path), str(path)
    try:
        raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MfdHubError(f"registry {where} not found") from None
    except yaml.YAMLError as err:
        raise MfdHubError(f"registry {where} is not valid YAML: {' '.join(str(err).split())}") from None
    top = _Check("top level", raw)
    targets = _targets(top)
    tables = _tables(top, targets)
    bases = _bases(top, targets)
    data = _data(top)
    defaults = top.sub("defaults", optional=True)
    drafters = {}
    for i, entry in enumerate(top.get("drafters", list)):
        if not isinstance(entry, dict):
            top.fail(f"drafters[{i}]", "must be a mapping")
        drafter = _drafter(i, entry, defaults, tables, bases, data)
        if drafter.name in drafters:
            top.fail("drafters", f"list {drafter.name!r} twice")
        drafters[drafter.name] = drafter
    return Registry(
        path=where, paper=top.get("paper", dict), recipe=top.get("recipe", dict), tables=tables, targets=targets,
        bases=bases, data=data, drafters=drafters,
    )
