"""The goodput ledger of a job: where its wall time went, and its progress with an ETA.

Wall time, from the submit to now (or to the job's end), is cut into disjoint parts that sum
to it exactly (one cursor walks the job's timeline and every second it passes goes to one
part):

- `waiting`: QUEUED, PREFLIGHT and the engine's PENDING before an attempt's first step;
- `startup`: STARTING/RUNNING up to an attempt's first step (imports, rendezvous, restore);
- `productive`: the steps after the first of each attempt, less the two below;
- `data_wait`, `checkpoint_stall`: the sums of the steps' `data_wait_ms` and
  `ckpt_stall_ms` (the per-rank step breakdown), as rank 0 logged them;
- `lost_work`: steps later redone after a restore: from the restored step's time to the
  attempt's last progress;
- `restart_downtime`: from a failed attempt's last progress (any rank's newest step) to the
  next attempt's first step; for a job that failed for good, to its end;
- `hung`: an attempt ended by the hang verdict (no step for `progress_timeout`, or silent
  heartbeats), from its last progress to the verdict;
- `stopped`: a stop's time (the step it cut, STOPPING), and the time a job sat ended before
  a resume;
- `shutdown`: a succeeded attempt's last step to the job's end (exit, teardown).

Goodput = productive / wall. Step times and the breakdown come from rank 0 (in synchronous
training every rank's steps end together; rank 0 always exists). The open interval of a
running job, from its last step to now, counts as productive (a step in progress) until a
verdict says otherwise.

Cheap to ask often (the panel's list polls every job): the ledger keeps, per job, what it
has read so far (a metrics cursor and an events cursor) and prefix sums over rank 0's steps,
so a look reads only what was stored since the last one and costs a bisection per attempt;
an ended job's answer is kept as it is. Of what was stored, it decodes only the chunks that
hold rank 0's points (a node's batch: 8 of 4,096 ranks), and takes any rank's newest step
time from the chunks' own column.
"""

from __future__ import annotations

import json
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from .. import layout
from ..states import TERMINAL_STATES

PARTS = ("waiting", "startup", "productive", "data_wait", "checkpoint_stall", "lost_work",
         "restart_downtime", "hung", "stopped", "shutdown")
# The rank whose steps and breakdown the ledger reads.
BREAKDOWN_RANK = 0
# The step rate of the ETA: over rank 0's last this many steps of the current attempt.
RATE_STEPS = 20
# An ended attempt's states, and the stop's, after which no step is expected.
_VERDICT = ("RESTARTING", "STOPPING", *TERMINAL_STATES)
_BEFORE_RUN = ("QUEUED", "PREFLIGHT", "PENDING")


@dataclass
class _Steps:
    """Rank 0's steps of one attempt, in the order logged, with prefix sums over the
    intervals between them (the first step's interval is start-up, so it is not summed)."""

    steps: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    waits: dict[int, float] = field(default_factory=dict)    # step -> data_wait_ms
    stalls: dict[int, float] = field(default_factory=dict)   # step -> ckpt_stall_ms
    # After step i: summed interval, data wait and checkpoint stall of steps 1..i (seconds)
    total: list[float] = field(default_factory=list)
    data: list[float] = field(default_factory=list)
    ckpt: list[float] = field(default_factory=list)
    last_any: float = 0.0   # the newest step of any rank

    def add(self, step: int, t: float) -> None:
        if self.steps and step <= self.steps[-1]:
            return  # a step logged twice, or out of order: the first time counts
        self.steps.append(step)
        self.times.append(t)

    def fold(self) -> None:
        """Extend the prefix sums over the steps added since."""
        for i in range(len(self.total), len(self.steps)):
            if i == 0:
                self.total.append(0.0)
                self.data.append(0.0)
                self.ckpt.append(0.0)
                continue
            interval = max(0.0, self.times[i] - self.times[i - 1])
            wait = min(interval, max(0.0, self.waits.get(self.steps[i], 0.0) / 1000))
            stall = min(interval - wait, max(0.0, self.stalls.get(self.steps[i], 0.0) / 1000))
            self.total.append(self.total[-1] + interval)
            self.data.append(self.data[-1] + wait)
            self.ckpt.append(self.ckpt[-1] + stall)

    def upto(self, step: int | None) -> int:
        """The index of the last step at or below `step` (-1: none); all with None."""
        if step is None:
            return len(self.steps) - 1
        return bisect_right(self.steps, step) - 1


@dataclass
class _Job:
    metric_seq: int = 0
    event_seq: int = 0
    states: dict[int, list[tuple[float, str]]] = field(default_factory=dict)
    attempts: dict[int, _Steps] = field(default_factory=dict)
    total_steps: int | None = None
    created: float = 0.0
    final: dict | None = None
    final_key: tuple | None = None


class Ledger:
    """Every job's ledger, kept incrementally. Thread-safe (the reader threads ask)."""

    def __init__(self, store: Any):
        self.store = store
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)

    def ledger(self, row: Any, now: float | None = None) -> dict:
        """The job's ledger (the goodput route's answer), `row` being its jobs row."""
        with self._lock:
            return self._ledger(row, time.time() if now is None else now)

    def summary_fields(self, row: Any) -> dict:
        """What a job's summary carries of it: goodput and progress."""
        answer = self.ledger(row)
        return {"goodput": None if answer["goodput"] is None else round(answer["goodput"], 4),
                "progress": answer["progress"]}

    # -- reading what was stored since the last look -----------------------------------------
    def _ledger(self, row: Any, now: float) -> dict:
        job_id = row["id"]
        job = self._jobs.get(job_id)
        if job is None or job.created != row["created"]:
            job = self._jobs[job_id] = _Job(created=row["created"])  # new, or an id reused
        key = (row["created"], row["ended"], row["attempt"], row["state"])
        if job.final is not None and job.final_key == key:
            return job.final
        self._read(job_id, job)
        answer = self._compute(row, job, now)
        if row["state"] in TERMINAL_STATES and row["ended"] is not None:
            job.final, job.final_key = answer, key
        return answer

    def _read(self, job_id: str, job: _Job) -> None:
        store = self.store
        for event in store.events(job_id, job.event_seq, types=("state", "total_steps")):
            job.event_seq = event["seq"]
            if event["type"] == "state":
                job.states.setdefault(event["attempt"] or 0, []).append((event["t"], event["state"]))
            elif event["data"] and isinstance(event["data"].get("steps"), int):
                job.total_steps = event["data"]["steps"]
        touched = set()
        # Any rank's newest step from the chunks' columns, and only the chunks that hold rank
        # 0's points decoded: at 4,096 ranks a look decoded 20,000 points a quarter second
        # (the panel's list asks every job's), 100 ms of the launcher's GIL.
        for attempt, t in store.newest_train_times(job_id, job.metric_seq).items():
            steps = job.attempts.setdefault(attempt, _Steps())
            steps.last_any = max(steps.last_any, t)
        while True:
            points, last = store.metric_page(job_id, job.metric_seq, rank=BREAKDOWN_RANK)
            if last == job.metric_seq:
                break
            job.metric_seq = last
            for p in points:
                if p["kind"] != "train" or p["step"] is None or p["rank"] != BREAKDOWN_RANK:
                    continue
                steps = job.attempts.setdefault(p["attempt"] or 0, _Steps())
                steps.add(p["step"], p["t"] or 0.0)
                if p["name"] == "data_wait_ms" and p["value"] is not None:
                    steps.waits[p["step"]] = p["value"]
                elif p["name"] == "ckpt_stall_ms" and p["value"] is not None:
                    steps.stalls[p["step"]] = p["value"]
                touched.add(p["attempt"] or 0)
        for attempt in touched:
            # The values of one logged step come in one entry, so in one chunk: fold them now.
            job.attempts[attempt].fold()

    # -- the walk -------------------------------------------------------------------------
    def _compute(self, row: Any, job: _Job, now: float) -> dict:
        store = self.store
        end = row["ended"] if row["state"] in TERMINAL_STATES and row["ended"] else now
        parts = dict.fromkeys(PARTS, 0.0)
        cursor = row["created"]

        def add(until: float, part: str) -> None:
            nonlocal cursor
            until = min(until, end)
            if until > cursor:
                parts[part] += until - cursor
                cursor = until

        arows = {a["attempt"]: a for a in store.attempt_rows(row["id"])}
        numbers = sorted(arows)
        counted = 0
        restarted = False
        for n in numbers:
            arow = arows[n]
            states = job.states.get(n, [])
            steps = job.attempts.get(n) or _Steps()
            first = steps.times[0] if steps.steps else None
            verdict = next(((t, s) for t, s in states if s in _VERDICT), None)
            stop_at = verdict[0] if verdict else end
            # 1. Before the first step (all of it, when the attempt ended without one).
            state: str | None = None
            for t, s in states:
                if first is not None and t >= first or t > stop_at:
                    break
                if state is not None:
                    add(t, _before(state, restarted))
                if s in _VERDICT:
                    state = s
                    break
                state = s
            if state not in _VERDICT:  # else it ended before its first step: nothing more
                verdict_state = verdict[1] if verdict else None
                if first is not None:
                    add(first, _before(state or "STARTING", restarted))
                    # 2. The steps: those the next attempt redid are lost work.
                    restored = _restored(arows.get(n + 1), job.attempts.get(n + 1), row, n, store)
                    keep = steps.upto(restored)
                    last = len(steps.steps) - 1
                    if keep >= 0:
                        # The kept steps as one span (its time on the launcher's clock, which
                        # a rank's may be off from), its breakdown taken out in proportion.
                        began = cursor
                        add(steps.times[keep], "productive")
                        share = (cursor - began) / steps.total[keep] if steps.total[keep] > 0 else 0.0
                        wait, stall = steps.data[keep] * share, steps.ckpt[keep] * share
                        parts["productive"] -= wait + stall
                        parts["data_wait"] += wait
                        parts["checkpoint_stall"] += stall
                        counted += keep
                    if keep < last:
                        add(steps.times[last], "lost_work")
                    tail = max(steps.times[last], steps.last_any)
                    add(min(tail, stop_at), "lost_work" if restored is not None and
                        restored <= steps.steps[last] else "productive")
                elif verdict is None:
                    add(end, _before(state or "QUEUED", restarted))
                # 3. From the last progress to the verdict.
                if verdict is not None:
                    add(verdict[0], _tail(arow, verdict_state, first is not None, restarted))
                else:
                    add(end, "productive" if first is not None else _before(state or "QUEUED", restarted))
            # 4. After the verdict, up to the next attempt.
            if verdict is not None:
                after = [(t, s) for t, s in states if t >= verdict[0]]
                following = job.states.get(n + 1)
                ends = [t for t, _ in after[1:]] + [following[0][0] if following else end]
                for (_, s), until in zip(after, ends, strict=True):
                    add(until, _after(s))
            restarted = any(s == "RESTARTING" for _, s in states)
        add(end, "stopped")  # nothing is left unassigned
        wall = max(0.0, end - row["created"])
        spec = json.loads(row["spec"])
        total = spec.get("steps") or job.total_steps
        seen = any(s.steps for s in job.attempts.values())
        return {
            "job": row["id"], "state": row["state"], "wall_seconds": wall,
            "goodput": parts["productive"] / wall if seen and wall > 0 else None,
            "parts": parts, "steps_counted": counted, "breakdown_rank": BREAKDOWN_RANK,
            "progress": _progress(row, job, total, now),
        }


def _before(state: str, restarted: bool) -> str:
    """Where the time before an attempt's first step goes."""
    if restarted:
        return "restart_downtime"
    if state in _BEFORE_RUN:
        return "waiting"
    if state in ("STARTING", "RUNNING"):
        return "startup"
    return "stopped"


def _tail(arow: Any, state: str | None, stepped: bool, restarted: bool) -> str:
    """Where an attempt's time from its last progress to its verdict goes."""
    if state in ("STOPPING", "STOPPED") or (arow["outcome"] in ("stopped", "preempted")):
        return "stopped"
    if state == "SUCCEEDED":
        return "shutdown" if stepped else ("restart_downtime" if restarted else "startup")
    failure = json.loads(arow["failure"]) if arow["failure"] else {}
    if failure.get("class") == "hang" or "hung" in (arow["reason"] or ""):
        return "hung"
    return "restart_downtime"


def _after(state: str) -> str:
    """Where the time after an attempt's verdict goes: RESTARTING is downtime; a stop or an
    ended job (until a resume) is stopped."""
    return "restart_downtime" if state == "RESTARTING" else "stopped"


def _restored(arow: Any, steps: _Steps | None, row: Any, attempt: int, store: Any) -> int | None:
    """The step the attempt after `attempt` restored (its steps after that are redone), or
    None when no attempt follows and none is coming. 0: it started over."""
    if arow is not None and arow["started"]:
        if arow["resume_path"]:
            step = layout.step_of(arow["resume_path"])
            if step is not None:
                return step
        return steps.steps[0] - 1 if steps is not None and steps.steps else 0
    if arow is not None or row["state"] == "RESTARTING" and row["attempt"] == attempt:
        # Coming: the newest committed checkpoint is what a restart takes.
        committed = [c["step"] for c in store.checkpoints(row["id"]) if c["step"] is not None]
        return max(committed) if committed else 0
    return None


def _progress(row: Any, job: _Job, total: int | None, now: float) -> dict | None:
    """Step, total steps and the ETA from the current attempt's recent step rate."""
    step = row["last_step"]
    if step is None and total is None:
        return None
    steps = job.attempts.get(row["attempt"])
    rate = None
    if steps is not None and len(steps.steps) >= 2:
        k = max(0, len(steps.steps) - 1 - RATE_STEPS)
        span = steps.times[-1] - steps.times[k]
        if span > 0:
            rate = (steps.steps[-1] - steps.steps[k]) / span
    eta = None
    if total is not None and step is not None and rate and row["state"] not in TERMINAL_STATES:
        eta = max(0.0, (total - step) / rate)
    return {"step": step, "total_steps": total, "steps_per_second": rate, "eta_seconds": eta}
