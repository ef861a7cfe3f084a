"""Metrics retention: recent points at full resolution, older ones downsampled, a cap per job.

A series is one (attempt, rank, kind, name, device). Its last `keep_last` points, and the
train points within `recent_steps` of the job's last step, stay as logged. Older points are
grouped in buckets of `bucket` seconds (by the time they were logged), and of each bucket
only the points holding its minimum, its maximum, its last value and its first NaN stay:
a spike or a NaN in an old stretch is still drawn. Downsampling deletes rows and keeps the
survivors' seq, so a view's `since` cursor stays valid; running it twice changes nothing, as
the buckets are fixed intervals of time.

A job over its cap (`max_points`) gets wider buckets (x4 each pass), and once a bucket spans
its whole history, less full resolution (keep_last and recent_steps halved): the recent
points go last. The per-job state (bucket width, how far downsampling reached, how many
points it removed) is in `metric_retention`, and the metrics answer shows it.

The work runs in slices (one rank of one job each) on the ingest writer's thread, between
its commits (ingest.py), so that it never waits on SQLite's write lock or makes ingest wait
for long.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator

DEFAULT_KEEP_LAST = 1000
DEFAULT_RECENT_STEPS = 1000
DEFAULT_MAX_POINTS = 2_000_000
FIRST_BUCKET = 1.0          # seconds
WIDEST_BUCKET = 7 * 86400.0
PASS_INTERVAL = 10.0        # seconds between passes over every job
SLICE_BUDGET = 0.02         # seconds of work per call between two ingest commits

_SERIES = "attempt, kind, name, device"
# The rows of one rank of one job that downsampling removes: old ones (neither among the
# last :keep of their series nor a train point of a recent step) that hold neither the
# minimum, the maximum, the last value nor the first NaN of their bucket.
_DOWNSAMPLE = f"""
DELETE FROM metrics WHERE seq IN (
  SELECT seq FROM (
    SELECT seq, value,
      ROW_NUMBER() OVER (PARTITION BY {_SERIES}, b ORDER BY value IS NULL, value, seq) AS lo,
      ROW_NUMBER() OVER (PARTITION BY {_SERIES}, b ORDER BY value IS NULL, value DESC, seq) AS hi,
      ROW_NUMBER() OVER (PARTITION BY {_SERIES}, b ORDER BY seq DESC) AS last,
      ROW_NUMBER() OVER (PARTITION BY {_SERIES}, b, value IS NULL ORDER BY seq) AS nth
    FROM (
      SELECT seq, {_SERIES}, value, step, CAST(t / :bucket AS INTEGER) AS b,
        ROW_NUMBER() OVER (PARTITION BY {_SERIES} ORDER BY seq DESC) AS from_end
      FROM metrics WHERE job_id = :job AND rank = :rank)
    WHERE from_end > :keep AND (kind != 'train' OR step IS NULL OR step < :recent_from))
  WHERE lo > 1 AND hi > 1 AND last > 1 AND NOT (value IS NULL AND nth = 1))
RETURNING t
"""


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int = DEFAULT_KEEP_LAST
    recent_steps: int = DEFAULT_RECENT_STEPS
    max_points: int = DEFAULT_MAX_POINTS

    @classmethod
    def from_env(cls, max_points: int | None = None) -> RetentionPolicy:
        """DLC_METRICS_KEEP_LAST, DLC_METRICS_RECENT_STEPS, DLC_METRICS_CAP (points per job;
        the launcher's --metrics-cap wins)."""
        def number(name: str, default: int) -> int:
            raw = os.environ.get(name, "")
            try:
                value = int(raw) if raw else default
            except ValueError:
                raise ValueError(f"{name}: expected a whole number, got {raw!r}") from None
            if value < 1:
                raise ValueError(f"{name}: must be at least 1, got {value}")
            return value

        if max_points is not None and max_points < 1:
            raise ValueError(f"--metrics-cap: must be at least 1, got {max_points}")
        return cls(keep_last=number("DLC_METRICS_KEEP_LAST", DEFAULT_KEEP_LAST),
                   recent_steps=number("DLC_METRICS_RECENT_STEPS", DEFAULT_RECENT_STEPS),
                   max_points=max_points or number("DLC_METRICS_CAP", DEFAULT_MAX_POINTS))


class Retention:
    """Call `run_slices()` from the thread that writes metrics; it does a bounded amount."""

    def __init__(self, store, policy: RetentionPolicy | None = None, interval: float = PASS_INTERVAL):
        self.store = store
        self.policy = policy or RetentionPolicy.from_env()
        self.interval = interval
        self._work: Iterator | None = None
        self._next_pass = 0.0
        self._again = False
        self.passes = 0

    def run_slices(self, budget: float = SLICE_BUDGET) -> None:
        now = time.monotonic()
        if self._work is None:
            if now < self._next_pass:
                return
            self._work = self._pass()
        end = now + budget
        while time.monotonic() < end:
            if next(self._work, None) is None:
                self._work = None
                self.passes += 1
                self._next_pass = 0.0 if self._again else time.monotonic() + self.interval
                self._again = False
                return

    def run_pass(self) -> None:
        """One whole pass at once (tests, and a launcher with no load)."""
        for _ in self._pass():
            pass
        self.passes += 1

    def _pass(self) -> Iterator[bool]:
        for (job_id,) in self.store.db.execute("SELECT id FROM jobs ORDER BY created").fetchall():
            yield from self._job(job_id)

    def _job(self, job_id: str) -> Iterator[bool]:
        state = self.store.retention_state(job_id) or {
            "bucket": FIRST_BUCKET, "keep_last": self.policy.keep_last,
            "recent_steps": self.policy.recent_steps, "downsampled_until": None, "dropped": 0}
        last_step = self.store.db.execute("SELECT last_step FROM jobs WHERE id = ?",
                                          (job_id,)).fetchone()
        recent_from = (last_step[0] or 0) - state["recent_steps"] if last_step else 0
        total = 0
        rank = -1
        while True:
            row = self.store.db.execute("SELECT MIN(rank) FROM metrics WHERE job_id = ? AND rank > ?",
                                        (job_id, rank)).fetchone()
            if row is None or row[0] is None:
                break
            rank = row[0]
            with self.store.tx() as db:
                removed = db.execute(_DOWNSAMPLE, {
                    "job": job_id, "rank": rank, "bucket": state["bucket"],
                    "keep": state["keep_last"], "recent_from": recent_from}).fetchall()
                if removed:
                    until = max(r[0] for r in removed)
                    state["dropped"] += len(removed)
                    state["downsampled_until"] = max(until, state["downsampled_until"] or until)
                    # With the deletion, so that an answer never shows one without the other.
                    self.store.set_retention_state(job_id, state, db)
                total += db.execute("SELECT COUNT(*) FROM metrics WHERE job_id = ? AND rank = ?",
                                    (job_id, rank)).fetchone()[0]
            yield True
        if total > self.policy.max_points:
            # Over the cap: coarser buckets first; the recent points' resolution goes last.
            if state["bucket"] < WIDEST_BUCKET:
                state["bucket"] = min(WIDEST_BUCKET, state["bucket"] * 4)
            else:
                state["keep_last"] = max(1, state["keep_last"] // 2)
                state["recent_steps"] = state["recent_steps"] // 2
            self._again = True  # the next pass at once, not a pass interval later
        if total or state["dropped"]:
            self.store.set_retention_state(job_id, state)
        yield True
