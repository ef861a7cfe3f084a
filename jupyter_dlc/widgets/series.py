"""Chart data of one job, kept bounded: metric points in, (x, y) columns per line out.

Pure Python (no widgets, no bokeh) so that the reduction rules can be tested on their own:

- every line holds at most `capacity` points: at capacity it keeps every other point and
  from then on accepts every 2nd (then 4th...) new point, so a long job keeps its whole
  history at a coarser resolution instead of losing its beginning;
- a resumed attempt continues from its checkpoint: when the first point of a new attempt
  arrives at step s, every train line drops its points at steps >= s, so the chart shows
  the trajectory that the model actually has;
- with more than MAX_RANK_LINES ranks a train metric is drawn as the mean over ranks with a
  min-max band, plus a line for each rank found to be an outlier (at most MAX_OUTLIERS),
  from the step where it first stood out: one line per rank does not scale to 4,096 ranks,
  and the one rank that diverges is what the user needs to see. The launcher folds the
  points into band rows (jupyter_dlc/bands.py; the view reads with `band=`); rows of one
  step, and the outlier ranks' own points, add up here, and a step's band is emitted once
  every rank is in it, or as a partial one when 64 newer steps wait on a rank that stopped
  logging. The step's outlier candidates (named by the launcher among the values it read)
  become outliers at emission, farthest from the mean first. Band and outlier lines stay
  in step order: a step a rank skipped is drawn after later ones, in its place.
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from collections import deque

from ..bands import MAX_OUTLIERS, MAX_RANK_LINES, outlier_ranks  # noqa: F401 (outlier_ranks: tests)

# The step broken down (runtime/breakdown.py): the parts drawn stacked, compute the rest.
STEP_MS = "step_ms"
STEP_PARTS = (("data", "data_wait_ms", "data wait"), ("sync", "grad_sync_ms", "gradient sync"),
              ("ckpt", "ckpt_stall_ms", "checkpoint stall"))
BREAKDOWN_NAMES = (STEP_MS,) + tuple(name for _, name, _ in STEP_PARTS)
BREAKDOWN_STEPS = 200   # the last steps the "where each step goes" chart draws
PENDING_STEPS = 64      # steps waiting for their last rank before a partial mean is drawn
SAMPLE_RATE_NAMES = ("samples_per_s", "samples_per_sec", "samples/s", "samples_per_second")


class Line:
    """x and y columns (plus any `extra` columns, e.g. a band's lo/hi) of one line with the
    halving rule above. `take_new()` hands over what was accepted since the last call, or
    the whole line when it must be re-sent (`reset`)."""

    def __init__(self, capacity: int, extra: tuple[str, ...] = ()):
        self.capacity = max(4, int(capacity))
        self.names = ("x", "y") + tuple(extra)
        self.cols: dict[str, list[float]] = {n: [] for n in self.names}
        self.stride = 1
        self._skipped = 0
        self.new: dict[str, list[float]] = {n: [] for n in self.names}
        self.reset = False

    @property
    def x(self) -> list[float]:
        return self.cols["x"]

    @property
    def y(self) -> list[float]:
        return self.cols["y"]

    def append(self, x: float, y: float, **extra: float) -> None:
        if self.stride > 1:
            self._skipped += 1
            if self._skipped < self.stride:
                return
            self._skipped = 0
        row = dict(extra, x=x, y=y)
        for name in self.names:
            self.cols[name].append(row[name])
            self.new[name].append(row[name])
        self._halve_when_full()

    def put(self, x: float, y: float, **extra: float) -> None:
        """`append`, but a point below the line's last x goes in its place, and the line is
        re-sent: a band's step drawn after a later one (a rank skipped it, so it waited)."""
        xs = self.cols["x"]
        if not xs or x >= xs[-1]:
            self.append(x, y, **extra)
            return
        at = bisect_right(xs, x)
        row = dict(extra, x=x, y=y)
        for name in self.names:
            self.cols[name].insert(at, row[name])
        self.reset = True
        self._halve_when_full()

    def _halve_when_full(self) -> None:
        if len(self.cols["x"]) >= self.capacity:
            self.cols = {n: v[::2] for n, v in self.cols.items()}
            self.stride *= 2
            self.reset = True

    def truncate_from(self, x: float) -> None:
        """Drop points at x >= `x` (a resumed attempt re-does those steps)."""
        if self.x and self.x[-1] >= x:
            keep = sum(1 for v in self.x if v < x)
            self.cols = {n: v[:keep] for n, v in self.cols.items()}
            self.reset = True

    def take_new(self) -> tuple[str, dict] | None:
        """("reset", full columns) or ("stream", new columns) or None; clears the pending."""
        if self.reset:
            out = ("reset", {n: list(v) for n, v in self.cols.items()})
        elif self.new["x"]:
            out = ("stream", {n: list(v) for n, v in self.new.items()})
        else:
            out = None
        self.reset = False
        self.new = {n: [] for n in self.names}
        return out


class _Pending:
    """One step's band so far: what band rows and kept ranks' points added up."""

    __slots__ = ("n", "sum", "lo", "hi", "candidates")

    def __init__(self) -> None:
        self.n = 0
        self.sum = 0.0
        self.lo = float("inf")
        self.hi = float("-inf")
        self.candidates: dict[int, float] = {}

    def merge(self, n: int, total: float, lo: float, hi: float) -> None:
        self.n += n
        self.sum += total
        self.lo = min(self.lo, lo)
        self.hi = max(self.hi, hi)


class TrainData:
    """Train metrics (kind "train") by name and line key: a rank number, or "mean" (with its
    band's "lo"/"hi" columns) past MAX_RANK_LINES ranks. `add` takes points, `add_band`
    the launcher's band rows."""

    def __init__(self, world_size: int, capacity: int):
        self.world_size = max(1, int(world_size))
        self.capacity = capacity
        self.by_rank = self.world_size <= MAX_RANK_LINES
        self.keys: list = list(range(self.world_size)) if self.by_rank else ["mean"]
        self.outliers: list[int] = []  # ranks with a line of their own, in the order found
        self.lines: dict[str, dict] = {}  # name -> {key: Line}
        self._pending: dict[str, dict[float, _Pending]] = {}  # name -> step -> its band so far
        # name -> the highest step drawn: a later value of a step up to it that is not still
        # pending is dropped (a rank that logged a step twice, or lagged past a partial draw:
        # it would draw the step again, from that value alone)
        self._drawn_through: dict[str, float] = {}
        self.attempt = 0
        self.last_step: dict[int, float] = {}  # rank -> last step (current attempt); -1: bands
        self.steps: deque = deque(maxlen=400)  # (t, step) of the lowest rank seen, this attempt
        self._rate_rank: int | None = None
        self.sample_rates: dict[int, float] = {}  # rank -> last samples/s value (-1: all ranks)

    def names(self) -> list[str]:
        names = sorted(self.lines)
        if "loss" in names:
            names.remove("loss")
            names.insert(0, "loss")
        return names

    def _line(self, name: str, key) -> Line:
        lines = self.lines.setdefault(name, {})
        line = lines.get(key)
        if line is None:
            line = lines[key] = Line(self.capacity, ("lo", "hi") if key == "mean" else ())
        return line

    def _current(self, attempt: int, step: float) -> bool:
        """Whether a point or row of `attempt` belongs to the chart (a new attempt resumes)."""
        if attempt > self.attempt:
            if self.attempt:
                self._new_attempt(step)
            self.attempt = attempt
        return attempt == self.attempt  # else a straggler of an attempt that was replaced

    def add(self, point: dict) -> None:
        step, value, rank = point.get("step"), point.get("value"), point.get("rank")
        if step is None or value is None or rank is None:
            return
        if not self._current(int(point.get("attempt") or 1), step):
            return
        name = point["name"]
        if self.by_rank:
            if name in SAMPLE_RATE_NAMES:
                self.sample_rates[rank] = value
            if rank < self.world_size:
                self._line(name, rank).append(step, value)
        else:
            if rank in self.outliers:
                self._line(name, rank).put(step, value)
            # the launcher left this rank out of its band rows (or sent every point)
            pending = self._pending_at(name, step)
            if pending is not None:
                pending.merge(1, value, value, value)
                self._settle(name, step)
        self._note_step(rank, point["t"], step)

    def add_band(self, row: dict) -> None:
        """A band row of the launcher (bands.py): this step's values it read, added up."""
        step, name = row["step"], row["name"]
        if self.by_rank or not self._current(int(row.get("attempt") or 1), step):
            return
        pending = self._pending_at(name, step)
        if pending is not None:
            pending.merge(row["n"], row["sum"], row["lo"], row["hi"])
        for outlier in row.get("outliers") or ():
            rank, value = outlier["rank"], outlier["value"]
            if rank in self.outliers:
                self._line(name, rank).put(step, value)
            elif pending is not None:
                pending.candidates[rank] = value
        if pending is not None:
            self._settle(name, step)
        if row.get("t") is not None:
            self._note_step(-1, row["t"], step)

    def _pending_at(self, name: str, step: float) -> _Pending | None:
        """The band of `step` so far; None for a step already drawn."""
        steps = self._pending.setdefault(name, {})
        pending = steps.get(step)
        if pending is None:
            if step <= self._drawn_through.get(name, float("-inf")):
                return None
            pending = steps[step] = _Pending()
        return pending

    def _settle(self, name: str, step: float) -> None:
        """Emit `step` once every rank is in it; the oldest steps once too many wait (a rank
        that stopped logging)."""
        pending = self._pending[name]
        if pending[step].n >= self.world_size:
            self._emit(name, step, pending.pop(step))
        if len(pending) > PENDING_STEPS:
            for old in sorted(pending)[: len(pending) - PENDING_STEPS]:
                self._emit(name, old, pending.pop(old))

    def _emit(self, name: str, step: float, band: _Pending) -> None:
        self._drawn_through[name] = max(step, self._drawn_through.get(name, step))
        mean = band.sum / band.n
        self._line(name, "mean").put(step, mean, lo=band.lo, hi=band.hi)
        if name in SAMPLE_RATE_NAMES:
            self.sample_rates = {-1: mean * self.world_size}
        for rank, value in sorted(band.candidates.items(), key=lambda item: -abs(item[1] - mean)):
            if len(self.outliers) >= MAX_OUTLIERS:
                break
            if rank not in self.outliers:
                self._promote(rank, name, step, value)

    def _promote(self, rank: int, name: str, step: float, value: float) -> None:
        """Give `rank` a line of its own, starting with what is still at hand: this step and
        its candidate values of steps still pending (later points are added as they come)."""
        self.outliers.append(rank)
        self.keys.append(rank)
        self._line(name, rank).put(step, value)
        for other, pending in self._pending.items():
            for s in sorted(pending):
                if rank in pending[s].candidates and (other != name or s > step):
                    self._line(other, rank).put(s, pending[s].candidates.pop(rank))

    def _note_step(self, rank: int, t: float, step: float) -> None:
        """The steps/s of the lowest rank seen (-1: the band rows, all ranks' latest)."""
        if step != self.last_step.get(rank):
            self.last_step[rank] = step
            if self._rate_rank is None or rank < self._rate_rank:
                self._rate_rank = rank
                self.steps.clear()
            if rank == self._rate_rank and (not self.steps or step > self.steps[-1][1]):
                self.steps.append((t, step))

    def _new_attempt(self, first_step: float) -> None:
        for lines in self.lines.values():
            for line in lines.values():
                line.truncate_from(first_step)
        self._pending.clear()
        self._drawn_through.clear()
        self.last_step.clear()
        self.steps.clear()
        self._rate_rank = None
        self.sample_rates.clear()

    def steps_per_s(self, window: float = 10.0) -> float | None:
        """Steps per second over the last `window` seconds of step timestamps."""
        if len(self.steps) < 2:
            return None
        t_last, s_last = self.steps[-1]
        first = None
        for t, s in self.steps:
            if t_last - t <= window:
                first = (t, s)
                break
        if first is None or t_last - first[0] <= 0:
            first = self.steps[-2]
        dt = t_last - first[0]
        return (s_last - first[1]) / dt if dt > 0 else None

    def samples_per_s(self) -> float | None:
        return sum(self.sample_rates.values()) if self.sample_rates else None


def step_breakdown(train: TrainData, rank: int | None = None,
                   last: int = BREAKDOWN_STEPS) -> dict[str, list[float]]:
    """Where each of the last `last` steps went, in ms: columns x (step), data, sync, ckpt
    and compute (step_ms less the three parts, never below 0), of `rank`, or with None per
    step the median over the ranks that logged it (past MAX_RANK_LINES ranks the launcher
    folds the ranks into a band, so it is the mean there). Each part is its own median."""
    lines = train.lines.get(STEP_MS, {})
    keys = [rank] if rank is not None else ([k for k in lines if k != "mean"] if train.by_rank
                                            else ["mean"])
    rows: dict[float, list[list[float]]] = {}
    for key in keys:
        step_line = lines.get(key)
        if step_line is None:
            continue
        parts = []
        for _, name, _ in STEP_PARTS:
            line = train.lines.get(name, {}).get(key)
            parts.append(dict(zip(line.x[-last:], line.y[-last:], strict=True)) if line else {})
        for x, total in zip(step_line.x[-last:], step_line.y[-last:], strict=True):
            values = [part.get(x, 0.0) for part in parts]
            rows.setdefault(x, []).append(values + [max(0.0, total - sum(values))])
    columns: dict[str, list[float]] = {"x": [], "data": [], "sync": [], "ckpt": [], "compute": []}
    names = ("data", "sync", "ckpt", "compute")
    for x in sorted(rows)[-last:]:
        columns["x"].append(x)
        for i, name in enumerate(names):
            columns[name].append(statistics.median(r[i] for r in rows[x]))
    return columns


class SystemData:
    """System metrics (kind "system") by (node, device, name); x is the time in ms."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.lines: dict[tuple, Line] = {}
        self.latest: dict[tuple, float] = {}

    def add(self, point: dict) -> None:
        value, name = point.get("value"), point.get("name")
        if value is None or not name:
            return
        key = (int(point.get("node") or 0), point.get("device") or "cpu", name)
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = Line(self.capacity)
        if line.x and point["t"] * 1000 <= line.x[-1]:
            return  # two ranks of one node reporting the same sample
        line.append(point["t"] * 1000.0, value)
        self.latest[key] = value

    def has_gpu(self) -> bool:
        return any(device.startswith("gpu") for _, device, _ in self.lines)


def label_for(key: tuple) -> str:
    """Legend text of a system line: "node 0 gpu1 util", "node 1 cpu util", "node 1 host mem"."""
    node, device, name = key
    if name == "gpu_util":
        return f"node {node} {device} util"
    if name == "gpu_mem":
        return f"node {node} {device} mem"
    if name == "cpu_util":
        return f"node {node} cpu util"
    if name == "mem_used":
        return f"node {node} host mem"
    return f"node {node} {device} {name}"
