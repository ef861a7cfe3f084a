"""`JobView`: the live view of one job under a `%%dlc` cell or `%dlc attach JOB`.

Layout, top to bottom: a header (state, attempt, elapsed, step, last loss, steps/s,
samples/s, last checkpoint), banners (launcher unreachable, active alerts, diagnosis of a
failed attempt), buttons (Stop, Resume from a committed step, Clone), the per-rank table,
the charts (a train metric against step with a metric dropdown, and utilisation per GPU per
node, or CPU where there is no GPU), and a log tail with a rank filter.

How it updates: metric points are PUSHED: a `push.MetricsFollower` thread follows the
launcher's `metrics/stream` for the job and draws each batch as soon as it arrives (and wakes
the updater when the job's summary changes state). ONE updater thread per view calls
`refresh_now()` every `push_interval` seconds while the stream is live (every `interval`
while it is down, when it also polls metrics since the last seq, all pages): job detail,
logs from the cursor, events since the last seq, checkpoints when a new one committed,
diagnosis when an attempt failed. Each refresh turns into at most one message per changed
widget, and each draw (a pushed batch, or a refresh) into one bokeh stream per changed line,
all in ONE PATCH-DOC (`JobChartsModel.batch()`), so the front end gets one bokeh message
per batch however many lines it touches. `push_trace` keeps when each pushed batch arrived and
was sent, for benchmarks/live_view.py's per-stage times.
When the job has ended the thread waits `ended_interval`, refreshes a last time and
exits (Resume or Clone start it again). When the launcher cannot be reached the view keeps
what it shows, says so in a banner and retries with backoff (0.5 s doubling to 10 s),
picking up a launcher that came back on a new port from the connection file.

Front ends: the text parts (header, banners, rank table, log tail, buttons) are plain
ipywidgets and work wherever ipywidgets do. The charts are a `jupyter_bokeh.BokehModel`,
which needs BokehJS on the page; in JupyterLab our extension loads it from the Jupyter
server extension (`{base_url}/dlc/static/bokeh/`), never from a CDN and never inlined into
the notebook. Where nothing loads BokehJS (nbclient/nbconvert output, the classic Notebook,
VS Code, a Lab without our extension) the chart area stays empty or shows the widget
manager's error, and a grey note under it (hidden by our extension once BokehJS is loaded)
says why; everything else still works, and the header carries the last loss and
throughput as text. The widget state saved with the notebook (e.g. nbclient's
`store_widget_state=True`) holds the whole chart: when the job ends the view re-sends its
full bokeh document once, so a notebook reopened later shows every kept point.
"""

from __future__ import annotations

import html
import threading
import time
from collections import deque

from .. import formatting
from ..client import TERMINAL, LauncherClient, LauncherError, LauncherUnavailable
from .charts import Charts, JobChartsModel
from .kernelthread import adopt_parent, capture_parent
from .push import MetricsFollower
from .ranktable import PAGE_SIZE, SORTS
from .series import SystemData, TrainData

STATE_COLOURS = {"SUCCEEDED": "#2e7d32", "FAILED": "#c62828", "STOPPED": "#6d4c41",
                 "RUNNING": "#1565c0", "RESTARTING": "#ef6c00", "QUEUED": "#616161",
                 "PREFLIGHT": "#616161", "STARTING": "#00838f", "PENDING": "#8e24aa"}
FROM_START = -1         # the Resume dropdown's value when no step is committed
MEDIAN_LABEL = "median of the ranks"
FROM_START_LABEL = "no checkpoint: from the start"
BACKOFF = (0.5, 1, 2, 4, 8, 10)
NO_BOKEH_NOTE = (
    '<div class="dlc-needs-bokehjs" style="color:#888;font-size:11px">Charts need BokehJS, '
    "which the jupyter-dlc JupyterLab extension loads from this Jupyter server "
    "(/dlc/static/bokeh/). This front end has not loaded it, so the charts above stay empty; "
    "state, ranks, throughput, last loss and logs are complete without them.</div>")


class _Followed:
    """What the view knows about the job it follows; replaced when the view follows a clone."""

    def __init__(self, job_id: str, world_size: int, capacity: int, log_lines: int):
        self.job_id = job_id
        self.world_size = world_size
        self.metrics_seq = 0
        self.events_seq = 0
        self.log_cursor: str | None = None
        self.log_attempt: int | None = None
        self.log_counter = 0
        self.logs_all: deque = deque(maxlen=log_lines)
        self.logs_by_rank: dict[int, deque] = {}
        self.log_lines = log_lines
        self.train = TrainData(world_size, capacity)
        self.system = SystemData(capacity)
        self.alerts: dict[str, dict] = {}
        self.diagnoses: list[dict] = []
        self.evidence: list[dict] = []  # `evidence` events: what was kept before a kill
        self.diagnosis_count = -1
        self.checkpoints: list[dict] | None = None
        self.checkpoint_key = None
        self.job: dict | None = None
        self.gone: str | None = None
        self.finalised = None      # (attempt, metrics seq) of the last full bokeh re-send
        # A branch's parent up to the branch step: {metric: [(step, value)]} of its rank 0,
        # read once and drawn muted under the branch's own lines; {} when there is none.
        self.parent_points: dict[str, list] | None = None
        self.goodput: dict | None = None   # the ledger as last read, and when
        self.goodput_read = (0.0, None)
        self.note = ""

    def band(self) -> list[int] | None:
        """What a metrics read asks for (bands.py): past 8 ranks, train points folded per
        step but for the outlier ranks' lines; else None, every point."""
        return None if self.train.by_rank else list(self.train.outliers)

    def add_log(self, rank: int | None, text: str) -> None:
        self.log_counter += 1
        item = (self.log_counter, rank, text)
        self.logs_all.append(item)
        if rank is not None:
            self.logs_by_rank.setdefault(rank, deque(maxlen=self.log_lines)).append(item)


class JobView:
    """Live view of a launcher job. `show()` displays it and starts its updater thread;
    `refresh_now()` polls once, synchronously (tests, `%%dlc --wait`)."""

    def __init__(self, client, job_id: str, interval: float = 0.25, ended_interval: float = 1.5,
                 capacity: int = 4000, log_lines: int = 200, push_interval: float = 1.0):
        import ipywidgets as w

        self.client = client
        self.interval = interval
        self.push_interval = push_interval
        self.ended_interval = ended_interval
        self.capacity = capacity
        self.log_lines = log_lines
        # _lock guards what the widgets show (held briefly: the stream's points wait on it);
        # _refresh_lock only keeps two refreshes apart, and is held across their HTTP calls.
        self._lock = threading.RLock()
        self._refresh_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._auto = False
        self._kernel = self._parent = None
        self._down: str | None = None
        self._down_count = 0
        self.refreshes = 0
        self._push: MetricsFollower | None = None
        self.points_pushed = 0  # points drawn from the stream / from a poll (tests, benchmark)
        self.points_polled = 0
        # (first seq, last seq, received, lock taken, sent) of each pushed batch, time.time()
        # seconds: where the kernel's part of logged -> drawn goes (benchmarks/live_view.py)
        self.push_trace: deque = deque(maxlen=4000)
        self.band_rows = 0  # band rows added, pushed or polled (bands.py)
        self.rank_page = 0
        self.rank_order = "rank"  # the rank table's (the launcher sorts and pages it)

        self.header = w.HTML()
        self.goodput_bar = w.HTML()  # where the job's wall time went (launcher/goodput.py)
        self.banner = w.HTML()
        self.stop_button = w.Button(description="Stop", icon="stop", button_style="danger",
                                    tooltip="Stop the job (ranks checkpoint, then exit)")
        self.resume_steps = w.Dropdown(description="from", options=[(FROM_START_LABEL, FROM_START)],
                                       layout=w.Layout(width="220px"))
        self.resume_button = w.Button(description="Resume", icon="play", button_style="success",
                                      tooltip="Start a new attempt from the chosen committed step")
        self.clone_button = w.Button(description="Clone", icon="copy",
                                     tooltip="Submit a new job with the same spec; this view follows it")
        self.action_note = w.HTML()
        self.rank_table = w.HTML()
        self.rank_sort = w.Dropdown(description="ranks", options=[(label, key) for key, label in SORTS],
                                    value="rank", layout=w.Layout(width="260px"))
        self.rank_prev = w.Button(description="◀", layout=w.Layout(width="36px"), tooltip="previous page")
        self.rank_next = w.Button(description="▶", layout=w.Layout(width="36px"), tooltip="next page")
        self.rank_pages = w.HTML()
        self.rank_bar = w.HBox([self.rank_sort, self.rank_prev, self.rank_pages, self.rank_next])
        self.rank_bar.layout.display = "none"  # shown when the ranks need more than one page
        self.metric_select = w.Dropdown(description="metric", options=["loss"], value="loss",
                                        layout=w.Layout(width="260px"))
        # Whose steps the "where each step goes" chart draws (shown once ranks log them).
        self.steps_select = w.Dropdown(description="steps of", options=[(MEDIAN_LABEL, -1)], value=-1,
                                       layout=w.Layout(width="260px", display="none"))
        self.chart_note = w.HTML(NO_BOKEH_NOTE)
        self.retention_note = w.HTML()  # says when older points are downsampled
        self._retention_text = ""
        self.log_filter = w.Dropdown(description="logs", options=[("all ranks", -1)], value=-1,
                                     layout=w.Layout(width="200px"))
        self.log_view = w.HTML()

        self._f = self._new_followed(job_id)
        self.charts = Charts(job_id, self._f.train, self._f.system, capacity)
        self.bokeh = JobChartsModel(self.charts.layout)
        self._set_log_filter_options()

        self.stop_button.on_click(lambda _: self._act(self.stop))
        self.resume_button.on_click(lambda _: self._act(lambda: self.resume(self._resume_step())))
        self.clone_button.on_click(lambda _: self._act(self.clone))
        self.metric_select.observe(self._on_metric, names="value")
        self.steps_select.observe(self._on_steps_of, names="value")
        self.log_filter.observe(lambda _: self._render_logs(), names="value")
        self.rank_sort.observe(lambda _: self._turn_rank_page(None), names="value")
        self.rank_prev.on_click(lambda _: self._turn_rank_page(-1))
        self.rank_next.on_click(lambda _: self._turn_rank_page(+1))

        self.widget = w.VBox([
            self.header, self.goodput_bar, self.banner,
            w.HBox([self.stop_button, self.resume_steps, self.resume_button, self.clone_button,
                    self.action_note]),
            self.rank_bar, self.rank_table, w.HBox([self.metric_select, self.steps_select]), self.bokeh,
            self.retention_note, self.chart_note,
            self.log_filter, self.log_view,
        ])
        self.widget.add_class("dlc-job-view")
        self.header.value = self._header_html(None)

    # -- public ---------------------------------------------------------------------------
    @property
    def job_id(self) -> str:
        return self._f.job_id

    @property
    def job(self) -> dict | None:
        return self._f.job

    def show(self) -> "JobView":
        from IPython.display import display

        bundle = self.widget._repr_mimebundle_()
        # what a front end without widgets (a terminal, nbconvert to text) shows instead
        job = self._f.job
        bundle["text/plain"] = formatting.status_line(job) if job else f"{self.job_id}: submitted"
        display(bundle, raw=True)
        self.start()
        return self

    def _ipython_display_(self) -> None:
        self.show()

    def start(self) -> None:
        """Start the updater thread; it adopts the parent of the cell running now."""
        self._kernel, self._parent = capture_parent()
        self._auto = True
        self._kick()

    def close(self) -> None:
        """Stop updating (the widgets stay as they are)."""
        self._auto = False
        self._closed.set()
        self._wake.set()
        self._stop_push()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the updater thread to finish (the job ended); True when it has."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def refresh_now(self) -> dict | None:
        """Poll the launcher once and update every part; returns the job (None when the
        launcher cannot be reached or the job is gone)."""
        with self._refresh_lock:
            return self._refresh()

    def stop(self, grace: float | None = None) -> dict:
        job = self.client.stop(self.job_id, grace)
        self._kick()
        return job

    def resume(self, step: int | None = None) -> dict:
        job = self.client.resume(self.job_id, step)
        self._kick()
        return job

    def clone(self) -> dict:
        """Submit the same spec as a new job, and follow that job from now on."""
        old = self.job_id
        job = self.client.clone(old)
        self.follow(job["id"], note=f"clone of {old}")
        return job

    def follow(self, job_id: str, note: str = "") -> None:
        """Show another job (a clone) in this view, from its beginning."""
        with self._lock:
            self._f = self._new_followed(job_id)
            self._f.note = note
            self.charts = Charts(job_id, self._f.train, self._f.system, self.capacity)
            self.bokeh.update_from_model(self.charts.layout)
            self.metric_select.options = ["loss"]
            self.metric_select.value = "loss"
            self.steps_select.options = [(MEDIAN_LABEL, -1)]
            self.steps_select.value = -1
            self.steps_select.layout.display = "none"
            self._set_log_filter_options()
            self.resume_steps.options = [(FROM_START_LABEL, FROM_START)]
            self.log_view.value = ""
            self.goodput_bar.value = ""
            self.header.value = self._header_html(None)
        self._kick()

    # -- the updater thread -----------------------------------------------------------------
    def _kick(self) -> None:
        with self._lock:
            self._wake.set()
            if self._auto and (self._thread is None or not self._thread.is_alive()):
                self._closed.clear()
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"dlc-view-{self.job_id}")
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
                self._render_banner()
                job = None
            if job is None:
                if self._f.gone:
                    break
                delay = BACKOFF[min(self._down_count, len(BACKOFF)) - 1] if self._down_count else 0.5
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

    # -- pushed points ----------------------------------------------------------------------
    def _ensure_push(self) -> None:
        """Follow the stream of the job shown now (a clone replaces it)."""
        with self._lock:
            push = self._push
            if push is not None and push.job_id == self.job_id and not push.stopped:
                return
            if push is not None:
                push.stop()
            f = self._f
            self._push = MetricsFollower(
                lambda: self.client, f.job_id, lambda: f.metrics_seq,
                lambda answer, since: self._pushed(f, answer, since),
                lambda job: self._job_changed(f, job), self._push_state,
                lambda: f.band()).start()

    def _stop_push(self) -> None:
        push, self._push = self._push, None
        if push is not None:
            push.stop()

    def _pushing(self) -> bool:
        push = self._push
        return push is not None and push.state != "down"

    def _pushed(self, f: _Followed, answer: dict, since: int) -> None:
        received = time.time()
        points = answer.get("points") or []
        last_seq = int(answer.get("last_seq") or 0)
        with self._lock:
            if f is not self._f:
                return  # the view follows another job now
            locked = time.time()
            self._show_downsampled(answer.get("downsampled"))
            added = self._add_answer(f, answer, since)
            self.points_pushed += added
            if added:
                self._draw()
                self.push_trace.append((int(points[0].get("seq") or 0) if points else last_seq,
                                        last_seq, received, locked, time.time()))

    def _show_downsampled(self, thinned: dict | None) -> None:
        text = formatting.downsampled_note(thinned)
        if self._retention_text != text:
            self._retention_text = text
            self.retention_note.value = f'<span class="dlc-retention-note">{html.escape(text)}</span>' \
                if text else ""

    def _job_changed(self, f: _Followed, job: dict) -> None:
        known = f.job or {}
        if (job.get("state"), job.get("attempt")) != (known.get("state"), known.get("attempt")):
            self._wake.set()  # a state change shows now, not at the next refresh

    def _push_state(self, state: str) -> None:
        if state == "down":
            self._wake.set()  # poll at once what the stream would have brought

    def _add_answer(self, f: _Followed, answer: dict, since: int) -> int:
        """Add a metrics answer's points not seen yet (a poll and the stream may both bring
        one) and its band rows, when it starts where the view is (rows have no seq: an
        answer that overlaps what the view has would add some twice); moves the view's seq.
        Returns the points added, a row counting its values. A new outlier rank: the stream
        reconnects asking for its points."""
        added = 0
        outliers = len(f.train.outliers)
        for point in answer.get("points") or ():
            if int(point.get("seq") or 0) <= f.metrics_seq:
                continue
            if point.get("kind") == "system":
                f.system.add(point)
            else:
                f.train.add(point)
            added += 1
        if since == f.metrics_seq:
            for row in answer.get("bands") or ():
                f.train.add_band(row)
                added += row["n"]
                self.band_rows += 1
        f.metrics_seq = max(f.metrics_seq, int(answer.get("last_seq") or 0))
        if len(f.train.outliers) != outliers and self._push is not None:
            self._push.renew()
        return added

    # -- one refresh ----------------------------------------------------------------------
    def _new_followed(self, job_id: str) -> _Followed:
        world = 1
        job = None
        try:
            job = self._read_job(job_id)
            world = int(job["nodes"]) * int(job["nproc_per_node"])
        except (LauncherError, KeyError, TypeError, ValueError):
            pass
        followed = _Followed(job_id, world, self.capacity, self.log_lines)
        followed.job = job
        return followed

    def _refresh(self) -> dict | None:
        f = self._f
        self.refreshes += 1
        try:
            job = self._read_job(f.job_id)
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
                self._render_banner()
                return None
            # 401: a launcher that restarted has a new token; anything else: keep trying
            self._launcher_down(str(error))
            return None
        with self._lock:
            if f is not self._f:
                return job  # the view follows a clone now; its own refresh draws it
            if self._down:
                self._down, self._down_count = None, 0
            f.job = job
            self._render(job)
            if job["state"] in TERMINAL:
                self._finalise(f, job)
        return job

    def _ensure_world(self, f: _Followed, job: dict) -> None:
        """The world size decides the chart's lines; it is known once the launcher answered."""
        world = int(job["nodes"]) * int(job["nproc_per_node"])
        if world != f.train.world_size and f.metrics_seq == 0:
            f.world_size = world
            f.train = TrainData(world, self.capacity)
            self.charts = Charts(f.job_id, f.train, f.system, self.capacity)
            self.bokeh.update_from_model(self.charts.layout)
            self._set_log_filter_options()
            if self._push is not None:
                self._push.renew()  # past 8 ranks it reads bands

    def _ensure_parent(self, f: _Followed, job: dict) -> None:
        """A branch's charts begin with its parent's curve up to the branch step."""
        parent = job.get("parent")
        if f.parent_points is None:
            f.parent_points = {}
            if parent:
                try:
                    f.parent_points = _parent_curves(self.client, parent["job"], parent["step"])
                except LauncherError:
                    pass  # the parent was deleted: the branch's own lines are all there is
        if f.parent_points and self.charts.parent_label is None:
            with self._lock, self.bokeh.batch():
                self.charts.set_parent(f"parent {parent['job']} to step {parent['step']}", f.parent_points)

    def _launcher_down(self, message: str) -> None:
        with self._lock:
            self._down = message
            self._down_count += 1
            self._render_banner()
        self._reconnect()

    def _reconnect(self) -> None:
        """A launcher that came back on a new port (its connection file says where)."""
        fresh = LauncherClient.from_connection_file()
        if fresh is not None and (fresh.url, fresh.token) != (self.client.url, self.client.token) \
                and fresh.alive():
            self.client = fresh

    def _poll_metrics(self, f: _Followed) -> None:
        for _ in range(1000):
            since = f.metrics_seq
            answer = self.client.metrics(f.job_id, since=since, band=f.band())
            self.points_polled += self._add_answer(f, answer, since)
            with self._lock:
                self._show_downsampled(answer.get("downsampled"))
            if int(answer.get("last_seq") or 0) == since:
                break

    def _poll_logs(self, f: _Followed) -> None:
        answer = self.client.logs(f.job_id, cursor=f.log_cursor,
                                  tail=None if f.log_cursor else self.log_lines)
        with self._lock:
            attempt = answer.get("attempt")
            if attempt is not None and attempt != f.log_attempt:
                if f.log_attempt is not None or (attempt or 1) > 1:
                    f.add_log(None, f"--- attempt {attempt} ---")
                f.log_attempt = attempt
            for line in answer.get("lines") or []:
                f.add_log(line.get("rank"), line.get("text", ""))
            f.log_cursor = answer.get("cursor") or f.log_cursor
            if answer.get("lines") or f.log_counter != getattr(f, "_rendered_counter", None):
                f._rendered_counter = f.log_counter
                self._render_logs()

    def _poll_events(self, f: _Followed) -> None:
        events = self.client.events(f.job_id, since=f.events_seq)
        with self._lock:
            self._apply_events(f, events)

    @staticmethod
    def _apply_events(f: _Followed, events: list) -> None:
        for event in events:
            f.events_seq = max(f.events_seq, int(event.get("seq") or 0))
            data = event.get("data") or {}
            kind = event.get("type")
            if kind in ("alert", "alert_resolved"):
                key = str(data.get("rule") or data.get("condition") or event.get("reason"))
                if kind == "alert":
                    f.alerts[key] = event
                else:
                    f.alerts.pop(key, None)
            elif kind == "diagnosis":
                f.diagnosis_count = -1  # fetch it
            elif kind == "evidence":
                f.evidence.append(event)
            elif kind == "checkpoint":
                f.checkpoint_key = None

    def _poll_checkpoints(self, f: _Followed, job: dict) -> None:
        last = job.get("last_checkpoint") or {}
        key = (last.get("step"), job.get("attempt"), job["state"] in TERMINAL)
        if f.checkpoints is None or key != f.checkpoint_key:
            checkpoints = self.client.checkpoints(f.job_id)
            with self._lock:
                f.checkpoints, f.checkpoint_key = checkpoints, key
                self._set_resume_options(checkpoints)

    def _poll_diagnosis(self, f: _Followed, job: dict) -> None:
        failed = sum(1 for a in job.get("attempts") or [] if a.get("failure"))
        if failed != f.diagnosis_count:
            f.diagnoses = self.client.diagnosis(f.job_id) if failed or f.diagnosis_count < 0 else []
            f.diagnosis_count = failed

    def _poll_goodput(self, f: _Followed, job: dict) -> None:
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
            self.goodput_bar.value = goodput_bar_html(ledger)

    def _finalise(self, f: _Followed, job: dict) -> None:
        """Once per ended attempt: re-send the whole bokeh document, so that the widget state
        saved with the notebook, and any view created from it later, holds every point."""
        key = (job.get("attempt"), f.metrics_seq)
        if f.finalised != key:
            f.finalised = key
            self.charts.flush_steps()
            self.bokeh.update_from_model(self.charts.layout)

    # -- rendering ------------------------------------------------------------------------
    def _render(self, job: dict) -> None:
        f = self._f
        self.header.value = self._header_html(job)
        self.rank_table.value = self._ranks_html(job)
        self._render_banner()
        ended = job["state"] in TERMINAL
        self.stop_button.disabled = ended
        self.resume_button.disabled = not ended
        self.resume_steps.disabled = not ended
        names = f.train.names()
        if names and list(self.metric_select.options) != names:
            current = self.metric_select.value
            self.metric_select.options = names
            self.metric_select.value = current if current in names else names[0]
        self._set_steps_options()
        self._draw()

    def _set_steps_options(self) -> None:
        """Median (or past 8 ranks the mean) and each rank with a line of its own."""
        train = self._f.train
        if "step_ms" not in train.lines:
            return
        first = MEDIAN_LABEL if train.by_rank else f"mean of {train.world_size} ranks"
        options = [(first, -1)] + [(f"rank {key}", key) for key in train.keys if key != "mean"]
        if list(self.steps_select.options) != options:
            current = self.steps_select.value
            self.steps_select.options = options
            self.steps_select.value = current if current in dict(options).values() else -1
        self.steps_select.layout.display = ""

    def _draw(self) -> None:
        """Send the charts' changes since the last draw: one bokeh message, however many lines
        changed (held under self._lock, like every chart change)."""
        with self.bokeh.batch():
            self.charts.push()

    def _header_html(self, job: dict | None) -> str:
        f = self._f
        if job is None:
            return f"<b>{html.escape(f.job_id)}</b>: waiting for the launcher"
        # Everything the launcher stored came from a job (names, steps, reasons): text, never
        # markup, or a report could run script in the notebook.
        state = _text(job["state"])
        colour = STATE_COLOURS.get(job["state"], "#555")
        parts = [
            f'<b>{_text(job["id"])}</b>',
            (f'<span class="dlc-state" data-state="{state}" style="background:{colour};color:white;'
             f'padding:1px 6px;border-radius:3px;font-weight:bold">{state}</span>'),
            f'attempt <b class="dlc-attempt">{_text(job.get("attempt"))}</b>',
            f"elapsed {_text(formatting.elapsed(job))}",
        ]
        if job.get("last_step") is not None:
            loss = job.get("last_loss")
            step = f'step <b class="dlc-step">{_text(job["last_step"])}</b>'
            progress = job.get("progress") or {}
            if progress.get("total_steps"):
                # "step 256 / 400, ETA 7 s" (formatting.progress_line), the step in bold
                rest = formatting.progress_line(progress).split(" / ", 1)[1]
                step += f' / <span class="dlc-progress">{_text(rest)}</span>'
            parts.append(step)
            if loss is not None:
                parts.append(f'loss <b class="dlc-loss">{_number(loss)}</b>')
        rate = f.train.steps_per_s()
        if rate is not None and state not in TERMINAL:
            parts.append(f"{rate:.1f} steps/s")
        elif rate is not None:
            parts.append(f"{rate:.1f} steps/s (at the end)")
        samples = f.train.samples_per_s()
        if samples is not None:
            parts.append(f"{samples:,.0f} samples/s (sum over ranks)")
        last = job.get("last_checkpoint")
        if last:
            when = time.strftime("%H:%M:%S", time.localtime(_seconds(last.get("time"))))
            parts.append(f"last checkpoint: step {_text(last.get('step'))} at {when} "
                         f"({_text(formatting.age(_seconds(last.get('time'))))} ago)")
        else:
            parts.append("no checkpoint yet")
        parent = job.get("parent")
        if parent:
            parts.append(f'<span class="dlc-parent">branched from {_text(parent.get("job"))} at step '
                         f'{_text(parent.get("step"))}</span>')
        text = " · ".join(parts)
        extra = []
        if f.note:
            extra.append(html.escape(f.note))
        if job.get("storage"):
            extra.append(f'<span class="dlc-storage" style="color:#c62828">{_text(job["storage"])}</span>')
        if state in ("FAILED", "STOPPED", "RESTARTING", "PENDING") and job.get("reason"):
            extra.append("reason: " + _text(job["reason"]))
        if formatting.engine_text(job):
            extra.append("engine: " + _text(formatting.engine_text(job)))
        limits = formatting.engine_limits_text(job)
        if limits:
            extra.append(f'<span class="dlc-engine-limits">{_text(limits)}</span>')
        if extra:
            text += '<br><span style="color:#555">' + " · ".join(extra) + "</span>"
        return f'<div class="dlc-header" style="font-family:var(--jp-ui-font-family,sans-serif)">{text}</div>'

    def _read_job(self, job_id: str) -> dict:
        """The job's detail with the rank table's page, sorted and cut by the launcher."""
        return self.client.job(job_id, rank_sort=self.rank_order, rank_page=self.rank_page,
                               rank_page_size=PAGE_SIZE)

    def _turn_rank_page(self, by: int | None) -> None:
        """Show another page, or the first in another order, at once: read from the launcher."""
        with self._lock:
            self.rank_order = self.rank_sort.value
            self.rank_page = 0 if by is None else max(0, self.rank_page + by)
            f = self._f
        try:
            job = self._read_job(f.job_id)
        except LauncherError:
            return  # the next refresh shows it, or that the launcher is down
        with self._lock:
            if f is self._f:
                f.job = job
                self.rank_table.value = self._ranks_html(job)

    def _ranks_html(self, job: dict) -> str:
        ranks = job.get("ranks") or []
        paged = job.get("rank_page") or {"page": 0, "pages": 1, "total": len(ranks)}
        self.rank_page, pages = paged["page"], paged["pages"]
        self.rank_bar.layout.display = "" if pages > 1 else "none"
        self.rank_prev.disabled = self.rank_page == 0
        self.rank_next.disabled = self.rank_page >= pages - 1
        first = self.rank_page * PAGE_SIZE
        self.rank_pages.value = (f'<span class="dlc-rank-pages" style="padding:0 6px">ranks {first + 1}-'
                                 f"{first + len(ranks)} of {paged['total']} · page {self.rank_page + 1}"
                                 f" of {pages}</span>")
        if not ranks:
            return '<div class="dlc-ranks" style="color:#888">no ranks started yet</div>'
        cell = 'style="padding:1px 8px;text-align:left"'
        head = "".join(f"<th {cell}>{h}</th>" for h in
                       ("node", "rank", "state", "last step", "last heartbeat", "exit code"))
        rows = []
        for r in ranks:
            heartbeat = (formatting.age(r["last_heartbeat"]) + " ago") if r.get("last_heartbeat") else "-"
            values = (r.get("node"), r.get("rank"), r.get("state"),
                      "-" if r.get("last_step") is None else r["last_step"], heartbeat,
                      "-" if r.get("exit_code") is None else r["exit_code"])
            colour = "#c62828" if r.get("exit_code") not in (None, 0) else "inherit"
            rows.append(f'<tr class="dlc-rank" data-rank="{_text(r.get("rank"))}" style="color:{colour}">'
                        + "".join(f"<td {cell}>{html.escape(str(v))}</td>" for v in values) + "</tr>")
        return (f'<table class="dlc-ranks" style="border-collapse:collapse;font-size:12px">'
                f"<tr>{head}</tr>{''.join(rows)}</table>")

    def _render_banner(self) -> None:
        f = self._f
        items = []
        if self._down:
            delay = BACKOFF[min(self._down_count, len(BACKOFF)) - 1]
            items.append(("#c62828", "launcher unreachable",
                          f"{self._down}; retrying every {delay:g}s, showing what was last known"))
        if f.gone:
            items.append(("#c62828", "job gone", f.gone))
        for event in f.alerts.values():
            data = event.get("data") or {}
            text = data.get("message") or event.get("reason") or ""
            rule = data.get("condition") or data.get("rule") or ""
            items.append(("#ef6c00", "alert", f"{text}" + (f" (rule: {rule})" if rule else "")))
        for s in (f.job or {}).get("stragglers") or []:
            items.append(("#f9a825", "straggler", s.get("message") or s.get("key") or ""))
        for event in f.evidence[-1:]:
            data = event.get("data") or {}
            items.append(("#455a64", "evidence", f"attempt {event.get('attempt')}: {event.get('reason')} "
                          f"in {data.get('dir')} (`%dlc evidence {f.job_id}` lists it)"))
        for d in f.diagnoses[-2:][::-1]:
            where = (f"rank {d.get('rank')} on node {d.get('node')}" if d.get("rank") is not None
                     else "job")
            text = f"attempt {d.get('attempt')} failed: {d.get('class')} ({where}): " \
                   f"{d.get('line') or d.get('reason') or ''}"
            if d.get("suggestion"):
                text += f" — what to do: {d['suggestion']}"
            items.append(("#6a1b9a", "diagnosis", text))
        self.banner.value = "".join(
            f'<div class="dlc-banner dlc-banner-{kind.split()[0]}" style="border-left:4px solid {colour};'
            f'background:#fafafa;padding:2px 8px;margin:2px 0"><b>{kind}</b>: {_text(text)}</div>'
            for colour, kind, text in items)

    def _render_logs(self) -> None:
        with self._lock:
            f = self._f
            rank = self.log_filter.value
            if rank is None or rank < 0:
                items = list(f.logs_all)
            else:
                items = list(f.logs_by_rank.get(rank, ()))
                # attempt separators belong to every filter
                items = sorted(items + [i for i in f.logs_all if i[1] is None])[-self.log_lines:]
            text = "\n".join(f"[{r}] {t}" if r is not None else t for _, r, t in items)
            self.log_view.value = (
                '<pre class="dlc-logs" style="max-height:220px;overflow:auto;font-size:11px;'
                f'margin:0;background:#f7f7f7;padding:4px">{html.escape(text) or "(no output yet)"}</pre>')

    def _set_log_filter_options(self) -> None:
        options = [("all ranks", -1)] + [(f"rank {r}", r) for r in range(self._f.world_size)]
        if list(self.log_filter.options) != options:
            self.log_filter.options = options
            self.log_filter.value = -1

    def _set_resume_options(self, checkpoints: list[dict]) -> None:
        steps = sorted({c["step"] for c in checkpoints}, reverse=True)
        if steps:
            options = [(f"step {s}" + (" (latest)" if i == 0 else ""), s) for i, s in enumerate(steps)]
        else:
            options = [(FROM_START_LABEL, FROM_START)]
        if list(self.resume_steps.options) != options:
            current = self.resume_steps.value
            self.resume_steps.options = options
            values = [v for _, v in options]
            self.resume_steps.value = current if current in values else values[0]

    def _resume_step(self) -> int | None:
        value = self.resume_steps.value
        return None if value in (None, FROM_START) else int(value)

    # -- callbacks (front-end messages, main thread) -----------------------------------------
    def _on_metric(self, change) -> None:
        with self._lock:
            if change["new"]:
                with self.bokeh.batch():
                    self.charts.select_metric(change["new"])

    def _on_steps_of(self, change) -> None:
        with self._lock:
            if change["new"] is not None:
                with self.bokeh.batch():
                    self.charts.select_steps_of(None if change["new"] < 0 else change["new"])

    def _act(self, action) -> None:
        try:
            action()
            self.action_note.value = ""
        except LauncherError as error:
            self.action_note.value = f'<span style="color:#c62828">{html.escape(str(error))}</span>'
        self.refresh_now()


# How often a running job's ledger is read again (each read is one small request).
GOODPUT_EVERY = 2.0
# The ledger's parts as the bar stacks them, with their colours (the panel's detail.ts the same).
GOODPUT_COLOURS = {"productive": "#2e7d32", "data_wait": "#f9a825", "checkpoint_stall": "#6a1b9a",
                   "startup": "#0277bd", "waiting": "#9e9e9e", "lost_work": "#c62828",
                   "restart_downtime": "#ef6c00", "hung": "#4e342e", "stopped": "#607d8b",
                   "shutdown": "#b0bec5"}


def goodput_bar_html(ledger: dict | None) -> str:
    """One stacked bar of where the job's wall time went, with the goodput percentage;
    each part's seconds in its tooltip and the legend under it."""
    if not ledger or not ledger.get("wall_seconds"):
        return ""
    wall = ledger["wall_seconds"]
    segments, legend = [], []
    for key, label in formatting.GOODPUT_PARTS:
        seconds = ledger["parts"].get(key, 0.0)
        if seconds <= 0:
            continue
        share = 100 * seconds / wall
        tip = _text(f"{label}: {formatting.duration(seconds)} ({share:.1f}%)")
        segments.append(f'<div class="dlc-goodput-part" data-part="{key}" title="{tip}" '
                        f'style="width:{share:.3f}%;background:{GOODPUT_COLOURS[key]}"></div>')
        if seconds >= 0.5:
            legend.append(f'<span style="color:{GOODPUT_COLOURS[key]}">■</span> {tip}')
    percent = _text(formatting.percent(ledger.get("goodput")))
    return (f'<div class="dlc-goodput" style="font-family:var(--jp-ui-font-family,sans-serif);'
            f'font-size:12px;margin:2px 0">goodput <b class="dlc-goodput-value">{percent}</b> '
            f'of {_text(formatting.duration(wall))}'
            f'<div class="dlc-goodput-bar" style="display:flex;height:10px;width:100%;'
            f'max-width:600px;background:#eee;border-radius:2px;overflow:hidden">{"".join(segments)}</div>'
            f'<div style="color:#555;font-size:11px">{" · ".join(legend)}</div></div>')


def _parent_curves(client, job_id: str, up_to: int) -> dict[str, list]:
    """{metric: [(step, value)]} of a job's rank-0 train points up to step `up_to`."""
    curves: dict[str, list] = {}
    for p in client.metrics_after(job_id):
        if p["rank"] == 0 and p.get("kind", "train") == "train" and p["step"] is not None \
                and p["step"] <= up_to and isinstance(p["value"], (int, float)):
            curves.setdefault(p["name"], []).append((p["step"], p["value"]))
    return {name: sorted(points) for name, points in curves.items()}


def _text(value) -> str:
    """Any stored value as HTML text: escaped, quotes included (it may sit in an attribute)."""
    return html.escape(str(value), quote=True)


def _number(value) -> str:
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return _text(value)


def _seconds(value) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0
