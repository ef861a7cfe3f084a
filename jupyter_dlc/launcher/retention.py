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

Deciding what to remove reads all of a job's points (a window query over its series): that
runs on a thread of its own with its own SQLite connection, which in WAL mode never blocks
the writer, and SQLite releases the GIL while it works. The removal itself, a delete by seq
in chunks, runs on the ingest writer's thread between its commits (ingest.py), so that it
never waits on SQLite's one write lock or makes ingest wait long. An index by rank would make
the analysis cheaper, but every insert would then touch one index page per rank: inserts
measured 4x slower with one.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time

log = logging.getLogger("jupyter_dlc.launcher")

DEFAULT_KEEP_LAST = 1000
DEFAULT_RECENT_STEPS = 1000
DEFAULT_MAX_POINTS = 2_000_000
FIRST_BUCKET = 1.0          # seconds
WIDEST_BUCKET = 7 * 86400.0
PASS_INTERVAL = 10.0        # seconds between passes over every job
SLICE_BUDGET = 0.01         # seconds of removals per call between two ingest commits

_SERIES = "attempt, rank, kind, name, device"
# The points of one job that downsampling removes: old ones (neither among the last :keep of
# their series nor a train point of a recent step) that hold neither the minimum, the
# maximum, the last value nor the first NaN of their bucket.
_REMOVABLE = f"""
SELECT seq, t FROM (
  SELECT seq, t, value,
    ROW_NUMBER() OVER (PARTITION BY {_SERIES}, b ORDER BY value IS NULL, value, seq) AS lo,
    ROW_NUMBER() OVER (PARTITION BY {_SERIES}, b ORDER BY value IS NULL, value DESC, seq) AS hi,
    ROW_NUMBER() OVER (PARTITION BY {_SERIES}, b ORDER BY seq DESC) AS last,
    ROW_NUMBER() OVER (PARTITION BY {_SERIES}, b, value IS NULL ORDER BY seq) AS nth
  FROM (
    SELECT seq, t, {_SERIES}, value, step, CAST(t / :bucket AS INTEGER) AS b,
      ROW_NUMBER() OVER (PARTITION BY {_SERIES} ORDER BY seq DESC) AS from_end
    FROM metrics WHERE job_id = :job)
  WHERE from_end > :keep AND (kind != 'train' OR step IS NULL OR step < :recent_from))
WHERE lo > 1 AND hi > 1 AND last > 1 AND NOT (value IS NULL AND nth = 1)
"""
DELETE_CHUNK = 2000


def positive_env_int(name: str, default: int) -> int:
    """A launcher setting from the environment; ValueError naming it when it is not >= 1."""
    raw = os.environ.get(name, "")
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}: expected a whole number, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{name}: must be at least 1, got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int = DEFAULT_KEEP_LAST
    recent_steps: int = DEFAULT_RECENT_STEPS
    max_points: int = DEFAULT_MAX_POINTS

    @classmethod
    def from_env(cls, max_points: int | None = None) -> RetentionPolicy:
        """DLC_METRICS_KEEP_LAST, DLC_METRICS_RECENT_STEPS, DLC_METRICS_CAP (points per job;
        the launcher's --metrics-cap wins)."""
        if max_points is not None and max_points < 1:
            raise ValueError(f"--metrics-cap: must be at least 1, got {max_points}")
        number = positive_env_int
        return cls(keep_last=number("DLC_METRICS_KEEP_LAST", DEFAULT_KEEP_LAST),
                   recent_steps=number("DLC_METRICS_RECENT_STEPS", DEFAULT_RECENT_STEPS),
                   max_points=max_points or number("DLC_METRICS_CAP", DEFAULT_MAX_POINTS))


class Retention:
    """`start()` the analysis thread; call `run_slices()` from the thread that writes metrics."""

    def __init__(self, store, policy: RetentionPolicy | None = None, interval: float = PASS_INTERVAL):
        self.store = store
        self.policy = policy or RetentionPolicy.from_env()
        self.interval = interval
        self.passes = 0
        # Chunks of (job id, seqs, newest t among them, the job's state), oldest first.
        self._removals: collections.deque = collections.deque()
        self._wake = threading.Event()
        # job id -> its newest seq when an analysis last left it under its cap.
        self._analyzed: dict[str, int] = {}
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._analyze_forever, name="dlc-retention",
                                        daemon=True)
        self._thread.start()

    def run_slices(self, budget: float = SLICE_BUDGET) -> None:
        """Remove what the analysis chose, for at most about `budget` seconds."""
        end = time.monotonic() + budget
        while self._removals and time.monotonic() < end:
            job_id, seqs, until, state = self._removals[0]
            try:
                with self.store.tx() as db:
                    current = self.store.retention_state(job_id) or {"dropped": 0, "downsampled_until": None}
                    removed = db.execute(f"DELETE FROM metrics WHERE seq IN ({','.join('?' * len(seqs))})",
                                         seqs).rowcount
                    state = dict(state, dropped=current["dropped"] + removed,
                                 downsampled_until=current["downsampled_until"])
                    if removed:
                        state["downsampled_until"] = max(until, current["downsampled_until"] or until)
                    # With the deletion, so that an answer never shows one without the other.
                    self.store.set_retention_state(job_id, state, db)
            finally:
                # Off the queue only once its transaction ended: the analysis waits for an
                # empty queue, and must then read the counts this chunk committed.
                self._removals.popleft()

    def run_pass(self) -> None:
        """Analyze every job and remove what it chose, all at once (tests; a quiet launcher)."""
        self._analyze_all()
        while self._removals:
            self.run_slices(budget=3600)

    def _analyze_forever(self) -> None:
        again = False
        while True:
            if not again:
                self._wake.wait(self.interval)
                self._wake.clear()
            while self._removals:  # the writer removes what the last analysis chose first
                time.sleep(0.1)
            started = time.monotonic()
            try:
                again = self._analyze_all()
            except Exception:  # noqa: BLE001 - retention must never end the launcher
                log.exception("metrics retention analysis failed; trying again later")
                again = False
            if again:
                # A job is still over its cap: analyze again at once, after a pause as long
                # as the analysis took, so that this thread never takes more than half a core.
                time.sleep(time.monotonic() - started)

    def _analyze_all(self) -> bool:
        """Queue the removals for every job; True if some job is still over its cap."""
        again = False
        for (job_id,) in self.store.db.execute("SELECT id FROM jobs ORDER BY created").fetchall():
            again |= self._analyze(job_id)
        self.passes += 1
        return again

    def _analyze(self, job_id: str) -> bool:
        db = self.store.db
        state = self.store.retention_state(job_id) or {
            "bucket": FIRST_BUCKET, "keep_last": self.policy.keep_last,
            "recent_steps": self.policy.recent_steps, "downsampled_until": None, "dropped": 0}
        newest = db.execute("SELECT MAX(seq) FROM metrics WHERE job_id = ?", (job_id,)).fetchone()[0]
        if newest is None or self._analyzed.get(job_id) == newest:
            return False  # nothing new since the last analysis left it under its cap
        total = db.execute("SELECT COUNT(*) FROM metrics WHERE job_id = ?", (job_id,)).fetchone()[0]
        row = db.execute("SELECT last_step FROM jobs WHERE id = ?", (job_id,)).fetchone()
        recent_from = ((row[0] or 0) if row else 0) - state["recent_steps"]
        removable = db.execute(_REMOVABLE, {"job": job_id, "bucket": state["bucket"],
                                            "keep": state["keep_last"],
                                            "recent_from": recent_from}).fetchall()
        for start in range(0, len(removable), DELETE_CHUNK):
            chunk = removable[start:start + DELETE_CHUNK]
            self._removals.append((job_id, [r[0] for r in chunk], max(r[1] for r in chunk),
                                   dict(state)))
        if total - len(removable) <= self.policy.max_points:
            self._analyzed[job_id] = newest
            return False
        # Over the cap: coarser buckets first; the recent points' resolution goes last.
        if state["bucket"] < WIDEST_BUCKET:
            state["bucket"] = min(WIDEST_BUCKET, state["bucket"] * 4)
        else:
            state["keep_last"] = max(1, state["keep_last"] // 2)
            state["recent_steps"] = state["recent_steps"] // 2
        if not removable:
            with self.store.tx() as db:  # the new policy, with the counts as they are now
                current = self.store.retention_state(job_id) or {}
                self.store.set_retention_state(job_id, dict(
                    state, dropped=current.get("dropped", state["dropped"]),
                    downsampled_until=current.get("downsampled_until", state["downsampled_until"])), db)
        else:
            self._removals[-1] = self._removals[-1][:3] + (dict(state),)
        return True
