"""Metrics retention: recent points at full resolution, older ones downsampled, a cap per job.

A series is one (attempt, rank, kind, name, device). Its last `keep_last` points, and the
train points within `recent_steps` of the job's last step, stay as logged. Older points are
grouped in buckets of `bucket` seconds (by the time they were logged), and of each bucket
only the points holding its minimum, its maximum, its last value and its first NaN stay:
a spike or a NaN in an old stretch is still drawn. Downsampling rewrites a chunk
(metric_chunks.py) with its survivors and their original indices, so a survivor keeps its
seq and a view's `since` cursor stays valid; running it twice changes nothing, as the
buckets are fixed intervals of time.

A job over its cap (`max_points`) gets wider buckets (x4 each pass), and once a bucket spans
its whole history, less full resolution (keep_last and recent_steps halved): the recent
points go last. The per-job state (bucket width, how far downsampling reached, how many
points it removed) is in `metric_retention`, and the metrics answer shows it.

The analysis runs in a process of its own with its own SQLite connection (WAL: it never
blocks the writer; retention_process.py says why not a thread), and its work is
proportional to what is new: it reads each new chunk's row once without its points (`names`
has the count of each series' points in it), keeps per series how many points came after
each pending chunk, and decodes a chunk only once all its points are old (beyond keep_last
of their series and recent_steps); a large chunk (a batch upload) or any chunk of a job
that went quiet is also decoded while only partly old, and only its old points are
considered. Old points are bucketed with numpy; with each series' survivors of its newest
bucket carried to the next pass (min, max, last and first NaN of a set are those of its
survivors together with what joins it), a bucket split across passes ends as if analyzed at
once. A point of a rarely logged series still among its last keep_last when its chunk was
analyzed stays as logged (retention never removes more than the rules say). The tracking is
in memory (in proportion to each job's recent points): after a restart, or a change of
bucket or policy, the first pass reads every chunk of the job once; an ended job's tracking
is let go once a pass found nothing new (a resume rebuilds it the same way). The removal
itself, rewriting (or deleting) chunks prepared by the analysis, runs on the ingest
writer's thread between its commits (ingest.py), in slices, so that it never waits on
SQLite's one write lock or makes ingest wait long. The next pass begins only once the last
pass's removals are committed (it must read what they wrote).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
import os
import time
from array import array
from bisect import bisect_left
from typing import Callable

import numpy as np

from ..states import TERMINAL_STATES
from . import metric_chunks

log = logging.getLogger("jupyter_dlc.launcher")

DEFAULT_KEEP_LAST = 1000
DEFAULT_RECENT_STEPS = 1000
DEFAULT_MAX_POINTS = 2_000_000
FIRST_BUCKET = 1.0          # seconds
WIDEST_BUCKET = 7 * 86400.0
PASS_INTERVAL = 10.0        # seconds between passes over every job
SLICE_BUDGET = 0.01         # seconds of removals per call between two ingest commits

# A pending chunk this large (a batch upload) is decoded while only partly old.
PARTIAL_MIN = 64
_FETCH = 500                # chunks per SELECT ... IN (...)
_BATCH = 2000               # chunks bucketed at once (the carry joins batches as it joins passes)
_SLICE_CHUNKS = 256         # chunk rewrites per writer transaction, at most


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




class _Series:
    """One series' points, counted from chunk rows; its pending chunks (oldest first): seq,
    and how many of its points came before and up to that chunk."""

    __slots__ = ("sid", "total", "seqs", "before", "after", "head")

    def __init__(self, sid: int):
        self.sid = sid
        self.total = 0
        self.seqs = array("q")
        self.before = array("q")
        self.after = array("q")
        self.head = 0

    def later(self, seq: int) -> int | None:
        """How many of this series' points came after chunk `seq`; None once that chunk left
        the pending ones (all its points of this series are old)."""
        at = bisect_left(self.seqs, seq, self.head)
        if at == len(self.seqs) or self.seqs[at] != seq:
            return None
        return self.total - self.after[at]

    def trim(self) -> None:
        if self.head > 1024 and self.head * 2 > len(self.seqs):
            for column in (self.seqs, self.before, self.after):
                del column[:self.head]
            self.head = 0


class _Track:
    """What the analysis knows of one job's chunks, under one policy (bucket, keep_last,
    recent_steps): a new policy starts a new track."""

    def __init__(self, policy: tuple):
        self.policy = policy
        self.seen = 0              # the newest chunk seq whose row was read
        self.recent_from: int | None = None
        self.newest: int | None = None  # the job's newest point seq at the last analysis
        self.settled = False       # whether the last analysis found no new chunk
        self.series: dict[tuple, _Series] = {}
        # (attempt, kind, device) -> {(rank, name): series id}: a point's series in one lookup
        self.sids: dict[tuple, dict[tuple, int]] = {}
        # seq -> [its series not yet beyond keep_last, step_max, kind, n, group]
        self.pending: dict[int, list] = {}
        self.waiting: list[tuple] = []   # heap of (step_max, seq): old but for recent steps
        self.big_waiting: set[int] = set()
        self.ready: list[int] = []
        # Each series' survivors of its newest analyzed bucket: sid, bucket, value, seq.
        self.carry: tuple[np.ndarray, ...] = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0),
                                              np.empty(0, np.int64))


def _survivors(sid, bucket, value, seq) -> np.ndarray:
    """Which points hold their (series, bucket)'s minimum, maximum, last value or first NaN
    (ties to the earliest), as in the SQL this replaced: NaN sorts after every number."""
    count = len(seq)
    keep = np.zeros(count, bool)
    if not count:
        return keep
    order = np.lexsort((seq, bucket, sid))  # by series, bucket, then seq
    s, b, v = sid[order], bucket[order], value[order]
    start = np.ones(count, bool)
    start[1:] = (s[1:] != s[:-1]) | (b[1:] != b[:-1])
    starts = np.flatnonzero(start)
    group = np.cumsum(start) - 1
    position = np.arange(count)
    nan = np.isnan(v)

    def first(where: np.ndarray) -> np.ndarray:
        """Each group's first sorted position where `where` holds (none: count)."""
        firsts = np.minimum.reduceat(np.where(where, position, count), starts)
        return order[firsts[firsts < count]]

    keep[order[np.append(starts[1:], count) - 1]] = True  # the last value
    keep[first(nan)] = True
    low = np.where(nan, np.inf, v)
    keep[first(~nan & (low == np.minimum.reduceat(low, starts)[group]))] = True
    high = np.where(nan, -np.inf, v)
    keep[first(~nan & (high == np.maximum.reduceat(high, starts)[group]))] = True
    return keep


class Retention:
    """The analysis (`analyze`, in its own process: retention_process.py) and the removals
    it chose (`queue` them where metrics are written, and call `run_slices()` between writes).
    `run_pass` does both at once."""

    def __init__(self, store, policy: RetentionPolicy | None = None, interval: float = PASS_INTERVAL):
        self.store = store
        self.policy = policy or RetentionPolicy.from_env()
        self.interval = interval
        self.passes = 0
        self.decoded = 0  # chunks the analysis decoded, all passes together
        # Slices of (job id, [(chunk seq, its new columns or None to delete it, points
        # removed)...], newest t among those points, the job's state), oldest first.
        self._removals: collections.deque = collections.deque()
        self._drained: Callable[[], None] | None = None
        self._tracks: dict[str, _Track] = {}
        # job id -> (newest seq, recent_from, policy) when a quiet analysis of the ended job
        # left it under its cap (its tracking dropped)
        self._idle: dict[str, tuple] = {}

    def queue(self, removals: list, drained: Callable[[], None]) -> None:
        """Removals an analysis chose (`analyze`), for `run_slices` to apply; `drained()` is
        called once the last of them is committed. One analysis's at a time."""
        self._removals.extend(removals)
        # After them: set first, a slice could find the queue empty before they were in it.
        self._drained = drained

    def pending(self) -> bool:
        return bool(self._removals)

    def run_slices(self, budget: float = SLICE_BUDGET) -> None:
        """Apply what the analysis chose, for at most about `budget` seconds."""
        end = time.monotonic() + budget
        while self._removals and time.monotonic() < end:
            job_id, rewrites, until, state = self._removals[0]
            try:
                with self.store.tx() as db:
                    current = self.store.retention_state(job_id) or {"dropped": 0, "downsampled_until": None}
                    removed = 0
                    for seq, columns, count in rewrites:
                        if columns is None:
                            changed = db.execute("DELETE FROM metric_chunks WHERE seq = ?", (seq,)).rowcount
                        else:
                            changed = db.execute(metric_chunks.REWRITE, (*columns, seq)).rowcount
                        if changed:  # not when the job was deleted meanwhile
                            removed += count
                    state = dict(state, dropped=current["dropped"] + removed,
                                 downsampled_until=current["downsampled_until"])
                    if removed:
                        state["downsampled_until"] = max(until, current["downsampled_until"] or until)
                    # With the removal, so that an answer never shows one without the other.
                    self.store.set_retention_state(job_id, state, db)
            finally:
                # Off the queue only once its transaction ended: the analysis waits for an
                # empty queue, and must then read the chunks and counts it committed.
                self._removals.popleft()
        if not self._removals and self._drained is not None:
            drained, self._drained = self._drained, None
            drained()

    def run_pass(self) -> None:
        """Analyze every job and remove what it chose, all at once (tests; a quiet launcher)."""
        self._analyze_all()
        while self._removals:
            self.run_slices(budget=3600)

    def analyze(self) -> tuple[bool, list]:
        """One pass over every job: whether some job is still over its cap (analyze again
        soon), and the removals chosen, taken off this object's queue (for `queue` elsewhere)."""
        try:
            again = self._analyze_all()
        except Exception:  # noqa: BLE001 - retention must never end ingest
            log.exception("metrics retention analysis failed; trying again later")
            self._tracks.clear()  # start over from the chunks
            again = False
        removals = list(self._removals)
        self._removals.clear()
        return again, removals

    def _analyze_all(self) -> bool:
        """Queue the removals for every job; True if some job is still over its cap."""
        again = False
        jobs = [job_id for (job_id,) in self.store.db.execute("SELECT id FROM jobs ORDER BY created")]
        for job_id in set(self._tracks) - set(jobs):
            del self._tracks[job_id]
        for job_id in set(self._idle) - set(jobs):
            del self._idle[job_id]
        for job_id in jobs:
            again |= self._analyze(job_id)
        self.passes += 1
        return again

    def _analyze(self, job_id: str) -> bool:
        db = self.store.db
        state = self.store.retention_state(job_id) or {
            "bucket": FIRST_BUCKET, "keep_last": self.policy.keep_last,
            "recent_steps": self.policy.recent_steps, "downsampled_until": None, "dropped": 0}
        newest = self.store.newest_metric_seq(job_id)
        if newest is None:
            self._tracks.pop(job_id, None)
            return False
        row = db.execute("SELECT last_step, state FROM jobs WHERE id = ?", (job_id,)).fetchone()
        recent_from = ((row[0] or 0) if row else 0) - state["recent_steps"]
        ended = row is None or row[1] in TERMINAL_STATES
        policy = (state["bucket"], state["keep_last"], state["recent_steps"])
        signature = (newest, recent_from, policy)
        if self._idle.get(job_id) == signature:
            return False  # nothing new since a quiet analysis left it under its cap
        self._idle.pop(job_id, None)
        track = self._tracks.get(job_id)
        if track is None or track.policy != policy:
            track = self._tracks[job_id] = _Track(policy)
        elif track.settled and track.newest == newest and track.recent_from == recent_from:
            if ended:  # nothing new since a quiet analysis, and nothing will come: let it go
                del self._tracks[job_id]
                self._idle[job_id] = signature
            return False  # a job paused: nothing new since a quiet analysis
        rewrites = self._downsample(job_id, track, recent_from)
        track.newest = newest
        if track.settled and ended:
            # A quiet pass of an ended job looked at all there is: its tracking (memory in
            # proportion to the job's recent points) goes; a resume rebuilds it by one read.
            del self._tracks[job_id]
        removed = sum(count for _, _, count, _ in rewrites)
        for start in range(0, len(rewrites), _SLICE_CHUNKS):
            part = rewrites[start:start + _SLICE_CHUNKS]
            self._removals.append((job_id, [r[:3] for r in part], max(r[3] for r in part), dict(state)))
        total = db.execute("SELECT SUM(n) FROM metric_chunks WHERE job_id = ?", (job_id,)).fetchone()[0] or 0
        if total - removed <= self.policy.max_points:
            if track.settled and ended:
                self._idle[job_id] = signature
            return False
        # Over the cap: coarser buckets first; the recent points' resolution goes last.
        if state["bucket"] < WIDEST_BUCKET:
            state["bucket"] = min(WIDEST_BUCKET, state["bucket"] * 4)
        else:
            state["keep_last"] = max(1, state["keep_last"] // 2)
            state["recent_steps"] = state["recent_steps"] // 2
        if not rewrites:
            with self.store.tx() as db:  # the new policy, with the counts as they are now
                current = self.store.retention_state(job_id) or {}
                self.store.set_retention_state(job_id, dict(
                    state, dropped=current.get("dropped", state["dropped"]),
                    downsampled_until=current.get("downsampled_until", state["downsampled_until"])), db)
        else:
            self._removals[-1] = self._removals[-1][:3] + (dict(state),)
        return True

    # -- the analysis -------------------------------------------------------------------
    def _downsample(self, job_id: str, track: _Track, recent_from: int) -> list[tuple]:
        """Read what is new of a job, bucket what became old; returns the chunk rewrites:
        (seq, new columns or None, points removed, newest t among them)."""
        _bucket, keep, _recent = track.policy
        touched = self._read_new(job_id, track)
        quiet = not touched
        moved = recent_from != track.recent_from
        for series in touched:
            limit = series.total - keep
            while series.head < len(series.seqs) and series.after[series.head] <= limit:
                self._release(track, series.seqs[series.head], recent_from)
                series.head += 1
            series.trim()
        while track.waiting and track.waiting[0][0] < recent_from:
            seq = heapq.heappop(track.waiting)[1]
            track.big_waiting.discard(seq)
            track.ready.append(seq)
        # Chunks only partly old: the head of a series past keep_last, and chunks waiting for
        # recent steps to move on; large ones at once, all once the job went quiet.
        partial: set[int] = set()
        for series in (track.series.values() if quiet or moved else touched):
            if series.head < len(series.seqs) and series.before[series.head] < series.total - keep:
                seq = series.seqs[series.head]
                if quiet or track.pending[seq][3] >= PARTIAL_MIN:
                    partial.add(seq)
        if quiet:
            partial.update(seq for _, seq in track.waiting)
        elif moved:
            partial.update(track.big_waiting)
        ready, track.ready = track.ready, []
        track.recent_from = recent_from
        track.settled = quiet
        order = sorted(set(ready) | partial)
        edited: dict[int, list] = {}  # chunk seq -> [head, t, s, name, v, index, rank, node, removed]
        rewrites = []
        for start in range(0, len(order), _BATCH):
            self._bucket_batch(job_id, track, order[start:start + _BATCH], partial, recent_from, edited)
            # A chunk none of whose points is carried is done with for this pass: its rewrite
            # is prepared now, so that few decoded chunks are alive at once.
            held = set((track.carry[3] // metric_chunks.CHUNK).tolist())
            for seq in [seq for seq in edited if seq not in held]:
                chunk = edited.pop(seq)
                if chunk[-1]:
                    rewrites.append(self._rewrite(seq, *chunk))
        return rewrites + [self._rewrite(seq, *chunk) for seq, chunk in edited.items() if chunk[-1]]

    def _read_new(self, job_id: str, track: _Track) -> set[_Series]:
        """Count the points of each series in the chunks written since the last pass."""
        cursor = self.store.db.execute(
            "SELECT seq, attempt, kind, device, ranks, names, n, step_max FROM metric_chunks"
            " WHERE job_id = ? AND seq > ? ORDER BY seq", (job_id, track.seen))
        cursor.row_factory = None
        touched: set[_Series] = set()
        every = track.series
        for seq, attempt, kind, device, ranks, names, n, step_max in cursor:
            ranks = metric_chunks.ranks_of(ranks)
            live = 0
            for name, counts in metric_chunks.counts_of(names).items():
                for rank, count in zip(ranks, counts, strict=True):
                    if not count:
                        continue
                    key = (attempt, rank, kind, device, name)
                    series = every.get(key)
                    if series is None:
                        series = every[key] = _Series(len(every))
                        track.sids.setdefault((attempt, kind, device), {})[(rank, name)] = series.sid
                    series.seqs.append(seq)
                    series.before.append(series.total)
                    series.total += count
                    series.after.append(series.total)
                    touched.add(series)
                    live += 1
            track.pending[seq] = [live, step_max, kind, n]
            track.seen = seq
        return touched

    @staticmethod
    def _release(track: _Track, seq: int, recent_from: int) -> None:
        """One series of chunk `seq` is beyond keep_last: once all are, the chunk is old
        (or waits for the recent steps to move past it)."""
        pending = track.pending[seq]
        pending[0] -= 1
        if pending[0]:
            return
        del track.pending[seq]
        _live, step_max, kind, n = pending
        if kind != "train" or step_max is None or step_max < recent_from:
            track.ready.append(seq)
        else:
            heapq.heappush(track.waiting, (step_max, seq))
            if n >= PARTIAL_MIN:
                track.big_waiting.add(seq)

    def _fetch(self, job_id: str, seqs: list[int]):
        """(seq, [head, t, s, name, v, index, rank, node, removed indices]) of chunks."""
        for start in range(0, len(seqs), _FETCH):
            part = seqs[start:start + _FETCH]
            cursor = self.store.db.execute(
                "SELECT seq, attempt, kind, device, names, data FROM metric_chunks"
                f" WHERE seq IN ({','.join('?' * len(part))})", part)
            cursor.row_factory = None
            for seq, attempt, kind, device, names, data in cursor:
                self.decoded += 1
                yield seq, [(job_id, attempt, kind, device), *metric_chunks.decode(names, data), set()]

    def _bucket_batch(self, job_id: str, track: _Track, seqs: list[int], partial: set[int],
                      recent_from: int, edited: dict[int, list]) -> None:
        """Bucket the old points of chunks `seqs` with the carried survivors; note what goes."""
        width, keep, _recent = track.policy
        every = track.series
        sids: list[int] = []
        times: list = []
        values: list = []
        points: list[int] = []
        for seq, chunk in self._fetch(job_id, seqs):
            edited[seq] = chunk
            (_job, attempt, kind, device), t, s, n, v, idx, r, _o, _removed = chunk
            base = seq * metric_chunks.CHUNK
            if seq not in partial:  # all old
                of = track.sids[(attempt, kind, device)]
                sids += [of[key] for key in zip(r, n, strict=True)]
                times += t
                values += v
                points += range(base, base + len(idx)) if type(idx) is range else [base + i for i in idx]
                continue
            # A point is old when more than keep_last of its series follow it, counted from
            # the chunk's end: a chunk retention rewrote holds fewer points than the counts,
            # but the ones it lost were older than any it still protects.
            later: dict[tuple, int | None] = {}
            tail: dict[tuple, int] = {}
            for j in range(len(n) - 1, -1, -1):
                key = (attempt, r[j], kind, device, n[j])
                if key not in later:
                    later[key] = every[key].later(seq)
                tail[key] = nth = tail.get(key, 0) + 1
                after = later[key]
                if (after is None or after + nth > keep) and \
                        (kind != "train" or s[j] is None or s[j] < recent_from):
                    sids.append(every[key].sid)
                    times.append(t[j])
                    values.append(v[j])
                    points.append(base + idx[j])
        if not points and not len(track.carry[0]):
            return
        sid = np.array(sids, np.int64)
        t_arr = np.array(times, float)
        bucket = np.nan_to_num(np.floor(t_arr / width), nan=-1.0).astype(np.int64)
        value = np.array(values, float)
        seq_arr = np.array(points, np.int64)
        # The carried survivors of these series join them, but not twice: a carried point of
        # a chunk analyzed again is among this batch's points.
        c_sid, c_bucket, c_value, c_seq = track.carry
        here = np.zeros(len(track.series), bool)
        here[sid] = True
        stays = ~here[c_sid]
        again = np.zeros(len(c_seq), bool)
        if len(c_seq) and seqs:
            batch = np.array(seqs, np.int64)
            chunk = c_seq // metric_chunks.CHUNK
            again = batch[np.minimum(np.searchsorted(batch, chunk), len(batch) - 1)] == chunk
        joins = ~stays & ~again
        sid = np.concatenate([sid, c_sid[joins]])
        bucket = np.concatenate([bucket, c_bucket[joins]])
        value = np.concatenate([value, c_value[joins]])
        seq_arr = np.concatenate([seq_arr, c_seq[joins]])
        keep_mask = _survivors(sid, bucket, value, seq_arr)
        # What stays of each series' newest bucket is carried on.
        k_sid, k_bucket = sid[keep_mask], bucket[keep_mask]
        newest = np.full(int(k_sid.max(initial=-1)) + 1, np.iinfo(np.int64).min)
        np.maximum.at(newest, k_sid, k_bucket)
        carried = keep_mask.copy()
        carried[keep_mask] = k_bucket == newest[k_sid]
        track.carry = tuple(np.concatenate([old[stays], new[carried]]) for old, new in
                            zip(track.carry, (sid, bucket, value, seq_arr), strict=True))
        gone = np.sort(seq_arr[~keep_mask])
        chunks, firsts = np.unique(gone // metric_chunks.CHUNK, return_index=True)
        chunks = chunks.tolist()
        for seq, chunk in self._fetch(job_id, [seq for seq in chunks if seq not in edited]):
            edited[seq] = chunk
        for seq, indices in zip(chunks, np.split(gone % metric_chunks.CHUNK, firsts[1:]) if chunks else [],
                                strict=True):
            chunk = edited.get(seq)
            if chunk is not None:
                chunk[-1].update(indices.tolist())
        # Chunks with nothing to remove need not stay in memory.
        for seq in seqs:
            if seq in edited and not edited[seq][-1]:
                del edited[seq]

    @staticmethod
    def _rewrite(seq: int, head: tuple, t: list, s: list, n: list, v: list, idx, r: list, o: list,
                 removed: set) -> tuple:
        """(seq, the chunk's new columns after `device`, or None, points removed, newest t
        among them)."""
        keep = [j for j, i in enumerate(idx) if i not in removed]
        gone_t = [t[j] for j, i in enumerate(idx) if i in removed and t[j] is not None]
        count = len(idx) - len(keep)
        until = max(gone_t, default=0.0)
        if not keep:
            return seq, None, count, until
        names: dict[str, int] = {}
        cols = {"t": [t[j] for j in keep], "s": [s[j] for j in keep],
                "k": [names.setdefault(n[j], len(names)) for j in keep], "v": [v[j] for j in keep],
                "r": [r[j] for j in keep], "o": [o[j] for j in keep], "i": [idx[j] for j in keep]}
        return seq, metric_chunks.columns_fields(head[2], list(names), cols), count, until
