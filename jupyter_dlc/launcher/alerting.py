"""Alert rules evaluated by the launcher each tick, on what the store and the logs hold.

Per job: an `AlertEvaluator` fed only what is new since its last look (metric rows by
sequence number, log bytes by offset), so a tick costs what arrived, not the job's history.
Its state (episodes, cursors) is saved with the job, so a restarted launcher neither fires
an open episode twice nor forgets one.

The same look feeds the straggler detector (stragglers.py) the new step-breakdown points;
who it names now is saved with the alert state (`stragglers`, the job's detail shows it), and
each change of who is named is a `straggler` event. The detector's windows are not saved (at
4,096 ranks they are a megabyte, every few seconds): a launcher that reads a job's state back
(a restart, or a job it had forgotten) refills them from the store, with the breakdown points
it had read before, so that nobody named is dropped and named again WINDOW steps later (with
a step a minute, an hour: a "no straggler any more" event and an alert episode closed, both
false).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .. import wirejson
from .alerts import AlertEvaluator, JobSnapshot, post_webhook, rules_for
from .stragglers import BREAKDOWN, WINDOW, StragglerDetector

log = logging.getLogger("jupyter_dlc.launcher")

EVALUATE_EVERY = 0.5  # seconds; a NaN reported mid-interval fires at the next tick
SAVE_EVERY = 5.0  # seconds between saves of the evaluation state when nothing fired
# A job not evaluated for this long (ended, or waiting for a restart or a slot) is dropped
# from memory; its state is in the store, where the next look reads it back.
FORGET_AFTER = 60.0
# Webhooks go out on a few threads of one executor; past this many waiting, a webhook is not
# sent and says so in an event (a slow receiver and an alert storm must not grow threads or
# memory without bound).
WEBHOOK_WORKERS, WEBHOOK_BACKLOG = 4, 64
_LOG_READ_LIMIT = 1 << 20
# Stored writes a refill reads back for each node's WINDOW steps: its node's batches, and
# as many of system samples and other writes between them.
REFILL_WRITES_PER_STEP = 2


class JobAlerts:
    def __init__(self, spec: dict, saved: dict | None):
        self.evaluator = AlertEvaluator(rules_for(spec.get("alerts") or [],
                                                  spec.get("default_alerts", True)))
        saved = saved or {}
        self.evaluator.load_state(saved.get("evaluator") or {})
        self.metric_seq = int(saved.get("metric_seq", 0))
        self.event_seq = int(saved.get("event_seq", 0))
        self.attempt = saved.get("attempt")
        self.log_offsets: dict[str, int] = saved.get("log_offsets") or {}
        self.last_run = 0.0
        self.last_saved = 0.0
        self.log_turn = 0
        # Names read by their latest point alone (each rank's last of every stored write):
        # an `is nan` rule judges nothing else, and the straggler detector takes each rank's
        # last step of every report (stragglers.py). Reading every step's breakdown was four
        # points a rank a step: at 4,096 ranks and 10 steps a second, 164,000 points a second
        # through the launcher's interpreter. A rule that names a breakdown metric reads every
        # point of it, and then the detector reads every step, so that its steps pair whole.
        full = {r.metric for r in self.evaluator.rules if r.metric and r.kind != "nan"}
        breakdown = set(BREAKDOWN)
        if full & breakdown:
            full |= breakdown
        self.metric_names = sorted(full)
        self.latest_names = sorted(({r.metric for r in self.evaluator.rules if r.metric and r.kind == "nan"}
                                    | breakdown) - full)
        self.nproc = int(spec.get("nproc_per_node") or 1)
        self.world = int(spec.get("nodes") or 1) * self.nproc
        self.detector = StragglerDetector(self.world, self.nproc)
        self.stragglers: list[dict] = saved.get("stragglers") or []
        # A sweep's trial with `best` rules: the sweep, and the metrics those rules compare.
        self.sweep = (spec.get("sweep") or {}).get("id")
        self.best_metrics = sorted({r.metric for r in self.evaluator.rules if r.kind == "sweep_best" and r.metric})

    def state(self) -> dict:
        return {"evaluator": self.evaluator.state(), "alerts": self.evaluator.active(),
                "metric_seq": self.metric_seq, "event_seq": self.event_seq,
                "attempt": self.attempt, "log_offsets": self.log_offsets,
                "stragglers": self.stragglers}

    def refill_detector(self, store, job_id: str, attempt_started: float | None) -> None:
        """The detector's windows as they were when this state was saved: the breakdown
        points of this attempt up to the saved cursor, the newest WINDOW steps of each rank
        (read from far enough back for a few other names logged between them)."""
        self.detector.named = {f["key"] for f in self.stragglers}  # its hysteresis goes on
        if not self.metric_seq:
            return
        # A node's write gives each of its ranks a step as the detector reads it (the newest
        # of the write): so back by the job's writes, WINDOW of every node's. Counting back by
        # seq numbers (as before) reached only the newest write or two: a write's points are
        # numbered CHUNK apart from the next, and every job's writes share the numbers.
        nodes = max(1, self.world // self.nproc)
        since = store.metric_seq_writes_back(job_id, self.metric_seq, nodes * WINDOW * REFILL_WRITES_PER_STEP)
        _, points = store.metric_points(job_id, since, [n for n in BREAKDOWN if n in self.metric_names],
                                        [n for n in BREAKDOWN if n in self.latest_names])
        started = attempt_started or 0.0
        self.detector.add((name, t, rank, value) for seq, name, t, rank, value, _device in points
                          if seq <= self.metric_seq and t is not None and t >= started)

    def judge_stragglers(self, snap: JobSnapshot) -> bool:
        """Feed the new breakdown points and judge; whether who is named changed."""
        self.detector.add((name, point[0], point[1], point[2])
                          for name in BREAKDOWN for point in snap.metrics.get(name, ()))
        found = self.detector.judge()
        snap.stragglers = found
        changed = [f["key"] for f in found] != [f["key"] for f in self.stragglers]
        self.stragglers = found
        return changed


# The rank logs one evaluation looks at. A job with more ranks has its logs read in turns
# (every rank's within world / LOGS_PER_LOOK evaluations): stat-ing 4,096 files twice a
# second was a tenth of the launcher's CPU, for rules that fire on what a log says, where a
# second or two does not matter.
LOGS_PER_LOOK = 512


def _log_turn(world: int, turn: int) -> list[int]:
    """The ranks whose logs one evaluation reads: all of them up to LOGS_PER_LOOK, else the
    next LOGS_PER_LOOK in turn."""
    first = (turn * LOGS_PER_LOOK) % world if world > LOGS_PER_LOOK else 0
    return [(first + at) % world for at in range(min(world, LOGS_PER_LOOK))]


class SweepBoard:
    """The best value of a metric at each step across a sweep's trials, for `best` rules.

    Read from the store: each trial's rank-0 points of the metric after the seq already read
    (every trial of the sweep, running or ended, so a trial started later is judged against
    the curves of those before it). Not saved: a restarted launcher reads the trials again
    from their first point on its first look, which rebuilds it whole."""

    def __init__(self, store):
        self.store = store
        self.best: dict[tuple[str, str], dict[int, float]] = {}
        self.cursors: dict[tuple[str, str], int] = {}  # (job, metric) -> seq read
        self.judged: set[tuple[str, str]] = set()  # (job, metric) of trials a `best` rule judges
        self.pending: dict[tuple[str, str], list[tuple[int, float]]] = {}  # read, not judged yet
        self.members: dict[str, set[str]] = {}
        self._members_read = 0.0

    def trials(self, sweep: str, job_id: str, now: float) -> set[str]:
        if job_id not in self.members.get(sweep, ()) or now - self._members_read > FORGET_AFTER:
            self._members_read = now
            found: dict[str, set[str]] = {}
            for row in self.store.job_rows():
                of = (json.loads(row["spec"]).get("sweep") or {}).get("id")
                if of:
                    found.setdefault(of, set()).add(row["id"])
            self.members = found
        return self.members.get(sweep, {job_id}) | {job_id}

    def read(self, sweep: str, metric: str, job_id: str, now: float) -> list[tuple]:
        """Take in every trial's new points; (step, value, best at that step) of `job_id`'s
        not judged yet. A trial's points may be read while another trial is evaluated: they
        wait for it in `pending` (only for trials that are judged, i.e. running)."""
        best = self.best.setdefault((sweep, metric), {})
        self.judged.add((job_id, metric))
        for trial in sorted(self.trials(sweep, job_id, now)):
            since = self.cursors.get((trial, metric), 0)
            if (self.store.newest_metric_seq(trial) or 0) <= since:
                continue  # nothing new (an ended trial): no chunk is read
            while True:
                points, last = self.store.metric_page(trial, since)
                for p in points:
                    value = p["value"]
                    if p["name"] != metric or p["rank"] != 0 or not isinstance(value, (int, float)) \
                            or not math.isfinite(value):
                        continue
                    step = int(p["step"])
                    best[step] = min(best.get(step, value), value)
                    if (trial, metric) in self.judged:
                        self.pending.setdefault((trial, metric), []).append((step, value))
                if not points or last <= since:
                    break
                since = last
            self.cursors[(trial, metric)] = since
        own = sorted(self.pending.pop((job_id, metric), []))
        return [(step, value, best.get(step)) for step, value in own]

    def forget(self, job_id: str) -> None:
        """A trial no longer evaluated: what waits for it goes; its points are read afresh
        (once) should another trial's look need them."""
        for key in [k for k in self.cursors if k[0] == job_id]:
            del self.cursors[key]
        self.judged = {k for k in self.judged if k[0] != job_id}
        for key in [k for k in self.pending if k[0] == job_id]:
            del self.pending[key]


class Alerting:
    def __init__(self, supervisor):
        self.supervisor = supervisor
        self.store = supervisor.store
        self.jobs: dict[str, JobAlerts] = {}
        self._webhooks = ThreadPoolExecutor(WEBHOOK_WORKERS, thread_name_prefix="dlc-webhook")
        self._webhooks_waiting = 0
        self._webhooks_lock = threading.Lock()
        self._last_forget = 0.0
        self.sweeps = SweepBoard(self.store)

    def close(self) -> None:
        """At the launcher's shutdown: webhooks not begun are dropped (those on the way
        finish on their own threads, within post_webhook's timeout)."""
        self._webhooks.shutdown(wait=False, cancel_futures=True)

    def forget_idle(self, now: float) -> None:
        if now - self._last_forget < FORGET_AFTER:
            return
        self._last_forget = now
        for job_id in [j for j, a in self.jobs.items() if now - a.last_run > FORGET_AFTER]:
            del self.jobs[job_id]
            self.sweeps.forget(job_id)  # an ended trial is judged no more

    def __call__(self, row, now: float, final: bool = False) -> None:
        """Evaluate a running job; `final` for the last look as its attempt ends."""
        self.forget_idle(now)
        if row is None or row["state"] not in ("STARTING", "RUNNING", "STOPPING"):
            return
        job_id = row["id"]
        alerts = self.jobs.get(job_id)
        if alerts is None:
            saved = wirejson.loads(row["alert_state"]) if row["alert_state"] else None
            alerts = self.jobs[job_id] = JobAlerts(json.loads(row["spec"]), saved)
            if saved and alerts.attempt == row["attempt"]:
                attempt = self.store.attempt_row(job_id, row["attempt"])
                alerts.refill_detector(self.store, job_id, attempt["started"] if attempt else None)
        if now - alerts.last_run < EVALUATE_EVERY and not final:
            return
        alerts.last_run = now
        if alerts.attempt != row["attempt"]:  # logs of a new attempt start from the top
            alerts.attempt, alerts.log_offsets = row["attempt"], {}
            alerts.detector = StragglerDetector(alerts.world, alerts.nproc)
        snapshot = self.snapshot(row, alerts)
        snapshot.progress = (now, row["last_step"], row["attempt"])
        if alerts.sweep:
            for metric in alerts.best_metrics:
                snapshot.sweep_points[metric] = self.sweeps.read(alerts.sweep, metric, job_id, now)
        named = alerts.judge_stragglers(snapshot)
        if named:
            self.store.add_event(job_id, row["attempt"], "straggler",
                                 "; ".join(f["message"] for f in alerts.stragglers)
                                 or "no straggler any more", {"stragglers": alerts.stragglers})
        transitions = alerts.evaluator.evaluate(now, snapshot)
        for transition in transitions:
            self.act(row, transition)
        # The state (per-series cursors, thousands with many ranks) is what a restarted
        # launcher evaluates on from: saved at once after a transition, else every few
        # seconds; what it re-reads after a restart then changes no episode already recorded.
        if transitions or named or final or now - alerts.last_saved >= SAVE_EVERY:
            alerts.last_saved = now
            state = alerts.state()
            # In slices: one json.dumps call of a 4,096-rank state kept the GIL for up to
            # 24 ms (wirejson.dumps_in_slices). The views read the small summary alone.
            self.store.update_job(job_id, alert_state=wirejson.dumps_in_slices(state),
                                  alert_summary=json.dumps({"alerts": state["alerts"],
                                                            "stragglers": state["stragglers"]}))

    def snapshot(self, row, alerts: JobAlerts) -> JobSnapshot:
        job_id = row["id"]
        snap = JobSnapshot()
        # Only the metrics a rule names: with thousands of ranks logging every step, reading
        # every point into Python each half second was a sixth of the launcher's CPU.
        alerts.metric_seq, points = self.store.metric_points(job_id, alerts.metric_seq,
                                                             alerts.metric_names, alerts.latest_names)
        for _seq, name, t, rank, value, device in points:
            snap.metrics.setdefault(name, []).append(
                (t, rank, float("nan") if value is None else value, device))
        for event in self.store.events(job_id, alerts.event_seq):
            alerts.event_seq = event["seq"]
            data = event["data"] or {}
            if event["type"] == "checkpoint" and data.get("seconds") is not None:
                snap.checkpoints.append((event["t"], data.get("rank"), data["seconds"]))
            elif event["type"] == "nan":
                snap.nan_events.append((event["t"], data.get("rank"), data.get("name", "loss")))
        # Two numbers, not a row per rank: this runs twice a second for every running job.
        world, snap.last_progress = self.store.progress_of(job_id, row["attempt"])
        attempt = self.store.attempt_row(job_id, row["attempt"])
        snap.started = attempt["started"] if attempt else None
        alerts.log_turn += 1
        # Through the job's engine, as the logs route reads them (Engine.logs).
        now = time.time()
        snap.log_lines = [(now, rank, text) for rank, text in self.supervisor.logs(
            row, row["attempt"], _log_turn(world, alerts.log_turn), alerts.log_offsets,
            limit=_LOG_READ_LIMIT)]
        return snap

    def act(self, row, transition) -> None:
        job_id = row["id"]
        payload = transition.payload(job_id=job_id, job_name=row["name"], attempt=row["attempt"])
        kind = "alert" if transition.kind == "fired" else "alert_resolved"
        self.store.add_event(job_id, row["attempt"], kind, transition.message, payload)
        if transition.kind != "fired":
            return
        action = transition.rule.action
        if action == "webhook" and transition.rule.url:
            self.send_webhook(job_id, row["attempt"], transition.rule.url, payload)
        elif action == "stop":
            self.supervisor.request_stop(job_id, None, reason=f"alert: {transition.message}")
        elif action == "checkpoint-and-stop":
            self.supervisor.checkpoint_and_stop(job_id, f"alert: {transition.message}")

    def send_webhook(self, job_id: str, attempt: int, url: str, payload: dict) -> None:
        with self._webhooks_lock:
            waiting = self._webhooks_waiting
            if waiting < WEBHOOK_WORKERS + WEBHOOK_BACKLOG:
                self._webhooks_waiting += 1
        if waiting >= WEBHOOK_WORKERS + WEBHOOK_BACKLOG:
            self.store.add_event(job_id, attempt, "webhook", f"webhook not sent: {waiting} webhooks "
                                 "are waiting for slow receivers", {"url": url, "ok": False})
            return
        try:
            self._webhooks.submit(self._post, job_id, attempt, url, payload)
        except RuntimeError:  # shut down: the launcher is ending
            with self._webhooks_lock:
                self._webhooks_waiting -= 1

    def _post(self, job_id: str, attempt: int, url: str, payload: dict) -> None:
        try:
            ok, detail = post_webhook(url, payload)
            self.store.add_event(job_id, attempt, "webhook", f"webhook {'delivered' if ok else 'failed'}: "
                                 f"{detail}", {"url": url, "ok": ok})
        finally:
            with self._webhooks_lock:
                self._webhooks_waiting -= 1


def attach_alerts(supervisor) -> None:
    supervisor.hooks.append(Alerting(supervisor))
