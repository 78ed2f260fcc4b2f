"""``mfd-hub verify``: is a drafter checkpoint sound? A report of named checks.

Each check passes, fails or is skipped with a reason; a checkpoint is sound when none fails.
Nothing here unpickles anything: ``.bin``/``.pt`` files are reported, never loaded.
"""

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASS, FAIL, SKIP, WARN = "pass", "fail", "skip", "warn"


@dataclass
class CheckResult:
    name: str
    status: str
    reason: str = ""


@dataclass
class VerifyReport:
    path: str
    checks: list = field(default_factory=list)

    @property
    def ok(self):
        return not self.failures()

    def failures(self):
        return [c for c in self.checks if c.status == FAIL]

    def add(self, name, status, reason=""):
        self.checks.append(CheckResult(name, status, reason))

    def to_dict(self):
        return {"path": self.path, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


def _check_config(report, folder):
    from .checkpoint import checkpoint_format, config_from_zlab
    from .errors import MfdHubError
    from .remote.configuration_mfd import DFlashConfig, drafter_config_problems

    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        fmt = checkpoint_format(raw)
        config = config_from_zlab(raw) if fmt == "zlab" else DFlashConfig.from_dict(raw)
    except FileNotFoundError:
        report.add("config", FAIL, "config.json is missing")
        return None
    except (json.JSONDecodeError, UnicodeDecodeError, MfdHubError, ValueError, TypeError, KeyError) as err:
        report.add("config", FAIL, " ".join(str(err).split()) or type(err).__name__)
        return None
    problems = drafter_config_problems(config)
    if problems:
        report.add("config", FAIL, problems[0])
        return None
    report.add("config", PASS, f"{fmt} drafter, {config.num_hidden_layers} layers, K={config.num_modes}")
    return config


def _check_weights(report, folder, config):
    """Expected tensors present with the right shapes, nothing unexpected, all finite."""
    import torch
    from safetensors import safe_open

    from .remote.modeling_mfd import DFlashDraftModel

    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in DFlashDraftModel(config).state_dict().items()}
    found = {}
    nonfinite = []
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                found[name] = tuple(tensor.shape)
                if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    nonfinite.append(name)
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(n for n in set(expected) & set(found) if expected[n] != found[n])
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing[:3]}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:3]}")
        if wrong:
            parts.append(f"{wrong[0]} has shape {found[wrong[0]]}, expected {expected[wrong[0]]}")
        report.add("tensors", FAIL, "; ".join(parts))
    else:
        total = sum(math.prod(s) for s in found.values())
        report.add("tensors", PASS, f"{len(found)} tensors, {total:,} values")
    report.add("finite", FAIL if nonfinite else PASS, f"non-finite values in {nonfinite[0]}" if nonfinite else "")


def verify_checkpoint(path, target=None):
    """Run every check on a checkpoint folder -> VerifyReport (``report.ok`` when sound)."""
    folder = Path(path)
    report = VerifyReport(path=str(folder))
    if not folder.is_dir():
        report.add("folder", FAIL, f"{folder} is not a folder")
        return report
    config = _check_config(report, folder)
    if config is not None:
        _check_weights(report, folder, config)
    return report
