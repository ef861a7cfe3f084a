"""Jobs side by side (`jupyter-dlc compare A B ...`, `%dlc compare A B ...`): one metric's
curves against step and against wall time, its last and best values, and what differs
between the jobs: spec fields, environment, parameters, script arguments, and the code.

The first job is the reference: every difference and the code diff are against it. Curves
and values are rank 0's, as the sweep's table has them. Stdlib and our client only.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from .spec import SpecError, show
from .sweeps import metric_points

# What the differences table leaves out: the code has its own diff, and these say where a
# job came from rather than what it ran.
NOT_COMPARED = frozenset({"code", "script", "source", "files", "name", "sweep"})
MAX_JOBS = 10
MAX_DIFF_LINES = 400


@dataclass
class Compared:
    job: dict
    script: str
    points: list[tuple[int, float, float]] = field(default_factory=list)  # (step, seconds since submit, value)

    @property
    def last(self) -> float | None:
        return max(self.points)[2] if self.points else None

    @property
    def best(self) -> float | None:
        return min((p[2] for p in self.points), default=None)


def gather(client, refs: list[str], metric: str = "loss") -> list[Compared]:
    """Each job's detail, the script it ran and its rank-0 points of `metric`."""
    if not 2 <= len(refs) <= MAX_JOBS:
        raise SpecError("jobs", f"compare takes 2 to {MAX_JOBS} jobs, got {len(refs)}")
    out = []
    for ref in refs:
        job = client.job(ref)
        created = job.get("created") or 0.0
        steps, _ = metric_points(client, job["id"], metric, with_time=True)
        out.append(Compared(job, client.script(job["id"])["script"],
                            sorted((step, t - created, value) for step, t, value in steps)))
    ids = [c.job["id"] for c in out]
    if len(set(ids)) < len(ids):
        raise SpecError("jobs", f"{show(refs)} names one job twice; give different jobs")
    return out


def flat_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec's fields to compare, with env and params one entry a name."""
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key in NOT_COMPARED:
            continue
        if key in ("env", "params", "resources") and isinstance(value, dict):
            out.update({f"{key}.{name}": item for name, item in value.items()})
        elif key == "args":
            out[key] = " ".join(value or [])
        else:
            out[key] = value
    return out


def differences(jobs: list[Compared]) -> list[tuple[str, list[Any]]]:
    """(field, the value in each job) of every field whose values are not all the same."""
    flats = [flat_spec(c.job.get("spec") or {}) for c in jobs]
    names = list(dict.fromkeys(name for flat in flats for name in flat))
    return [(name, [flat.get(name) for flat in flats]) for name in names
            if len({repr(flat.get(name)) for flat in flats}) > 1]


def code_diff(reference: Compared, other: Compared) -> list[str]:
    """A unified diff of the code two jobs ran, cut at MAX_DIFF_LINES."""
    lines = list(difflib.unified_diff(reference.script.splitlines(), other.script.splitlines(),
                                      fromfile=reference.job["id"], tofile=other.job["id"], lineterm="", n=2))
    if len(lines) > MAX_DIFF_LINES:
        lines = lines[:MAX_DIFF_LINES] + [f"... ({len(lines) - MAX_DIFF_LINES} more lines)"]
    return lines


def value_text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_text(jobs: list[Compared], metric: str = "loss") -> str:
    """What `jupyter-dlc compare` prints: the values, the differences, the code diffs."""
    from .formatting import table

    best = min((c.best for c in jobs if c.best is not None), default=None)
    rows = [("JOB", "STATE", "STEPS", f"LAST {metric.upper()}", f"BEST {metric.upper()}", "WALL")] + [
        (c.job["id"], c.job["state"], str(max(c.points)[0]) if c.points else "-", value_text(c.last),
         value_text(c.best) + (" *" if best is not None and c.best == best else ""),
         f"{c.points[-1][1]:.0f}s" if c.points else "-")
        for c in jobs]
    out = [table(rows), ""]
    found = differences(jobs)
    if found:
        out.append(table([("FIELD", *(c.job["id"] for c in jobs))] +
                         [(name, *(value_text(v) for v in values)) for name, values in found]))
    else:
        out.append("no spec field differs")
    for other in jobs[1:]:
        diff = code_diff(jobs[0], other)
        out += ["", *(diff or [f"the code of {other.job['id']} is the same as {jobs[0].job['id']}'s"])]
    return "\n".join(out)
