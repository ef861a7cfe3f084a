"""Sweeps from a cell or the CLI: `--sweep NAME=VALUES` axes expanded into trials, each a job.

    --sweep lr=1e-3,3e-4,1e-4 --sweep batch=32,64       a grid: 6 trials
    --sweep "lr=loguniform(1e-4,1e-2)" --trials 8       random: 8 trials, seeded (--sweep-seed)
    --sweep "lr=loguniform(1e-4,1e-2)" --sweep batch=32,64 --trials 4    each grid point 4 times

Random axes: `uniform(a,b)`, `loguniform(a,b)` (a > 0), `randint(a,b)` (a <= n < b, as Ray
Tune's) and `choice(x,y,...)`. Grid values are numbers where they parse as numbers, true or
false, else strings. Without a random axis, `--trials N` repeats each grid point N times.

Each trial is a job (named NAME-K) with its values in the spec's `params` (runtime.params(),
DLC_PARAM_<NAME>) and `sweep: {id, trial, parallel}`; the launcher's admission runs at most
`parallel` of a sweep's trials at once (launcher/supervisor.py `admit`), so a sweep outlives
the kernel that submitted it. The trials are checked, all of them, before the first is
submitted.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import product
from typing import Any

from .spec import PARAM_NAME, JobSpec, SpecError, show

MAX_TRIALS = 1000
_AXIS = re.compile(r"^\s*(?P<name>[^=\s]+)\s*=(?P<values>.*)$", re.S)
_DRAW = re.compile(r"^\s*(?P<kind>uniform|loguniform|randint|choice)\s*\((?P<args>.*)\)\s*$", re.S)
_INT = re.compile(r"^[+-]?\d{1,18}$")


@dataclass(frozen=True)
class Axis:
    name: str
    grid: tuple[Any, ...] = ()        # the values of a grid axis
    draw: str | None = None           # uniform | loguniform | randint | choice
    args: tuple[Any, ...] = ()

    def sample(self, rng: random.Random) -> Any:
        low, high = (self.args + (None, None))[:2]
        if self.draw == "uniform":
            return rng.uniform(low, high)
        if self.draw == "loguniform":
            return math.exp(rng.uniform(math.log(low), math.log(high)))
        if self.draw == "randint":
            return rng.randrange(int(low), int(high))
        return rng.choice(self.args)


def parse_value(text: str) -> Any:
    """`32` → 32, `1e-3` → 0.001, `true` → True, anything else the string itself."""
    word = text.strip()
    if _INT.fullmatch(word):
        return int(word)
    if word.lower() in ("true", "false"):
        return word.lower() == "true"
    try:
        number = float(word)
    except ValueError:
        return word
    return number if math.isfinite(number) else word


def parse_axis(text: str) -> Axis:
    """One `--sweep` value. SpecError (field `sweep`) naming what is wrong."""
    if not isinstance(text, str) or len(text) > 4096:
        raise SpecError("sweep", f"expected NAME=VALUES, got {show(text)}")
    match = _AXIS.match(text)
    if not match:
        raise SpecError("sweep", f"expected NAME=VALUES (lr=1e-3,3e-4 or \"lr=loguniform(1e-4,1e-2)\"), "
                        f"got {show(text)}")
    name, values = match.group("name"), match.group("values")
    if not PARAM_NAME.fullmatch(name):
        raise SpecError("sweep", f"{show(name)} is not a parameter name; use letters, digits and _ "
                        "(not first), e.g. lr or batch_size")
    draw = _DRAW.match(values)
    if draw is None:
        grid = tuple(parse_value(v) for v in values.split(","))
        if not values.strip() or any(v == "" for v in grid):
            raise SpecError("sweep", f"{name}: a value is empty in {show(values)}; list them as {name}=1,2,3")
        return Axis(name, grid=grid)
    kind = draw.group("kind")
    args = tuple(parse_value(v) for v in draw.group("args").split(","))
    if kind == "choice":
        if any(a == "" for a in args):
            raise SpecError("sweep", f"{name}: choice() needs values, e.g. choice(relu,gelu)")
        return Axis(name, draw=kind, args=args)
    numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if len(args) != 2 or len(numbers) != 2 or not numbers[0] < numbers[1]:
        raise SpecError("sweep", f"{name}: {kind}(low,high) needs two numbers, low below high; "
                        f"got {show(draw.group('args'))}")
    if kind == "loguniform" and numbers[0] <= 0:
        raise SpecError("sweep", f"{name}: loguniform needs a low bound above 0, got {numbers[0]:g}")
    if kind == "randint" and not all(isinstance(n, int) for n in numbers):
        raise SpecError("sweep", f"{name}: randint(low,high) takes whole numbers")
    return Axis(name, draw=kind, args=tuple(numbers))


def expand(axes_text: Iterable[str], trials: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """The trials' parameters, in order: the grid's points (the first axis slowest), each
    `trials` times, random axes drawn per trial from a generator seeded with `seed`."""
    axes = [parse_axis(text) for text in axes_text]
    if not axes:
        return []
    names = [a.name for a in axes]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise SpecError("sweep", f"{repeated[0]} is swept twice; give each parameter one --sweep")
    grid = [a for a in axes if a.draw is None]
    drawn = [a for a in axes if a.draw is not None]
    if drawn and trials is None:
        raise SpecError("trials", f"{drawn[0].name} is drawn at random: say how many trials, e.g. --trials 8")
    if trials is not None and not 1 <= trials <= MAX_TRIALS:
        raise SpecError("trials", f"must be between 1 and {MAX_TRIALS}, got {trials}")
    points = list(product(*(a.grid for a in grid)))
    total = len(points) * (trials or 1)
    if total > MAX_TRIALS:
        raise SpecError("sweep", f"{total} trials; at most {MAX_TRIALS} are allowed")
    rng = random.Random(seed)
    out = []
    for point in points:
        for _ in range(trials or 1):
            values = dict(zip((a.name for a in grid), point, strict=True))
            values.update({a.name: a.sample(rng) for a in drawn})
            out.append({name: values[name] for name in names})
    return out


def trial_specs(spec: JobSpec, trials: list[dict[str, Any]], parallel: int | None,
                sweep_id: str | None = None) -> list[JobSpec]:
    """One validated spec a trial: named NAME-K, with its values and its sweep."""
    if parallel is not None and not 1 <= parallel <= 1024:
        raise SpecError("parallel", f"must be between 1 and 1024, got {parallel}")
    sweep_id = sweep_id or f"{spec.name[:44]}-sweep-{secrets.token_hex(3)}"
    return [dataclasses.replace(spec, name=f"{spec.name[:56]}-{k}", params={**spec.params, **values},
                                sweep={"id": sweep_id, "trial": k, "parallel": parallel}).validate()
            for k, values in enumerate(trials)]


def from_options(options: Any, spec: JobSpec) -> list[JobSpec]:
    """The trial specs of `--sweep/--trials/--parallel/--sweep-seed` over the cell's or the
    script's spec; [] when there is no sweep (and then those options are refused)."""
    if not options.sweep:
        for flag, value in (("trials", options.trials), ("parallel", options.parallel)):
            if value is not None:
                raise SpecError(flag, f"only applies to a sweep; add --sweep NAME=VALUES or drop --{flag}")
        return []
    return trial_specs(spec, expand(options.sweep, options.trials, options.sweep_seed), options.parallel)


def submit(client, specs: list[JobSpec]) -> list[dict]:
    """Submit the trials in order; where the launcher refuses one (all share the refusal, so
    the first), nothing after it is sent and the error says what was."""
    jobs = []
    for spec in specs:
        try:
            jobs.append(client.submit(spec))
        except Exception as error:
            if not jobs:
                raise
            raise type(error)(f"{error} (trial {len(jobs)}; trials 0-{len(jobs) - 1} were submitted: "
                              f"{', '.join(j['id'] for j in jobs)})") from None
    return jobs


def metric_points(client, job_id: str, metric: str = "loss", since: int = 0,
                  with_time: bool = False) -> tuple[list, int]:
    """Rank 0's finite (step, value) points of `metric` after seq `since` ((step, t, value)
    `with_time`), and the last seq read."""
    out = []
    for p in client.metrics_after(job_id, since):
        since = max(since, p["seq"])
        if p["name"] == metric and p["rank"] == 0 and isinstance(p["value"], (int, float)) \
                and not isinstance(p["value"], bool) and math.isfinite(p["value"]):
            out.append((p["step"], p["t"], p["value"]) if with_time else (p["step"], p["value"]))
    return out, since


def trial_jobs(client, sweep_id: str) -> list[dict]:
    """The sweep's jobs as the launcher lists them, by trial."""
    return sorted((j for j in client.jobs() if (j.get("sweep") or {}).get("id") == sweep_id),
                  key=lambda j: j["sweep"]["trial"])


def trials_of(client, sweep_id: str, metric: str = "loss") -> list[dict]:
    """The sweep's jobs, by trial, each with `best` (the lowest `metric` rank 0 logged) and
    `last`; what `jupyter-dlc sweep` shows."""
    jobs = trial_jobs(client, sweep_id)
    if not jobs:
        raise SpecError("sweep", f"no trials of sweep {show(sweep_id)}; `jupyter-dlc list` shows the jobs")
    out = []
    for job in jobs:
        values, _ = metric_points(client, job["id"], metric)
        out.append(dict(job, best=min((v for _, v in values), default=None),
                        last=max(values)[1] if values else None))
    return out
