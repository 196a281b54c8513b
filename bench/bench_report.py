"""The JSON report that the Python benchmarks write when given --json.

Each benchmark gathers its figures in one dict; this writes it out in the
one place, so that every report is written the same way.
"""
import json


def write_json_report(path, report, indent=1):
    """Writes `report` to `path` as JSON indented by `indent`; nothing when `path`
    is empty or None (no --json)."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump(report, f, indent=indent)
