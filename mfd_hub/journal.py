"""Append-only JSON-lines journals of long runs (``bench``, ``evaluate --trees``): a header line with
the run's settings, then one line per finished unit, each synced as it ends, so a run of hours
survives being stopped and a resume reads back what it finished."""

import json
import os

from .errors import MfdHubError


def check_header(first_line, path, settings, what, format_name=None):
    """Refuse, with one line, a journal of another kind or with other settings than ``settings``."""
    try:
        header = json.loads(first_line)
    except json.JSONDecodeError:
        raise MfdHubError(f"{path}: not a {what} progress file; run without --resume to replace it") from None
    if header.get("settings") != settings or (format_name is not None and header.get("format") != format_name):
        old = header.get("settings") or {}
        changed = sorted(k for k in set(settings) | set(old) if old.get(k) != settings.get(k))
        raise MfdHubError(f"{path} holds a {what} run with other settings ({', '.join(changed)}); "
                          "resume it with the same ones, or run without --resume to start afresh")


def read_entries(path, settings, what, format_name=None):
    """The entries after the header of the journal at ``path``, once its header is checked. A line
    cut by a crash is dropped from the file, so that the next line appended starts clean."""
    lines = path.read_bytes().split(b"\n")
    check_header(lines[0], path, settings, what, format_name)
    if lines[-1]:
        with open(path, "r+b") as handle:
            handle.truncate(sum(len(line) + 1 for line in lines[:-1]))
    entries = []
    for line in lines[1:-1]:  # the last piece has no newline: empty, or cut by a crash
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def append_line(path, document):
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(document) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
