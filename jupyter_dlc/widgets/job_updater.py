"""`JobUpdater`: what keeps a job view current: its updater thread, the stream follower it
owns, and one refresh (what to read from the launcher, what changed, what to show).

Metric points are PUSHED: a `push.MetricsFollower` thread follows the launcher's
`metrics/stream` for the job and draws each batch as soon as it arrives (and wakes the
updater when the job's summary changes state). ONE updater thread per view calls
`refresh_now()` every `push_interval` seconds while the stream is live (every `interval`
while it is down, when it also polls metrics since the last seq, all pages): job detail,
logs from the cursor, events since the last seq, checkpoints when a new one committed,
diagnosis when an attempt failed, the goodput ledger. Each refresh turns into at most one
message per changed widget, and each draw (a pushed batch, or a refresh) into one bokeh
stream per changed line, all in ONE PATCH-DOC (`JobChartsModel.batch()`), so the front end
gets one bokeh message per batch however many lines it touches. `push_trace` keeps when
each pushed batch arrived and was sent, for benchmarks/live_view.py's per-stage times.

Lifecycle: `start()` (under the cell that shows the view: the thread adopts that cell's
parent, kernelthread.py) starts the thread, and any action that changes the job (`kick()`)
starts it again after it ended; `stop()` asks the thread and the follower to leave and
returns at once; `join()` waits for the thread. The thread also ends by itself: when the
job has ended it waits `ended_interval`, refreshes a last time and exits, stopping the
follower. When the launcher cannot be reached the view keeps what it shows, says so in a
banner and retries with backoff (0.5 s doubling to 10 s), picking up a launcher that came
back on a new port from the connection file. When the job has ended, the whole bokeh
document is re-sent once per attempt, so a notebook saved with its widget state (e.g.
nbclient's `store_widget_state=True`) and reopened later shows every kept point.

Two locks: the widgets' `lock` guards what they show and is held briefly (the stream's
points wait on it); `_refresh_lock` only keeps two refreshes apart, and is held across
their HTTP calls.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from ..client import TERMINAL, LauncherClient, LauncherError, LauncherUnavailable
from .followed_job import FollowedJob
from .job_widgets import JobWidgets
from .kernelthread import adopt_parent, capture_parent
from .push import MetricsFollower
from .ranktable import PAGE_SIZE, RankPage

BACKOFF = (0.5, 1, 2, 4, 8, 10)
# How often a running job's ledger is read again (each read is one small request).
GOODPUT_EVERY = 2.0


def read_job(client, job_id: str, paging: RankPage) -> dict:
    """The job's detail with the rank table's page, sorted and cut by the launcher."""
    return client.job(job_id, rank_sort=paging.order, rank_page=paging.page, rank_page_size=PAGE_SIZE)


def read_followed(client, job_id: str, paging: RankPage, capacity: int, log_lines: int) -> FollowedJob:
    """A `FollowedJob` for `job_id`, sized for its world when the launcher answers."""
    world = 1
    job = None
    try:
        job = read_job(client, job_id, paging)
        world = int(job["nodes"]) * int(job["nproc_per_node"])
    except (LauncherError, KeyError, TypeError, ValueError):
        pass
    followed = FollowedJob(job_id, world, capacity, log_lines)
    followed.job = job
    return followed


class JobUpdater:
    """Refreshes `ui` from the launcher for the job `followed`, on demand (`refresh_now`) or
    on its own thread (`start` ... `stop`, `join`)."""

    def __init__(self, client, ui: JobWidgets, followed: FollowedJob, interval: float,
                 push_interval: float, ended_interval: float, capacity: int, log_lines: int):
        self.client = client  # replaced by a launcher that came back on a new port
        self.ui = ui
        self.followed = followed
        self.interval = interval
        self.push_interval = push_interval
        self.ended_interval = ended_interval
        self.capacity = capacity
        self.log_lines = log_lines
        self._lock = ui.lock
        self._refresh_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._auto = False
        self._kernel = self._parent = None
        self._down: str | None = None
        self._down_count = 0
        self.follower: MetricsFollower | None = None
        self.refreshes = 0
        self.points_pushed = 0  # points drawn from the stream / from a poll (tests, benchmark)
        self.points_polled = 0
        # (first seq, last seq, received, lock taken, sent) of each pushed batch, time.time()
        # seconds: where the kernel's part of logged -> drawn goes (benchmarks/live_view.py)
        self.push_trace: deque = deque(maxlen=4000)
        self.band_rows = 0  # band rows added, pushed or polled (bands.py)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the updater thread; it adopts the parent of the cell running now."""
        self._kernel, self._parent = capture_parent()
        self._auto = True
        self.kick()

    def stop(self) -> None:
        """Stop updating: the thread and the follower leave; returns without waiting."""
        self._auto = False
        self._closed.set()
        self._wake.set()
        self._stop_push()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the updater thread to finish; True when it has."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def kick(self) -> None:
        """Refresh now: wake the thread, or start it again when it ended (after `start`)."""
        with self._lock:
            self._wake.set()
            if self._auto and (self._thread is None or not self._thread.is_alive()):
                self._closed.clear()
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"dlc-view-{self.followed.job_id}")
                self._thread.start()

    def _run(self) -> None:
        adopt_parent(self._kernel, self._parent)
        final_pending = False
        while not self._closed.is_set():
            self._wake.clear()
            self._ensure_push()
            try:
                job = self.refresh_now()
            except Exception as error:  # a bug must not end the view silently
                self._down = f"view error: {type(error).__name__}: {error}"
                self._down_count += 1
                self.ui.show_banner(self.followed, self._down_now())
                job = None
            if job is None:
                if self.followed.gone:
                    break
                delay = self._retry_delay() if self._down_count else 0.5
                final_pending = False
            elif job["state"] in TERMINAL:
                if final_pending:  # that was the final refresh
                    with self._lock:
                        if not self._wake.is_set():
                            self._thread = None
                            self._stop_push()
                            return
                    final_pending = False
                    continue
                final_pending = True
                delay = self.ended_interval
            else:
                final_pending = False
                delay = self.push_interval if self._pushing() else self.interval
            self._wake.wait(delay)
        with self._lock:
            if self._thread is threading.current_thread():
                self._thread = None
                self._stop_push()

    # -- what the view asks for -------------------------------------------------------------
    def refresh_now(self) -> dict | None:
        """Poll the launcher once and update every part; returns the job (None when the
        launcher cannot be reached or the job is gone)."""
        with self._refresh_lock:
            return self._refresh()

    def follow(self, job_id: str, note: str = "") -> None:
        """Show another job (a clone) from its beginning."""
        with self._lock:
            self.followed = read_followed(self.client, job_id, self.ui.paging, self.capacity, self.log_lines)
            self.followed.note = note
            self.ui.show_new_job(self.followed)
        self.kick()

    def read_rank_page(self) -> None:
        """Read and show the rank table's page the widgets chose."""
        with self._lock:
            f = self.followed
        try:
            job = read_job(self.client, f.job_id, self.ui.paging)
        except LauncherError:
            return  # the next refresh shows it, or that the launcher is down
        with self._lock:
            if f is self.followed:
                f.job = job
                self.ui.show_ranks(job)

    # -- pushed points ----------------------------------------------------------------------
    def _ensure_push(self) -> None:
        """Follow the stream of the job shown now (a clone replaces it)."""
        with self._lock:
            push = self.follower
            f = self.followed
            if push is not None and push.job_id == f.job_id and not push.stopped:
                return
            if push is not None:
                push.stop()
            self.follower = MetricsFollower(
                lambda: self.client, f.job_id, lambda: f.metrics_seq,
                lambda answer, since: self._pushed(f, answer, since),
                lambda job: self._job_changed(f, job), self._push_state,
                lambda: f.band()).start()

    def _stop_push(self) -> None:
        push, self.follower = self.follower, None
        if push is not None:
            push.stop()

    def _pushing(self) -> bool:
        push = self.follower
        return push is not None and push.state != "down"

    def _pushed(self, f: FollowedJob, answer: dict, since: int) -> None:
        received = time.time()
        points = answer.get("points") or []
        last_seq = int(answer.get("last_seq") or 0)
        with self._lock:
            if f is not self.followed:
                return  # the view follows another job now
            locked = time.time()
            self.ui.show_downsampled(answer.get("downsampled"))
            added = self._add_answer(f, answer, since)
            self.points_pushed += added
            if added:
                self.ui.draw()
                self.push_trace.append((int(points[0].get("seq") or 0) if points else last_seq,
                                        last_seq, received, locked, time.time()))

    def _job_changed(self, f: FollowedJob, job: dict) -> None:
        known = f.job or {}
        if (job.get("state"), job.get("attempt")) != (known.get("state"), known.get("attempt")):
            self._wake.set()  # a state change shows now, not at the next refresh

    def _push_state(self, state: str) -> None:
        if state == "down":
            self._wake.set()  # poll at once what the stream would have brought

    def _add_answer(self, f: FollowedJob, answer: dict, since: int) -> int:
        """`FollowedJob.add_metrics`, counted; a new outlier rank: the stream reconnects
        asking for its points. Returns the values added."""
        added = f.add_metrics(answer, since)
        self.band_rows += added.band_rows
        if added.new_outliers and self.follower is not None:
            self.follower.renew()
        return added.values

    # -- one refresh ----------------------------------------------------------------------
    def _refresh(self) -> dict | None:
        f = self.followed
        self.refreshes += 1
        try:
            job = read_job(self.client, f.job_id, self.ui.paging)
            with self._lock:
                self._ensure_world(f, job)
            self._ensure_parent(f, job)
            with self._lock:
                if not self._pushing():
                    self._poll_metrics(f)
            self._poll_logs(f)
            self._poll_events(f)
            self._poll_checkpoints(f, job)
            self._poll_diagnosis(f, job)
            self._poll_goodput(f, job)
        except LauncherUnavailable as error:
            self._launcher_down(str(error))
            return None
        except LauncherError as error:
            if error.status == 404:
                f.gone = str(error)
                self.ui.show_banner(self.followed, self._down_now())
                return None
            # 401: a launcher that restarted has a new token; anything else: keep trying
            self._launcher_down(str(error))
            return None
        with self._lock:
            if f is not self.followed:
                return job  # the view follows a clone now; its own refresh draws it
            if self._down:
                self._down, self._down_count = None, 0
            f.job = job
            self.ui.show_job(f, job)
            if job["state"] in TERMINAL:
                self._finalise(f, job)
        return job

    def _ensure_world(self, f: FollowedJob, job: dict) -> None:
        if f.set_world(int(job["nodes"]) * int(job["nproc_per_node"])):
            self.ui.show_new_world(f)
            if self.follower is not None:
                self.follower.renew()  # past 8 ranks it reads bands

    def _ensure_parent(self, f: FollowedJob, job: dict) -> None:
        """A branch's charts begin with its parent's curve up to the branch step."""
        parent = job.get("parent") or {}
        if f.parent_points is None:
            f.parent_points = {}
            if parent:
                try:
                    f.parent_points = _parent_curves(self.client, parent["job"], parent["step"])
                except LauncherError:
                    pass  # the parent was deleted: the branch's own lines are all there is
        if f.parent_points and self.ui.charts.parent_label is None:
            self.ui.show_parent(f"parent {parent['job']} to step {parent['step']}", f.parent_points)

    def _down_now(self) -> tuple[str, float] | None:
        """(why the launcher is unreachable, how often it is retried), or None while it answers."""
        return (self._down, self._retry_delay()) if self._down else None

    def _retry_delay(self) -> float:
        return BACKOFF[min(self._down_count, len(BACKOFF)) - 1]

    def _launcher_down(self, message: str) -> None:
        with self._lock:
            self._down = message
            self._down_count += 1
            self.ui.show_banner(self.followed, self._down_now())
        self._reconnect()

    def _reconnect(self) -> None:
        """A launcher that came back on a new port (its connection file says where)."""
        fresh = LauncherClient.from_connection_file()
        if fresh is not None and (fresh.url, fresh.token) != (self.client.url, self.client.token) \
                and fresh.alive():
            self.client = fresh

    def _poll_metrics(self, f: FollowedJob) -> None:
        for _ in range(1000):
            since = f.metrics_seq
            answer = self.client.metrics(f.job_id, since=since, band=f.band())
            self.points_polled += self._add_answer(f, answer, since)
            with self._lock:
                self.ui.show_downsampled(answer.get("downsampled"))
            if int(answer.get("last_seq") or 0) == since:
                break

    def _poll_logs(self, f: FollowedJob) -> None:
        answer = self.client.logs(f.job_id, cursor=f.log_cursor,
                                  tail=None if f.log_cursor else self.log_lines)
        with self._lock:
            f.add_logs(answer)
            if answer.get("lines") or f.log_counter != f.logs_shown:
                f.logs_shown = f.log_counter
                self.ui.show_logs(f)

    def _poll_events(self, f: FollowedJob) -> None:
        events = self.client.events(f.job_id, since=f.events_seq)
        with self._lock:
            f.add_events(events)

    def _poll_checkpoints(self, f: FollowedJob, job: dict) -> None:
        last = job.get("last_checkpoint") or {}
        key = (last.get("step"), job.get("attempt"), job["state"] in TERMINAL)
        if f.checkpoints is None or key != f.checkpoint_key:
            checkpoints = self.client.checkpoints(f.job_id)
            with self._lock:
                f.checkpoints, f.checkpoint_key = checkpoints, key
                self.ui.show_checkpoints(checkpoints)

    def _poll_diagnosis(self, f: FollowedJob, job: dict) -> None:
        failed = sum(1 for a in job.get("attempts") or [] if a.get("failure"))
        if failed != f.diagnosis_count:
            f.diagnoses = self.client.diagnosis(f.job_id) if failed or f.diagnosis_count < 0 else []
            f.diagnosis_count = failed

    def _poll_goodput(self, f: FollowedJob, job: dict) -> None:
        """The ledger, every GOODPUT_EVERY seconds while the job runs and once when its state
        or attempt changed (an ended job's does not change)."""
        read_at, key = f.goodput_read
        now = time.time()
        new_key = (job["state"], job.get("attempt"))
        if key == new_key and (job["state"] in TERMINAL or now - read_at < GOODPUT_EVERY):
            return
        ledger = self.client.goodput(f.job_id)
        with self._lock:
            f.goodput, f.goodput_read = ledger, (now, new_key)
            self.ui.show_goodput(ledger)

    def _finalise(self, f: FollowedJob, job: dict) -> None:
        """Once per ended attempt: re-send the whole bokeh document (see the module's text)."""
        key = (job.get("attempt"), f.metrics_seq)
        if f.finalised != key:
            f.finalised = key
            self.ui.resend_charts()


def _parent_curves(client, job_id: str, up_to: int) -> dict[str, list]:
    """{metric: [(step, value)]} of a job's rank-0 train points up to step `up_to`."""
    curves: dict[str, list] = {}
    for p in client.metrics_after(job_id):
        if p["rank"] == 0 and p.get("kind", "train") == "train" and p["step"] is not None \
                and p["step"] <= up_to and isinstance(p["value"], (int, float)):
            curves.setdefault(p["name"], []).append((p["step"], p["value"]))
    return {name: sorted(points) for name, points in curves.items()}
