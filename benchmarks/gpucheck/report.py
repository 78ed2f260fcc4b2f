"""The report: one record per check (its kind decides the exit code), the printed table and the
JSON form."""

import math
import sys
import time
import traceback


EXACT, GOAL, INFO = "exact", "goal", "info"  # exactness (decides the exit code), goals, plain figures


class Report:
    def __init__(self, device, quick, compat):
        self.device, self.quick, self.compat = device, quick, compat
        self.checks = []
        self.section_seconds = {}

    def run(self, section, name, kind, goal, fn, unsupported_if=None):
        """Run one check: ``fn() -> (measured text, ok, value, details)``. An exception becomes an
        ``error`` (or ``unsupported`` when ``unsupported_if`` names why this environment cannot
        run it); goals off the full GPU shapes are ``n/a``."""
        started = time.perf_counter()
        try:
            measured, ok, value, details = fn()
            if kind == INFO:
                status = "info"
            elif kind == GOAL and (self.quick or self.device != "cuda") and ok is not None and section == "speed":
                status = "n/a"
            else:
                status = "pass" if ok else "fail"
        except Exception as error:  # report it and carry on with the other checks
            first = (str(error).strip().splitlines() or [""])[0][:300]
            measured, value = f"{type(error).__name__}: {first}", None
            details = {"traceback": traceback.format_exc().splitlines()[-12:]}
            status = "error"
            if unsupported_if:
                status = "unsupported"
                measured = f"{unsupported_if}; raised {measured}"
        if unsupported_if and status != "unsupported":
            details = {**(details or {}), "note": f"the compatibility probe expected problems: {unsupported_if}"}
        self.checks.append({
            "name": name, "section": section, "kind": kind, "goal": goal, "measured": measured,
            "value": value, "status": status,
            "passed": {"pass": True, "fail": False, "error": False, "unsupported": False}.get(status),
            "seconds": round(time.perf_counter() - started, 3), "details": details or {},
        })
        return self.checks[-1]


def exit_code(checks):
    """1 when an exactness check did not pass or any check could not run, else 0."""
    for check in checks:
        if check["status"] in ("error", "unsupported"):
            return 1
        if check["kind"] == EXACT and check["status"] != "pass":
            return 1
    return 0


def print_table(checks, stream=sys.stdout):
    rows = [(c["name"], c["goal"], c["measured"], c["status"]) for c in checks]
    widths = [max(len("check"), *(len(r[0]) for r in rows)), 44, 78, 11]

    def wrap(text, width):
        words, lines, line = str(text).split(" "), [], ""
        for word in words:
            if line and len(line) + 1 + len(word) > width:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        return lines + [line]

    header = f"{'check':<{widths[0]}}  {'goal':<{widths[1]}}  {'measured':<{widths[2]}}  status"
    print(header, file=stream)
    print("-" * len(header), file=stream)
    for name, goal, measured, status in rows:
        goal_lines, measured_lines = wrap(goal, widths[1]), wrap(measured, widths[2])
        for i in range(max(len(goal_lines), len(measured_lines))):
            first = i == 0
            print(f"{name if first else '':<{widths[0]}}  {goal_lines[i] if i < len(goal_lines) else '':<{widths[1]}}  "
                  f"{measured_lines[i] if i < len(measured_lines) else '':<{widths[2]}}  {status if first else ''}",
                  file=stream)


def summarise(checks):
    counts = {}
    for c in checks:
        key = f"{c['kind']}:{c['status']}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def clean(value):
    """JSON-safe: NaN/inf become null, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value
