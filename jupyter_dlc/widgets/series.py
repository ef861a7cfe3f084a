"""Chart data of one job, kept bounded: metric points in, (x, y) columns per line out.

Pure Python (no widgets, no bokeh) so that the reduction rules can be tested on their own:

- every line holds at most `capacity` points: at capacity it keeps every other point and
  from then on accepts every 2nd (then 4th...) new point, so a long job keeps its whole
  history at a coarser resolution instead of losing its beginning;
- a resumed attempt continues from its checkpoint: when the first point of a new attempt
  arrives at step s, every train line drops its points at steps >= s, so the chart shows
  the trajectory that the model actually has;
- with more than MAX_RANK_LINES ranks a train metric is drawn as rank 0 and the mean over
  ranks (a step's mean is emitted once every rank has logged that step).
"""

from __future__ import annotations

from collections import deque

MAX_RANK_LINES = 8
SAMPLE_RATE_NAMES = ("samples_per_s", "samples_per_sec", "samples/s", "samples_per_second")


class Line:
    """x/y columns of one line with the halving rule above. `new_x/new_y` hold what was
    accepted since the last `take_new()`; `reset` says the whole line must be re-sent."""

    def __init__(self, capacity: int):
        self.capacity = max(4, int(capacity))
        self.x: list[float] = []
        self.y: list[float] = []
        self.stride = 1
        self._skipped = 0
        self.new_x: list[float] = []
        self.new_y: list[float] = []
        self.reset = False

    def append(self, x: float, y: float) -> None:
        if self.stride > 1:
            self._skipped += 1
            if self._skipped < self.stride:
                return
            self._skipped = 0
        self.x.append(x)
        self.y.append(y)
        self.new_x.append(x)
        self.new_y.append(y)
        if len(self.x) >= self.capacity:
            self.x, self.y = self.x[::2], self.y[::2]
            self.stride *= 2
            self.reset = True

    def truncate_from(self, x: float) -> None:
        """Drop points at x >= `x` (a resumed attempt re-does those steps)."""
        if self.x and self.x[-1] >= x:
            keep = sum(1 for v in self.x if v < x)
            self.x, self.y = self.x[:keep], self.y[:keep]
            self.reset = True

    def take_new(self) -> tuple[str, dict] | None:
        """("reset", full columns) or ("stream", new columns) or None; clears the pending."""
        if self.reset:
            out = ("reset", {"x": list(self.x), "y": list(self.y)})
        elif self.new_x:
            out = ("stream", {"x": list(self.new_x), "y": list(self.new_y)})
        else:
            out = None
        self.reset = False
        self.new_x, self.new_y = [], []
        return out


class TrainData:
    """Train metrics (kind "train") by name and line key: a rank number or "mean"."""

    def __init__(self, world_size: int, capacity: int):
        self.world_size = max(1, int(world_size))
        self.capacity = capacity
        self.by_rank = self.world_size <= MAX_RANK_LINES
        self.keys: list = list(range(self.world_size)) if self.by_rank else [0, "mean"]
        self.lines: dict[str, dict] = {}  # name -> {key: Line}
        self._pending: dict[str, dict[float, list]] = {}  # name -> step -> [sum, count]
        self.attempt = 0
        self.last_step: dict[int, float] = {}  # rank -> last step (current attempt)
        self.steps: deque = deque(maxlen=400)  # (t, step) of the lowest rank seen, this attempt
        self._rate_rank: int | None = None
        self.sample_rates: dict[int, float] = {}  # rank -> last samples/s value

    def names(self) -> list[str]:
        names = sorted(self.lines)
        if "loss" in names:
            names.remove("loss")
            names.insert(0, "loss")
        return names

    def _line(self, name: str, key) -> Line:
        lines = self.lines.setdefault(name, {k: Line(self.capacity) for k in self.keys})
        return lines[key]

    def add(self, point: dict) -> None:
        step, value, rank = point.get("step"), point.get("value"), point.get("rank")
        if step is None or value is None or rank is None:
            return
        attempt = int(point.get("attempt") or 1)
        if attempt > self.attempt:
            if self.attempt:
                self._new_attempt(step)
            self.attempt = attempt
        elif attempt < self.attempt:
            return  # a straggler of an attempt that was replaced
        name = point["name"]
        if name in SAMPLE_RATE_NAMES:
            self.sample_rates[rank] = value
        if self.by_rank:
            if rank < self.world_size:
                self._line(name, rank).append(step, value)
        else:
            if rank == 0:
                self._line(name, 0).append(step, value)
            self._add_to_mean(name, step, value)
        if step != self.last_step.get(rank):
            self.last_step[rank] = step
            if self._rate_rank is None or rank < self._rate_rank:
                self._rate_rank = rank
                self.steps.clear()
            if rank == self._rate_rank:
                self.steps.append((point["t"], step))

    def _add_to_mean(self, name: str, step: float, value: float) -> None:
        pending = self._pending.setdefault(name, {})
        acc = pending.setdefault(step, [0.0, 0])
        acc[0] += value
        acc[1] += 1
        if acc[1] >= self.world_size:
            self._line(name, "mean").append(step, acc[0] / acc[1])
            del pending[step]
        if len(pending) > 64:  # a rank that stopped logging: emit the oldest partial means
            for old in sorted(pending)[: len(pending) - 64]:
                total, count = pending.pop(old)
                self._line(name, "mean").append(old, total / count)

    def _new_attempt(self, first_step: float) -> None:
        for lines in self.lines.values():
            for line in lines.values():
                line.truncate_from(first_step)
        self._pending.clear()
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
