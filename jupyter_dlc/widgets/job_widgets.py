"""`JobWidgets`: the job view's widget tree, and what puts the followed job on it.

Layout, top to bottom: a header (state, attempt, elapsed, step, last loss, steps/s,
samples/s, last checkpoint), the goodput bar, banners (launcher unreachable, active alerts,
diagnosis of a failed attempt), buttons (Stop, Resume from a committed step, Clone), the
per-rank table with its pages, the charts (a train metric against step with a metric
dropdown, where each step goes, and utilisation per GPU per node, or CPU where there is no
GPU), and a log tail with a rank filter.

The `show_*` methods take what the updater read (a `FollowedJob`, a job's detail, a
ledger...), render it (job_html.py) and set only the widgets it changes; the caller holds
`lock`. The controls' handlers (buttons, dropdowns) run on the kernel's main thread when
the front end sends a message; those that change the job or read the launcher go through
the callbacks `connect` was given.

Front ends: the text parts (header, banners, rank table, log tail, buttons) are plain
ipywidgets and work wherever ipywidgets do. The charts are a `jupyter_bokeh.BokehModel`,
which needs BokehJS on the page; in JupyterLab our extension loads it from the Jupyter
server extension (`{base_url}/dlc/static/bokeh/`), never from a CDN and never inlined into
the notebook. Where nothing loads BokehJS (nbclient/nbconvert output, the classic Notebook,
VS Code, a Lab without our extension) the chart area stays empty or shows the widget
manager's error, and a grey note under it (hidden by our extension once BokehJS is loaded)
says why; everything else still works, and the header carries the last loss and
throughput as text.
"""

from __future__ import annotations

import threading
from typing import Callable

from .. import formatting
from ..client import TERMINAL, LauncherError
from . import job_html
from .charts import Charts, JobChartsModel
from .followed_job import FollowedJob
from .ranktable import SORTS, RankPage

FROM_START = -1         # the Resume dropdown's value when no step is committed
MEDIAN_LABEL = "median of the ranks"
FROM_START_LABEL = "no checkpoint: from the start"


class JobWidgets:
    """The widgets of one job view (`widget` is the whole tree), its charts and its lock."""

    def __init__(self, followed: FollowedJob, paging: RankPage, capacity: int):
        import ipywidgets as w

        # Guards what the widgets show; held briefly, since the stream's points wait on it.
        self.lock = threading.RLock()
        self.paging = paging  # which page of the rank table the launcher is asked for
        self.capacity = capacity
        self._followed = followed  # the job whose logs the log filter shows
        self._retention_text = ""

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
        self.chart_note = w.HTML(job_html.NO_BOKEH_NOTE)
        self.retention_note = w.HTML()  # says when older points are downsampled
        self.log_filter = w.Dropdown(description="logs", options=[("all ranks", -1)], value=-1,
                                     layout=w.Layout(width="200px"))
        self.log_view = w.HTML()

        self.charts = self._new_charts(followed)
        self.bokeh = JobChartsModel(self.charts.layout)
        self._set_log_filter_options(followed.world_size)

        self.metric_select.observe(self._on_metric, names="value")
        self.steps_select.observe(self._on_steps_of, names="value")
        self.log_filter.observe(lambda _: self.show_logs(self._followed), names="value")

        self.widget = w.VBox([
            self.header, self.goodput_bar, self.banner,
            w.HBox([self.stop_button, self.resume_steps, self.resume_button, self.clone_button,
                    self.action_note]),
            self.rank_bar, self.rank_table, w.HBox([self.metric_select, self.steps_select]), self.bokeh,
            self.retention_note, self.chart_note,
            self.log_filter, self.log_view,
        ])
        self.widget.add_class("dlc-job-view")
        self.header.value = job_html.header_html(followed.job_id, None)

    def connect(self, stop: Callable[[], object], resume: Callable[[int | None], object],
                clone: Callable[[], object], refresh: Callable[[], object],
                read_rank_page: Callable[[], None]) -> None:
        """Wire the buttons: each action, then `refresh` (a failed action's error shows
        beside the buttons); the rank table's arrows and order: `read_rank_page`."""
        self._read_rank_page = read_rank_page
        self.stop_button.on_click(lambda _: self._act(stop, refresh))
        self.resume_button.on_click(lambda _: self._act(lambda: resume(self._resume_step()), refresh))
        self.clone_button.on_click(lambda _: self._act(clone, refresh))
        self.rank_sort.observe(lambda _: self._turn_rank_page(None), names="value")
        self.rank_prev.on_click(lambda _: self._turn_rank_page(-1))
        self.rank_next.on_click(lambda _: self._turn_rank_page(+1))

    # -- what the updater hands over (the caller holds self.lock) -----------------------------
    def show_new_job(self, f: FollowedJob) -> None:
        """Start over for another job (a clone): empty charts, logs and ledger, first options."""
        self._followed = f
        self.charts = self._new_charts(f)
        self.bokeh.update_from_model(self.charts.layout)
        self.metric_select.options = ["loss"]
        self.metric_select.value = "loss"
        self.steps_select.options = [(MEDIAN_LABEL, -1)]
        self.steps_select.value = -1
        self.steps_select.layout.display = "none"
        self._set_log_filter_options(f.world_size)
        self.resume_steps.options = [(FROM_START_LABEL, FROM_START)]
        self.log_view.value = ""
        self.goodput_bar.value = ""
        self.header.value = job_html.header_html(f.job_id, None)

    def show_new_world(self, f: FollowedJob) -> None:
        """The world size became known (`FollowedJob.set_world`): charts and log filter for it."""
        self.charts = self._new_charts(f)
        self.bokeh.update_from_model(self.charts.layout)
        self._set_log_filter_options(f.world_size)

    def show_parent(self, label: str, points: dict[str, list]) -> None:
        """A branch's parent curve, drawn muted under the branch's own lines."""
        with self.lock, self.bokeh.batch():
            self.charts.set_parent(label, points)

    def show_job(self, f: FollowedJob, job: dict) -> None:
        """A job's detail as the launcher answered it: header, rank table, banners (the
        launcher answered, so none says it is unreachable), buttons, metric and steps
        choices; then the charts' changes since the last draw."""
        self.header.value = job_html.header_html(
            f.job_id, job, f.note, f.train.steps_per_s(), f.train.samples_per_s())
        self.show_ranks(job)
        self.show_banner(f, None)
        ended = job["state"] in TERMINAL
        self.stop_button.disabled = ended
        self.resume_button.disabled = not ended
        self.resume_steps.disabled = not ended
        names = f.train.names()
        if names and list(self.metric_select.options) != names:
            current = self.metric_select.value
            self.metric_select.options = names
            self.metric_select.value = current if current in names else names[0]
        self._set_steps_options(f)
        self.draw()

    def show_ranks(self, job: dict) -> None:
        """The rank table's page in the detail, and the page bar when there is more than one."""
        ranks = job.get("ranks") or []
        paged = job.get("rank_page") or {"page": 0, "pages": 1, "total": len(ranks)}
        self.paging.page, pages = paged["page"], paged["pages"]
        self.rank_bar.layout.display = "" if pages > 1 else "none"
        self.rank_prev.disabled = self.paging.page == 0
        self.rank_next.disabled = self.paging.page >= pages - 1
        self.rank_pages.value = job_html.rank_pages_html(self.paging.page, len(ranks), paged["total"], pages)
        self.rank_table.value = job_html.ranks_html(ranks)

    def show_banner(self, f: FollowedJob, down: tuple[str, float] | None) -> None:
        """The banners; `down` is (why the launcher is unreachable, the retry delay) or None."""
        message, retry_every = down or (None, 0.5)
        self.banner.value = job_html.banner_html(
            f.job_id, down=message, retry_every=retry_every, gone=f.gone, alerts=f.alerts.values(),
            stragglers=(f.job or {}).get("stragglers") or [], evidence=f.evidence, diagnoses=f.diagnoses)

    def show_logs(self, f: FollowedJob) -> None:
        with self.lock:
            self.log_view.value = job_html.logs_html(f.logs_of(self.log_filter.value))

    def show_checkpoints(self, checkpoints: list[dict]) -> None:
        """The Resume dropdown: each committed step, newest first (and chosen unless the user
        chose another that is still there)."""
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

    def show_goodput(self, ledger: dict | None) -> None:
        self.goodput_bar.value = job_html.goodput_bar_html(ledger)

    def show_downsampled(self, thinned: dict | None) -> None:
        text = formatting.downsampled_note(thinned)
        if self._retention_text != text:
            self._retention_text = text
            self.retention_note.value = job_html.retention_note_html(text)

    def draw(self) -> None:
        """Send the charts' changes since the last draw: one bokeh message, however many lines
        changed (held under self.lock, like every chart change)."""
        with self.bokeh.batch():
            self.charts.push()

    def resend_charts(self) -> None:
        """Re-send the whole bokeh document, so that the widget state saved with the notebook,
        and any view created from it later, holds every point."""
        self.charts.flush_steps()
        self.bokeh.update_from_model(self.charts.layout)

    # -- the widgets' own state ---------------------------------------------------------------
    def _new_charts(self, f: FollowedJob) -> Charts:
        return Charts(f.job_id, f.train, f.system, self.capacity)

    def _set_steps_options(self, f: FollowedJob) -> None:
        """Median (or past 8 ranks the mean) and each rank with a line of its own."""
        train = f.train
        if "step_ms" not in train.lines:
            return
        first = MEDIAN_LABEL if train.by_rank else f"mean of {train.world_size} ranks"
        options = [(first, -1)] + [(f"rank {key}", key) for key in train.keys if key != "mean"]
        if list(self.steps_select.options) != options:
            current = self.steps_select.value
            self.steps_select.options = options
            self.steps_select.value = current if current in dict(options).values() else -1
        self.steps_select.layout.display = ""

    def _set_log_filter_options(self, world_size: int) -> None:
        options = [("all ranks", -1)] + [(f"rank {r}", r) for r in range(world_size)]
        if list(self.log_filter.options) != options:
            self.log_filter.options = options
            self.log_filter.value = -1

    def _resume_step(self) -> int | None:
        value = self.resume_steps.value
        return None if value in (None, FROM_START) else int(value)

    # -- handlers (front-end messages, main thread) -------------------------------------------
    def _on_metric(self, change) -> None:
        with self.lock:
            if change["new"]:
                with self.bokeh.batch():
                    self.charts.select_metric(change["new"])

    def _on_steps_of(self, change) -> None:
        with self.lock:
            if change["new"] is not None:
                with self.bokeh.batch():
                    self.charts.select_steps_of(None if change["new"] < 0 else change["new"])

    def _turn_rank_page(self, by: int | None) -> None:
        """Show another page, or the first in another order, at once: read from the launcher."""
        with self.lock:
            self.paging.order = self.rank_sort.value
            self.paging.page = 0 if by is None else max(0, self.paging.page + by)
        self._read_rank_page()

    def _act(self, action: Callable[[], object], refresh: Callable[[], object]) -> None:
        try:
            action()
            self.action_note.value = ""
        except LauncherError as error:
            self.action_note.value = job_html.error_note_html(str(error))
        refresh()
