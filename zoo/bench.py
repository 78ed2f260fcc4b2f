"""Benchmarks of speculative decoding, measured side by side in one process.

For every prompt, plain decoding (transformers ``generate``) and each speculative configuration
run back to back, so a speedup is a ratio of times taken under the same machine conditions.
Per configuration: tau, tokens/s, speedup over plain decoding, time per stage, and two views of
where the tree's budget goes (from the target's own probabilities at verify time):

- chimera share: nodes the target essentially never says: some step on the node's path has
  target probability below ``RARE`` (1%). A product tree that splices two futures fills up with
  such prefixes; DESIGN §1 / the paper report 27-33% of a 64-node product tree.
- mass per depth: the target probability of the tree's prefixes at each depth, summed
  (the expected number of tokens a tree accepts is the mass it covers).

At temperature 0 every speculative output is also checked against plain decoding.
"""

import dataclasses
import gzip
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mfd_hub.errors import MfdHubError
from mfd_hub.journal import append_line, check_header, read_entries

RARE = 0.01


@dataclass
class RunStats:
    """Accumulated over the prompts of one (drafter, method, budget, temperature) cell."""

    drafter: str
    method: str
    budget: object  # an int, or "auto"
    temperature: float
    dtype: str = "float32"
    tokens: int = 0
    rounds: int = 0
    seconds: float = 0.0
    stage_seconds: dict = field(default_factory=dict)
    nodes: int = 0
    tree_nodes: int = 0  # nodes verified over all rounds (the budgets "auto" chose, for it)
    rare_last_step: int = 0
    chimeras: int = 0
    mass_by_depth: dict = field(default_factory=dict)
    nodes_by_depth: dict = field(default_factory=dict)
    mismatches: int = 0  # T = 0 outputs not identical to plain decoding in the same dtype
    near_ties: int = 0  # ... of which diverged at a near-tie that rounding explains
    divergences: list = field(default_factory=list)  # every non-identical output's classification
    prompts: int = 0
    tokens_accepted: int = 0
    rounds_by_modes: dict = field(default_factory=dict)  # rounds per count of modes drafted (0: a plain step)

    def add(self, other):
        """Fold ``other`` (the same cell, other prompts) into this one."""
        for name in ("tokens", "rounds", "seconds", "nodes", "tree_nodes", "rare_last_step", "chimeras",
                     "mismatches", "near_ties", "prompts", "tokens_accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("stage_seconds", "mass_by_depth", "nodes_by_depth", "rounds_by_modes"):
            mine = getattr(self, name)
            for key, value in getattr(other, name).items():
                mine[key] = mine.get(key, 0) + value
        self.divergences.extend(other.divergences)

    def to_json(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data):
        data = dict(data)
        for name in ("mass_by_depth", "nodes_by_depth", "rounds_by_modes"):  # JSON keys are strings; these are ints
            data[name] = {int(key): value for key, value in data.get(name, {}).items()}
        return cls(**data)

    def row(self, baseline):
        """baseline: {"dtype", "tokens", "seconds"}: the fastest plain decoding at this temperature."""
        tau = self.tokens_accepted / self.rounds if self.rounds else float("nan")
        speed = self.tokens / self.seconds if self.seconds else float("nan")
        plain = baseline["tokens"] / baseline["seconds"] if baseline["seconds"] else float("nan")
        depths = sorted(self.mass_by_depth)
        return {
            "drafter": self.drafter,
            "method": self.method,
            "budget": self.budget,
            "temperature": self.temperature,
            "dtype": self.dtype,
            "prompts": self.prompts,
            "tau": tau,
            "tokens_per_second": speed,
            "plain_tokens_per_second": plain,
            "baseline_dtype": baseline["dtype"],
            "speedup": speed / plain if plain == plain and plain > 0 else float("nan"),
            "mean_tree_size": self.tree_nodes / self.rounds if self.rounds else None,
            "stage_seconds_per_round": {k: v / max(1, self.rounds) for k, v in self.stage_seconds.items()},
            # how many modes each round drafted (auto chooses the mixture's): share of rounds, and the mean
            "modes_drafted": {m: n / max(1, self.rounds) for m, n in sorted(self.rounds_by_modes.items())},
            "mean_modes_drafted": (sum(m * n for m, n in self.rounds_by_modes.items()) / self.rounds
                                   if self.rounds_by_modes and self.rounds else None),
            "chimera_share": self.chimeras / self.nodes if self.nodes else None,
            "rare_last_step_share": self.rare_last_step / self.nodes if self.nodes else None,
            "mass_per_depth": {d: self.mass_by_depth[d] / max(1, self.rounds) for d in depths},
            "mismatches": self.mismatches,
            "near_ties": self.near_ties,
            "unexplained": self.mismatches - self.near_ties,
            "divergences": list(self.divergences),
        }


PROGRESS_NAME = "progress.jsonl"
PACKED_PROGRESS_NAME = PROGRESS_NAME + ".gz"


class BenchJournal:
    """The prompts a bench run has finished, in ``OUT/progress.jsonl``, so that a run of hours
    survives being stopped (Ctrl-C, a crash, a restart): a first line with the run's settings, then
    one line per (temperature, prompt) with that prompt's plain decodings and configurations,
    appended as each ends. With ``resume``, a later run into the same folder with the same settings
    reads the prompts found there (by name and token ids, so ``--limit 20`` can grow into all 164)
    and runs only the rest; other settings are refused. Without it an old journal is discarded and
    the run starts afresh (its results would be replaced anyway). A line cut by a crash is dropped.
    Timings read back were taken when their prompt ran: each prompt's plain and speculative runs
    side by side, so ratios stay fair across the runs that resume one another.

    A finished run's journal may be kept packed (``pack_journal``: ``progress.jsonl.gz``, a fifth
    of the size, so that results kept in git stay small); a resume checks its settings first (a
    refused resume leaves it as it was), then unpacks it and goes on as above."""

    def __init__(self, out_dir, settings, resume=False):
        self.path = Path(out_dir) / PROGRESS_NAME
        packed = self.path.with_name(PACKED_PROGRESS_NAME)
        self.settings = json.loads(json.dumps(settings))  # as it reads back
        self.units = {}
        if not resume:
            for old in (self.path, packed):
                if old.exists():
                    old.unlink()
        if not self.path.exists() and packed.exists():
            text = gzip.decompress(packed.read_bytes())
            check_header(text.split(b"\n", 1)[0], packed, self.settings, "bench")
            temporary = self.path.with_suffix(".tmp")
            temporary.write_bytes(text)
            temporary.replace(self.path)
            packed.unlink()
        if self.path.exists():
            for unit in read_entries(self.path, self.settings, "bench"):
                self.units[(unit["temperature"], unit["prompt"], unit["ids"])] = unit
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            append_line(self.path, {"format": "mfd-hub-bench-progress-1", "settings": self.settings})

    @staticmethod
    def _ids_digest(ids):
        return hashlib.sha256(json.dumps(ids.reshape(-1).tolist()).encode()).hexdigest()[:16]

    def get(self, temperature, name, ids):
        """The finished unit of this prompt ({"plain", "cells"}), or None."""
        unit = self.units.get((float(temperature), name, self._ids_digest(ids)))
        if unit is None:
            return None
        return {"plain": unit["plain"], "cells": [RunStats.from_json(cell) for cell in unit["cells"]]}

    def add(self, temperature, name, ids, unit):
        line = {"temperature": float(temperature), "prompt": name, "ids": self._ids_digest(ids),
                "plain": unit["plain"], "cells": [stats.to_json() for stats in unit["cells"]]}
        append_line(self.path, line)
        self.units[(line["temperature"], name, line["ids"])] = line

    def __len__(self):
        return len(self.units)



def pack_journal(out_dir):
    """Store a bench folder's ``progress.jsonl`` as ``progress.jsonl.gz`` (byte-reproducible: no
    time stamp), which ``BenchJournal`` reads back on a resume. -> whether a journal was packed."""
    plain = Path(out_dir) / PROGRESS_NAME
    if not plain.exists():
        return False
    packed = plain.with_name(PACKED_PROGRESS_NAME)
    temporary = packed.with_suffix(".tmp")
    temporary.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=9, mtime=0))
    temporary.replace(packed)
    plain.unlink()
    return True


def _tree_coverage(stats, tree, tokens, logits, temperature):
    """Fold one round's tree into ``stats``: target probability of every node's last step."""
    probs = torch.softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
    parents = tree.parents
    n = parents.shape[0]
    step = torch.ones(n, dtype=torch.float64)
    step[1:] = probs[parents[1:], tokens[1:]].double()
    path_prob = step.clone()
    rare_on_path = torch.zeros(n, dtype=torch.bool)
    rare_on_path[1:] = step[1:] < RARE
    for i in range(1, n):  # parents precede children
        p = int(parents[i])
        path_prob[i] = path_prob[p] * step[i]
        rare_on_path[i] |= bool(rare_on_path[p])
    depths = tree.depths.tolist()
    for i in range(1, n):
        d = depths[i]
        stats.mass_by_depth[d] = stats.mass_by_depth.get(d, 0.0) + float(path_prob[i])
        stats.nodes_by_depth[d] = stats.nodes_by_depth.get(d, 0) + 1
    stats.nodes += n - 1
    stats.rare_last_step += int((step[1:] < RARE).sum())
    stats.chimeras += int(rare_on_path[1:].sum())


def plain_decode(target, ids, max_new_tokens, temperature, stop_ids, seed, with_logits=False):
    """Plain decoding with transformers' generate -> (new token ids, seconds, logits or None);
    ``with_logits`` (T = 0 only) also returns plain decoding's own logits per new token."""
    from mfd_hub.targets import greedy_decode

    torch.manual_seed(seed)
    start = time.perf_counter()
    logits = None
    if temperature == 0:
        new = greedy_decode(target, ids, max_new_tokens, stop_ids=stop_ids, return_logits=with_logits)
        if with_logits:
            new, logits = new
    else:
        out = target.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=True,
            temperature=temperature, top_k=0, top_p=1.0, eos_token_id=stop_ids or None, pad_token_id=0,
        )
        new = out[0, ids.shape[1] :].tolist()
    return new, time.perf_counter() - start, logits


def methods_for(draft, methods):
    """The methods a drafter can run: the mixture needs modes (K > 0)."""
    return [m for m in methods if m != "mixture" or draft.config.num_modes > 0]


def cells_per_prompt(drafters, methods, budgets):
    return sum(len(budgets) if m != "chain" else 1 for d in drafters.values() for m in methods_for(d, methods))


def run_benchmark(targets, spec_dtype, stop_ids, encoded_prompts, drafters, methods, budgets, temperatures,
                  max_new_tokens=128, seed=0, progress=None, journal=None, prompt_names=None):
    """targets: {torch dtype: the target in it}, plain decoding runs in each and the fastest is the
    baseline; speculation runs in ``spec_dtype`` (drafters already in it). encoded_prompts: list
    of [1, L] id tensors; drafters: {label: DFlashDraftModel}; budgets: ints and/or "auto".
    ``journal`` (a ``BenchJournal``): prompts it already holds are read from it instead of run,
    and every prompt run is added to it; ``prompt_names`` name the prompts there (default: their
    index). Returns the list of result rows (one per drafter x method x budget x temperature)."""
    cells, plain = {}, {}
    for temperature in temperatures:
        for index, ids in enumerate(encoded_prompts):
            name = str(prompt_names[index]) if prompt_names else str(index)
            unit = journal.get(temperature, name, ids) if journal is not None else None
            if unit is None:
                unit = _bench_one_prompt(targets, spec_dtype, stop_ids, index, ids, drafters, methods, budgets,
                                         temperature, max_new_tokens, seed, progress)
                if journal is not None:
                    journal.add(temperature, name, ids, unit)
            elif progress is not None:
                progress(len(unit["cells"]))
            for dtype, (tokens, seconds) in unit["plain"].items():
                total = plain.setdefault((temperature, dtype), [0, 0.0])
                total[0] += tokens
                total[1] += seconds
            for stats in unit["cells"]:
                key = (stats.drafter, stats.method, stats.budget, stats.temperature)
                if key in cells:
                    cells[key].add(stats)
                else:
                    cells[key] = stats
    baselines = {}
    for (temperature, dtype), (tokens, seconds) in plain.items():
        best = baselines.get(temperature)
        if best is None or tokens / seconds > best["tokens"] / best["seconds"]:
            baselines[temperature] = {"dtype": dtype, "tokens": tokens, "seconds": seconds}
    return [cell.row(baselines[cell.temperature]) for cell in cells.values()]


def _bench_one_prompt(targets, spec_dtype, stop_ids, index, ids, drafters, methods, budgets, temperature,
                      max_new_tokens, seed, progress):
    """Plain decoding in every dtype, then every configuration, on one prompt -> {"plain": {dtype
    name: [tokens, seconds]}, "cells": [RunStats of this prompt alone]}."""
    from mfd_hub.near_tie import classify_divergence
    from mfd_hub.precision import dtype_name

    plain, reference, cells = {}, None, []
    target = targets[spec_dtype]
    for dtype, model in targets.items():  # every plain dtype, interleaved with the cells
        tokens, seconds, logits = plain_decode(model, ids, max_new_tokens, temperature, stop_ids, seed + index,
                                               with_logits=temperature == 0 and dtype == spec_dtype)
        plain[dtype_name(dtype)] = [len(tokens), seconds]
        if dtype == spec_dtype:
            reference = (tokens, logits)
    for label, draft in drafters.items():
        for method in methods_for(draft, methods):
            for budget in budgets if method != "chain" else [_chain_budget(budgets)]:
                stats = RunStats(label, method, budget, temperature, dtype_name(spec_dtype))

                def on_round(tree, tokens, logits, path, stats=stats, method=method):
                    if method != "chain":
                        _tree_coverage(stats, tree, tokens, logits, temperature)

                out = draft.spec_generate(
                    target, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                    stop_token_ids=stop_ids, method=method, tree_budget=budget, on_round=on_round,
                    generator=torch.Generator().manual_seed(seed + index),
                )
                stats.prompts += 1
                stats.tokens += len(out.new_tokens)
                stats.tokens_accepted += sum(out.acceptance_lengths)
                stats.rounds += out.rounds
                stats.tree_nodes += sum(out.tree_sizes)
                stats.seconds += out.seconds
                for k, v in out.stage_seconds.items():
                    stats.stage_seconds[k] = stats.stage_seconds.get(k, 0.0) + v
                for m in out.modes_drafted:
                    stats.rounds_by_modes[m] = stats.rounds_by_modes.get(m, 0) + 1
                if temperature == 0:
                    check = classify_divergence(reference[0], out.new_tokens, reference[1], spec_dtype, target, ids)
                    if not check["identical"]:
                        stats.mismatches += 1
                        stats.near_ties += 1 if check["explained"] else 0
                        stats.divergences.append({"prompt": index, **check})
                cells.append(stats)
                if progress is not None:
                    progress(1)
    return {"plain": plain, "cells": cells}


def _chain_budget(budgets):
    """A chain runs once: at the smallest fixed budget, or "auto" when only "auto" is asked."""
    fixed = [b for b in budgets if b != "auto"]
    return min(fixed) if fixed else "auto"


ROUND_STAGES = ("draft", "tree", "verify", "commit")


def round_stages_ms(seconds_per_round):
    """'draft / tree / verify / commit' in ms a round, where a user sees where a round's time goes."""
    return " / ".join(f"{1000 * seconds_per_round.get(stage, 0.0):.1f}" for stage in ROUND_STAGES)


def markdown_table(rows):
    header = ("| drafter | method | B | dtype | T | tau | speedup | tok/s | baseline | chimera share | "
              "divergences (near-tie) | ms a round: " + " / ".join(ROUND_STAGES) + " |")
    lines = [header, "|" + "---|" * 12]
    for r in rows:
        chim = "" if r["chimera_share"] is None else f"{100 * r['chimera_share']:.1f}%"
        budget = r["budget"] if r["budget"] != "auto" else f"auto ({r['mean_tree_size']:.1f})"
        lines.append(
            f"| {r['drafter']} | {r['method']} | {budget} | {r['dtype']} | {r['temperature']:g} | {r['tau']:.2f} | "
            f"{r['speedup']:.2f}x | {r['tokens_per_second']:.1f} | {r['plain_tokens_per_second']:.1f} "
            f"{r['baseline_dtype']} | {chim} | {r['mismatches']} ({r['near_ties']}) | "
            f"{round_stages_ms(r['stage_seconds_per_round'])} |"
        )
    return "\n".join(lines) + "\n"


def write_outputs(rows, out_dir, meta):
    """results.json, results.md and PNG plots (speedup and tau against budget, per method; only
    with matplotlib installed, the ``plots`` extra) -> the names written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (out_dir / "results.md").write_text(markdown_table(rows))
    written = ["results.json", "results.md"]
    try:
        import matplotlib
    except ImportError:
        return written + ["(no plots: pip install matplotlib)"]
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for metric in ("speedup", "tau"):
        for temperature in sorted({r["temperature"] for r in rows}):
            fig, ax = plt.subplots(figsize=(6, 4))
            fixed = sorted({r["budget"] for r in rows if r["method"] != "chain" and r["budget"] != "auto"})
            for (label, method) in sorted({(r["drafter"], r["method"]) for r in rows}):
                cell = [r for r in rows if r["drafter"] == label and r["method"] == method
                        and r["temperature"] == temperature]
                pts = sorted((r["budget"], r[metric]) for r in cell if r["budget"] != "auto")
                flat = [(f"{label} {method}", pts[0][1])] if method == "chain" and pts else []
                flat += [(f"{label} {method} auto", r[metric]) for r in cell if r["budget"] == "auto"]
                if pts and method != "chain":
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", marker="o", label=f"{label} {method}")
                for name, value in flat:  # one figure per cell: a level across the fixed budgets
                    xs = fixed or [1]
                    ax.plot(xs, [value] * len(xs), "--" if method == "chain" else ":", label=name)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("tree budget B")
            ax.set_ylabel(metric)
            ax.set_title(f"{metric} vs budget (T={temperature:g})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            name = f"{metric}_T{temperature:g}.png"
            fig.tight_layout()
            fig.savefig(out_dir / name, dpi=110)
            plt.close(fig)
            written.append(name)
    return written


HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n"


def load_prompt_set(spec, limit=None):
    """``humaneval`` (the built-in held-out set, asked as an instruction) or a JSON Lines file
    -> list of (id, prompt text)."""
    from .prompts import humaneval_prompts
    from mfd_hub.recipes.regen import read_prompts

    if spec == "humaneval":
        prompts = [(task, HUMANEVAL_INSTRUCTION + text) for task, text in humaneval_prompts()]
    else:
        prompts = read_prompts(spec)
    if not prompts:
        raise MfdHubError(f"no prompts in {spec}")
    return prompts[:limit] if limit else prompts


def drafter_label(spec):
    """A short name for a drafter in tables: the folder's name (its run's name for a run's final/)."""
    path = Path(str(spec))
    return f"{path.parent.name}/{path.name}" if path.name == "final" and path.parent.name else path.name


def default_drafters(target_spec):
    from mfd_hub.targets import is_smollm2

    if is_smollm2(target_spec):
        return ["MFD-SmolLM2-135M", "DPACE-SmolLM2-135M"]
    raise MfdHubError(f"name the drafters to measure against {target_spec} with --drafter")


def weights_digest(model):
    """sha256 of a model's parameter names, dtypes, shapes and values (a retrained drafter at the
    same path is another drafter)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:20]


def run_bench_command(target_spec, drafter_specs, prompt_spec, limit, methods, budgets, temperatures,
                      max_new_tokens=128, seed=0, out_dir="bench-results", log=None, dtype="auto", resume=False,
                      linears="auto"):
    """What ``mfd-hub bench`` does: load, measure, write -> dict(rows, markdown, files, meta).
    Finished prompts are kept in ``out_dir`` as they end (``BenchJournal``): with ``resume``, a
    run stopped part way goes on from them.

    Raises MfdHubError, after writing the results, when a T = 0 output diverged from plain
    decoding beyond what rounding in the dtype explains."""
    from tqdm import tqdm

    from mfd_hub.pair import load_pair
    from mfd_hub.precision import dtype_name

    prompts = load_prompt_set(prompt_spec, limit)
    specs = list(drafter_specs or default_drafters(target_spec))
    # every drafter loads in fp32 on CPU, then takes the dtype chosen for the first one (timed on the first prompt)
    pair = load_pair(specs[0], target_spec, dtype=dtype, linears=linears, device="cpu", baselines=True,
                     timing_prompt=prompts[0][1], more_drafters=specs[1:], log=log)
    encoded = [pair.encode(text) for _, text in prompts]
    stops, targets, spec_dtype, draft_dtype = pair.stop_ids, pair.plain_targets, pair.dtype, pair.draft_dtype
    drafters = {drafter_label(spec): draft for spec, draft in zip(specs, pair.drafts)}
    linears = pair.linears_choice
    settings = {"target": str(target_spec), "drafters": {label: weights_digest(d) for label, d in drafters.items()},
                "methods": methods, "budgets": budgets, "max_new_tokens": max_new_tokens, "seed": seed,
                "dtype": dtype_name(spec_dtype), "drafter_dtype": dtype_name(draft_dtype),
                "plain_dtypes": [dtype_name(d) for d in targets], "threads": torch.get_num_threads(),
                "linears": linears}  # as the round costs: what runs depends on the CPU (meta says what ran)
    journal = BenchJournal(out_dir, settings, resume=resume)
    if log and len(journal):
        log(f"resuming: {len(journal)} prompt run(s) already in {journal.path}")
    total = len(temperatures) * len(encoded) * cells_per_prompt(drafters, methods, budgets)
    with pair.packed(), tqdm(total=total, desc="bench", unit="run", disable=log is None) as bar:
        if "auto" in budgets:  # the one-time cost measurement is not part of any timed run
            for draft in drafters.values():
                draft.spec_generate(targets[spec_dtype], encoded[0], max_new_tokens=2, tree_budget="auto",
                                    method="mixture" if draft.config.num_modes else "product")
        rows = run_benchmark(targets, spec_dtype, stops, encoded, drafters, methods, budgets, temperatures,
                             max_new_tokens=max_new_tokens, seed=seed, progress=bar.update, journal=journal,
                             prompt_names=[name for name, _ in prompts])
    meta = {
        "target": str(target_spec), "prompts": str(prompt_spec), "prompt_count": len(prompts),
        "drafters": list(drafters), "methods": methods, "budgets": budgets, "temperatures": temperatures,
        "max_new_tokens": max_new_tokens, "seed": seed, "threads": torch.get_num_threads(),
        "device": str(pair.target.device), "dtype": dtype_name(spec_dtype), "drafter_dtype": dtype_name(draft_dtype),
        "plain_dtypes": [dtype_name(d) for d in targets], "linears": pair.linears,
    }
    files = write_outputs(rows, out_dir, meta)
    result = {"meta": meta, "rows": rows, "markdown": markdown_table(rows), "files": files}
    unexplained = [r for r in rows if r["unexplained"]]
    if unexplained:
        r = unexplained[0]
        raise MfdHubError(f"{r['drafter']} {r['method']} B={r['budget']}: {r['unexplained']} output(s) diverged from "
                          f"plain {r['dtype']} decoding beyond what rounding explains (results in {out_dir}): a bug")
    return result
